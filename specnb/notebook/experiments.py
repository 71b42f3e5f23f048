"""Experiments the notebooks run: sweeps of tree shapes x budgets x prompts for draft -> target
pairs, stored resumably, and the tidy tables computed from them.

A unit of work is one generation: (pair, shape, budget, prompt), where (shape, budget) names a
method (`methods`: "chain:4" is the draft model filling a chain of 4, "ngram/kary2:8" the n-gram
drafter filling a binary tree of 8, "dynamic:16" a dynamic tree). The target's own greedy decoding
of each prompt is the unit with shape "autoregressive" and budget 0; it is the reference output
(greedy equality is checked for every speculative unit) and the speed baseline of the same run.
transformers' own speculative decoders run as units too, on the same prompts in the same process
(`specnb.baselines`): shape "hf_assisted" (assisted generation with the pair's draft, budget = its
fixed draft length) and "hf_prompt_lookup" (budget = `prompt_lookup_num_tokens`); their tree is
recorded as a chain of that length. Every unit also gets the perplexity of its output under the
target (`quality.perplexity`).
Each unit stores its per-step rows and a one-row summary (see `storage.Sweep`).

Metric conventions (`metrics`): acceptance_rate = accepted / drafted; acceptance_length = accepted
draft tokens per step, bonus EXCLUDED; tau = tokens per target call, bonus INCLUDED.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Sequence

import pandas as pd
import torch
from tqdm.auto import tqdm

from ..analysis.baselines import hf_assisted_generate, hf_prompt_lookup_generate
from ..core.generation import GenerationResult, autoregressive_generate, speculative_generate
from ..drafters.methods import build_drafter, parse_method
from ..analysis.metrics import step_row, summarize
from ..io.prompts import Prompt
from ..analysis.quality import greedy_equal, perplexity
from ..io.storage import Sweep
from ..core.trees import Tree

BASELINE = "autoregressive"
UNIT_KEY = ("pair", "shape", "budget", "prompt_id")


@dataclass(frozen=True)
class Pair:
    """A draft -> target pair as named in parameter files."""

    target: str
    draft: str
    target_quantization: str | None = None
    draft_quantization: str | None = None
    draft_layers: int | None = None  # keep only the draft's first layers (early-exit self-draft)
    methods: tuple[str, ...] | None = None  # this pair's method specs; None: the sweep's own

    def __post_init__(self) -> None:
        if self.methods is not None:
            object.__setattr__(self, "methods", tuple(self.methods))
            parse_trees(self.methods)  # refuse a bad spec before any model loads

    @property
    def label(self) -> str:
        def side(name: str, quant: str | None, layers: int | None = None) -> str:
            out = name + (f"[{quant}]" if quant else "")
            return out + (f"[:{layers} layers]" if layers else "")

        return f"{side(self.draft, self.draft_quantization, self.draft_layers)} -> {side(self.target, self.target_quantization)}"

    @classmethod
    def from_dict(cls, d: dict) -> Pair:
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown pair fields {sorted(unknown)}; allowed: {sorted(cls.__dataclass_fields__)}")
        return cls(**d)


def run_sweep(
    store: Sweep,
    pair_label: str,
    target: torch.nn.Module,
    draft: torch.nn.Module,
    tokenizer,
    prompts: Sequence[Prompt],
    trees: dict[tuple[str, int], Tree],
    max_new_tokens: int,
    progress: bool = True,
) -> None:
    """Run every (prompt, tree) unit not yet in `store`, baseline first per prompt."""
    from ..io.models import prompt_ids

    drafters: dict[str, object] = {}  # one drafter per method, reused across prompts
    todo = [(p, None) for p in prompts] + [(p, k) for p in prompts for k in trees]
    todo = [(p, k) for p, k in todo if _key(pair_label, k, p) not in store]
    references: dict[str, list[int]] = {}
    ids_of = {p.id: prompt_ids(tokenizer, p.text) for p in prompts}  # tokenize each prompt once
    perplexities: dict[tuple[str, tuple[int, ...]], float] = {}  # equal outputs are scored once
    for prompt, k in tqdm(todo, desc=pair_label, disable=not progress):
        ids = ids_of[prompt.id]
        result = _generate(target, draft, drafters, ids, k, trees[k] if k else None, max_new_tokens)
        output = (prompt.id, tuple(result.tokens.tolist()))
        if output not in perplexities:
            perplexities[output] = perplexity(target, ids, result.tokens)
        reference = references.get(prompt.id) or _stored_tokens(store, pair_label, prompt)
        if k is None:
            references[prompt.id] = result.tokens.tolist()
            reference = references[prompt.id]
        store.add(
            _key(pair_label, k, prompt),
            _step_rows(result),
            meta=_unit_summary(result, prompt, reference, trees[k] if k else None, perplexities[output]),
        )


def _generate(
    target: torch.nn.Module,
    draft: torch.nn.Module | None,
    drafters: dict[str, object],
    ids: torch.Tensor,
    k: tuple[str, int] | None,
    tree: Tree | None,
    max_new_tokens: int,
) -> GenerationResult:
    """One unit: the baseline (k None), a transformers method, or a specnb method (`methods`)."""
    if k is None:
        return autoregressive_generate(target, ids, max_new_tokens=max_new_tokens)
    method = parse_method(f"{k[0]}:{k[1]}")
    if method.drafter == "hf_assisted":
        return hf_assisted_generate(target, draft, ids, num_assistant_tokens=method.budget, max_new_tokens=max_new_tokens)
    if method.drafter == "hf_prompt_lookup":
        return hf_prompt_lookup_generate(target, ids, prompt_lookup_num_tokens=method.budget, max_new_tokens=max_new_tokens)
    if method.spec not in drafters:
        drafters[method.spec] = build_drafter(method, target, draft)
    return speculative_generate(target, drafters[method.spec], ids, tree=tree, max_new_tokens=max_new_tokens)


def run_pairs(
    store: Sweep,
    pairs: Sequence[Pair],
    prompts: Sequence[Prompt],
    trees: dict[tuple[str, int], Tree],
    max_new_tokens: int,
    progress: bool = True,
) -> pd.DataFrame:
    """Load each pair in turn and sweep it; a pair whose tokenizers differ is skipped (its reason
    recorded) before any weights load. Returns one row per pair: label, status, reason."""
    import gc

    from ..io.models import check_pair, load_pair, load_tokenizer

    status = []
    for pair in pairs:
        try:
            check_pair(load_tokenizer(pair.target), load_tokenizer(pair.draft), pair.target, pair.draft)
        except ValueError as e:
            status.append({"pair": pair.label, "status": "skipped", "reason": str(e)})
            continue
        target, draft, tokenizer = load_pair(
            pair.target, pair.draft, pair.target_quantization, pair.draft_quantization, draft_layers=pair.draft_layers
        )
        own = trees if pair.methods is None else parse_trees(pair.methods)
        run_sweep(store, pair.label, target, draft, tokenizer, prompts, own, max_new_tokens, progress)
        status.append({"pair": pair.label, "status": "measured", "reason": ""})
        del target, draft
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return pd.DataFrame(status)


def unit_table(store: Sweep) -> pd.DataFrame:
    """One row per generation: its key, prompt category and summary metrics."""
    return store.meta_frame()


def steps_frame(store: Sweep) -> pd.DataFrame:
    """One row per target call, with its unit's key."""
    return store.frame()


