"""Data-driven trees as pure functions: Sequoia's programme against a brute-force search over every
tree, against best-first where that is optimal; the hindsight tree against every tree on counted
data; the budget recommendation against the cost model's arithmetic."""

from __future__ import annotations

import random

import pandas as pd
import pytest

from specnb import Tree
from specnb.analysis.cost_model import expected_tau
from specnb.analysis.tree_design import (
    accepted_lengths,
    expected_accepted,
    hindsight_trees,
    prefix_value,
    recommend_budget,
    sequoia_trees,
)
from specnb.core.trees import SPARSE_ACCEPTANCE
from specnb.notebook.readings import recommendation


def all_trees(n: int, k: int, gaps: bool, max_depth: int | None = None) -> set[frozenset]:
    """Every tree of exactly n nodes with ranks < k (as sets of rank paths): grown one node at a
    time from every smaller tree, so nothing is missed."""
    trees = {frozenset()}
    for _ in range(n):
        grown = set()
        for t in trees:
            for parent in [()] + list(t):
                if max_depth is not None and len(parent) >= max_depth:
                    continue
                for r in range(k):
                    child = parent + (r,)
                    if child in t:
                        continue
                    if not gaps and r > 0 and parent + (r - 1,) not in t:
                        continue
                    grown.add(t | {child})
        trees = grown
    return trees


def test_enumeration_counts_small_trees():
    # gap-free trees with unbounded fan-out are ordered trees: Catalan numbers 1, 2, 5, 14
    assert [len(all_trees(n, n, gaps=False)) for n in (1, 2, 3, 4)] == [1, 2, 5, 14]
    assert len(all_trees(2, 2, gaps=True)) == 1 + 2 * 2  # both root children, or one and a child of it


VECTORS = {
    "monotone": (0.6, 0.25, 0.1),
    "sparse": SPARSE_ACCEPTANCE[:3],
    "not_monotone": (0.2, 0.7, 0.5),
    "with_zero": (0.5, 0.0, 0.4),
}


@pytest.mark.parametrize("max_depth", [None, 2])
@pytest.mark.parametrize("name", list(VECTORS))
def test_sequoia_equals_brute_force(name, max_depth):
    acc = VECTORS[name]
    trees = sequoia_trees(acc, 6, max_depth)
    for n in range(1, 7):
        best = max(expected_accepted(Tree.from_paths(t), acc) for t in all_trees(n, len(acc), False, max_depth))
        assert trees[n].num_nodes == n and not trees[n].has_rank_gaps
        assert max_depth is None or trees[n].depth <= max_depth
        assert expected_accepted(trees[n], acc) == pytest.approx(best, abs=1e-12), n


def test_sequoia_hand_checked():
    assert sequoia_trees((0.5,), 3)[3] == Tree.chain(3)  # one rank only: the chain, .5 + .25 + .125
    trees = sequoia_trees((0.9, 0.5), 3)
    assert trees[2] == Tree.chain(2)  # .9 + .81 beats .9 + .5
    assert trees[3] == Tree.chain(3)  # .9 + .81 + .729 beats .9 + .5 + .81
    trees = sequoia_trees((0.6, 0.5), 3)
    assert trees[3].paths == ((0,), (1,), (0, 0))  # .6 + .5 + .36 beats .6 + .36 + .216 and .6 + .36 + .3


@pytest.mark.parametrize("max_depth", [None, 3, 6])
def test_sequoia_equals_best_first_for_monotone_vectors(max_depth):
    """Non-increasing node values make best-first optimal too: the two agree on every budget."""
    trees = sequoia_trees(SPARSE_ACCEPTANCE, 128, max_depth)
    assert sorted(trees) == list(range(1, 129))
    values = [expected_accepted(trees[n], SPARSE_ACCEPTANCE) for n in range(1, 129)]
    assert values == sorted(values)
    for n in (1, 2, 7, 16, 33, 64, 128):
        assert trees[n].num_nodes == n
        greedy = Tree.best_first(n, SPARSE_ACCEPTANCE, max_depth=max_depth)
        assert values[n - 1] == pytest.approx(expected_accepted(greedy, SPARSE_ACCEPTANCE), rel=1e-12)


