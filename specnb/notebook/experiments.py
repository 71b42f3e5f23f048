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
recorded as a chain of that length; "hf_uag" is transformers' universal assisted generation, for a
draft of another tokenizer (budget = draft tokens per step). Every unit also gets the perplexity of its output under the
target and its greedy verdict against the target's own output: "exact", "tie" (a numerical tie of
the target's top two logits at the first difference) or "mismatch" (`analysis.quality`).
Each unit stores its per-step rows and a one-row summary (see `storage.Sweep`).

Metric conventions (`metrics`): acceptance_rate = accepted / drafted; acceptance_length = accepted
draft tokens per step, bonus EXCLUDED; tau = tokens per target call, bonus INCLUDED.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from ..analysis import replay, spread, tree_design
from ..analysis.baselines import hf_assisted_generate, hf_prompt_lookup_generate, hf_uag_generate
from ..analysis.collect import CollectReport, collect_units
from ..analysis.collection import CollectConfig, Collection
from ..analysis.executors import Executor, LocalExecutor
from ..analysis.cost_model import draft_widths
from ..analysis.metrics import step_row, summarize
from ..analysis.quality import TIE_MARGIN, Score, compare_greedy, logit_gap, score
from ..analysis.redraft import Redrafted, redraft
from ..core.drafting import Drafter
from ..core.generation import GenerationResult, autoregressive_generate, speculative_generate
from ..core.trees import Tree
from ..drafters.cross_tokenizer import CrossTokenizerDrafter
from ..drafters.methods import DYNAMIC, DYNAMIC_MAX_DEPTH, DYNAMIC_TOP_K, build_drafter, method_trees, parse_method
from ..drafters.retokenize import TokenText
from ..io.models import ModelPair, check_pair, default_device, default_dtype, describe_model, load_model, load_tokenizer, model_dtype, prompt_format, prompt_ids
from ..io.cpu_linear import effective_path, linear_path
from ..io.sources import check_sources
from ..io.prompts import Prompt
from ..bench.timing import environment_row
from ..bench.verify_curve import curve_table, missing_points, verify_curve
from ..io.storage import Sweep

BASELINE = "autoregressive"
# where each notebook's budget recommendation takes its tau and its costs (`readings.recommendation`)
RECOMMENDATION_01 = ("tau replayed from this notebook's collection of the pair on its prompts (measured); draft and "
                     "verify costs from the curves measured on this machine")
RECOMMENDATION_03 = ("tau from the `acceptance` parameter (an assumed per-rank vector, through Sequoia's model of "
                     "independent ranks: not measured here; notebook 01 measures the pair's); draft and verify costs "
                     "from the curves measured on this machine")
WARMUP_TOKENS = 4  # tokens of each method's untimed warm-up run (`run_sweep`)
GAP_TOKENS = 8  # tokens of the first prompt's output that `quality.logit_gap` decodes and verifies
UNIT_KEY = ("pair", "shape", "budget", "prompt_id")


