"""The notebooks' computed readings: short markdown paragraphs written from their tables.

One function per reading; no fixed conclusion anywhere: every sentence is computed from the numbers
it is given (which shape wins, whether speculation pays here, how the replay agrees with real
runs). Conventions: tau = tokens per target call, bonus INCLUDED; acceptance length excludes it;
acceptance rate = accepted / drafted.

    replay_reading     notebook 01: best preset and designed trees per budget (held out and
                       in-sample), the hindsight tree's tau_all (the ceiling of static trees'
                       tau_all, every position) and each shape's fraction of it, designs that do not beat the
                       presets held out, replay against real runs, the verdict, the deploy lines
    hindsight_reading  notebook 01, one budget: what the hindsight tree is a ceiling of (tau_all) and
                       of what not (the run-trajectory tau), with the trees that beat it there
    verdict_reading    the tree to deploy, its intervals and verdict, the measured run (01)
    check_reading      the prediction against the measured run, re-priced while it ran (01)
    pairs_reading      notebook 02: best and worst method per pair and budget, speed, equality;
                       per target, the fastest pair and method (does a draft of another
                       tokenizer pay where the same-tokenizer draft does not?)
    recommendation     the budget the cost model picks on this device (notebooks 01 and 03)
    curve_reading      the verify curve's shape as measured: its step and its slope (01 and 03)
    collection_reading notebook 01: units collected / total, the workers, failed units by name
    findings           the report's (notebook 07) summary: 3-5 findings, each with its number and
                       interval as a table of the report writes it, answering the brief
    analysis           the report's (notebook 07) drafted analysis in paragraphs across pairs: which shape
                       wins and why, where tokens stop paying, how the pairs differ, what tree attention
                       costs, whether speculation pays here; each number as one of the report's tables
                       writes it (rank_shares, trend_table, verify_cost_table)
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import pandas as pd

from ..analysis.heldout import Choice, preset_gaps
from ..analysis.spread import MIN_PROMPTS
from ..bench.verify_curve import curve_shape
from ..io.engines import ENGINE_NAMES, deploy_lines
from ..io.tree_results import Earlier

if TYPE_CHECKING:
    from ..experiments.collect import CollectReport


# where each notebook's budget recommendation takes its tau and its costs (`recommendation`)
RECOMMENDATION_03_FROM_01 = (
    "tau of the preset shapes from notebook 01's measured per-rank acceptance vector of the pair, through "
    "Sequoia's model of independent ranks; tau of 01's own trees (shapes 01:...) as 01 measured it held out; "
    "draft and verify costs from the curves measured on this machine"
)
DESIGNS = ("sequoia", "medusa", "hindsight")  # trees fitted to the collected data (`analysis.heldout`)
RECOMMENDATION_03 = (
    "tau from the `acceptance` parameter (an assumed per-rank vector, through Sequoia's model of "
    "independent ranks: not measured here; notebook 01 measures the pair's); draft and verify costs "
    "from the curves measured on this machine"
)


def replay_reading(
    table: pd.DataFrame,
    agreement: pd.DataFrame,
    held: pd.DataFrame,
    choice: Choice | None,
    measured: pd.DataFrame | None = None,
    folds: pd.DataFrame | None = None,
) -> str:
    """Markdown reading of notebook 01, computed from its tables (no fixed conclusions): per budget
    the best preset and the designs (held-out tau, in-sample in brackets), the hindsight tree's
    tau_all (every position, in-sample: the ceiling of static trees' tau_all, never called a ceiling
    of the run-trajectory tau, which another tree may beat: `hindsight_reading`), the designs that do
    not beat the best preset held out, the replay
    against real runs, the verdict (`verdict_reading`), and last the chosen tree's deploy lines.
    held: `heldout.HeldOut.table`; folds: `heldout.selection`."""
    lines = ["tau = tokens per target call, bonus included; run-trajectory positions unless noted."]
    presets = table[~table["shape"].isin(DESIGNS + ("dynamic", "oracle"))]
    fitted = held[held["fitted"]].set_index(["shape", "budget"])
    for budget, b in table.groupby("budget"):
        parts = []
        p = presets[presets["budget"] == budget]
        if len(p):
            best = p.loc[p["tau"].idxmax()]
            parts.append(f"best preset {best['shape']} tau {best['tau']:.2f}{_interval(best, 'tau')}")
        for shape in DESIGNS:
            if (shape, budget) in fitted.index:
                r = fitted.loc[(shape, budget)]
                name = "hindsight as a design" if shape == "hindsight" else shape
                parts.append(f"{name} {r['tau_heldout']:.2f} held out ({r['tau_in_sample']:.2f} in-sample)")
        ceiling = hindsight_reading(b)
        if ceiling:
            parts.append(ceiling)
        for shape in ("dynamic", "oracle"):
            row = b[b["shape"] == shape]
            if len(row):
                parts.append(f"{shape} {row['tau'].iloc[0]:.2f}")
        lines.append(f"- {budget} draft tokens: " + ", ".join(parts))
    if len(presets):
        frac = presets.groupby("shape")["tau_all_over_hindsight"].mean().sort_values(ascending=False)
        if frac.notna().any():
            lines.append(
                "- mean over the budgets of tau_all (every position) as a fraction of the hindsight tree's, the "
                "best static tau_all in-sample: " + ", ".join(f"{k} {v:.2f}" for k, v in frac.items())
            )
    lines.append("- " + heldout_note(held))
    same, compared = int(agreement["identical_steps"].sum()), int(agreement["steps_compared"].sum())
    ties, bad = int(agreement["tie_steps"].sum()), int(agreement["mismatched_steps"].sum())
    parts = ", ".join(f"{r.method} ({r.source}, {r.prompts} prompts)" for r in agreement.itertuples())
    extra = (f", {ties} differ at a draft rank within the tie margin (numerical)" if ties else "") + (
        f", **{bad} differ for no numerical reason (a bug to report)**" if bad else ""
    )
    lines.append(f"- replay against real runs: {same}/{compared} steps identical{extra}: {parts}")
    lines.append("- " + verdict_reading(choice, measured, folds))
    if choice is not None:
        lines.append(deploy_reading(choice))
    return "\n".join(lines)


def earlier_batch_reading(earlier: Earlier, rows: pd.DataFrame, best: pd.DataFrame) -> str:
    """Notebook 06: where 01's trees stand at each batch size against the best tree here, and what 01
    said of its recommended tree (`experiments.earlier.batch_rows`; best: `cost_model.best_budgets`)."""
    if earlier.results is None or rows.empty:
        return earlier.note
    lines = [earlier.note]
    rec = earlier.results.recommendation
    if rec is not None:
        lines.append(
            f"- notebook 01 recommended {rec.tree.name} with {rec.tree.budget} draft tokens: expected "
            f"{rec.speedup:.2f}x [{rec.speedup_low:.2f}, {rec.speedup_high:.2f}] ({rec.verdict}) "
            f"on {rec.device or 'its device'}"
            + (f", measured {rec.measured_speedup:.2f}x" if rec.measured_speedup is not None else "")
        )
    top = rows.loc[rows.groupby("batch")["speedup"].idxmax()].set_index("batch")
    here = best.set_index("batch") if "batch" in best else pd.DataFrame()
    for b, r in top.iterrows():
        other = (
            f"; best here {here.loc[b, 'shape']}:{int(here.loc[b, 'budget'])} {here.loc[b, 'speedup']:.2f}x"
            if b in here.index
            else ""
        )
        lines.append(
            f"- batch {b}: 01's best {r['shape']}:{int(r['budget'])} {r['speedup']:.2f}x the target alone{other}"
        )
    return "\n".join(lines)


def hindsight_reading(rows: pd.DataFrame) -> str:
    """What the hindsight tree of one budget bounds, from `replay_table`'s rows of that budget: its
    tau_all (every position, in-sample) is the ceiling of static trees' tau_all; its run-trajectory tau
    is not a ceiling (the positions a run visits depend on the tree), and the static trees whose
    trajectory tau beats it are named. "" without a hindsight row or tau_all (a cross-tokenizer pair)."""
    own = rows[rows["shape"] == "hindsight"]
    if own.empty or own["tau_all"].isna().all():
        return ""
    h = own.iloc[0]
    text = f"ceiling of static trees' tau_all (every position, in-sample): hindsight {h['tau_all']:.2f}"
    static = rows[~rows["shape"].isin(("hindsight", "dynamic", "oracle"))]
    above = static[static["tau"] > h["tau"] + 1e-9].sort_values("tau", ascending=False)
    if len(above):
        beat = ", ".join(f"{r.shape} {r.tau:.2f}" for r in above.itertuples())
        text += f" (its run-trajectory tau {h['tau']:.2f} is no ceiling: {beat})"
    return text


def heldout_note(held: pd.DataFrame) -> str:
    """Which designs beat the best preset on held-out prompts and which do not (`heldout.preset_gaps`)."""
    if not held["fitted"].any():
        return "no tree was fitted to the data (a cross-tokenizer pair has no draft ranks of the target's tokens)"
    gaps = preset_gaps(held)
    if gaps.empty:
        return "nothing could be held out (fewer than 2 prompts): the designs' tau is in-sample only"
    lose = gaps[~gaps["beats_best_preset"]]
    if lose.empty:
        return "on held-out prompts every design beats the best preset of its budget"
    shown = ", ".join(
        f"{r.shape} at {r.budget} ({r.tau_heldout:.2f} vs {r.best_preset} {r.best_preset_tau:.2f}"
        + (", a tie)" if abs(r.tau_heldout - r.best_preset_tau) < 5e-3 else ")")
        for r in lose.itertuples()
    )
    return f"on held-out prompts these designs do **not** beat the best preset of their budget: {shown}"


def verdict_reading(
    choice: Choice | None,
    measured: pd.DataFrame | None = None,
    folds: pd.DataFrame | None = None,
    check: pd.DataFrame | None = None,
) -> str:
    """The tree to deploy with its held-out tau and expected speed-up, their 95% intervals, the verdict
    (only where the interval excludes 1), the measured run against the target alone, the prediction
    checked against it (`check`: `experiments.sweeps.prediction_check`), and the choice itself held
    out (chosen on the other folds, scored on each)."""
    if choice is None:
        return "no tree has a held-out tau: no recommendation"
    kind = "a design fitted on every prompt" if choice.fitted else "a preset"
    out = (
        f"recommended (cost model with held-out tau): **{choice.shape} with {choice.budget} draft tokens** ({kind}), "
        f"held-out tau {choice.tau:.2f}{_bracket(choice.tau_low, choice.tau_high)}, expected "
        f"{choice.speedup:.2f}x{_bracket(choice.speedup_low, choice.speedup_high)} the target alone "
        f"(95% intervals: bootstrap over held-out prompts, the cost curves at their quartiles): "
        f"speculation **{choice.verdict}**"
    )
    if choice.verdict == "cannot tell":
        out += " (the interval holds 1.0, or there are too few prompts for one)"
    if measured is not None and not measured.empty:
        r = measured.iloc[0]
        out += (
            f"; run end to end on {int(r['prompts'])} prompts: {r['speedup']:.2f}x the target alone"
            f"{_interval(r, 'speedup')}{against_expected(r['speedup'], choice.speedup_low, choice.speedup_high)}"
        )
    if check is not None and not check.empty:
        out += ". " + check_reading(check)
    if folds is not None and not folds.empty:
        picks = ", ".join(f"{r.shape}:{r.budget}" for r in folds.itertuples())
        out += f"; chosen on the other folds and scored on each, the choice picks {picks}"
    return out


def check_reading(check: pd.DataFrame) -> str:
    """The prediction against the measurement (`experiments.sweeps.prediction_check`), in one sentence."""
    row = check.set_index("quantity")
    steady, tau = row.loc["speed-up, steady state"], row.loc["tau (bonus included)"]
    decode, prompts = row.loc["target alone, seconds per token"], int(check["prompts"].iloc[0])
    return (
        f"Checked on those {prompts} prompts, every step after each prompt's first (which carries its prefill): "
        f"measured {steady['measured']:.2f}x against {steady['predicted']:.2f}x [{steady['low']:.2f}, "
        f"{steady['high']:.2f}] predicted (the held-out tau {tau['predicted']:.2f}, the interval "
        f"{steady.get('interval') or f'that of a mean over {prompts} prompts'}; the cost model's points re-timed "
        "during the runs: one decode "
        f"{decode['predicted'] * 1e3:.0f} ms, in the runs {decode['measured'] * 1e3:.0f} ms): **{steady['check']}** "
        f"(measured tau {tau['measured']:.2f}; with each prompt's prefill {check['measured'].iloc[-1]:.2f}x)"
    )


def against_expected(measured: float, low: float, high: float) -> str:
    """Where a measured speed-up falls against the expected interval [low, high]: said when it falls
    outside (prediction and measurement disagree on this run), nothing when inside or without one."""
    if not (low == low and high == high) or low <= measured <= high:
        return ""
    side = "below" if measured < low else "above"
    return (
        f", {side} the expected interval [{low:.2f}, {high:.2f}]: the cost model's prediction and this "
        "measurement disagree on this run"
    )


def _bracket(low: float, high: float) -> str:
    """ " [low, high]", or a note that there is no interval (fewer than MIN_PROMPTS prompts)."""
    if low == low and high == high:
        return f" [{low:.2f}, {high:.2f}]"
    return f" (no interval: fewer than {MIN_PROMPTS} prompts)"


def deploy_reading(choice: Choice) -> str:
    """The chosen tree's line for each serving engine, or why it cannot take it (`io.engines`), as markdown."""
    lines = [
        f"- {ENGINE_NAMES[name]}: `{line.line}` ({line.note})"
        if line.line is not None
        else f"- {ENGINE_NAMES[name]}: not accepted: {line.note}"
        for name, line in deploy_lines(choice.tree).items()
    ]
    return "\n".join([f"\nDeploy {choice.shape} with {choice.budget} draft tokens (also in deploy.txt):", *lines])


