"""Notebook 01's trees priced where notebooks 03 and 06 measure (`io.tree_results.acceptance_from`
reads them): 03 puts them in its cost model on its own curves, 06 replays them on its prompts and
prices them at every batch size. A row's shape is "01:<name>" so it never merges with a preset's.
tau includes the bonus token.

The batch-1 verdict of a pair on a machine is 01's, wherever it is printed (`pair_verdict`): 01's
recommended tree at 01's held-out tau and interval, priced by 01's own function
(`analysis.heldout.choose`) on 01's verify curve (CURVE_FILE in its run folder); 03 and 06 print it
as is, and beside it, without a verdict, what their own curves and tau make of the same tree
(`verdict_reading` says how those inputs differ)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import torch

from ..analysis.cost_model import batch_cost_table, step_cost
from ..analysis.heldout import choose
from ..io.tree_results import Earlier
from .batch_study import replayed_runs

PREFIX = "01:"
CURVE_FILE = "verify_curve.csv"  # notebook 01's verify-cost curve, in its run folder
DEFAULT_TOP_K = 16  # ranks `batch_study.replayed_runs` keeps for preset trees


def add_cost_rows(cost: pd.DataFrame, earlier: Earlier, curve: pd.DataFrame, target: str, draft: str) -> pd.DataFrame:
    """`cost` (a `cost_model.cost_table`) with rows for 01's trees on the same curves, each at the tau
    01 measured (held out; in-sample where nothing was), those within the curve's measured sizes
    only; `cost` itself without trees from 01."""
    if not earlier.trees:
        return cost
    model = step_cost(curve, target, draft)
    largest = int(model.verify_s.index.max())
    tau = earlier.heldout_tau()
    rows = [
        {"shape": PREFIX + name, **model.row(tree, tau[(name, budget)])}
        for (name, budget), tree in earlier.trees.items()
        if 0 < tree.num_nodes <= largest and (name, budget) in tau
    ]
    return pd.concat([cost, pd.DataFrame(rows)[list(cost.columns)]], ignore_index=True) if rows else cost


def batch_rows(
    earlier: Earlier,
    folder: Path,
    models: tuple[torch.nn.Module, torch.nn.Module],
    labels: tuple[str, str],
    prompts: Sequence[tuple[str, str, torch.Tensor]],
    curve: pd.DataFrame,
    batches: Sequence[int],
    max_new_tokens: int,
) -> pd.DataFrame:
    """`cost_model.batch_cost_table` rows of 01's trees, replayed on these prompts from the collection
    in `folder` (`batch_study.replayed_runs`, resumed when the notebook made it with the same
    settings); empty without trees from 01. models: (target, draft); labels: the curve's names for them."""
    if not earlier.trees:
        return pd.DataFrame()
    trees = {(PREFIX + name, budget): tree for (name, budget), tree in earlier.trees.items()}
    if (
        max(max(t.ranks, default=0) for t in trees.values()) >= DEFAULT_TOP_K
    ):  # the notebook's collection keeps fewer ranks
        folder = Path(folder).with_name(Path(folder).name + "_01")
    _, runs = replayed_runs(folder, *models, prompts, trees, max_new_tokens)
    return batch_cost_table(curve, trees, runs, batches, *labels)


def curve_01(earlier: Earlier) -> pd.DataFrame | None:
    """Notebook 01's verify-cost curve (CURVE_FILE in its run folder); None without one."""
    path = None if earlier.folder is None else earlier.folder / CURVE_FILE
    return pd.read_csv(path) if path is not None and path.exists() else None


def pair_verdict(
    earlier: Earlier, curve: pd.DataFrame | None = None, target: str | None = None, draft: str | None = None
) -> pd.Series | None:
    """01's recommended tree priced exactly as 01 priced it: `analysis.heldout.choose` on one row,
    the tree at 01's held-out tau and its 95% interval, on `curve` (default: 01's own, `curve_01`).
    A row of `choose` (expected_tau, t_draft_s, t_verify_s, baseline_tokens_per_s, speedup with
    speedup_ci_low and _high, verdict); None without a recommendation of 01 or a curve. target and
    draft: the curve's model names (default: its only target and its only draft)."""
    rec = None if earlier.results is None else earlier.results.recommendation
    curve = curve_01(earlier) if curve is None else curve
    if rec is None or curve is None or curve.empty:
        return None
    target = target or _only(curve, "target")
    draft = draft or _only(curve, "draft")
    t = rec.tree
    row = {
        "shape": t.name,
        "budget": t.budget,
        "fitted": t.fitted,
        "tau_in_sample": t.tau_in_sample,
        "tau_heldout": t.tau_heldout if t.tau_heldout == t.tau_heldout else t.tau_in_sample,
        "tau_heldout_ci_low": rec.tau_low,
        "tau_heldout_ci_high": rec.tau_high,
    }
    speed, _ = choose(pd.DataFrame([row]), {(t.name, t.budget): t.tree}, curve, target, draft)
    return None if speed.empty else speed.iloc[0]


