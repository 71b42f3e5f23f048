"""The tidy tables the notebooks compute from a sweep's units (`experiments`): per method
pooled metrics with 95% intervals over prompts (`shape_table`), the target alone (`baseline_table`),
how often each node is accepted (`node_frequency`), specnb's
methods against transformers' on the same prompts (`head_to_head`) and the draft and verify cost of
a step against the target's own (`step_costs`).

Metric conventions (`analysis.metrics`): acceptance_rate = accepted / drafted; acceptance_length =
accepted draft tokens per step, bonus EXCLUDED; tau = tokens per target call, bonus INCLUDED.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from ..analysis import spread
from ..core.trees import Tree
from ..io.storage import Sweep

BASELINE = "autoregressive"


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
    spans = _spans(g, base[[*base_by, "prompt_id", "num_tokens", "total_time"]], base_by)
    spans.index = out.index
    out = pd.concat([out, spans], axis=1)
    out["tokens_per_s"] = out["tokens"] / out["time_s"]
    base_speed = base.groupby(base_by)[["num_tokens", "total_time"]].sum()
    base_speed = (base_speed["num_tokens"] / base_speed["total_time"]).rename("baseline_tokens_per_s").reset_index()
    out = out.merge(base_speed, on=base_by, how="left")
    out["speedup"] = out["tokens_per_s"] / out["baseline_tokens_per_s"]
    return out


def _spans(groups, base_units: pd.DataFrame, base_by: list[str]) -> pd.DataFrame:
    """Per group (in order) the 95% intervals of tau and acceptance rate across its prompts, and of
    its speedup against the target alone on the same prompts (paired bootstrap)."""

    def speedup_span(u: pd.DataFrame) -> dict[str, float]:  # against the target alone, on the same prompts
        both = u.merge(base_units, on=[*base_by, "prompt_id"], suffixes=("", "_base"))
        low, high = spread.speed_ratio_interval(
            both["num_tokens"], both["total_time"], both["num_tokens_base"], both["total_time_base"]
        )
        return {"speedup_ci_low": low, "speedup_ci_high": high}

    return pd.DataFrame(
        [
            {
                **spread.interval_columns("tau", u["num_tokens"], u["num_steps"]),
                **spread.interval_columns("acceptance_rate", u["num_accepted"], u["num_drafted"]),
                **speedup_span(u),
            }
            for _, u in groups
        ]
    )


def baseline_table(units: pd.DataFrame, by: Sequence[str] = ("pair",)) -> pd.DataFrame:
    """The target's own decoding per group: time to first token, time per output token, tokens/s."""
    base = units[units["shape"] == BASELINE]
    out = (
        base.groupby(list(by))
        .agg(
            prompts=("prompt_id", "nunique"),
            tokens=("num_tokens", "sum"),
            time_s=("total_time", "sum"),
            ttft_s=("ttft_s", "mean"),
            tpot_s=("tpot_s", "mean"),
            peak_memory_bytes=("peak_memory_bytes", "max"),
        )
        .reset_index()
    )
    out["tokens_per_s"] = out["tokens"] / out["time_s"]
    return out


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


def head_to_head(
    table: pd.DataFrame, units: pd.DataFrame, matchups: Sequence[tuple[str, str]] | None = None
) -> pd.DataFrame:
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
            low, high = spread.speed_ratio_interval(
                both["num_tokens_a"], both["total_time_a"], both["num_tokens_b"], both["total_time_b"]
            )
            rows.append(
                {
                    "pair": pair,
                    "ours": ours,
                    "theirs": theirs,
                    "tau_ours": a["tau"],
                    "tau_theirs": b["tau"],
                    "tokens_per_s_ours": a["tokens_per_s"],
                    "tokens_per_s_theirs": b["tokens_per_s"],
                    "speed_ratio": a["tokens_per_s"] / b["tokens_per_s"],
                    "speed_ratio_ci_low": low,
                    "speed_ratio_ci_high": high,
                    "verdict": spread.verdict(low, high),
                    "prompts": len(both),
                    "greedy_equal_ours": f"{int(a['greedy_equal'])}/{int(a['prompts'])}",
                    "greedy_equal_theirs": f"{int(b['greedy_equal'])}/{int(b['prompts'])}",
                }
            )
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
    out = (
        spec.groupby(["pair", "shape", "budget"], sort=False)
        .agg(
            steps=("num_tokens", "size"),
            tau=("num_tokens", "mean"),
            nodes_per_step=("num_drafted", "mean"),
            draft_s_per_step=("draft_time", "mean"),
            verify_s_per_step=("verify_time", "mean"),
        )
        .reset_index()
        .merge(base.reset_index(), on="pair", how="left")
    )
    out["draft_cost"] = out["draft_s_per_step"] / out["target_s_per_token"]
    out["verify_cost"] = out["verify_s_per_step"] / out["target_s_per_token"]
    out["predicted_speedup"] = out["tau"] / (out["draft_cost"] + out["verify_cost"])
    return out


def _rank_path(value) -> tuple[int, ...]:
    """A stored rank path ("0/1/0") back as a tuple; read back from CSV, pandas may have made an
    empty path NaN and a one-rank path a number."""
    if value is None or (isinstance(value, float) and value != value):
        return ()
    if isinstance(value, (int, float)):
        return (int(value),)
    return tuple(int(float(r)) for r in str(value).split("/") if r.strip() != "")