@dataclass(frozen=True)
class Pair(ModelPair):
    """A draft -> target pair as named in parameter files (`ModelPair`), with its own methods."""

    methods: tuple[str, ...] | None = None  # this pair's method specs; None: the sweep's own

    def __post_init__(self) -> None:
        if self.methods is not None:
            object.__setattr__(self, "methods", tuple(self.methods))
            method_trees(self.methods)  # refuse a bad spec before any model loads

    @property
    def draft_label(self) -> str:
        """The draft as tables name it: its name, quantization and kept layers."""
        out = self.draft + (f"[{self.draft_quantization}]" if self.draft_quantization else "")
        return out + (f"[:{self.draft_layers} layers]" if self.draft_layers else "")

    @property
    def target_label(self) -> str:
        return self.target + (f"[{self.target_quantization}]" if self.target_quantization else "")

    @property
    def label(self) -> str:
        return f"{self.draft_label} -> {self.target_label}"

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
    dynamic: tuple[int, int] = (DYNAMIC_TOP_K, DYNAMIC_MAX_DEPTH),
    draft_tokenizer=None,
    baseline_of: str | None = None,
    texts: tuple[TokenText, TokenText] | None = None,
    rounds: int = 1,
    warmup: bool = True,
) -> None:
    """Run every (prompt, tree) unit not yet in `store`. Timing is fair between methods: with
    `warmup` every method first runs once untimed (a few tokens); then per prompt the methods run
    interleaved, `rounds` times, in an order rotated from prompt to prompt, and each unit keeps its
    fastest round (greedy: every round gives the same tokens; a shared CPU's spikes only slow a
    run down) and records every round's seconds (`round_times`). The target alone is stored first
    per prompt: the reference of every method's output. A prompt's units are stored when its rounds
    are done (an interrupted run redoes that prompt only). dynamic:
    (children per node, depth) of dynamic trees (`methods.build_drafter`). `tokenizer` is the
    target's; draft_tokenizer, the draft's, is needed by the cross-tokenizer methods (xtok, hf_uag)
    only. baseline_of: an earlier pair of the same target in `store`, whose target-alone units are
    copied (meta "baseline_of") instead of run again: same model, prompt and run. texts: the two
    tokenizers read as bytes (`TokenText`), when already made."""
    drafters: dict[str, object] = {}  # one drafter per method, reused across prompts
    vocabularies = _Vocabularies(tokenizer, draft_tokenizer, texts)
    todo = {p.id: [k for k in [None, *trees] if _key(pair_label, k, p) not in store] for p in prompts}
    references: dict[str, list[int]] = {}
    ids_of = {p.id: prompt_ids(tokenizer, p.text) for p in prompts}  # tokenize each prompt once
    scores: dict[tuple[str, tuple[int, ...]], Score] = {}  # equal outputs are scored once
    gap: list[float] = []  # the target's decode-vs-verify logit gap (`quality.logit_gap`), measured once
    if warmup and any(todo.values()):  # every method once, untimed: no timed run pays a first call's costs
        for k in [None, *trees]:
            _generate(target, draft, drafters, ids_of[prompts[0].id], k, trees[k] if k else None,
                      min(WARMUP_TOKENS, max_new_tokens), vocabularies, dynamic)
    bar = tqdm(total=sum(map(len, todo.values())), desc=pair_label, disable=not progress)
    for i, prompt in enumerate(prompts):
        keys, ids = todo[prompt.id], ids_of[prompt.id]
        if None in keys and baseline_of is not None and _key(baseline_of, None, prompt) in store:
            earlier = _key(baseline_of, None, prompt)
            store.add(_key(pair_label, None, prompt), store.rows(earlier), meta={**store.meta(earlier), "baseline_of": baseline_of})
            keys = [k for k in keys if k is not None]
            bar.update()
        best: dict = {}  # per method, its fastest round (greedy: every round gives the same tokens)
        rounds_s: dict = {k: [] for k in keys}
        order = keys[i % len(keys):] + keys[: i % len(keys)] if keys else []  # rotated: no method always first
        for _ in range(rounds):
            for k in order:
                result = _generate(target, draft, drafters, ids, k, trees[k] if k else None, max_new_tokens, vocabularies, dynamic)
                rounds_s[k].append(result.total_time)
                if k not in best or result.total_time < best[k].total_time:
                    best[k] = result
        for k in sorted(keys, key=lambda k: k is not None):  # the target alone first: the reference
            result = best[k]
            output = (prompt.id, tuple(result.tokens.tolist()))
            if output not in scores:
                scores[output] = score(target, ids, result.tokens)
            if k is None:
                references[prompt.id] = result.tokens.tolist()
            reference = references.get(prompt.id) or _stored_tokens(store, pair_label, prompt)
            if not gap:
                gap.append(logit_gap(target, ids, (reference or result.tokens.tolist())[:GAP_TOKENS] or [0]))
            summary = _unit_summary(result, prompt, reference, trees[k] if k else None, scores[output], target.dtype, gap[0])
            store.add(_key(pair_label, k, prompt), _step_rows(result),
                      meta={**summary, "rounds": rounds, "round_times": " ".join(f"{t:.4f}" for t in rounds_s[k])})
            bar.update()
    bar.close()


def _generate(
    target: torch.nn.Module,
    draft: torch.nn.Module | None,
    drafters: dict[str, object],
    ids: torch.Tensor,
    k: tuple[str, int] | None,
    tree: Tree | None,
    max_new_tokens: int,
    vocabularies: _Vocabularies,
    dynamic: tuple[int, int] = (DYNAMIC_TOP_K, DYNAMIC_MAX_DEPTH),
) -> GenerationResult:
    """One unit: the baseline (k None), a transformers method, or a specnb method (`methods`)."""
    if k is None:
        return autoregressive_generate(target, ids, max_new_tokens=max_new_tokens)
    method = parse_method(f"{k[0]}:{k[1]}")
    if method.drafter == "hf_assisted":
        return hf_assisted_generate(target, draft, ids, num_assistant_tokens=method.budget, max_new_tokens=max_new_tokens)
    if method.drafter == "hf_uag":
        return hf_uag_generate(target, draft, ids, vocabularies.target, vocabularies.draft, num_assistant_tokens=method.budget,
                               max_new_tokens=max_new_tokens)
    if method.drafter == "hf_prompt_lookup":
        return hf_prompt_lookup_generate(target, ids, prompt_lookup_num_tokens=method.budget, max_new_tokens=max_new_tokens)
    if method.spec not in drafters:
        texts = vocabularies.texts() if method.drafter == "xtok" else (None, None)
        drafters[method.spec] = build_drafter(method, target, draft, dynamic=dynamic,
                                              target_tokenizer=texts[0], draft_tokenizer=texts[1])
    return speculative_generate(target, drafters[method.spec], ids, tree=tree, max_new_tokens=max_new_tokens)


class _Vocabularies:
    """A sweep's two tokenizers (target, draft), read as `TokenText` once, when a method needs it."""

    def __init__(self, target, draft, texts: tuple[TokenText, TokenText] | None = None) -> None:
        self.target, self.draft = target, draft
        self._texts = texts

    def texts(self) -> tuple[TokenText, TokenText]:
        if self.draft is None:
            raise ValueError("cross-tokenizer methods need the draft's tokenizer (run_sweep(..., draft_tokenizer=...))")
        if self._texts is None:
            self._texts = (TokenText.of(self.target), TokenText.of(self.draft))
        return self._texts