def engine_reading(table: pd.DataFrame) -> str:
    """`engine_choice.engine_table` as sentences: per engine setting and releases, what it takes, its
    expected speed-up and how it compares with the best tree of all on the same prompts (paired)."""
    lines = ["Each serving engine's setting for this pair (rules and sources: docs/engines.md):"]
    for r in table.itertuples():
        head = f"- {r.engine} ({r.releases}; {r.takes})"
        if not isinstance(getattr(r, "shape", None), str):
            lines.append(f"{head}: {r.line}")
            continue
        paired = f"{r.versus_best:+.2f}x{_bracket(r.versus_best_ci_low, r.versus_best_ci_high)}"
        against = (
            "the best tree of all"
            if r.verdict == "the best tree"
            else f"{r.verdict} the best tree ({paired} on {r.prompts_compared} prompts, paired)"
        )
        lines.append(
            f"{head}: expected {r.speedup:.2f}x{_bracket(r.speedup_ci_low, r.speedup_ci_high)}, held-out tau "
            f"{r.tau_heldout:.2f}, {against}: `{r.line}`"
        )
    return "\n".join(lines)


def pairs_reading(table: pd.DataFrame, versus: pd.DataFrame | None = None) -> str:
    """A short markdown reading of a shape table, computed from it (no fixed conclusions); with the
    head-to-head table (`tables.head_to_head`), each matchup's verdict: a winner only where the
    interval of the speed ratio excludes 1."""
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
        line = f"- highest tau overall: {best['shape']} with {best['budget']} tokens ({best['tau']:.2f})"
        if t["tokens_per_s"].notna().any():
            fastest = t.loc[t["tokens_per_s"].idxmax()]
            line += (
                f"; highest tokens/s measured: {fastest['shape']} with {fastest['budget']} tokens, "
                f"{fastest['speedup']:.2f}x the target alone{_interval(fastest, 'speedup')}"
            )
        lines.append(line)
        if versus is not None and len(versus):
            for r in versus[versus["pair"] == pair].itertuples():
                lines.append(
                    f"- {r.ours} against {r.theirs}: {r.speed_ratio:.2f}x the tokens/s (95% interval over "
                    f"{r.prompts} prompts {r.speed_ratio_ci_low:.2f}-{r.speed_ratio_ci_high:.2f}): **{r.verdict}**"
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
        cross = t[t["shape"].str.startswith("xtok/")]
        if len(cross) and "draft_tokens_per_accepted" in t:
            best_cross = cross.loc[cross["tau"].idxmax()]
            lines.append(
                f"- across tokenizers: {best_cross['shape']}:{best_cross['budget']} accepts "
                f"{best_cross['acceptance_length']:.2f} target tokens per step (tau {best_cross['tau']:.2f}) for "
                f"{best_cross['draft_tokens_per_accepted']:.2f} draft tokens per accepted target token"
            )
        lines.append("- " + greedy_summary(t))
    lines += _fastest_per_target(table)
    return "\n".join(lines)


def _interval(row: pd.Series, metric: str) -> str:
    """ " (95% interval a-b)" from a row's `<metric>_ci_low/high`, or "" where there is none."""
    low, high = row.get(f"{metric}_ci_low"), row.get(f"{metric}_ci_high")
    return f" (95% interval {low:.2f}-{high:.2f})" if low == low and high == high and low is not None else ""


def _fastest_per_target(table: pd.DataFrame) -> list[str]:
    """Per target with more than one pair: the fastest (pair, method) measured, and whether any pays."""
    measured = table.dropna(subset=["speedup"])
    if measured.empty:
        return []
    target = measured["pair"].str.split(" -> ").str[-1]
    lines = []
    for name, t in measured.groupby(target, sort=False):
        if t["pair"].nunique() < 2:
            continue
        per_pair = t.loc[t.groupby("pair", sort=False)["speedup"].idxmax()]
        parts = "; ".join(f"{r.pair}: {r.shape}:{r.budget} {r.speedup:.2f}x" for r in per_pair.itertuples())
        best = per_pair.loc[per_pair["speedup"].idxmax()]
        verdict = "pays" if best["speedup"] > 1 else "does not pay: the target alone is faster"
        lines.append(
            f"**Target {name}**, fastest method per draft (tokens/s over the target alone, same run): {parts}. "
            f"Best: {best['pair']} with {best['shape']}:{best['budget']}, {best['speedup']:.2f}x: "
            f"speculation {verdict}."
        )
    return lines


def greedy_summary(table: pd.DataFrame) -> str:
    """How the greedy outputs of a shape table compare with the target's own: exact, numerical
    ties (`analysis.quality.TIE_MARGIN`), mismatches."""
    total, exact = int(table["prompts"].sum()), int(table["greedy_equal"].sum())
    ties = int(table["greedy_ties"].sum()) if "greedy_ties" in table else 0
    bad = int(table["greedy_mismatches"].sum()) if "greedy_mismatches" in table else total - exact - ties
    out = f"greedy outputs against the target's own: {exact}/{total} exact"
    if ties:
        out += (
            f", {ties} numerical ties (the target's top two logits closer than the tie margin where they first differ)"
        )
    if bad:
        out += f", **{bad} mismatches** (not explained by a tie: a bug to report)"
    return out


def recommendation(cost: pd.DataFrame, source: str = "") -> str:
    """The budget the cost model picks on this device, in one markdown paragraph; `source` says where
    its tau and its costs come from (two notebooks may price one pair from different inputs)."""
    best = cost.loc[cost["tokens_per_s"].idxmax()]
    per_shape = cost.loc[cost.groupby("shape")["tokens_per_s"].idxmax()]
    others = ", ".join(f"{r.shape} {int(r.nodes)} ({r.speedup:.2f}x)" for r in per_shape.itertuples())
    return (
        f"Best on this device: **{best['shape']} with {int(best['nodes'])} draft tokens**, expected tau "
        f"{best['expected_tau']:.2f} (bonus included), {best['tokens_per_s']:.2f} tokens/s = "
        f"{best['speedup']:.2f}x the target alone (a point estimate without an interval: no verdict; the pair's "
        f"verdict is notebook 01's, `experiments.earlier.pair_verdict`). Best budget per shape: {others}."
        + (f" Inputs: {source}." if source else "")
    )


def curve_reading(curve: pd.DataFrame, model: str | None = None) -> str:
    """Markdown: the verify curve's shape as measured (`verify_curve.curve_shape`): where it steps,
    where it slopes, and what the largest tree costs in decodes."""
    c = curve_shape(curve, model)
    out = (
        f"Verify cost as measured: one decode (1 token) {c['decode_ms']:.0f} ms; {c['first_tokens']} tokens "
        f"{c['first_ms']:.0f} ms ({c['first_ms'] / c['decode_ms']:.2f}x a decode: +{c['step_per_token_ms']:.1f} ms per "
        f"added token over that first stretch)"
    )
    if c["last_tokens"] > c["first_tokens"]:
        out += (
            f"; from {c['first_tokens']} to {c['last_tokens']} tokens {c['slope_ms']:+.1f} ms per further token "
            f"(least squares), {c['last_ms']:.0f} ms at {c['last_tokens']} "
            f"({c['last_ms'] / c['decode_ms']:.2f}x a decode)"
        )
    added = (
        "the first added token accounts"
        if c["first_tokens"] == 2
        else f"the first {c['first_tokens'] - 1} added tokens account"
    )
    if c["step_share"] >= 0.6 and c["last_tokens"] > c["first_tokens"]:
        shape = (
            f"mostly a step: {added} for {c['step_share']:.0%} of the "
            f"largest tree's extra cost, so a bigger tree costs little more than a small one"
        )
    elif c["last_tokens"] > c["first_tokens"]:
        shape = (
            f"mostly a slope: {added} for {c['step_share']:.0%} of "
            f"the largest tree's extra cost, the rest grows with the tree"
        )
    else:
        shape = "one tree size measured: no slope to read"
    return out + f". The curve is {shape}."


def long_reading(table: pd.DataFrame) -> str:
    """Notebook 04: memory, speed, acceptance and quality of each window against the full cache."""
    lines = ["tau = tokens per target call, bonus included; KV = bytes of the target's and draft's caches at the end."]
    for window, t in table[table["window"] > 0].groupby("window"):
        parts = []
        for row in t.itertuples():
            part = f"{row.method}: KV {row.kv_over_full:.2f}x the full cache's, {row.speed_over_full:.2f}x its tokens/s"
            if row.method != "autoregressive":
                part += f", tau {row.tau:.2f}"
            parts.append(part)
        first = t["first_difference"].dropna()
        diverge = (
            f"first differs from full-cache greedy at token {int(first.min())}"
            if len(first)
            else "never differs from full-cache greedy"
        )
        lines.append(
            f"- window {window}: " + "; ".join(parts) + f"; output {diverge}, perplexity {t['perplexity'].mean():.2f}"
        )
        idle = t[t["evictions"] == 0]["method"].tolist()
        if idle:
            lines.append(
                f"  - **warning: window {window} never evicted** for {', '.join(idle)}: the generation ended "
                f"before the cache held sink + {window} tokens, so these rows say nothing about streaming "
                "(raise max_new_tokens, lower the window, or keep stop_at_eos False)"
            )
    spec = table[table["method"] != "autoregressive"]
    exact, total = int(spec["streaming_exact"].sum()), int(spec["prompts"].sum())
    ties = int(spec["streaming_ties"].sum())
    lines.append(
        f"- speculative outputs equal to the streaming target's own greedy output (same policy): {exact}/{total} exact"
        + (f", {ties} numerical ties" if ties else "")
    )
    return "\n".join(lines)


def collection_reading(report: CollectReport) -> str:
    """Markdown: units collected / total, by how many workers on how many nodes, failures by prompt id."""
    o = report.outcome
    written = sum(r["status"] == "written" for r in o.results.values())
    text = (
        f"**{len(report.collection.prompts)} / {len(report.units)} units collected**: {report.present} already there, "
        f"{written} written now by {len(o.workers)} worker(s) on {len({w.node for w in o.workers})} node(s) "
        f"in {o.seconds:.1f} s ({o.lost_workers} workers lost, {o.retried} attempts retried)."
    )
    if o.failures:
        failed = "; ".join(f"`{pid}` ({f.attempts} attempts; {f.error})" for pid, f in zip(report.failed, o.failures))
        text += f"\n\n**Failed units, left out of everything below:** {failed}. Rerun the notebook to try them again."
    return text


def grid_reading(best: pd.DataFrame, ranks: pd.DataFrame | None = None, saturation: float = 0.05) -> str:
    """A markdown reading of the grid across pairs (`experiments.grid.best_per_budget`), computed
    from it: per pair the best tree at each budget (held-out tau), why (with `ranks`,
    `experiments.grid.rank_table`: how often the draft's rank-r token is the target's next), the
    budget past which doubling the tokens gains less than `saturation` of tau, and how close the
    best tree comes to the oracle bound; then the pairs ranked at the largest budget they share."""
    lines = []
    for pair, b in best.groupby("pair", sort=False):
        b = b.sort_values("budget")
        top = b.loc[b["tau_heldout"].idxmax()]
        winners = ", ".join(_winner(r) for r in b.itertuples())
        line = (
            f"- **{pair}** ({top['kind']}): highest held-out tau {top['tau_heldout']:.2f}"
            f"{_bracket(top['tau_heldout_ci_low'], top['tau_heldout_ci_high'])} with {top['best_shape']} at "
            f"{top['budget']} draft tokens. The winner per budget against its runner-up, tau's difference "
            f"paired on the same prompts: {winners}."
        )
        mine = ranks[(ranks["pair"] == pair) & ranks["share"].notna()] if ranks is not None else pd.DataFrame()
        if len(mine) >= 2:
            a = mine.sort_values("rank")["share"].to_numpy()
            line += (
                f" The draft's top token is the target's next at {a[0]:.0%} of positions, its second at {a[1]:.0%}"
                + (f", its third at {a[2]:.0%}" if len(a) > 2 else "")
                + f". Under Sequoia's positional assumption a second node under the top token is accepted at about "
                f"{a[0] ** 2:.0%} (its square), a second sibling at {a[1]:.0%}: "
                + ("going deeper pays first." if a[0] ** 2 > a[1] else "going wider pays first.")
            )
        gains = b["tau_heldout"].to_numpy()
        flat = next((i for i in range(1, len(gains)) if gains[i] < gains[i - 1] * (1 + saturation)), None)
        if flat is not None:
            line += (
                f" Past {b['budget'].iloc[flat - 1]} tokens the next budget adds less than {saturation:.0%} "
                f"({gains[flat - 1]:.2f} -> {gains[flat]:.2f}): the added nodes are branches rarely accepted."
            )
        bounded = b.dropna(subset=["oracle_tau"])
        if len(bounded):
            last = bounded.iloc[-1]
            line += (
                f" At {last['budget']} tokens it reaches {last['tau_heldout'] / last['oracle_tau']:.0%} of the "
                f"oracle bound ({last['oracle_tau']:.2f})."
            )
        else:
            line += " No oracle bound across tokenizers (the table's notes say why)."
        lines.append(line)
    shared = best.groupby("budget")["pair"].nunique()
    common = shared[shared == best["pair"].nunique()]
    if best["pair"].nunique() > 1 and len(common):
        n = int(common.index.max())
        at = best[best["budget"] == n].sort_values("tau_heldout", ascending=False)
        lines.append(
            f"- At {n} draft tokens the pairs rank: "
            + "; ".join(f"{r.pair} {r.tau_heldout:.2f} ({r.best_shape})" for r in at.itertuples())
            + ". tau counts target tokens per target call; what a step costs differs by pair (notebook 01 prices it)."
        )
    return "\n".join(lines)


def _winner(r) -> str:
    """'8: kary2 ahead of chain by 0.21 [0.12, 0.30]', or '... tied with chain (+0.03 [-0.02, 0.08])'."""
    return f"{r.budget}: {r.best_shape}" + _against_runner_up(r)


def _against_runner_up(r) -> str:
    """' ahead of chain by +0.21 [0.12, 0.30]', ' tied with chain (+0.03 [-0.02, 0.08])', or '' without one."""
    if not isinstance(r.runner_up, str) or not r.runner_up:
        return ""
    lead = f"{r.lead:+.2f}{_bracket(r.lead_ci_low, r.lead_ci_high)}"
    return f" tied with {r.runner_up} ({lead})" if r.verdict == "tied" else f" ahead of {r.runner_up} by {lead}"


def categories_reading(winners: pd.DataFrame) -> str:
    """Whether the winning shape changes with the prompt's category (`analysis.ranking.category_winners`):
    per pair and budget, the categories whose own winner is another shape, with both taus there."""
    lines = []
    for (pair, budget), part in winners.groupby(["pair", "budget"], sort=False):
        other = part[~part["same_winner"]]
        n = int(part["prompts"].max())
        if other.empty:
            lines.append(
                f"- **{pair}**, {budget} draft tokens: {part['overall_winner'].iloc[0]} wins in every category."
            )
            continue
        said = "; ".join(
            f"{r.category}: {r.winner} {r.winner_tau:.2f} against {r.overall_winner} {r.overall_winner_tau:.2f}"
            for r in other.itertuples()
        )
        lines.append(
            f"- **{pair}**, {budget} draft tokens: {part['overall_winner'].iloc[0]} wins overall; another shape "
            f"leads in {len(other)} of {len(part)} categories ({said})."
        )
    if not lines:
        return ""
    note = f"A category holds {n} prompts here: its taus carry no interval, and a lead inside one is a hint."
    return "\n".join(lines) + "\n\n" + note


def percent(value: float) -> str:
    """How the report's tables and analysis write a share: '77%'."""
    return f"{value:.0%}"


def rank_shares(ranks: pd.DataFrame) -> pd.DataFrame:
    """Per pair, the share of positions where the draft's rank-r token is the target's next (ranks 0-3),
    and the top token's share squared: roughly what a second level under the top token is accepted at
    under Sequoia's positional assumption. Pairs without ranks (another tokenizer) are left out."""
    have = ranks.dropna(subset=["share"])
    rows = []
    for pair, t in have.groupby("pair", sort=False):
        shares = t.sort_values("rank")["share"].tolist()
        row = {"pair": pair} | ({} if t["kind"].iloc[0] == pair else {"kind": t["kind"].iloc[0]})  # named by kind
        row |= {f"rank {i}": percent(s) for i, s in enumerate(shares)}
        row["rank 0 squared"] = percent(shares[0] ** 2)
        rows.append(row)
    return pd.DataFrame(rows)


def trend_table(speed: pd.DataFrame) -> pd.DataFrame:
    """03's speed-up of one tree call over one call per sequence, median over the other axes, by draft
    tokens, prefix length and batch size (value '2.00')."""
    s = speed.dropna(subset=["per_sequence_over_tree"])
    rows = []
    for axis, label in (("nodes", "draft tokens"), ("prefix", "prefix length"), ("batch", "batch size")):
        for value, median in s.groupby(axis)["per_sequence_over_tree"].median().items():
            rows.append({"axis": label, "value": value, "median speed-up": f"{median:.2f}"})
    return pd.DataFrame(rows)


def trend_moves(speed: pd.DataFrame, words: tuple[str, str, str] = ("up", "down", "flat")) -> list[tuple]:
    """Per axis of `trend_table` with more than one value: (axis, word, first, last), the word saying
    whether the median speed-up rises, falls or stays from the axis's first value to its last."""
    out = []
    for axis, t in trend_table(speed).groupby("axis", sort=False):
        if len(t) > 1:
            first, last = t["median speed-up"].iloc[0], t["median speed-up"].iloc[-1]
            word = words[2] if first == last else words[0] if float(last) > float(first) else words[1]
            out.append((axis, word, first, last))
    return out


def verify_cost_table(curve: pd.DataFrame) -> pd.DataFrame:
    """A real target's verify of N draft tokens (N + 1 rows) in ms and in decodes (01's or 03's curve)."""
    target = curve[(curve["role"] == "target") & (curve["kind"] == "verify")].sort_values("nodes")
    decode = float(target["median_ms"].iloc[0])
    return pd.DataFrame(
        {
            "draft tokens": target["nodes"],
            "median ms": [f"{m:.0f}" for m in target["median_ms"]],
            "x a decode": [f"{m / decode:.2f}" for m in target["median_ms"]],
        }
    )


def _names(items: list[str]) -> str:
    items = [str(i) for i in items]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _grouped(rows: pd.DataFrame, every: int) -> str:
    """'chain for every pair' or 'chain for A and B, dynamic for C' (rows: one per pair, best_shape)."""
    groups = rows.groupby("best_shape", sort=False)["pair"].apply(list)
    if len(groups) == 1 and len(groups.iloc[0]) == every > 1:
        return f"{groups.index[0]} for every pair"
    return "; ".join(f"{shape} for {_names(pairs)}" for shape, pairs in groups.items())


def analysis(
    best: pd.DataFrame | None,
    ranks: pd.DataFrame | None = None,
    speed: pd.DataFrame | None = None,
    curve: pd.DataFrame | None = None,
    verdict: pd.DataFrame | None = None,
    flat: float = 0.05,
    costs: pd.DataFrame | None = None,
) -> str:
    """The report's drafted analysis in paragraphs, computed from the tables the report shows (each
    number written as its table writes it): which shape wins at which budget and why (acceptance by
    sibling rank, `rank_shares`: a level is reached only through the one above it), where adding draft
    tokens stops paying (doubling gains less than `flat` of tau), how the pairs differ and how far
    from the oracle bound, what tree attention costs and when it stops being nearly free (`trend_table`,
    `verify_cost_table`), and whether speculation pays off on this device (`verdict`: 01's
    recommendation as the report tabulates it). A paragraph whose table is missing is left out."""
    paragraphs = []
    if best is not None and len(best):
        paragraphs += [_why_shapes(best, ranks), _where_it_stops(best, flat), _pairs_differ(best)]
    if speed is not None and "per_sequence_over_tree" in speed and speed["per_sequence_over_tree"].notna().any():
        paragraphs.append(_attention_cost(speed, curve))
    if costs is not None and len(costs) > 1:
        paragraphs.append(_fastest_not_highest(costs))
    if verdict is not None and len(verdict):
        paragraphs.append(_pays_off(verdict.iloc[0]))
    return "\n\n".join(p for p in paragraphs if p)


def step_costs(recommendation: pd.DataFrame) -> pd.DataFrame:
    """01's cost model (recommendation.csv) for two trees: the fastest (expected speed-up) and the one
    of highest tau, each with its depth (one draft pass a level), draft, verify and step time in ms
    and expected speed-up; one row where they are the same tree."""
    ranked = recommendation.dropna(subset=["speedup", "expected_tau"])
    picks = [ranked.loc[ranked["speedup"].idxmax()], ranked.loc[ranked["expected_tau"].idxmax()]]
    rows = []
    for label, r in zip(("fastest", "highest tau"), picks):
        name = f"{r['shape']}:{int(r['budget'])}"
        if rows and rows[0]["tree"] == name:
            rows[0]["is"] = "fastest and highest tau"
            continue
        rows.append(
            {
                "is": label,
                "tree": name,
                "tau": f"{r['expected_tau']:.2f}",
                "draft passes (depth)": int(r["depth"]),
                "draft ms": f"{1000 * r['t_draft_s']:.0f}",
                "verify ms": f"{1000 * r['t_verify_s']:.0f}",
                "step ms": f"{1000 * r['t_step_s']:.0f}",
                "expected speed-up": f"{r['speedup']:.2f}",
            }
        )
    return pd.DataFrame(rows)


def _fastest_not_highest(costs: pd.DataFrame) -> str:
    fast, high = costs.iloc[0], costs.iloc[1]
    return (
        f"**Why the fastest tree is not the one that accepts most.** {high['tree']} has the highest tau "
        f"({high['tau']}), but its {high['draft passes (depth)']} levels cost as many draft passes "
        f"({high['draft ms']} ms) and its verify {high['verify ms']} ms: a step of {high['step ms']} ms. "
        f"{fast['tree']} accepts less ({fast['tau']}) in a step of {fast['step ms']} ms "
        f"({fast['draft passes (depth)']} draft passes, verify {fast['verify ms']} ms). Tokens per second are tau "
        f"over the step's time, so {fast['tree']} is expected at {fast['expected speed-up']}x the target alone and "
        f"{high['tree']} at {high['expected speed-up']}x: on this device a level of the tree is paid in draft "
        "time whether or not it is accepted."
    )


def findings(
    best: pd.DataFrame | None,
    ranks: pd.DataFrame | None = None,
    speed: pd.DataFrame | None = None,
    verdict: pd.DataFrame | None = None,
    methods: pd.DataFrame | None = None,
) -> str:
    """The report's findings, one bullet each, computed from the tables the report shows: the shape
    that wins at the smallest and the largest budget per pair (paired against the runner-up, "tied"
    where the interval holds 0: `best`, 02's grid_best.csv); why (`ranks`: the draft's top token
    against its second); what one tree call saves over one call per sequence and how that moves
    (`speed`, 03); whether speculation pays on this device, measured (`verdict`, 01's recommendation;
    `methods`, 02's end-to-end runs). A bullet whose table is missing is left out."""
    bullets = []
    if best is not None and len(best):
        for budget, label in ((best["budget"].min(), "few"), (best["budget"].max(), "many")):
            rows = best[best["budget"] == budget].sort_values("pair")
            bullets.append(
                f"**With {label} draft tokens ({budget})**, paired on the same prompts (tau): "
                + "; ".join(_finding_winner(r) for r in rows.itertuples())
                + "."
            )
    shares = rank_shares(ranks) if ranks is not None and ranks["share"].notna().any() else pd.DataFrame()
    if len(shares) and "rank 1" in shares:
        deeper = [r["pair"] for _, r in shares.iterrows() if float(r["rank 0 squared"][:-1]) > float(r["rank 1"][:-1])]
        bullets.append(
            "**Why**: a node one level under the draft's top token is accepted at about its top share squared ("
            + _names([f"{r['rank 0 squared']} ({r['pair']})" for _, r in shares.iterrows()])
            + "), a second sibling at its second share ("
            + _names(list(shares["rank 1"]))
            + "), so "
            + (
                "depth pays before width, for every pair with ranks."
                if len(deeper) == len(shares)
                else f"depth pays first for {_names(deeper)} only, width for the others."
                if deeper
                else "a second sibling earns more than a deeper node: width pays first."
            )
        )
    if speed is not None and "per_sequence_over_tree" in speed and speed["per_sequence_over_tree"].notna().any():
        s = speed.dropna(subset=["per_sequence_over_tree"])
        moves = [f"{word} with {axis} ({first} -> {last})" for axis, word, first, last in trend_moves(speed)]
        bullets.append(
            f"**Tree attention**: one tree-masked call runs {s['per_sequence_over_tree'].min():.2f}x to "
            f"{s['per_sequence_over_tree'].max():.2f}x as fast as one call per root-to-leaf sequence over 03's grid"
            + (f"; its median moves {_names(moves)}" if moves else "")
            + "."
        )
    pays = []
    if verdict is not None and len(verdict):
        row = verdict.iloc[0]
        measured = str(row.get("measured speed-up") or "")
        pays.append(
            f"01's choice, {row['tree']}, is expected at {row['expected speed-up']} the target alone"
            + (f" and ran at {measured} end to end" if measured else "")
            + f" (verdict: {row['verdict']})"
        )
    if methods is not None and len(methods) and "speedup" in methods:
        fastest = []
        for pair, t in methods.dropna(subset=["speedup"]).groupby("pair", sort=False):
            top = t.loc[t["speedup"].idxmax()]
            low, high = top.get("speedup_ci_low"), top.get("speedup_ci_high")
            has = low == low and high == high and low is not None and high is not None
            side = "" if not has else " (cannot tell)" if low <= 1 <= high else " (faster)" if low > 1 else " (slower)"
            shown = f"{top['speedup']:.2f}" + (f" [{low:.2f}, {high:.2f}]" if has else "")
            fastest.append(f"{pair}, {top['shape']}, {shown}x{side}")
        pays.append("02's fastest method per pair against the target alone: " + "; ".join(fastest))
    if pays:
        bullets.append("**Does it pay on this device?** " + ". ".join(pays) + ".")
    return "\n".join(f"- {b}" for b in bullets)


def _finding_winner(r) -> str:
    """'a -> b: kary2 (3.10 [2.80, 3.30]) ahead of chain by +0.21 [0.12, 0.30]', or '... tied with chain'."""
    tau = f"{r.tau_heldout:.2f}{_bracket(r.tau_heldout_ci_low, r.tau_heldout_ci_high)}"
    return f"{r.pair}: {r.best_shape} ({tau})" + _against_runner_up(r)


def _why_shapes(best: pd.DataFrame, ranks: pd.DataFrame | None) -> str:
    pairs = best["pair"].nunique()
    low, high = best["budget"].min(), best["budget"].max()
    out = (
        f"**Which shape wins, and why.** With {low} draft tokens the best tree (held-out tau) is "
        f"{_grouped(best[best['budget'] == low], pairs)}; with {high}, {_grouped(best[best['budget'] == high], pairs)}."
    )
    shares = rank_shares(ranks) if ranks is not None and ranks["share"].notna().any() else pd.DataFrame()
    if len(shares) and "rank 1" in shares:
        top = ranks.dropna(subset=["share"]).pivot_table(index="pair", columns="rank", values="share")
        deeper = [pair for pair in shares["pair"] if top.loc[pair, 0] ** 2 > top.loc[pair, 1]]
        out += (
            " The rank table says why: a second level under the draft's top token is accepted at about the top "
            "share squared [Chen et al. 2024], "
        )
        if len(deeper) == len(shares):
            out += (
                "more than a second sibling, so a node spent deeper on the top path is worth more than one beside "
                "it, and deep trees (chain, dynamic, sparse) lead until the top path's acceptance decays: a level is "
                "reached only through the one above it."
            )
        elif not deeper:
            out += "less than a second sibling, so width pays before depth: wide and k-ary trees lead."
        else:
            out += f"more than a second sibling for {_names(deeper)} only, where depth pays first."
    missing = sorted(set(best["pair"]) - set(shares["pair"] if len(shares) else []))
    if missing:
        plural = "s" if len(missing) > 1 else ""
        out += f" For the {_names(missing)} pair{plural}: no ranks (another vocabulary; its trees are re-drafted)."
    return out


def _where_it_stops(best: pd.DataFrame, flat: float) -> str:
    stops, grows = [], []
    for pair, b in best.groupby("pair", sort=False):
        b = b.sort_values("budget").dropna(subset=["tau_heldout"])
        gains = b["tau_heldout"].to_numpy()
        at = next((i for i in range(1, len(gains)) if gains[i] < gains[i - 1] * (1 + flat)), None)
        if at is not None:
            stops.append(f"past {b['budget'].iloc[at - 1]} for {pair} ({gains[at - 1]:.2f} -> {gains[at]:.2f})")
        elif len(gains) > 1:
            grows.append(
                f"{pair} ({gains[-2]:.2f} -> {gains[-1]:.2f} from {b['budget'].iloc[-2]} to {b['budget'].iloc[-1]})"
            )
    out = "**Where adding draft tokens stops paying.** "
    if stops:
        out += f"Doubling the draft tokens adds under a twentieth of tau {'; '.join(stops)}. "
    if grows:
        out += (
            f"Tau still grows at the largest budget measured for {_names(grows)}; whether a larger budget pays is "
            "a question of cost: each added token lengthens the verify and, for deep trees, the draft. "
        )
    rates = [b.sort_values("budget")["acceptance_rate"] for _, b in best.groupby("pair", sort=False)]
    if all(len(r) > 1 and round(r.iloc[-1], 2) < round(r.iloc[0], 2) for r in rates):
        out += (
            "The best tree's acceptance rate falls with the budget for every pair (the grid): each added node sits "
            "at a rank or depth the target takes less often. "
        )
    return out.rstrip()


def _pairs_differ(best: pd.DataFrame) -> str:
    shared = best.groupby("budget")["pair"].nunique()
    common = shared[shared == best["pair"].nunique()]
    if best["pair"].nunique() < 2 or not len(common):
        return ""
    n = int(common.index.max())
    at = best[best["budget"] == n].sort_values("tau_heldout", ascending=False)
    out = (
        f"**How the pairs differ.** With {n} draft tokens the pairs rank "
        + ", then ".join(
            f"{r.pair} ({'' if r.kind == r.pair else r.kind + ', '}tau {r.tau_heldout:.2f})" for r in at.itertuples()
        )
        + ". "
    )
    bounded = at.dropna(subset=["oracle_tau"])
    if len(bounded):
        out += (
            "The best tree reaches "
            + _names([f"{percent(r.tau_heldout / r.oracle_tau)} ({r.pair})" for r in bounded.itertuples()])
            + " of the oracle bound's tau: the gap is what choosing each step's tree knowing the target's "
            "continuation would add."
        )
    return out


def _attention_cost(speed: pd.DataFrame, curve: pd.DataFrame | None) -> str:
    s = speed.dropna(subset=["per_sequence_over_tree"])
    low, high = s.loc[s["per_sequence_over_tree"].idxmin()], s.loc[s["per_sequence_over_tree"].idxmax()]
    where = lambda r: f"batch {r['batch']}, prefix {r['prefix']}, {r['nodes']} draft tokens"  # noqa: E731
    out = (
        "**What tree attention costs.** One tree-masked call against one call per root-to-leaf sequence runs "
        f"{low['per_sequence_over_tree']:.2f}x as fast at {where(low)} and {high['per_sequence_over_tree']:.2f}x at "
        f"{where(high)}. "
    )
    moves = [
        f"stays flat across {axis}" if word == "flat" else f"{word} with {axis}"
        for axis, word, first, last in trend_moves(speed, ("grows", "shrinks", "flat"))
    ]
    if moves:
        out += (
            f"Its median {_names(moves)} (the medians above). Each per-sequence call attends the whole shared "
            "prefix again and pays a call's overhead"
            + (
                ", and a tree of more draft tokens has more leaves, hence more calls to replace. "
                if "grows with draft" in moves[0]
                else ". "
            )
        )
    if any(m.startswith("shrinks with prefix") for m in moves):
        out += (
            "That reason predicts a speed-up growing with the prefix (each call re-reads it); it shrinks here, which "
            "these runs do not explain. "
        )
    if curve is not None and len(curve) and {"role", "kind", "nodes", "median_ms"} <= set(curve):
        costs = verify_cost_table(curve)
        ratio = costs["x a decode"].astype(float)
        if len(costs) > 1 and (ratio <= 1.5).all():
            out += (
                f"On the real target a verify of up to {costs['draft tokens'].iloc[-1]} draft tokens costs at most "
                f"{costs['x a decode'].iloc[-1]}x one decoded token: nearly free over the budgets measured."
            )
        elif len(costs) > 1:
            over = costs[ratio > 1.5].iloc[0]
            within = costs[ratio <= 1.5]["draft tokens"]
            out += (
                "On the real target a verify stays within half again one decode"
                + (f" up to {within.iloc[-1]} draft tokens" if len(within) else " at no budget measured")
                + f" and costs {over['x a decode']}x one at {over['draft tokens']} ({over['median ms']} ms against "
                f"{costs['median ms'].iloc[0]} ms): past that, each added node must earn its time back in tau."
            )
    return out.rstrip()


def _pays_off(row: pd.Series) -> str:
    out = (
        f"**Does speculation pay off on this device?** For 01's pair, {row['tree']} is expected to run at "
        f"{row['expected speed-up']} the target alone"
    )
    measured = str(row.get("measured speed-up") or "")
    if measured:
        out += f" and ran at {measured} end to end on {row['measured on']} prompts"
        bounds = [float(v) for v in re.findall(r"\d+\.\d+", str(row["expected speed-up"]))[1:3]]
        if len(bounds) == 2 and not bounds[0] <= float(measured.rstrip("x")) <= bounds[1]:
            side = "below" if float(measured.rstrip("x")) < bounds[0] else "above"
            out += f", {side} the expected interval"
    steady = str(row.get("steady state measured") or "")
    if steady:
        out += (
            f". Priced on cost points timed while those runs ran, the steady state (each prompt's prefill left out) "
            f"was predicted at {row['steady state predicted']} and measured at {steady}"
        )
    return out + f". Verdict: **{row['verdict']}**."
