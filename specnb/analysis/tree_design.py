"""Data-driven draft trees: the best tree for a measured acceptance vector, the best static tree in
hindsight, and the budget that maximises expected tokens per second.

What it holds (pure functions: no model, no disk; the data come from `analysis.replay`):
    sequoia_trees      Sequoia's dynamic programme (Chen et al. 2024, Sec. 3.1): for every budget
                       n up to a maximum, the tree of n nodes (optionally of bounded depth) with the
                       most expected accepted tokens when the rank-r child of an accepted node is
                       accepted with probability a_r (the positional assumption), sibling ranks
                       without gaps (0..k-1, what lossless sampling needs)
    expected_accepted  that objective for any tree: sum over nodes of prod a_{rank} along the path
                       (= `cost_model.expected_tau` - 1; bonus token excluded)
    hindsight_trees    for every budget n, the static tree that would have accepted the most
                       draft tokens summed over EVERY collected position (the ceiling of static
                       trees' tau_all, in-sample; not of the run-trajectory tau, whose positions
                       depend on the tree): the top-n rank-path prefixes by how often the target's
                       continuation started with them
    accepted_lengths   a static tree's accepted draft tokens at each position, from the positions'
                       continuation rank paths (what greedy replay computes at every position)
    recommend_budget   with replayed tau per tree and the step-time model of `cost_model` (verify-cost
                       curve of the target, per-level cost of the draft), expected tokens/s per tree
                       and the budget that maximises it on the measured device

Conventions: acceptance length = accepted draft tokens per step (bonus EXCLUDED); tau = 1 + that
(bonus INCLUDED). Ties between trees of equal value break towards the canonical (depth, path) order.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from ..core.trees import Path, Tree
from .cost_model import StepCost, expected_tau, step_cost

_NEG = -np.inf


def expected_accepted(tree: Tree, acceptance: Sequence[float]) -> float:
    """Expected accepted draft tokens per step (bonus excluded) under the positional assumption."""
    return expected_tau(tree, acceptance) - 1.0


def sequoia_trees(
    acceptance: Sequence[float] | Sequence[Sequence[float]], max_nodes: int = 128, max_depth: int | None = None
) -> dict[int, Tree]:
    """For every n in 1..max_nodes, the gap-free tree of exactly n nodes (depth <= max_depth) that
    maximises `expected_accepted` under `acceptance` (a_r for rank r; ranks beyond it are unused).

    The programme (Sequoia, Chen et al. 2024): a node's subtree value is the sum over its children
    of a_rank * (1 + value of the child's own subtree). Let F_d(m) be the best value of m nodes
    below one node with d levels left, and G_d(i, m) the best value of m nodes spread over the
    children of rank i, i+1, ... (ranks used without gaps, so a forest that uses rank i + 1 also
    uses rank i):
        G_d(i, 0) = 0,   G_d(K, m > 0) = -inf,
        G_d(i, m) = max over s in 1..m of  a_i (1 + F_{d-1}(s - 1)) + G_d(i + 1, m - s),
        F_d(m) = G_d(0, m),   F_0(0) = 0,   F_0(m > 0) = -inf.
    Without a depth limit F no longer depends on d and is computed in increasing m (F(m) only needs
    F(0..m-1)). Cost O(depth * max_nodes^2 * K) numpy operations of size <= max_nodes, one pass
    for all budgets. Budgets the limits make impossible (more than sum_d K^d nodes) are left out.

    acceptance may also be per depth (a[d-1][r] for the rank-r child at depth d, e.g. Medusa heads,
    `head_collection.rank_accuracy`): depth is then at most len(a) and F_d uses depth's row.

    When `acceptance` is non-increasing, `Tree.best_first` finds the same value (node values then
    never exceed their parent's or elder sibling's, so the top-n nodes form a valid tree); this
    programme is also exact for vectors that are not monotone (measured ones can be noisy).
    """
    per_depth = len(acceptance) > 0 and isinstance(acceptance[0], (list, tuple, np.ndarray))
    rows = [[float(a) for a in row] for row in acceptance] if per_depth else [[float(a) for a in acceptance]]
    if not rows[0] or any(not 0.0 <= a <= 1.0 for row in rows for a in row):
        raise ValueError(f"acceptance values must lie in [0, 1], got {acceptance!r}")
    if per_depth:  # Medusa heads: depth d's rank-r child is accepted with probability a[d-1][r]
        if max_depth is not None and max_depth > len(rows):
            raise ValueError(f"a per-depth acceptance of {len(rows)} depths allows max_depth <= {len(rows)}")
        max_depth = len(rows) if max_depth is None else max_depth
    acc = rows[0]
    if max_nodes < 1:
        raise ValueError(f"max_nodes must be >= 1, got {max_nodes}")
    if max_depth is None:
        value, split = _forest(acc, max_nodes, below=None)
        splits = None
    else:
        if max_depth < 1:
            raise ValueError(f"max_depth must be >= 1, got {max_depth}")
        value = np.full(max_nodes + 1, _NEG)
        value[0] = 0.0
        splits = []
        for i in range(max_depth):  # level i from the bottom: children at depth max_depth - i
            value, split = _forest(rows[max_depth - 1 - i] if per_depth else acc, max_nodes, below=value)
            splits.append(split)
    out: dict[int, Tree] = {}
    for n in range(1, max_nodes + 1):
        if not np.isfinite(value[n]):
            continue
        paths: list[Path] = []
        if splits is None:
            _rebuild(lambda d: split, 0, n, (), paths)
        else:
            _rebuild(lambda d: splits[d - 1], max_depth, n, (), paths)
        out[n] = Tree.from_paths(paths)
    return out


def _forest(acc: list[float], n: int, below: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """One level of the programme: F(m) for m in 0..n and the chosen subtree sizes split[i, m].

    below: F_{d-1}, the value of a child's own forest by its size; None = unlimited depth, where a
    child's forest is valued by the table being filled (sizes < m are final when m is computed)."""
    k = len(acc)
    forest = np.full((k + 1, n + 1), _NEG)
    forest[:, 0] = 0.0
    split = np.zeros((k + 1, n + 1), dtype=np.int64)
    value = np.full(n + 1, _NEG)
    value[0] = 0.0
    child = value if below is None else below
    for m in range(1, n + 1):
        s = np.arange(1, m + 1)
        sub = child[s - 1]
        finite = np.isfinite(sub)
        for i in range(k - 1, -1, -1):
            gain = np.where(finite, acc[i] * (1.0 + np.where(finite, sub, 0.0)), _NEG)
            cand = gain + forest[i + 1, m - s]
            j = int(np.argmax(cand))  # first maximum: the smallest subtree for rank i on ties
            forest[i, m] = cand[j]
            split[i, m] = s[j]
        value[m] = forest[0, m]
    return value, split


def _rebuild(split_at, depth: int, m: int, prefix: Path, out: list[Path]) -> None:
    """Append the paths of the best forest of m nodes below `prefix` (depth levels left)."""
    rank = 0
    while m > 0:
        s = int(split_at(depth)[rank, m])
        path = prefix + (rank,)
        out.append(path)
        _rebuild(split_at, depth - 1, s - 1, path, out)
        m -= s
        rank += 1


def hindsight_trees(counts: Mapping[Path, int], budgets: Iterable[int]) -> dict[int, Tree]:
    """For each budget n, the static tree of n nodes with the most accepted draft tokens on the data
    `counts` describes: counts[v] = number of positions whose continuation rank path starts with v.

    Why the top-n prefixes by count are optimal: a static tree T accepts, at one position, the
    longest prefix of that position's rank path that is a node of T, i.e. as many tokens as T has
    nodes on that path; summed over positions, T accepts sum over v in T of counts[v]. A child's
    count never exceeds its parent's (a path starting with the child starts with the parent), so
    taking nodes in the order (count descending, then (depth, path)) always takes a parent before
    its child: the first n nodes are prefix-closed, hence a tree, and no n-node set (tree or not)
    has a larger sum. Nodes with count 0 (never on any continuation) are worth nothing; when fewer
    than n prefixes ever occurred, the tree is filled with count-0 nodes in canonical order so its
    budget, and its verification cost, are n. Ranks may have gaps (greedy decoding allows them).
    """
    order = sorted(((c, p) for p, c in counts.items() if c > 0), key=lambda cp: (-cp[0], len(cp[1]), cp[1]))
    ranked = [p for _, p in order]
    return {n: Tree.from_paths(_fill(ranked[:n], n)) for n in budgets}


def accepted_lengths(rank_paths: np.ndarray | Sequence[Sequence[int]], tree: Tree) -> np.ndarray:
    """Int [N]: the draft tokens `tree` accepts at each of N positions under greedy verification,
    the longest prefix of the position's continuation rank path that is a node path of the tree;
    rank_paths: int [N, D], entry d the rank of the continuation's token at depth d + 1 under the
    draft there, any negative value or a rank the tree lacks ending the path (no token, not drafted;
    a rank that stands for "not among the top k", as `training.eagle.chain_ranks` writes k, must
    exceed the tree's largest rank)."""
    nodes = set(tree.paths)
    out = np.zeros(len(rank_paths), dtype=np.int64)
    for i, path in enumerate(np.asarray(rank_paths).tolist()):
        d = 0
        while d < len(path) and path[d] >= 0 and tuple(path[: d + 1]) in nodes:
            d += 1
        out[i] = d
    return out


def prefix_value(tree: Tree, counts: Mapping[Path, int]) -> int:
    """Accepted draft tokens of `tree` summed over the positions `counts` describes."""
    return sum(counts.get(p, 0) for p in tree.paths)


def _fill(paths: list[Path], n: int) -> list[Path]:
    """`paths` (a tree) grown to n nodes with the canonically smallest free child each time."""
    paths = list(paths)
    have = set(paths)
    frontier: list[tuple[int, Path]] = []

    def push_next_child(parent: Path) -> None:
        r = 0
        while parent + (r,) in have:
            r += 1
        heapq.heappush(frontier, (len(parent) + 1, parent + (r,)))

    for p in [()] + paths:
        push_next_child(p)
    while len(paths) < n:
        _, path = heapq.heappop(frontier)
        if path in have:
            continue
        paths.append(path)
        have.add(path)
        push_next_child(path[:-1])
        push_next_child(path)
    return paths


def recommend_budget(
    replayed: pd.DataFrame, trees: Mapping[tuple[str, int], Tree], curve: pd.DataFrame, target: str, draft: str
) -> pd.DataFrame:
    """Expected tokens/s of each replayed tree on the device the curves were measured on.

    replayed: rows with shape, budget and tau (tokens per target call, bonus included), e.g. from
    `replay.replay`; trees: the same (shape, budget) keys; curve: `timing.verify_curve` rows of the
    target (kind "verify", n = 0 included) and of the draft (role "draft"). Returns the columns of
    `timing.cost_table` with expected_tau = the replayed tau, sorted by tokens/s, best first;
    `notebook.readings.recommendation` turns it into a sentence.
    """
    cost: StepCost = step_cost(curve, target, draft)
    rows = []
    for r in replayed.itertuples():
        tree = trees[(r.shape, int(r.budget))]
        rows.append({"shape": r.shape, "budget": int(r.budget), **cost.row(tree, float(r.tau))})
    out = pd.DataFrame(rows)
    return out.sort_values("tokens_per_s", ascending=False, kind="stable").reset_index(drop=True)


def medusa_tree(accuracy: Sequence[Sequence[float]], n: int) -> Tree:
    """Medusa's own tree search (`medusa/eval/gen_results.py`, `explore_graph`): from the root's
    rank-0 child, add n - 1 times the neighbour (next sibling, or first child) of a chosen node
    with the largest expected acceptance prod_d accuracy[d-1][r_d] (ties: canonical order).
    accuracy[d][r]: the share of positions whose depth-(d+1) token is head d+1's rank-r token
    (`head_collection.rank_accuracy`); depth <= len(accuracy), ranks < len(accuracy[d])."""
    acc = [[float(a) for a in row] for row in accuracy]
    if not acc or n < 1:
        raise ValueError("medusa_tree needs a non-empty accuracy table and n >= 1")
    value = lambda path: float(np.prod([acc[d][r] for d, r in enumerate(path)]))  # noqa: E731
    frontier: list[tuple[float, int, Path]] = [(-value((0,)), 1, (0,))]
    chosen: list[Path] = []
    while frontier and len(chosen) < n:
        _, depth, path = heapq.heappop(frontier)
        chosen.append(path)
        if path[-1] + 1 < len(acc[depth - 1]):
            sibling = path[:-1] + (path[-1] + 1,)
            heapq.heappush(frontier, (-value(sibling), depth, sibling))
        if depth < len(acc):
            heapq.heappush(frontier, (-value(path + (0,)), depth + 1, path + (0,)))
    return Tree.from_paths(chosen)