def shape_table(units: pd.DataFrame, by: Sequence[str] = ("pair", "shape", "budget")) -> pd.DataFrame:
    """Pooled metrics per group (sums over all steps of all prompts), the spread of per-prompt tau,
    and speed against the same pair's baseline in the same run."""
    by = list(by)
    spec = units[units["shape"] != BASELINE]
    base = units[units["shape"] == BASELINE]
    g = spec.groupby(by, sort=False)
    out = g.agg(
        prompts=("prompt_id", "nunique"),
        steps=("num_steps", "sum"),
        drafted=("num_drafted", "sum"),
        accepted=("num_accepted", "sum"),
        tokens=("num_tokens", "sum"),
        time_s=("total_time", "sum"),
        tau_prompt_std=("tau", "std"),
        tau_prompt_min=("tau", "min"),
        tau_prompt_max=("tau", "max"),
        greedy_equal=("greedy_equal", "sum"),
        nodes=("num_nodes", "first"),
        depth=("depth", "first"),
        **({"perplexity": ("perplexity", "mean")} if "perplexity" in spec else {}),
    ).reset_index()
    out["acceptance_rate"] = out["accepted"] / out["drafted"]
    out["acceptance_length"] = out["accepted"] / out["steps"]
    out["tau"] = out["tokens"] / out["steps"]
    out["tokens_per_s"] = out["tokens"] / out["time_s"]
    base_by = [c for c in by if c not in ("shape", "budget")]
    base_speed = base.groupby(base_by)[["num_tokens", "total_time"]].sum()
    base_speed = (base_speed["num_tokens"] / base_speed["total_time"]).rename("baseline_tokens_per_s").reset_index()
    out = out.merge(base_speed, on=base_by, how="left")
    out["speedup"] = out["tokens_per_s"] / out["baseline_tokens_per_s"]
    return out


