"""The cost model of a speculative step (Sequoia, Chen et al. 2024): expected tokens per second of a
tree on the device where the verify-cost curves were measured (`bench.verify_curve`).

    expected_tau       expected tokens per target call, bonus included, under a per-rank acceptance
                       vector (Sequoia's positional assumption)
    draft_seconds      the draft's time for a tree: the root's forward plus one per level fed
    draft_widths       the level widths to time for a set of trees
    StepCost, step_cost   seconds of one step from the measured curves: t_draft(tree) + t_verify(n)
    cost_table         expected tokens/s = tau / (t_draft + t_verify) per shape and budget
    batch_cost_table   the same at batch sizes B from the batched curves (`bench.batch_curve`) and
                       each prompt's replayed steps (rows leave the batch as they finish):
                       tokens/s per row and in all, against the target alone at the same B
    best_budgets       per batch size (and shape), the budget of the highest expected tokens/s

Pure: tables in, tables out; no model, no disk.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..core.trees import Tree


def expected_tau(tree: Tree, acceptance: Sequence[float]) -> float:
    """Expected tokens per target call, bonus included, if the rank-r child of an accepted node is
    accepted with probability acceptance[r] (Sequoia's positional assumption): 1 + the sum over
    nodes of the product of acceptance[rank] along the node's path. Ranks beyond the vector: 0."""
    value: list[float] = []
    for parent, rank in zip(tree.parents, tree.ranks):
        a = acceptance[rank] if rank < len(acceptance) else 0.0
        value.append(a * (value[parent] if parent >= 0 else 1.0))
    return 1.0 + sum(value)


def draft_seconds(tree: Tree, draft_width_s: Callable[[int], float]) -> float:
    """Draft time of one step: the root's forward plus one forward per level fed (the nodes that
    have children; leaves are only chosen), each costing `draft_width_s(width)`."""
    return float(sum(draft_width_s(w) for w in tree.draft_widths))


def draft_widths(trees: Iterable[Tree]) -> list[int]:
    """Powers of two from 1 up to the widest fed level of any of `trees`: the draft forward widths
    to time (`StepCost` interpolates between them)."""
    widest = max([1] + [len(level.fed) for tree in trees for level in tree.levels])
    return [2**i for i in range(math.ceil(math.log2(widest)) + 1)]


@dataclass(frozen=True)
class StepCost:
    """Seconds of one speculative step on the measured device, read from the curves.

    t_verify(n): the target's "verify" rows at n nodes (trees of any shape with n nodes: the
    attention is dense, so the shape hardly changes the time), linearly interpolated between
    measured n; the draft's time per level of width w is interpolated from its plain-forward rows.
    """

    verify_s: pd.Series  # median seconds of one verification, indexed by nodes (0 = plain decoding)
    draft_width_s: pd.Series  # median seconds of one draft forward, indexed by its width in tokens
    target: str
    draft: str

    def t_verify(self, n: int) -> float:
        if n in self.verify_s.index:
            return float(self.verify_s.loc[n])
        return float(np.interp(n, self.verify_s.index.to_numpy(), self.verify_s.to_numpy()))

    def t_draft(self, tree: Tree) -> float:
        return draft_seconds(tree, self.t_draft_width)

    def t_draft_width(self, width: int) -> float:
        """One draft forward of `width` tokens, interpolated between the measured widths."""
        widths = self.draft_width_s
        return float(np.interp(width, widths.index.to_numpy(), widths.to_numpy()))

    def row(self, tree: Tree, tau: float) -> dict[str, float | int | str]:
        """Expected speed of `tree` at `tau` tokens per target call (bonus included)."""
        base = self.t_verify(0)
        t_draft = self.t_draft(tree)
        t_verify = self.t_verify(tree.num_nodes)
        t_step = t_draft + t_verify
        return {
            "target": self.target,
            "draft": self.draft,
            "nodes": tree.num_nodes,
            "depth": tree.depth,
            "leaves": len(tree.leaves),
            "expected_tau": tau,
            "t_draft_s": t_draft,
            "t_draft_chain_s": tree.depth * self.t_draft(Tree.chain(1)),
            "t_verify_s": t_verify,
            "t_step_s": t_step,
            "tokens_per_s": tau / t_step,
            "baseline_tokens_per_s": 1.0 / base,
            "speedup": tau / t_step * base,
        }


def step_cost(curve: pd.DataFrame, target: str, draft: str) -> StepCost:
    """The step-time model of `target` verifying and `draft` drafting, from `verify_curve` rows."""
    v = curve[(curve["model"] == target) & (curve["role"] == "target") & (curve["kind"] == "verify")]
    d = curve[(curve["model"] == draft) & (curve["role"] == "draft")]
    if v.empty or d.empty or 0 not in set(v["nodes"]):
        raise ValueError("cost_table needs the target's verify curve including n = 0 and the draft's forward curve")
    t_verify = v.groupby("nodes")["median_s"].median().sort_index()
    widths = d.groupby("tokens")["median_s"].median().sort_index()
    return StepCost(t_verify, widths, target, draft)


def cost_table(
    curve: pd.DataFrame,
    shapes: Sequence[str],
    acceptance: Sequence[float],
    target: str,
    draft: str,
    custom: Mapping[str, Tree] | None = None,
) -> pd.DataFrame:
    """Expected tokens/s per (tree shape, nodes) from the measured curves (see `StepCost`), with
    tau from the acceptance vector (`expected_tau`), at every measured n > 0; each custom tree
    (name -> `Tree`) at its own node count (t_verify interpolated). speedup = tokens/s over the
    target's own decoding, 1 / t_verify(0)."""
    cost = step_cost(curve, target, draft)
    named = [(s, Tree.preset(s, int(n))) for s in shapes for n in sorted(cost.verify_s.index) if n > 0]
    named += list((custom or {}).items())
    rows = [{"shape": shape, **cost.row(tree, expected_tau(tree, acceptance))} for shape, tree in named]
    return pd.DataFrame(rows)[_COST_COLUMNS]


_COST_COLUMNS = [
    "target",
    "draft",
    "shape",
    "nodes",
    "depth",
    "leaves",
    "expected_tau",
    "t_draft_s",
    "t_draft_chain_s",
    "t_verify_s",
    "t_step_s",
    "tokens_per_s",
    "baseline_tokens_per_s",
    "speedup",
]


def batch_cost_table(
    curve: pd.DataFrame,
    trees: Mapping[tuple[str, int], Tree],
    runs: Mapping[tuple[str, int], Sequence[tuple[int, int]]],
    batches: Sequence[int],
    target: str,
    draft: str,
) -> pd.DataFrame:
    """Expected tokens/s of each (shape, budget) tree at each batch size B, from the batched curves
    (rows of `bench.batch_curve`) and, per prompt in order, the (tokens, steps) a greedy run of that
    tree makes (`runs`, replayed: under greedy decoding a row's steps do not depend on the rows
    beside it). A batch of B holds the first B prompts.

    A batched step (`core.batch`) costs t_step(b) = t_draft(b) + t_verify(b, n) with b the rows
    still running: the target verifies b x (n + 1) tokens; the draft first feeds each row what it
    lacks (a block of ceil(tau) tokens per row, an approximation: the block is as wide as the row
    that accepted most), then one forward per fed level (b x its width). Rows finish after
    different numbers of steps and leave the batch, so the batch's time is the sum over its steps
    of t_step(rows still running), t_step interpolated between the measured batch sizes. tau: the
    B prompts' tokens over their steps (per row, bonus included); tokens/s in all: their tokens
    over that time, per row: that / B; speedup: over the target alone at the same B (B rows, one
    decoding step each per token: B / t_verify(B, 0) tokens/s)."""
    curves = _BatchCurves(curve, target, draft)
    rows = []
    for (shape, budget), tree in trees.items():
        fed = [len(level.fed) for level in tree.levels if level.fed]
        for b in batches:
            chosen = list(runs[(shape, budget)])[:b]
            tokens, steps = sum(t for t, _ in chosen), [s for _, s in chosen]
            tau = tokens / sum(steps)
            seconds = 0.0
            for step in range(max(steps)):
                d, v = curves.step(sum(s > step for s in steps), tau, fed, tree.num_nodes)
                seconds = seconds + d + v
            full_draft, full_verify = curves.step(b, tau, fed, tree.num_nodes)
            base = curves.at(curves.verify_at, b, 0)
            rows.append(
                {
                    "target": target,
                    "draft": draft,
                    "batch": b,
                    "shape": shape,
                    "budget": budget,
                    "nodes": tree.num_nodes,
                    "depth": tree.depth,
                    "tau": tau,
                    "steps": max(steps),
                    "t_draft_s": full_draft,
                    "t_verify_s": full_verify,
                    "t_step_s": full_draft + full_verify,
                    "seconds": seconds,
                    "tokens_per_s": tokens / seconds,
                    "tokens_per_s_row": tokens / seconds / b,
                    "baseline_tokens_per_s": b / base,
                    "speedup": tokens / seconds * base / b,
                }
            )
    return pd.DataFrame(rows)


class _BatchCurves:
    """One pair's batched curves (rows of `bench.batch_curve`) by measured batch size: the target's
    verify seconds by tree size and the draft's forward seconds by width."""

    def __init__(self, curve: pd.DataFrame, target: str, draft: str) -> None:
        self.measured = sorted(int(x) for x in curve["batch"].unique())
        self.verify_at: dict[int, pd.Series] = {}
        self.width_at: dict[int, pd.Series] = {}
        for b in self.measured:
            at = curve[curve["batch"] == b]
            self.verify_at[b] = (
                at[(at["model"] == target) & (at["role"] == "target")]
                .groupby("nodes")["median_s"]
                .median()
                .sort_index()
            )
            self.width_at[b] = (
                at[(at["model"] == draft) & (at["role"] == "draft")].groupby("nodes")["median_s"].median().sort_index()
            )
            if self.verify_at[b].empty or self.width_at[b].empty or 0 not in self.verify_at[b].index:
                raise ValueError(
                    f"batch {b}: the curve needs the target's verify rows (n = 0 included) and the draft's"
                )

    def at(self, table: dict[int, pd.Series], b: float, x: float) -> float:
        """The curve's seconds at x (nodes or width), interpolated in x, then in the batch size."""
        ys = [float(np.interp(x, table[m].index.to_numpy(), table[m].to_numpy())) for m in self.measured]
        return float(np.interp(b, self.measured, ys))

    def step(self, active: int, tau: float, fed: Sequence[int], nodes: int) -> tuple[float, float]:
        """(t_draft, t_verify) of one step with `active` rows: the draft feeds a block of ceil(tau)
        tokens per row and then each fed level's width; the target verifies `nodes` per row."""
        t_draft = self.at(self.width_at, active, math.ceil(tau)) + sum(self.at(self.width_at, active, w) for w in fed)
        return t_draft, self.at(self.verify_at, active, nodes)


def best_budgets(table: pd.DataFrame, by: Sequence[str] = ("batch",)) -> pd.DataFrame:
    """Per group of `by` (default: each batch size), the row of the highest expected tokens/s."""
    return table.loc[table.groupby(list(by), sort=True)["tokens_per_s"].idxmax()].reset_index(drop=True)
