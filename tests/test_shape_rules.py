"""Shapes of the user's that fill any budget (`io.tree_spec.ShapeRule`, the {"widths": [...]} spec):
hand-checked fills, the full tree equal to `Tree.from_branching`, every fill a valid gap-free tree of
exactly n nodes equal to a brute-force sort of whole levels, fills nested as the budget grows, and
bad specs refused with what to change."""

from __future__ import annotations

import itertools
import math

import pytest

from specnb.core.trees import Tree
from specnb.io.tree_spec import MAX_NODES, ShapeRule, TreeSpecError, parse_custom_shapes, parse_custom_trees, parse_tree

WIDTHS = [(1,), (2,), (5,), (2, 1), (3, 2), (1, 3), (2, 2, 2), (3, 2, 1), (4, 1, 2), (2, 3, 1, 2), (1, 1, 4)]


def reference_fill(widths: tuple[int, ...], n: int) -> list[tuple[int, ...]]:
    """The filling rule written plainly: whole levels, each sorted by (rank sum, path), cut at n."""
    out: list[tuple[int, ...]] = []
    level: list[tuple[int, ...]] = [()]
    depth = 0
    while len(out) < n:
        width = widths[min(depth, len(widths) - 1)]
        level = sorted((p + (r,) for p in level for r in range(width)), key=lambda p: (sum(p), p))
        out += level[: n - len(out)]
        depth += 1
    return out


@pytest.mark.parametrize(
    ("widths", "n", "paths"),
    [
        ((2, 1), 1, [(0,)]),
        ((2, 1), 2, [(0,), (1,)]),
        ((2, 1), 3, [(0,), (1,), (0, 0)]),
        ((2, 1), 4, [(0,), (1,), (0, 0), (1, 0)]),
        ((2, 1), 5, [(0,), (1,), (0, 0), (1, 0), (0, 0, 0)]),
        ((2, 1), 8, [(0,), (1,), (0, 0), (1, 0), (0, 0, 0), (1, 0, 0), (0, 0, 0, 0), (1, 0, 0, 0)]),
        # rank sums (0, 0): 0, (0, 1): 1, (1, 0): 1, (1, 1): 2, (2, 0): 2: the lower sum first, ties by path
        ((3, 2), 5, [(0,), (1,), (2,), (0, 0), (0, 1)]),
        ((3, 2), 7, [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (1, 1)]),
        ((3, 2), 10, [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1), (0, 0, 0)]),
        # depth 3 under (0, 0) s0, (0, 1) s1, (1, 0) s1, (1, 1) s2: (0, 0, 0) s0, then three of sum 1 by path
        ((2, 2), 10, [(0,), (1,), (0, 0), (0, 1), (1, 0), (1, 1), (0, 0, 0), (0, 0, 1), (0, 1, 0), (1, 0, 0)]),
        ((1, 3), 4, [(0,), (0, 0), (0, 1), (0, 2)]),
        ((1, 3), 6, [(0,), (0, 0), (0, 1), (0, 2), (0, 0, 0), (0, 0, 1)]),  # width 3 repeats past the list
    ],
)
def test_hand_checked_fills(widths, n, paths):
    assert ShapeRule(widths).fill(n) == Tree.from_paths(paths)


@pytest.mark.parametrize("widths", WIDTHS + [(8, 8), (3, 3, 3, 3)])
def test_the_full_size_is_the_branching_tree(widths):
    rule = ShapeRule(widths)
    assert rule.full_size == Tree.from_branching(widths).num_nodes
    assert rule.fill(rule.full_size) == Tree.from_branching(widths)


@pytest.mark.parametrize("widths", WIDTHS)
def test_every_fill_is_the_rule_and_a_valid_gap_free_tree(widths):
    rule = ShapeRule(widths)
    for n in range(1, 65):
        tree = rule.fill(n)
        assert tree.num_nodes == n
        assert not tree.has_rank_gaps
        assert all(p[:-1] in set(tree.paths) for p in tree.paths if len(p) > 1)  # every parent present
        assert all(p[-1] < rule.width(len(p) - 1) for p in tree.paths)
        for depth in range(1, tree.depth):  # every level above the last is complete
            assert len(tree.level(depth)) == math.prod(rule.width(d) for d in range(depth))
        assert tree == Tree.from_paths(reference_fill(rule.widths, n))