def baseline_table(units: pd.DataFrame, by: Sequence[str] = ("pair",)) -> pd.DataFrame:
    """The target's own decoding per group: time to first token, time per output token, tokens/s."""
    base = units[units["shape"] == BASELINE]
    out = base.groupby(list(by)).agg(
        prompts=("prompt_id", "nunique"),
        tokens=("num_tokens", "sum"),
        time_s=("total_time", "sum"),
        ttft_s=("ttft_s", "mean"),
        tpot_s=("tpot_s", "mean"),
        peak_memory_bytes=("peak_memory_bytes", "max"),
    ).reset_index()
    out["tokens_per_s"] = out["tokens"] / out["time_s"]
    return out


def depth_table(steps: pd.DataFrame, by: Sequence[str] = ("pair", "shape", "budget")) -> pd.DataFrame:
    """Tidy per-depth acceptance: steps that accepted at least d draft tokens / steps."""
    rows = []
    spec = steps[steps["shape"] != BASELINE]
    for key, g in spec.groupby(list(by), sort=False):
        key = key if isinstance(key, tuple) else (key,)
        for d in range(1, int(g["tree_depth"].max()) + 1):
            rows.append({**dict(zip(by, key)), "depth": d, "acceptance": float((g["num_accepted"] >= d).mean())})
    return pd.DataFrame(rows)


def node_frequency(steps: pd.DataFrame, tree: Tree) -> dict[tuple[int, ...], float]:
    """How often each node of `tree` was on the accepted path, per step."""
    counts = {p: 0 for p in tree.paths}
    n = 0
    for ranks in steps["accepted_ranks"]:
        n += 1
        path = _rank_path(ranks)
        for d in range(1, len(path) + 1):
            if path[:d] in counts:
                counts[path[:d]] += 1
    return {p: c / n for p, c in counts.items()} if n else counts


# specnb methods and the transformers method that drafts the same tokens (same draft, same length)
COUNTERPARTS = (("chain", "hf_assisted"), ("ngram/chain", "hf_prompt_lookup"))


def head_to_head(table: pd.DataFrame, matchups: Sequence[tuple[str, str]] | None = None) -> pd.DataFrame:
    """specnb method against another method of the same pair, same prompts, same run: one row per
    (pair, ours, theirs) found in a shape table, with tau and tokens/s of both and their ratio.
    matchups: spec pairs, e.g. [("chain:4", "hf_assisted:4")]; default: every budget of each
    `COUNTERPARTS` pair present in the table."""
    if matchups is None:
        budgets = sorted(table["budget"].unique())
        matchups = [(f"{a}:{k}", f"{b}:{k}") for a, b in COUNTERPARTS for k in budgets]
    spec = table.assign(spec=table["shape"] + ":" + table["budget"].astype(str)).set_index(["pair", "spec"])
    rows = []
    for pair in table["pair"].unique():
        for ours, theirs in matchups:
            if (pair, ours) not in spec.index or (pair, theirs) not in spec.index:
                continue
            a, b = spec.loc[(pair, ours)], spec.loc[(pair, theirs)]
            rows.append({
                "pair": pair, "ours": ours, "theirs": theirs,
                "tau_ours": a["tau"], "tau_theirs": b["tau"],
                "tokens_per_s_ours": a["tokens_per_s"], "tokens_per_s_theirs": b["tokens_per_s"],
                "speed_ratio": a["tokens_per_s"] / b["tokens_per_s"],
                "greedy_equal_ours": f"{int(a['greedy_equal'])}/{int(a['prompts'])}",
                "greedy_equal_theirs": f"{int(b['greedy_equal'])}/{int(b['prompts'])}",
            })
    return pd.DataFrame(rows)


