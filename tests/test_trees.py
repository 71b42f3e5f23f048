import random

import pytest
import torch

from specnb import Tree


def test_hand_checked_small_tree():
    #        root
    #       /    \
    #     (0)    (1)
    #    /   \      \
    # (0,0) (0,1)  (1,0)
    #   |
    # (0,0,0)
    tree = Tree.from_paths([(1, 0), (0,), (0, 0, 0), (0, 1), (1,), (0, 0)])
    assert tree.paths == ((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0))
    assert tree.parents == (-1, -1, 0, 0, 1, 2)
    assert tree.depths == (1, 1, 2, 2, 2, 3)
    assert tree.ranks == (0, 1, 0, 1, 0, 0)
    assert tree.num_nodes == 6 and tree.depth == 3
    assert tree.children == ((0, 1), (2, 3), (4,), (5,), (), (), ())
    assert tree.leaves == (3, 4, 5)
    assert tree.leaf_paths == ((0, 3), (1, 4), (0, 2, 5))
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0],
            [0, 1, 0, 0, 0, 0],
            [1, 0, 1, 0, 0, 0],
            [1, 0, 0, 1, 0, 0],
            [0, 1, 0, 0, 1, 0],
            [1, 0, 1, 0, 0, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(tree.ancestor_mask(), expected)
    assert tree.position_offsets().tolist() == [1, 1, 2, 2, 2, 3]
    assert tree.level(2) == range(2, 5)
    assert tree.truncated(1).paths == ((0,), (1,))


def test_hand_checked_chain_and_wide():
    chain = Tree.chain(3)
    assert chain.paths == ((0,), (0, 0), (0, 0, 0))
    assert torch.equal(chain.ancestor_mask(), torch.tril(torch.ones(3, 3, dtype=torch.bool)))
    wide = Tree.wide(3)
    assert wide.paths == ((0,), (1,), (2,))
    assert torch.equal(wide.ancestor_mask(), torch.eye(3, dtype=torch.bool))
    assert wide.depth == 1 and wide.leaves == (0, 1, 2)


def test_from_parents_canonicalises():
    # input order: 0:(0,) 1:(0,0) 2:(1,) 3:(0,1)  -> canonical (0,),(1,),(0,0),(0,1)
    tree = Tree.from_parents([-1, 0, -1, 0])
    assert tree.paths == ((0,), (1,), (0, 0), (0, 1))
    assert tree.parents == (-1, -1, 0, 0)


@pytest.mark.parametrize(
    "make, n, depth",
    [
        (lambda n: Tree.chain(n), 7, 7),
        (lambda n: Tree.kary(2, n), 7, 3),
        (lambda n: Tree.kary(3, n), 13, 3),
        (lambda n: Tree.wide(n), 9, 1),
        (lambda n: Tree.beams(3, n), 10, 4),
        (lambda n: Tree.sparse(n), 16, None),
    ],
)
def test_presets_fill_the_budget(make, n, depth):
    tree = make(n)
    assert tree.num_nodes == n
    if depth is not None:
        assert tree.depth == depth
    assert not tree.has_rank_gaps
    assert Tree.from_paths(tree.paths) == tree


def test_beams_are_independent_chains():
    tree = Tree.beams(3, 7)
    assert tree.paths == ((0,), (1,), (2,), (0, 0), (1, 0), (2, 0), (0, 0, 0))


def test_sparse_favours_higher_ranked_parents():
    tree = Tree.sparse(32)
    subtree = {r: sum(1 for p in tree.paths if p[0] == r) for r in range(3)}
    assert subtree[0] > subtree[1] > subtree[2] > 0
    assert tree.depth > Tree.kary(2, 32).depth  # deeper along the likely branch


def test_best_first_is_optimal_for_monotone_vector():
    # exhaustive over all trees of 4 nodes with ranks < 3, depth <= 4
    acc = (0.6, 0.25, 0.1)

    def value(paths):
        total = 0.0
        for p in paths:
            v = 1.0
            for r in p:
                v *= acc[r]
            total += v
        return total

    candidates = [(a,) for a in range(3)]
    candidates += [c + (b,) for c in list(candidates) for b in range(3)]
    candidates += [c + (b,) for c in candidates if len(c) == 2 for b in range(3)]
    import itertools

    best = 0.0
    for combo in itertools.combinations(candidates, 4):
        s = set(combo)
        if all(len(p) == 1 or p[:-1] in s for p in combo):
            best = max(best, value(combo))
    assert value(Tree.best_first(4, acc).paths) == pytest.approx(best)


def random_tree(seed: int, n: int) -> Tree:
    rng = random.Random(seed)
    return Tree.from_parents([rng.randint(-1, i - 1) for i in range(n)])


@pytest.mark.parametrize("seed", range(25))
def test_random_trees_are_consistent(seed):
    tree = random_tree(seed, n=1 + seed % 13)
    mask = tree.ancestor_mask()
    for i in range(tree.num_nodes):
        ancestors = set(tree.node_path(i))
        assert set(torch.nonzero(mask[i]).flatten().tolist()) == ancestors
        assert mask[i].sum() == tree.depths[i]
        parent = tree.parents[i]
        assert parent < i  # canonical order is topological
        if parent >= 0:
            assert tree.depths[i] == tree.depths[parent] + 1
            assert tree.paths[i][:-1] == tree.paths[parent]
    assert Tree.from_paths(reversed(tree.paths)) == tree  # paths round-trip in any order
    assert Tree.from_parents(tree.parents) == tree
    assert sorted(tree.depths) == list(tree.depths)
    for d in range(tree.depth + 1):
        assert tree.truncated(d).paths == tuple(p for p in tree.paths if len(p) <= d)


@pytest.mark.parametrize(
    "paths, message",
    [
        ([(0,), ()], "empty path"),
        ([(0,), (0,)], "duplicate"),
        ([(0,), (-1,)], "negative rank"),
        ([(0,), (1, 0, 0)], "no parent"),
    ],
)
def test_invalid_paths_raise(paths, message):
    with pytest.raises(ValueError, match=message):
        Tree.from_paths(paths)


@pytest.mark.parametrize("parents", [[0], [-1, 1], [-1, 2, 0], [-2]])
def test_non_topological_parents_raise(parents):
    with pytest.raises(ValueError, match="topological"):
        Tree.from_parents(parents)


def test_bad_budgets_raise():
    with pytest.raises(ValueError):
        Tree.chain(-1)
    with pytest.raises(ValueError):
        Tree.kary(0, 4)
    with pytest.raises(ValueError):
        Tree.best_first(4, [0.5, 1.5])


def test_empty_tree_and_rank_gaps():
    assert Tree.chain(0).num_nodes == 0 and Tree.chain(0).depth == 0
    assert Tree.from_paths([(0,), (2,)]).has_rank_gaps


def test_presets_by_name():
    assert Tree.preset("chain", 4) == Tree.chain(4)
    assert Tree.preset("kary3", 7) == Tree.kary(3, 7)
    assert Tree.preset("beams2", 6) == Tree.beams(2, 6)
    assert Tree.preset("sparse", 9) == Tree.sparse(9)
    with pytest.raises(ValueError, match="unknown tree shape"):
        Tree.preset("karyx", 4)