@pytest.mark.parametrize("widths", WIDTHS)
def test_fills_are_nested_as_the_budget_grows(widths):
    rule = ShapeRule(widths)
    for n in range(1, 64):
        assert set(rule.fill(n).paths) <= set(rule.fill(n + 1).paths)


def test_huge_widths_fill_the_largest_budget_quickly():
    assert ShapeRule((10**9, 10**9)).fill(MAX_NODES).num_nodes == MAX_NODES
    assert ShapeRule((512, 512)).fill(MAX_NODES).level(2) == range(512, 1024)


@pytest.mark.parametrize(
    ("widths", "line"),
    [
        ((3, 2, 1), "widths 3, 2, 1 per depth (then 1), filled level by level in rank order"),
        ((4,), "widths 4 per depth (then 4), filled level by level in rank order"),
    ],
)
def test_describe(widths, line):
    assert ShapeRule(widths).describe() == line


def test_parse_custom_shapes_returns_the_rules_and_parse_custom_trees_the_fixed_trees():
    specs = {
        "mine": [[0], [1], [0, 0]],
        "two_one": {"branching": [2, 1]},
        "grow": {"widths": [3, 2, 1]},
        "pair": {"widths": (2.0, "1")},
    }
    assert parse_custom_shapes(specs) == {"grow": ShapeRule((3, 2, 1)), "pair": ShapeRule((2, 1))}
    assert parse_custom_trees(specs) == {
        "mine": Tree.from_paths([(0,), (1,), (0, 0)]),
        "two_one": Tree.from_branching([2, 1]),
    }
    assert parse_custom_shapes(None) == parse_custom_shapes({}) == {}


@pytest.mark.parametrize(
    ("widths", "nodes"), [([3, 2, 1], 15), ([2, 2], 6), ([8, 8, 8, 8], MAX_NODES), ([10**6, 10**6], MAX_NODES)]
)
def test_parse_tree_gives_a_widths_spec_its_listed_levels_capped(widths, nodes):
    tree = parse_tree("grow", {"widths": widths})
    assert tree == ShapeRule(tuple(widths)).fill(nodes)
    if nodes < MAX_NODES:
        assert tree == Tree.from_branching(widths)


@pytest.mark.parametrize(
    ("name", "spec", "message"),
    [
        ("grow", {"widths": []}, "at least one whole number"),
        ("grow", {"widths": [2, 0]}, "each >= 1"),
        ("grow", {"widths": [-1]}, "each >= 1"),
        ("grow", {"widths": [2.5]}, "whole numbers >= 1"),
        ("grow", {"widths": [True, 1]}, "whole numbers >= 1"),
        ("grow", {"widths": ["two"]}, "whole numbers >= 1"),
        ("grow", {"widths": "321"}, "a list of whole numbers"),
        ("grow", {"widths": 3}, "a list of whole numbers"),
        ("grow", {"widths": [2], "paths": [[0]]}, "one key 'widths'"),
        ("chain", {"widths": [2]}, "the name is a preset's"),
        ("oracle", {"widths": [2]}, "tables use that name"),
        ("My-Tree", {"widths": [2]}, "methods cannot name it"),
    ],
)
def test_bad_widths_specs_are_refused_with_what_to_change(name, spec, message):
    for parse in (parse_custom_shapes, parse_custom_trees, lambda specs: parse_tree(name, specs[name])):
        with pytest.raises(TreeSpecError, match=message):
            parse({name: spec})


def test_parse_custom_shapes_refuses_a_list():
    with pytest.raises(TreeSpecError, match="maps names to specs"):
        parse_custom_shapes([{"widths": [2]}])


@pytest.mark.parametrize("budget", [0, -1, MAX_NODES + 1, 2.0, True])
def test_fill_refuses_a_budget_outside_the_range(budget):
    with pytest.raises(TreeSpecError, match=f"1 to {MAX_NODES} draft tokens"):
        ShapeRule((2, 1)).fill(budget)


def test_a_rule_is_an_immutable_hashable_value():
    rule = ShapeRule([3, 2, 1])
    assert rule.widths == (3, 2, 1) and rule == ShapeRule((3, 2, 1)) and hash(rule) == hash(ShapeRule((3, 2, 1)))
    with pytest.raises(AttributeError):
        rule.widths = (1,)  # type: ignore[misc]
    assert list(itertools.islice((rule.width(d) for d in itertools.count()), 5)) == [3, 2, 1, 1, 1]