def step_costs(steps: pd.DataFrame) -> pd.DataFrame:
    """Why a method is fast or slow: mean draft and verify seconds per target call, against the
    target's own seconds per token (its plain decoding steps in the same run), per pair and method.
    draft_cost = draft s per step / target s per token; verify_cost = verify s per step / target s
    per token (a tree costs more than one token to verify on a compute-bound device); tau is what
    one step buys. Speculation pays when tau > draft_cost + verify_cost."""
    plain = steps[(steps["shape"] == BASELINE) & (steps["position"] > 0)]  # step 0 includes the prefill
    base = plain.groupby("pair")["verify_time"].mean().rename("target_s_per_token")
    spec = steps[steps["shape"] != BASELINE]
    out = spec.groupby(["pair", "shape", "budget"], sort=False).agg(
        steps=("num_tokens", "size"),
        tau=("num_tokens", "mean"),
        nodes_per_step=("num_drafted", "mean"),
        draft_s_per_step=("draft_time", "mean"),
        verify_s_per_step=("verify_time", "mean"),
    ).reset_index().merge(base.reset_index(), on="pair", how="left")
    out["draft_cost"] = out["draft_s_per_step"] / out["target_s_per_token"]
    out["verify_cost"] = out["verify_s_per_step"] / out["target_s_per_token"]
    out["predicted_speedup"] = out["tau"] / (out["draft_cost"] + out["verify_cost"])
    return out


# ---- collect once, replay many (notebook 01; `replay`) ------------------------------------------


def collect_pair(
    folder,
    target: torch.nn.Module,
    draft: torch.nn.Module,
    tokenizer,
    prompts: Sequence[Prompt],
    trees: dict[tuple[str, int], Tree],
    max_new_tokens: int,
    super_k: int,
    super_depth: int,
    dynamic_budgets: Sequence[int],
    describe: dict | None = None,
):
    """`replay.collect` for a prompt set: ranks kept up to the widest rank any tree uses, super-trees
    (when super_k > 0) as large as the largest dynamic budget. Resumable in `folder`."""
    from ..io.models import prompt_ids
    from ..analysis.replay import CollectConfig, collect

    widest = max((max(path) for tree in trees.values() for path in tree.paths), default=0)
    config = CollectConfig(
        max_new_tokens=max_new_tokens, top_k=max(widest + 1, super_k, 2), super_k=super_k,
        super_depth=super_depth, super_size=max(dynamic_budgets, default=1),
    )
    ids = {p.id: prompt_ids(tokenizer, p.text) for p in prompts}
    return collect(folder, target, draft, ids, config, categories={p.id: p.category for p in prompts},
                   describe=describe, progress=True)


def replay_table(collection, trees: dict[tuple[str, int], Tree], budgets: Sequence[int], dynamic_budgets: Sequence[int]):
    """Every shape x budget replayed, plus the data-driven trees: "sequoia" (Sequoia's DP under the
    measured acceptance vector), "hindsight" (the best static tree on this data), "dynamic" and the
    per-position "oracle" (super-trees needed). Returns (table, trees incl. the designed ones).

    Rows: trajectory-mode metrics (the positions a real run visits: what it would measure), plus
    tau_all over every position, and tau_all as a fraction of the hindsight ceiling and of the
    oracle of the same budget (both defined on all positions)."""
    from ..analysis import replay

    designed = {("sequoia", n): t for n, t in replay.sequoia(collection, budgets).items()}
    designed |= {("hindsight", n): t for n, t in replay.ceiling(collection, budgets).items()}
    every = {**trees, **designed}
    parts = [(replay.replay(collection, every, mode="trajectory"), replay.replay(collection, every, mode="all"))]
    if collection.has_super_trees and dynamic_budgets:
        for fn in (replay.replay_dynamic, replay.oracle):
            parts.append((fn(collection, dynamic_budgets, mode="trajectory"), fn(collection, dynamic_budgets, mode="all")))
    table = pd.concat([t for t, _ in parts], ignore_index=True)
    every_pos = pd.concat([a for _, a in parts], ignore_index=True)[["shape", "budget", "tau"]]
    table = table.merge(every_pos.rename(columns={"tau": "tau_all"}), on=["shape", "budget"])
    for ref in ("hindsight", "oracle"):
        top = every_pos[every_pos["shape"] == ref].set_index("budget")["tau"]
        table[f"tau_all_over_{ref}"] = table["tau_all"] / table["budget"].map(top)
    return table, every