def run_pairs(
    store: Sweep,
    pairs: Sequence[Pair],
    prompts: Sequence[Prompt],
    trees: dict[tuple[str, int], Tree],
    max_new_tokens: int,
    progress: bool = True,
    collections: Path | None = None,
    measure: Sequence[str] = (),
    dtype: str | None = None,
    cpu_linear: str = "stock",
    rounds: int = 1,
) -> pd.DataFrame:
    """Sweep every pair, the models in `dtype` (`io.models.model_dtype`; None: the device's default),
    a CPU float32 model's linear layers on `cpu_linear` (`io.cpu_linear`), every measured method
    warmed up, then run `rounds` times per prompt interleaved with the others (`run_sweep`).
    Before any weights load, every model of every pair is resolved (access, licence, name:
    `io.sources`, one error listing every problem) and every pair's tokenizers are compared: on a
    pair whose vocabularies differ, the methods that need a shared one (`Method.shared_vocabulary`)
    are refused, the reason recorded (check_pair's message, which names the cross-tokenizer
    methods); the others (xtok, hf_uag, n-gram, early exit) run. Each model is loaded once and kept
    while a later pair still uses it (two drafts for one target load the target once), and measured
    alone once per target and prompt (later pairs of that target copy those units:
    `run_sweep(baseline_of=...)`).

    collections: a folder for one collection per pair; given, the methods a collection answers
    (`Method.replayable`: the draft model's static and dynamic trees) are replayed from it (exact
    acceptance, no wall clock: source "replay"), except those in `measure`, which run end to end
    like every other method. Returns one row per pair: label, status ("measured", "partial": some
    methods refused, "skipped": all refused), vocabulary ("shared" or "different"), reason, and for
    a pair that ran, the target and draft as loaded (`io.models.describe_model`: dtype, 4-bit
    layers, stand-in or not)."""
    import gc

    check_sources({name for pair in pairs for name in (pair.target, pair.draft)})
    status: dict[Pair, dict] = {}
    allowed: dict[Pair, dict[tuple[str, int], Tree]] = {}
    texts: dict[Pair, tuple[TokenText, TokenText]] = {}
    for pair in pairs:
        own = trees if pair.methods is None else method_trees(pair.methods)
        reasons, refused = [], []
        try:
            check_pair(load_tokenizer(pair.target), load_tokenizer(pair.draft), pair.target, pair.draft)
            vocabulary = "shared"
        except ValueError as e:
            vocabulary = "different"
            refused = [k for k in own if parse_method(f"{k[0]}:{k[1]}").shared_vocabulary]
            if refused:
                reasons.append(f"refused {', '.join(f'{a}:{b}' for a, b in refused)}: {e}")
        cross = [k for k in own if k not in refused and parse_method(f"{k[0]}:{k[1]}").drafter == "xtok"]
        if cross:  # both tokenizers must read as bytes (`retokenize`), checked before any weights load
            try:
                texts[pair] = (TokenText.of(load_tokenizer(pair.target)), TokenText.of(load_tokenizer(pair.draft)))
            except ValueError as e:
                refused += cross
                reasons.append(f"refused {', '.join(f'{a}:{b}' for a, b in cross)}: {e}")
        allowed[pair] = {k: t for k, t in own.items() if k not in refused}
        state = "measured" if not refused else "partial" if allowed[pair] else "skipped"
        status[pair] = {"pair": pair.label, "status": state, "vocabulary": vocabulary, "reason": "; ".join(reasons),
                        "prompt_format": prompt_format(pair.target, load_tokenizer(pair.target)),
                        "target_loaded": "", "draft_loaded": ""}
    runnable = [pair for pair in pairs if allowed[pair]]
    first_of_target: dict[tuple, str] = {}  # target -> the first pair that measured it alone
    loaded: dict[tuple, torch.nn.Module] = {}
    for i, pair in enumerate(runnable):
        wanted = {key for later in runnable[i:] for key in (pair_keys(later))}
        for key in [k for k in loaded if k not in wanted]:  # no later pair uses it: free it first
            del loaded[key]
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        target_key, draft_key = pair_keys(pair)
        for key in (target_key, draft_key):
            if key not in loaded:
                loaded[key] = load_model(key[0], key[1], dtype=dtype, layers=key[2], cpu_linear=cpu_linear)[0]
        status[pair].update(target_loaded=describe_model(loaded[target_key]), draft_loaded=describe_model(loaded[draft_key]))
        target, draft, tokenizer = loaded[target_key], loaded[draft_key], load_tokenizer(pair.target)
        own = allowed[pair]
        replayed = {} if collections is None else {
            k: t for k, t in own.items() if parse_method(f"{k[0]}:{k[1]}").replayable and f"{k[0]}:{k[1]}" not in measure}
        first_of_target.setdefault(target_key, pair.label)
        run_sweep(store, pair.label, target, draft, tokenizer, prompts,
                  {k: t for k, t in own.items() if k not in replayed}, max_new_tokens, progress,
                  draft_tokenizer=load_tokenizer(pair.draft), baseline_of=first_of_target[target_key],
                  texts=texts.get(pair), rounds=rounds)
        if replayed:
            folder = Path(collections) / re.sub(r"[^A-Za-z0-9_.-]+", "_", pair.label)
            replay_units(store, pair.label, folder, target, draft, tokenizer, prompts, replayed, max_new_tokens)
    return pd.DataFrame([status[pair] for pair in pairs])