def test_sequoia_never_loses_to_best_first_and_respects_limits():
    rng = random.Random(0)
    for _ in range(20):
        acc = tuple(rng.uniform(0.01, 0.9) for _ in range(4))
        trees = sequoia_trees(acc, 12)
        for n in (3, 6, 12):
            assert expected_accepted(trees[n], acc) >= expected_accepted(Tree.best_first(n, acc), acc) - 1e-12
    assert sorted(sequoia_trees((0.5, 0.4), 10, max_depth=2)) == [1, 2, 3, 4, 5, 6]  # at most 2 + 4 nodes
    assert expected_accepted(Tree.chain(2), (0.5,)) == expected_tau(Tree.chain(2), (0.5,)) - 1
    with pytest.raises(ValueError):
        sequoia_trees((1.5,), 4)


def random_counts(seed: int, positions: int = 40, k: int = 3, depth: int = 4) -> dict:
    """Prefix counts of random continuation rank paths, as `replay.prefix_counts` makes them."""
    rng = random.Random(seed)
    counts: dict = {}
    for _ in range(positions):
        path = ()
        for _ in range(rng.randint(0, depth)):
            path = path + (min(int(rng.expovariate(1.2)), k - 1),)
            counts[path] = counts.get(path, 0) + 1
    return counts


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_hindsight_tree_equals_brute_force(seed):
    counts = random_counts(seed)
    trees = hindsight_trees(counts, range(1, 6))
    for n in range(1, 6):
        best = max(prefix_value(Tree.from_paths(t), counts) for t in all_trees(n, 3, gaps=True))
        assert trees[n].num_nodes == n
        assert prefix_value(trees[n], counts) == best


def test_hindsight_tree_fills_to_the_budget_with_unused_nodes():
    counts = {(0,): 5, (0, 0): 2, (1,): 1}
    trees = hindsight_trees(counts, [2, 3, 6])
    assert trees[2].paths == ((0,), (0, 0))
    assert set(trees[3].paths) == {(0,), (1,), (0, 0)}
    assert trees[6].num_nodes == 6 and prefix_value(trees[6], counts) == 8
    assert set(trees[3].paths) <= set(trees[6].paths)


def test_recommend_budget_maximises_tau_over_step_time():
    curve = pd.DataFrame(
        [
            {"model": "t", "role": "target", "kind": "verify", "nodes": n, "tokens": n + 1, "median_s": 1.0 + 0.1 * n}
            for n in (0, 4, 16)
        ]
        + [{"model": "d", "role": "draft", "kind": "plain", "nodes": w, "tokens": w, "median_s": 0.05} for w in (1, 16)]
    )
    trees = {("chain", 4): Tree.chain(4), ("wide", 16): Tree.wide(16), ("kary2", 8): Tree.kary(2, 8)}
    replayed = pd.DataFrame([{"shape": s, "budget": b, "tau": tau} for (s, b), tau in zip(trees, (2.0, 1.9, 2.2))])
    cost = recommend_budget(replayed, trees, curve, "t", "d")
    # chain 4: 2.0 / (4 * .05 + 1.4); wide 16: 1.9 / (.05 + 2.6); kary2 8: 2.2 / (3 * .05 + 1.8) (interpolated)
    expect = {"chain": 2.0 / 1.6, "wide": 1.9 / 2.65, "kary2": 2.2 / 1.95}
    assert dict(zip(cost["shape"], cost["tokens_per_s"])) == pytest.approx(expect)
    assert cost.iloc[0]["shape"] == "chain" and cost.iloc[0]["speedup"] == pytest.approx(2.0 / 1.6)
    assert "chain with 4 draft tokens" in recommendation(cost)


def test_accepted_lengths_hand_checked():
    """The longest prefix of each rank path that is a node path; -1 (no token) ends a path."""
    tree = Tree.from_paths([(0,), (1,), (0, 0), (0, 1), (0, 0, 0)])
    paths = [[0, 0, 0, 5], [0, 1, 0, 0], [1, 0, 0, 0], [2, 0, 0, 0], [0, 0, -1, 0], [0, 0, 0, 0], [1, -1, -1, -1]]
    assert accepted_lengths(paths, tree).tolist() == [3, 2, 1, 0, 2, 3, 1]