def replay_agreement(store: Sweep, pair_label: str, collection, specs: Sequence[str]) -> pd.DataFrame:
    """Real runs (units in `store`) against the replay, step by step: one row per method with the
    steps compared and how many were identical (position, drafted, accepted and tokens added)."""
    from ..analysis.replay import replay_steps

    steps = steps_frame(store)
    rows = []
    for spec in specs:
        method = parse_method(spec)
        tree = method.budget if method.drafter == "dynamic" else method.tree
        replayed = replay_steps(collection, tree)
        real = steps[(steps["pair"] == pair_label) & (steps["shape"] == method.label) & (steps["budget"] == method.budget)]
        compared = identical = 0
        for pid, mine in replayed.items():
            theirs = real[real["prompt_id"] == pid].sort_values("position")
            pairs = list(zip([(s.position, s.num_drafted, s.num_accepted, s.num_tokens) for s in mine],
                             theirs[["position", "num_drafted", "num_accepted", "num_tokens"]].itertuples(index=False)))
            compared += max(len(mine), len(theirs))
            identical += sum(tuple(a) == tuple(int(x) for x in b) for a, b in pairs)
        rows.append({"method": spec, "steps_compared": compared, "identical_steps": identical,
                     "tau_real": real["num_tokens"].sum() / max(len(real), 1),
                     "tau_replayed": sum(s.num_tokens for v in replayed.values() for s in v) / max(sum(len(v) for v in replayed.values()), 1)})
    return pd.DataFrame(rows)


def replayed_steps_frame(collection, tree: Tree) -> pd.DataFrame:
    """The replayed run-trajectory steps of one static tree as a steps frame (for `node_frequency`)."""
    from ..analysis.replay import replay_steps

    return pd.DataFrame([step_row(s) for v in replay_steps(collection, tree).values() for s in v])


def replay_depths(table: pd.DataFrame) -> pd.DataFrame:
    """Tidy per-depth acceptance (P(accepted >= d), run trajectory) from a replay table, in the
    columns of `depth_table`, for the trees a real drafter could build (not the oracle)."""
    cols = [c for c in table.columns if re.fullmatch(r"depth_\d+_acceptance", c)]
    long = table[table["shape"] != "oracle"].melt(id_vars=["shape", "budget"], value_vars=cols,
                                                  var_name="depth", value_name="acceptance")
    long["depth"] = long["depth"].str.extract(r"(\d+)", expand=False).astype(int)
    return long.dropna(subset=["acceptance"]).sort_values(["budget", "shape", "depth"]).reset_index(drop=True)


def replay_reading(table: pd.DataFrame, agreement: pd.DataFrame, speed: pd.DataFrame) -> str:
    """Markdown reading of notebook 01's replay, computed from its tables (no fixed conclusions)."""
    lines = ["tau = tokens per target call, bonus included; run-trajectory positions unless noted."]
    presets = table[~table["shape"].isin(["sequoia", "hindsight", "dynamic", "oracle"])]
    for budget, b in table.groupby("budget"):
        parts = []
        p = presets[presets["budget"] == budget]
        if len(p):
            best = p.loc[p["tau"].idxmax()]
            parts.append(f"best preset {best['shape']} tau {best['tau']:.2f}")
        for shape in ("sequoia", "hindsight", "dynamic", "oracle"):
            row = b[b["shape"] == shape]
            if len(row):
                parts.append(f"{shape} {row['tau'].iloc[0]:.2f}")
        lines.append(f"- {budget} draft tokens: " + ", ".join(parts))
    if len(presets):
        frac = presets.groupby("shape")["tau_all_over_hindsight"].mean().sort_values(ascending=False)
        if frac.notna().any():
            lines.append("- mean fraction of the hindsight (best static) tree's tau over the budgets (all positions): "
                         + ", ".join(f"{k} {v:.2f}" for k, v in frac.items()))
    same, compared = int(agreement["identical_steps"].sum()), int(agreement["steps_compared"].sum())
    lines.append(f"- replay against real runs: {same}/{compared} steps identical ({', '.join(agreement['method'])})")
    best = speed.iloc[0]
    verdict = "pays off" if best["speedup"] > 1 else "does not pay off here (the target alone is faster)"
    lines.append(f"- fastest on this device by the cost model: {best['shape']} with {int(best['budget'])} draft "
                 f"tokens, {best['speedup']:.2f}x the target alone: speculation {verdict}")
    return "\n".join(lines)