def replay_units(
    store: Sweep,
    pair_label: str,
    folder: Path,
    target: torch.nn.Module,
    draft: torch.nn.Module,
    tokenizer,
    prompts: Sequence[Prompt],
    trees: dict[tuple[str, int], Tree],
    max_new_tokens: int,
) -> None:
    """Units of replayable methods from one collection of the pair (collected, or resumed, in
    `folder`): the steps a real greedy run would make (`replay.replay_steps`), the output (the
    target's continuation) checked against the stored target-alone unit, times left empty.
    Needs the target-alone units of `run_sweep` in `store` first."""
    dynamic = [k[1] for k in trees if k[0] == DYNAMIC]
    static = {k: t for k, t in trees.items() if k[0] != DYNAMIC}
    report = collect_pair(folder, target, draft, tokenizer, prompts, static, max_new_tokens,
                          super_k=DYNAMIC_TOP_K if dynamic else 0, super_depth=DYNAMIC_MAX_DEPTH,
                          dynamic_budgets=dynamic, describe={"pair": pair_label}, retries=0)
    collection = report.check().collection
    data = {p.prompt_id: p for p in collection.prompts}
    for (label, budget), tree in trees.items():
        steps = replay.replay_steps(collection, budget if label == DYNAMIC else tree)
        for prompt in prompts:
            key = _key(pair_label, (label, budget), prompt)
            if key in store:
                continue
            mine = steps[prompt.id]
            tokens = torch.tensor(data[prompt.id].tokens[: sum(s.num_tokens for s in mine)])  # host
            result = GenerationResult(tokens, mine, len(data[prompt.id].prompt), math.nan, math.nan, None, "replay")
            quality = score(target, torch.tensor(data[prompt.id].prompt), tokens)  # host: score moves them
            baseline = store.meta(_key(pair_label, None, prompt)) or {}
            summary = _unit_summary(result, prompt, _stored_tokens(store, pair_label, prompt), tree, quality, target.dtype,
                                    float(baseline.get("logit_gap") or 0.0))
            store.add(key, [{**r, "source": "replay"} for r in _step_rows(result)], meta={**summary, "source": "replay"})


def pair_keys(pair: Pair) -> tuple[tuple, tuple]:
    """(target, draft) as (name, quantization, kept layers): equal keys are one loaded model."""
    return (pair.target, pair.target_quantization, None), (pair.draft, pair.draft_quantization, pair.draft_layers)


def unit_table(store: Sweep) -> pd.DataFrame:
    """One row per generation: its key, prompt category and summary metrics."""
    return store.meta_frame()


def steps_frame(store: Sweep) -> pd.DataFrame:
    """One row per target call, with its unit's key."""
    return store.frame()


def shape_table(units: pd.DataFrame, by: Sequence[str] = ("pair", "shape", "budget")) -> pd.DataFrame:
    """Pooled metrics per group (sums over all steps of all prompts), the spread of per-prompt tau,
    95% intervals of tau and acceptance rate across prompts (`analysis.spread`, bootstrap over
    prompts; NaN below 3 prompts), and speed against the same pair's baseline in the same run, with
    its 95% interval (`speedup_ci_low/high`: paired bootstrap over the prompts both ran)."""
    by = list(by)
    spec = units[units["shape"] != BASELINE]
    base = units[units["shape"] == BASELINE]
    g = spec.groupby(by, sort=False)
    out = g.agg(
        prompts=("prompt_id", "nunique"),
        steps=("num_steps", "sum"),
        drafted=("num_drafted", "sum"),
        **({"draft_tokens": ("num_draft_tokens", "sum")} if "num_draft_tokens" in spec else {}),
        accepted=("num_accepted", "sum"),
        tokens=("num_tokens", "sum"),
        time_s=("total_time", lambda v: v.sum(min_count=1)),  # NaN when every unit was replayed
        tau_prompt_std=("tau", "std"),
        tau_prompt_min=("tau", "min"),
        tau_prompt_max=("tau", "max"),
        greedy_equal=("greedy_equal", "sum"),
        greedy_ties=("greedy", lambda v: int((v == "tie").sum())),
        greedy_mismatches=("greedy", lambda v: int((v == "mismatch").sum())),
        **({"tie_margin": ("tie_margin", "max"), "logit_gap": ("logit_gap", "max")} if "tie_margin" in spec else {}),
        nodes=("num_nodes", "first"),
        depth=("depth", "first"),
        **({"source": ("source", "first")} if "source" in spec else {}),
        **({"perplexity": ("perplexity", "mean")} if "perplexity" in spec else {}),
    ).reset_index()
    out["acceptance_rate"] = out["accepted"] / out["drafted"]
    if "draft_tokens" in out:  # the draft's own tokens per accepted (target) token: its cost
        out["draft_tokens_per_accepted"] = out["draft_tokens"] / out["accepted"]
    out["acceptance_length"] = out["accepted"] / out["steps"]
    out["tau"] = out["tokens"] / out["steps"]
    base_by = [c for c in by if c not in ("shape", "budget")]
    base_units = base[[*base_by, "prompt_id", "num_tokens", "total_time"]]

    def speedup_span(u: pd.DataFrame) -> dict[str, float]:  # against the target alone, on the same prompts
        both = u.merge(base_units, on=[*base_by, "prompt_id"], suffixes=("", "_base"))
        low, high = spread.speed_ratio_interval(both["num_tokens"], both["total_time"], both["num_tokens_base"],
                                                both["total_time_base"])
        return {"speedup_ci_low": low, "speedup_ci_high": high}

    spans = pd.DataFrame([{**spread.interval_columns("tau", u["num_tokens"], u["num_steps"]),
                           **spread.interval_columns("acceptance_rate", u["num_accepted"], u["num_drafted"]),
                           **speedup_span(u)}
                          for _, u in g], index=out.index)
    out = pd.concat([out, spans], axis=1)
    out["tokens_per_s"] = out["tokens"] / out["time_s"]
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
COUNTERPARTS = (("chain", "hf_assisted"), ("xtok/chain", "hf_uag"), ("ngram/chain", "hf_prompt_lookup"))