def verdict_reading(
    earlier: Earlier, verdict: pd.Series | None, own: pd.Series | None = None, own_what: str = ""
) -> str:
    """Markdown: the pair's batch-1 verdict (`pair_verdict` on 01's curve) with its inputs, and, when
    given, this notebook's own price of the same tree (`own`: a `pair_verdict` or
    `cost_model.batch_cost_table` row) from `own_what`, with how its inputs differ: no verdict."""
    if verdict is None:
        return (
            f"**Batch-1 verdict: none here.** {earlier.note}. The verdict of a pair on a machine is notebook 01's "
            "(its recommended tree at its held-out tau with a 95% interval, priced on its verify curve): run 01 for "
            "this pair on this machine, or name its run folder in `acceptance_from`. The rows above rest on "
            "an assumed or one-sample tau without an interval, so they carry no verdict."
        )
    rec = earlier.results.recommendation
    curve = curve_01(earlier)
    out = (
        f"**Batch-1 verdict for {earlier.results.pair}** (one per pair and machine, the same as notebook 01's: "
        f"`analysis.heldout.choose` on 01's held-out tau and 01's verify curve, {earlier.folder}/{CURVE_FILE}"
        f"{_curve_label(curve)}): {verdict['shape']} with {int(verdict['budget'])} draft tokens, tau "
        f"{verdict['expected_tau']:.2f} [{verdict['tau_ci_low']:.2f}, {verdict['tau_ci_high']:.2f}], expected "
        f"{verdict['speedup']:.2f}x [{verdict['speedup_ci_low']:.2f}, {verdict['speedup_ci_high']:.2f}] the target "
        f"alone: **{verdict['verdict']}**"
    )
    if rec.measured_speedup is not None:
        out += f"; 01 measured {rec.measured_speedup:.2f}x on {rec.measured_prompts} prompts against the target alone"
    if rec.check:
        c = rec.check
        out += (
            f" (steady state, each prompt's first step left out: {c['measured']:.2f}x against {c['predicted']:.2f}x "
            f"[{c['low']:.2f}, {c['high']:.2f}] predicted on the cost model's points timed while it ran: {c['check']})"
        )
    if own is None:
        return out + "."
    tau = float(own["expected_tau"] if "expected_tau" in own else own["tau"])
    same = all(
        math.isclose(float(own[k]), float(verdict[k]), rel_tol=1e-9)
        for k in ("t_draft_s", "t_verify_s", "baseline_tokens_per_s")
    ) and math.isclose(tau, float(verdict["expected_tau"]), rel_tol=1e-9)
    return out + (
        f".\n\nThe same tree priced on {own_what}: {own['speedup']:.2f}x, not a verdict"
        + (
            " (the same inputs as 01's)."
            if same
            else f"; its inputs against 01's: tau {tau:.2f} vs {verdict['expected_tau']:.2f}, the target alone "
            f"{1e3 / own['baseline_tokens_per_s']:.0f} vs {1e3 / verdict['baseline_tokens_per_s']:.0f} ms a token, "
            f"its verification {own['t_verify_s'] * 1e3:.0f} vs {verdict['t_verify_s'] * 1e3:.0f} ms, the draft "
            f"{own['t_draft_s'] * 1e3:.0f} vs {verdict['t_draft_s'] * 1e3:.0f} ms a step."
        )
    )


def _only(curve: pd.DataFrame, role: str) -> str:
    names = sorted(set(curve.loc[curve["role"] == role, "model"]))
    if len(names) != 1:
        raise ValueError(f"the curve holds {len(names)} {role} models ({names}): name the one to price")
    return names[0]


def _curve_label(curve: pd.DataFrame | None) -> str:
    """ ": cache of P tokens, L linears, device D" from a verify curve's columns, where it has them."""
    if curve is None:
        return ""
    parts = [
        f"{label} {', '.join(str(v) for v in sorted(set(curve[col].astype(str))))}"
        for col, label in (("prefix", "cache of tokens:"), ("linear", "linears:"), ("device", "device:"))
        if col in curve
    ]
    return f" ({'; '.join(parts)})" if parts else ""


def batch_row(rows: pd.DataFrame, verdict: pd.Series | None, batch: int = 1) -> pd.Series | None:
    """The row of `batch_rows` (06's price at `batch`) of the tree `verdict` is about; None without one."""
    if verdict is None or rows.empty:
        return None
    mine = rows[
        (rows["batch"] == batch)
        & (rows["shape"] == PREFIX + str(verdict["shape"]))
        & (rows["budget"] == verdict["budget"])
    ]
    return None if mine.empty else mine.iloc[0]