def reading(table: pd.DataFrame) -> str:
    """A short markdown reading of a shape table, computed from it (no fixed conclusions)."""
    lines = []
    for pair, t in table.groupby("pair", sort=False):
        lines.append(f"**{pair}** (tau = tokens per target call, bonus included):")
        for budget, b in t.groupby("budget"):
            best = b.loc[b["tau"].idxmax()]
            worst = b.loc[b["tau"].idxmin()]
            lines.append(
                f"- {budget} draft tokens: best {best['shape']} (tau {best['tau']:.2f}, acceptance rate "
                f"{best['acceptance_rate']:.2f}), worst {worst['shape']} (tau {worst['tau']:.2f})"
            )
        best = t.loc[t["tau"].idxmax()]
        fastest = t.loc[t["tokens_per_s"].idxmax()]
        lines.append(
            f"- highest tau overall: {best['shape']} with {best['budget']} tokens ({best['tau']:.2f}); "
            f"fastest: {fastest['shape']} with {fastest['budget']} tokens, "
            f"{fastest['speedup']:.2f}x the target alone"
        )
        rate_trend = t.groupby("budget")["acceptance_rate"].mean()
        if len(rate_trend) > 1:
            direction = "falls" if rate_trend.iloc[-1] < rate_trend.iloc[0] else "rises"
            lines.append(
                f"- mean acceptance rate {direction} from {rate_trend.iloc[0]:.2f} at {rate_trend.index[0]} "
                f"to {rate_trend.iloc[-1]:.2f} at {rate_trend.index[-1]} tokens: more draft tokens, "
                f"each less likely to be accepted"
                if direction == "falls"
                else f"- mean acceptance rate {direction} from {rate_trend.iloc[0]:.2f} to {rate_trend.iloc[-1]:.2f}"
            )
        equal, total = int(t["greedy_equal"].sum()), int(t["prompts"].sum())
        lines.append(f"- greedy output equal to the target's own: {equal}/{total} generations")
    return "\n".join(lines)


# ---- helpers --------------------------------------------------------------------------------


def _key(pair: str, k: tuple[str, int] | None, prompt: Prompt) -> dict:
    shape, budget = k if k is not None else (BASELINE, 0)
    return {"pair": pair, "shape": shape, "budget": budget, "prompt_id": prompt.id}


def _rank_path(value) -> tuple[int, ...]:
    """A stored rank path ("0/1/0") back as a tuple; read back from CSV, pandas may have made an
    empty path NaN and a one-rank path a number."""
    if value is None or (isinstance(value, float) and value != value):
        return ()
    if isinstance(value, (int, float)):
        return (int(value),)
    return tuple(int(float(r)) for r in str(value).split("/") if r.strip() != "")


def _stored_tokens(store: Sweep, pair: str, prompt: Prompt) -> list[int] | None:
    meta = store.meta(_key(pair, None, prompt))
    return None if meta is None else [int(t) for t in str(meta["tokens"]).split() if t]


def _step_rows(result: GenerationResult) -> list[dict]:
    return [step_row(s) for s in result.steps]


def _unit_summary(
    result: GenerationResult, prompt: Prompt, reference: list[int] | None, tree: Tree | None, ppl: float = float("nan")
) -> dict:
    s = summarize(result)
    tokens = result.tokens.tolist()
    return {
        "category": prompt.category,
        "num_nodes": tree.num_nodes if tree else 0,
        "depth": tree.depth if tree else 0,
        "num_steps": s.num_steps,
        "num_drafted": s.num_drafted,
        "num_accepted": s.num_accepted,
        "num_tokens": s.num_tokens,
        "acceptance_rate": s.acceptance_rate,
        "acceptance_length": s.acceptance_length,
        "tau": s.tau,
        "ttft_s": s.ttft_s,
        "tpot_s": s.tpot_s,
        "tokens_per_s": s.tokens_per_s,
        "total_time": result.total_time,
        "draft_time_s": s.draft_time_s,
        "verify_time_s": s.verify_time_s,
        "peak_memory_bytes": s.peak_memory_bytes,
        "greedy_equal": greedy_equal(tokens, reference),
        "perplexity": ppl,
        "tokens": " ".join(map(str, tokens)),
    }


def trees_for(shapes: Iterable[str], budgets: Iterable[int]) -> dict[tuple[str, int], Tree]:
    """Every shape x budget method, keyed (shape, budget), with the tree it requests each step."""
    return parse_trees(f"{s}:{b}" for s in shapes for b in budgets)


def parse_trees(specs: Iterable[str]) -> dict[tuple[str, int], Tree]:
    """Method specs (`methods`: "chain:4", "ngram/kary2:8", "dynamic:16", "hf_assisted:4") keyed
    (shape, budget) as tables name them, with the tree each requests per step."""
    methods = [parse_method(spec) for spec in specs]
    return {(m.label, m.budget): m.tree for m in methods}