def head_to_head(table: pd.DataFrame, units: pd.DataFrame, matchups: Sequence[tuple[str, str]] | None = None) -> pd.DataFrame:
    """specnb method against another method of the same pair, same prompts, same run (interleaved,
    `run_sweep`): one row per (pair, ours, theirs) found in a shape table, with tau and tokens/s of
    both, their ratio, its 95% interval over prompts (paired bootstrap, `spread.speed_ratio_interval`)
    and the verdict it allows ("faster", "slower", "within the spread": a winner is named only
    where the interval excludes 1). units: the unit table the shape table pooled (per-prompt tokens
    and seconds). matchups: spec pairs, e.g. [("chain:4", "hf_assisted:4")]; default: every budget
    of each `COUNTERPARTS` pair present in the table."""
    if matchups is None:
        budgets = sorted(table["budget"].unique())
        matchups = [(f"{a}:{k}", f"{b}:{k}") for a, b in COUNTERPARTS for k in budgets]
    spec = table.assign(spec=table["shape"] + ":" + table["budget"].astype(str)).set_index(["pair", "spec"])
    per_prompt = units.assign(spec=units["shape"] + ":" + units["budget"].astype(str))
    rows = []
    for pair in table["pair"].unique():
        for ours, theirs in matchups:
            if (pair, ours) not in spec.index or (pair, theirs) not in spec.index:
                continue
            a, b = spec.loc[(pair, ours)], spec.loc[(pair, theirs)]
            mine = per_prompt[per_prompt["pair"] == pair]
            both = mine[mine["spec"] == ours].merge(mine[mine["spec"] == theirs], on="prompt_id", suffixes=("_a", "_b"))
            low, high = spread.speed_ratio_interval(both["num_tokens_a"], both["total_time_a"], both["num_tokens_b"],
                                                    both["total_time_b"])
            rows.append({
                "pair": pair, "ours": ours, "theirs": theirs,
                "tau_ours": a["tau"], "tau_theirs": b["tau"],
                "tokens_per_s_ours": a["tokens_per_s"], "tokens_per_s_theirs": b["tokens_per_s"],
                "speed_ratio": a["tokens_per_s"] / b["tokens_per_s"], "speed_ratio_ci_low": low, "speed_ratio_ci_high": high,
                "verdict": spread.verdict(low, high), "prompts": len(both),
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
    later = steps[steps["position"] > 0]  # every method's first step carries the prompt
    if "source" in later:
        later = later[later["source"] != "replay"]  # replayed steps have no times
    base = later[later["shape"] == BASELINE].groupby("pair")["verify_time"].mean().rename("target_s_per_token")
    spec = later[later["shape"] != BASELINE]
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
    target: torch.nn.Module | None,
    draft: torch.nn.Module | None,
    tokenizer,
    prompts: Sequence[Prompt],
    trees: dict[tuple[str, int], Tree],
    max_new_tokens: int,
    super_k: int,
    super_depth: int,
    dynamic_budgets: Sequence[int],
    describe: dict | None = None,
    top_k: int = 16,
    super_prompts: int | None = None,
    pair: Pair | None = None,
    executor: Executor = LocalExecutor(),
    retries: int = 2,
    dtype: str | None = None,
    draft_tokenizer=None,
) -> CollectReport:
    """`analysis.collect.collect_units` for a prompt set: ranks kept up to top_k (at least the widest
    rank any tree uses; the oracle's limit K), super-trees (when super_k > 0) as large as the largest
    dynamic budget, on the first `super_prompts` prompts (None: all). Resumable in `folder` (a path,
    a shared folder or an fsspec URL). The local executor uses the loaded `target` and `draft`; any
    other (Ray) loads `pair` on each worker (in `dtype`, `io.models.model_dtype`), and the draft's
    dtype is recorded so that a worker loading another refuses. The report holds the collection of
    the collected prompts and the failures by name (`CollectReport`).

    `tokenizer` is the target's; with the draft's (draft_tokenizer) and a different vocabulary, the
    collection is a cross-tokenizer one, made in this process: the continuation from an exact
    cross-tokenizer chain:4 run, nothing else (`redrafter` answers it)."""
    ids = {p.id: prompt_ids(tokenizer, p.text) for p in prompts}
    draft_dtype = draft.dtype if draft is not None else model_dtype(dtype) or default_dtype(default_device())
    describe = {**(describe or {}), "draft_dtype": str(draft_dtype).removeprefix("torch.")}
    categories = {p.id: p.category for p in prompts}
    if draft_tokenizer is not None and draft_tokenizer.get_vocab() != tokenizer.get_vocab():
        if target is None or draft is None:
            raise ValueError("a cross-tokenizer collection runs in this process: pass the loaded target and draft")
        config = CollectConfig(max_new_tokens=max_new_tokens, run_tree="chain:4", cross_tokenizer=True)
        drafter = CrossTokenizerDrafter(draft, draft_tokenizer, tokenizer)
        return collect_units(folder, (target, draft, drafter), ids, config, categories=categories, describe=describe,
                             retries=retries)
    widest = max((max(path) for tree in trees.values() for path in tree.paths), default=0)
    config = CollectConfig(
        max_new_tokens=max_new_tokens, top_k=max(widest + 1, super_k, top_k), super_k=super_k,
        super_depth=super_depth, super_size=max(dynamic_budgets, default=1),
    )
    if isinstance(executor, LocalExecutor) and target is not None and draft is not None:
        models: ModelPair | tuple = (target, draft)
    elif pair is not None:
        models = ModelPair(pair.target, pair.draft, pair.target_quantization, pair.draft_quantization, pair.draft_layers, dtype,
                           pair.cpu_linear)
    else:
        raise ValueError("workers load the pair themselves: pass the pair's names (pair=...)")
    return collect_units(folder, models, ids, config, categories=categories,
                         describe=describe, executor=executor, retries=retries,
                         super_prompts=None if super_prompts is None else [p.id for p in prompts[:super_prompts]])


def cost_curves(
    store: Sweep,
    pair: Pair,
    prefix: int,
    nodes: Sequence[int],
    trees: Iterable[Tree],
    repeats: int,
    models: tuple[torch.nn.Module, torch.nn.Module] | None = None,
    dtype: str | None = None,
) -> pd.DataFrame:
    """The curves of the cost model (`analysis.cost_model`): the target's verify time against tree
    size on a cache of `prefix` tokens, and the draft's forward time per level width up to the
    widest level of `trees`. Points already in `store` for this machine are read, not measured
    again: notebooks 01 and 03 share one store (`session.shared_folder`), so the second reuses what
    the first measured (each row says when, in "measured"). models: the pair's (target, draft) if
    loaded; otherwise they are loaded (in `dtype`, `io.models.model_dtype`, with the pair's
    cpu_linear) only if a point is missing. Curves are kept per linear path (`io.cpu_linear`)."""
    device = models[0].device if models else default_device()
    env = environment_row(device, models[0].dtype if models else model_dtype(dtype) or default_dtype(device))
    env["linear"] = linear_path(models[0]) if models else effective_path(pair.cpu_linear, device, model_dtype(env["dtype"]))
    widths = draft_widths(trees)
    names = (pair.target_label, pair.draft_label)
    if missing_points(store, names[0], "target", prefix, nodes, env=env) or missing_points(store, names[1], "draft", prefix, widths, env=env):
        target, draft = models or (load_model(pair.target, pair.target_quantization, dtype=dtype, cpu_linear=pair.cpu_linear)[0],
                                   load_model(pair.draft, pair.draft_quantization, dtype=dtype, layers=pair.draft_layers,
                                              cpu_linear=pair.cpu_linear)[0])
        verify_curve(store, target, names[0], prefix, nodes, repeats=repeats)
        verify_curve(store, draft, names[1], prefix, widths, role="draft", repeats=repeats)
    return curve_table(store, names, prefix, env["device"], env["linear"])


def designed_trees(collection: Collection, budgets: Sequence[int]) -> dict[tuple[str, int], Tree]:
    """The data-driven static trees of a collection: "sequoia" (Sequoia's DP under the measured
    acceptance vector) and "hindsight" (the best static tree on this very data), per budget."""
    sequoia = tree_design.sequoia_trees(replay.acceptance_vector(collection), max(budgets))
    hindsight = tree_design.hindsight_trees(replay.prefix_counts(collection), budgets)
    return {("sequoia", n): sequoia[n] for n in budgets} | {("hindsight", n): hindsight[n] for n in budgets}


def replay_table(collection: Collection, trees: dict[tuple[str, int], Tree], budgets: Sequence[int],
                 dynamic_budgets: Sequence[int], oracle_k: int | None = None,
                 redraft_with: Callable[[str, int], Drafter] | None = None) -> tuple[pd.DataFrame, dict[tuple[str, int], Tree]]:
    """Every shape x budget replayed, plus the data-driven trees (`designed_trees`), "dynamic"
    (super-trees needed; on the prompts collected with them) and the per-position "oracle"
    (`replay.oracle`, ranks below `oracle_k`, default the collection's top_k; column `top_k`).
    Returns (table, trees incl. the designed ones).

    Rows: trajectory-mode metrics (the positions a real run visits: what it would measure) with
    95% intervals of tau and acceptance rate across prompts (`analysis.spread`), the number of
    prompts, plus tau_all over every position, and tau_all as a fraction of the hindsight ceiling
    and of the oracle of the same budget (both defined on all positions, on the same prompts as the
    row: dynamic rows on a super-tree subset are compared on that subset).

    A cross-tokenizer collection (`redraft_with`: `redrafter(...)` of the pair) is re-drafted
    instead (`analysis.redraft`): every shape x budget drafted in draft tokens and "dynamic", on the
    run trajectory, exact; no designed trees, no oracle and no tau_all (they need draft ranks of the
    target's tokens): those columns are NaN."""
    if collection.config.cross_tokenizer:
        return _redraft_table(collection, trees, dynamic_budgets, _needs(redraft_with)), dict(trees)
    every = {**trees, **designed_trees(collection, budgets)}
    hindsight = {k: t for k, t in every.items() if k[0] == "hindsight"}

    def rows(c: Collection, replayed) -> pd.DataFrame:
        """replayed(mode) -> rows; trajectory rows with tau_all and the ratios on `c`'s prompts."""
        table = replayed("trajectory")
        every_pos = replayed("all")[["shape", "budget", "tau"]].rename(columns={"tau": "tau_all"})
        for ref, part in (("hindsight", replay.replay(c, hindsight, mode="all")),
                          ("oracle", replay.oracle(c, budgets, mode="all", k=oracle_k))):
            every_pos[f"tau_all_over_{ref}"] = every_pos["tau_all"] / every_pos["budget"].map(part.set_index("budget")["tau"])
        return table.merge(every_pos, on=["shape", "budget"])

    parts = [rows(collection, lambda m: pd.concat([replay.replay(collection, every, mode=m),
                                                   replay.oracle(collection, budgets, mode=m, k=oracle_k)],
                                                  ignore_index=True))]
    if collection.has_super_trees and dynamic_budgets:
        subset = collection.super_tree_prompts()
        parts.append(rows(subset, lambda m: replay.replay_dynamic(subset, dynamic_budgets, mode=m)))
    return pd.concat(parts, ignore_index=True), every


def replay_agreement(store: Sweep | None, pair_label: str, collection: Collection, specs: Sequence[str],
                     redraft_with: Callable[[str, int], Drafter] | None = None) -> pd.DataFrame:
    """Real runs against the replay, step by step: one row per method with the steps compared and
    how many were identical (position, drafted, accepted and tokens added). The collection's own
    run (its `run_tree`, on every prompt) is always compared, as source "collection run"; `specs`
    are end-to-end units in `store` (source "end to end"). A cross-tokenizer collection is
    re-drafted (`redraft_with`) instead of replayed; its specs are xtok methods."""
    rows = []
    run_spec = collection.config.run_tree
    replayed = _replayed(collection, "chain", collection.config.run, redraft_with)
    real = {p.prompt_id: [tuple(int(x) for x in row) for row in p.run_steps] for p in collection.prompts}
    rows.append(_agreement_row(run_spec, "collection run", replayed, real, collection))
    steps = steps_frame(store) if store is not None and len(store) else pd.DataFrame()
    for spec in specs:
        method = parse_method(spec)
        dynamic = method.drafter == "dynamic" or method.shape == DYNAMIC
        mine = steps[(steps["pair"] == pair_label) & (steps["shape"] == method.label) & (steps["budget"] == method.budget)]
        prompts = set(mine["prompt_id"])
        shape = DYNAMIC if dynamic else method.shape
        tree = method.budget if dynamic and not collection.config.cross_tokenizer else method.tree
        replayed = {pid: s for pid, s in _replayed(collection, shape, tree, redraft_with, method.budget).items()
                    if pid in prompts}
        real = {pid: [tuple(int(x) for x in r) for r in g.sort_values("position")[
                    ["position", "num_drafted", "num_accepted", "num_tokens"]].itertuples(index=False)]
                for pid, g in mine.groupby("prompt_id")}
        rows.append(_agreement_row(spec, "end to end", replayed, real, collection))
    return pd.DataFrame(rows)


def _agreement_row(spec: str, source: str, replayed: dict, real: dict, collection: Collection) -> dict:
    """Identical steps; a differing step is a "tie" when a draft rank in its span could flip by
    rounding (`rank_margin` below the tie margin of the draft's dtype), else a mismatch."""
    margins = {p.prompt_id: p.rank_margin for p in collection.prompts}
    threshold = TIE_MARGIN.get(collection_dtype(collection), TIE_MARGIN[torch.float16])
    compared = identical = ties = 0
    for pid, mine in replayed.items():
        ours = [(s.position, s.num_drafted, s.num_accepted, s.num_tokens) for s in mine]
        theirs = real.get(pid, [])
        compared += max(len(ours), len(theirs))
        for a, b in zip(ours, theirs):
            if a == b:
                identical += 1
            elif margins.get(pid) is not None and margins[pid][a[0] : a[0] + max(a[3], b[3]) + 1].min(initial=np.inf) < threshold:
                ties += 1
    n_real = sum(len(v) for v in real.values())
    n_replayed = sum(len(v) for v in replayed.values())
    return {"method": spec, "source": source, "prompts": len(replayed), "steps_compared": compared,
            "identical_steps": identical, "tie_steps": ties, "mismatched_steps": compared - identical - ties,
            "tau_real": sum(r[3] for v in real.values() for r in v) / max(n_real, 1),
            "tau_replayed": sum(s.num_tokens for v in replayed.values() for s in v) / max(n_replayed, 1)}


def collection_dtype(collection: Collection) -> torch.dtype:
    """The draft's dtype as recorded in the collection's description (float32 when not recorded)."""
    return getattr(torch, str(collection.describe.get("draft_dtype", "float32")), torch.float32)


def replayed_steps_frame(collection, tree: Tree, shape: str = "",
                         redraft_with: Callable[[str, int], Drafter] | None = None) -> pd.DataFrame:
    """The replayed run-trajectory steps of one static tree as a steps frame (for `node_frequency`).
    A cross-tokenizer collection is re-drafted with the drafter of (shape, tree size), and each
    step's `accepted_ranks` is the accepted path in the DRAFT's tree (`tree`), not in the verified
    target-token tree."""
    if not collection.config.cross_tokenizer:
        return pd.DataFrame([step_row(s) for v in replay.replay_steps(collection, tree).values() for s in v])
    runs = _redrafts(collection, shape, tree, tree.num_nodes, _needs(redraft_with))
    return pd.DataFrame([{**step_row(s), "accepted_ranks": "/".join(map(str, path))}
                         for run in runs.values() for s, path in zip(run.steps, run.draft_paths)])


# ---- cross-tokenizer collections: re-drafted, not replayed (`analysis.redraft`) -----------------


def different_vocabularies(target: str, draft: str) -> bool:
    """Whether two models' tokenizers map tokens to ids differently (a cross-tokenizer pair:
    `load_pair(..., cross_tokenizer=True)`); reads the tokenizers only."""
    return load_tokenizer(target).get_vocab() != load_tokenizer(draft).get_vocab()


def redrafter(draft: torch.nn.Module, target_tokenizer, draft_tokenizer) -> Callable[[str, int], Drafter]:
    """(shape, budget) -> a fresh cross-tokenizer drafter of `draft` for it ("dynamic": a dynamic
    tree of that budget), the vocabularies read once."""
    texts = (TokenText.of(target_tokenizer), TokenText.of(draft_tokenizer))
    return lambda shape, budget: build_drafter(parse_method(f"xtok/{shape}:{budget}"), None, draft, target_tokenizer=texts[0], draft_tokenizer=texts[1])


def _needs(redraft_with: Callable[[str, int], Drafter] | None) -> Callable[[str, int], Drafter]:
    if redraft_with is None:
        raise ValueError("a cross-tokenizer collection is re-drafted: pass redraft_with=redrafter(draft model, "
                         "target tokenizer, draft tokenizer)")
    return redraft_with


def _redrafts(collection: Collection, shape: str, tree: Tree, budget: int,
              redraft_with: Callable[[str, int], Drafter]) -> dict[str, Redrafted]:
    """Per prompt, the re-drafted run of (shape, budget) whose requested tree is `tree`."""
    drafter = redraft_with(shape, budget)
    # the continuation holds a stop token only as its last token, when it stopped: the one stop
    # token that can cut a step
    return {p.prompt_id: redraft(drafter, p.prompt.tolist(), p.tokens.tolist(), tree, collection.config.max_new_tokens,
                                 frozenset(p.tokens[-1:].tolist()) if p.stopped else frozenset())
            for p in collection.prompts}


def _replayed(collection: Collection, shape: str, tree: Tree | int,
              redraft_with: Callable[[str, int], Drafter] | None, budget: int | None = None) -> dict[str, tuple]:
    """Per prompt, the steps of `tree` (an int: the dynamic tree of that budget): replayed, or
    re-drafted for a cross-tokenizer collection."""
    if not collection.config.cross_tokenizer:
        return replay.replay_steps(collection, tree)
    size = budget if budget is not None else tree.num_nodes  # type: ignore[union-attr]
    runs = _redrafts(collection, shape, tree, size, _needs(redraft_with))  # type: ignore[arg-type]
    return {pid: run.steps for pid, run in runs.items()}


def _redraft_table(collection: Collection, trees: dict[tuple[str, int], Tree], dynamic_budgets: Sequence[int],
                   redraft_with: Callable[[str, int], Drafter]) -> pd.DataFrame:
    rows = []
    keys = [(k, t) for k, t in trees.items()] + [((DYNAMIC, n), Tree.chain(DYNAMIC_MAX_DEPTH)) for n in dynamic_budgets]
    for (shape, budget), tree in keys:
        runs = _redrafts(collection, shape, tree, budget, redraft_with)
        results = [GenerationResult(torch.tensor([], dtype=torch.long), run.steps, 0, math.nan, math.nan, None, "redraft")  # host
                   for run in runs.values()]
        s = summarize(results).row()
        rows.append({"shape": shape, "budget": budget, "nodes": budget if shape == DYNAMIC else tree.num_nodes,
                     "depth": tree.depth, "mode": "trajectory", "prompts": len(runs), "steps": s["num_steps"],
                     "drafted": s["num_drafted"], "accepted": s["num_accepted"], "tokens": s["num_tokens"],
                     **{k: v for k, v in s.items() if k in ("acceptance_rate", "acceptance_length", "tau",
                                                            "draft_tokens_per_accepted")
                        or k.startswith(("depth_", "rank_"))},
                     "tau_all": math.nan, "tau_all_over_hindsight": math.nan, "tau_all_over_oracle": math.nan})
    return pd.DataFrame(rows)


def replay_depths(table: pd.DataFrame) -> pd.DataFrame:
    """Tidy per-depth acceptance (P(accepted >= d), run trajectory) from a replay table, in the
    columns of `depth_table`, for the trees a real drafter could build (not the oracle)."""
    cols = [c for c in table.columns if re.fullmatch(r"depth_\d+_acceptance", c)]
    long = table[table["shape"] != "oracle"].melt(id_vars=["shape", "budget"], value_vars=cols,
                                                  var_name="depth", value_name="acceptance")
    long["depth"] = long["depth"].str.extract(r"(\d+)", expand=False).astype(int)
    return long.dropna(subset=["acceptance"]).sort_values(["budget", "shape", "depth"]).reset_index(drop=True)


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
    result: GenerationResult, prompt: Prompt, reference: list[int] | None, tree: Tree | None, quality: Score,
    dtype: torch.dtype, gap: float = 0.0,
) -> dict:
    s = summarize(result)
    tokens = result.tokens.tolist()
    equality = compare_greedy(tokens, reference, quality.margins, dtype, gap)
    return {
        "category": prompt.category,
        "num_nodes": tree.num_nodes if tree else 0,
        "depth": tree.depth if tree else 0,
        "num_steps": s.num_steps,
        "num_drafted": s.num_drafted,
        "num_draft_tokens": s.num_draft_tokens,
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
        "source": "measured",  # or "replay": acceptance replayed from a collection, no wall clock
        "greedy": equality.verdict,  # exact, tie (numerical) or mismatch (a bug)
        "greedy_equal": equality.verdict == "exact",
        "first_difference": equality.position,
        "difference_margin": equality.margin,
        "tie_margin": equality.threshold,  # max(the dtype's convention, 2 x logit_gap)
        "logit_gap": gap,  # the target's measured decode-vs-verify logit gap on this device
        "perplexity": quality.perplexity,
        "tokens": " ".join(map(str, tokens)),
    }
