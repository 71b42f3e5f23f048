"""Draft trees: their shape, canonical order, and the tensors verification needs.

A `Tree` holds the draft positions of one speculative step. The root, the last accepted token, is
implicit; node i is named by its *rank path* (Medusa's tree spec, Cai et al. 2024): entry d is the
sibling rank of the node at depth d+1, i.e. rank r = the draft's r-th most likely token after the
parent's path (in sampling mode, the r-th draw without replacement from q).

Canonical order is by (depth, path): depth-1 nodes first, and every node after its parent. Since
nodes are sorted by depth, the nodes of depth <= d are a prefix of the order; drafting level by
level and truncating a tree at a depth both rely on it.

Shape presets, each filled to a budget of n draft tokens:
    Tree.chain(n)          one sequence (the classic draft of Leviathan et al. 2023)
    Tree.kary(k, n)        the complete k-ary tree, filled breadth-first
    Tree.wide(n)           n siblings at depth 1
    Tree.beams(k, n)       k independent chains, one per depth-1 rank (SpecInfer-style beams)
    Tree.sparse(n)         Medusa-style: best-first under an assumed per-rank acceptance vector, so
                           higher-ranked parents get more children
    Tree.best_first(n, v)  the same for any acceptance vector v (Sequoia's positional assumption)
    Tree.preset(name, n)   any of the above by name ("chain", "kary2", "beams4", ...)

`TokenTrie` builds a tree from token sequences instead (n-gram continuations, merged drafts): one
node per distinct token path, identical prefixes shared, sibling ranks in order of first appearance.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import torch

Path = tuple[int, ...]

# Per-rank acceptance assumed by `Tree.sparse`: the top-1 child of an accepted node is accepted
# about half the time, lower ranks far less (the shape of measured vectors in Sequoia, Fig. 3).
SPARSE_ACCEPTANCE: tuple[float, ...] = (0.55, 0.2, 0.1, 0.06, 0.04, 0.03, 0.02, 0.015, 0.01, 0.01)


@dataclass(frozen=True)
class Tree:
    """An immutable draft tree; build it with `from_paths`, `from_parents` or a preset."""

    paths: tuple[Path, ...]
    # derived, filled in __post_init__; not part of equality or hashing
    parents: tuple[int, ...] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        paths = tuple(tuple(int(r) for r in p) for p in self.paths)
        _check_paths(paths)
        order = sorted(paths, key=lambda p: (len(p), p))
        if order != list(paths):
            raise ValueError("Tree paths must be in canonical (depth, path) order; use Tree.from_paths")
        index = {p: i for i, p in enumerate(paths)}
        object.__setattr__(self, "paths", paths)
        object.__setattr__(self, "parents", tuple(index.get(p[:-1], -1) for p in paths))

    # ---- construction -------------------------------------------------------------------------

    @classmethod
    def from_paths(cls, paths: Iterable[Sequence[int]]) -> Tree:
        """Tree from Medusa-style rank paths, in any order, e.g. [(0,), (1,), (0, 0)]."""
        checked = [tuple(int(r) for r in p) for p in paths]
        _check_paths(tuple(checked))
        return cls(tuple(sorted(checked, key=lambda p: (len(p), p))))

    @classmethod
    def from_parents(cls, parents: Sequence[int]) -> Tree:
        """Tree from a parents list (-1 = child of the root) in topological order.

        Sibling ranks follow the order of appearance. The result is in canonical order, which may
        differ from the input's order: read `tree.parents` for the canonical parents list.
        """
        paths: list[Path] = []
        num_children: dict[int, int] = {}
        for i, parent in enumerate(parents):
            parent = int(parent)
            if parent < -1 or parent >= i:
                raise ValueError(
                    f"parents[{i}] = {parent}: a parent must be -1 (the root) or an earlier node "
                    f"(0..{i - 1}); the list must be topological"
                )
            rank = num_children.get(parent, 0)
            num_children[parent] = rank + 1
            paths.append((paths[parent] if parent >= 0 else ()) + (rank,))
        return cls.from_paths(paths)

    # ---- presets ------------------------------------------------------------------------------

    @classmethod
    def chain(cls, n: int) -> Tree:
        """A single sequence of n draft tokens."""
        return cls(tuple((0,) * d for d in range(1, _budget(n) + 1)))

    @classmethod
    def kary(cls, k: int, n: int) -> Tree:
        """The first n nodes, breadth-first, of the complete k-ary tree."""
        if k < 1:
            raise ValueError(f"k-ary tree needs k >= 1, got {k}")
        n = _budget(n)
        paths: list[Path] = []
        level: list[Path] = [()]
        while len(paths) < n:
            level = [p + (r,) for p in level for r in range(k)]
            paths.extend(level[: n - len(paths)])
        return cls(tuple(paths))

    @classmethod
    def from_branching(cls, widths: Sequence[int]) -> Tree:
        """The tree with widths[d] children under every node of depth d (the root is depth 0):
        `from_branching([3, 2, 1])` has 3 nodes at depth 1, 6 at depth 2 and 6 at depth 3."""
        if not widths or any(int(w) < 1 for w in widths):
            raise ValueError(f"branching widths must be a non-empty list of integers >= 1, got {list(widths)}")
        level: list[Path] = [()]
        paths: list[Path] = []
        for w in widths:
            level = [p + (r,) for p in level for r in range(int(w))]
            paths += level
        return cls.from_paths(paths)

    def to_choices(self) -> list[list[int]]:
        """The tree as Medusa's and EAGLE-1's `choices` (a list of rank paths, sorted by (depth, path))."""
        return [list(p) for p in self.paths]

    @classmethod
    def wide(cls, n: int) -> Tree:
        """n siblings at depth 1: the draft's top-n guesses for the next token only."""
        return cls(tuple((r,) for r in range(_budget(n))))

    @classmethod
    def beams(cls, k: int, n: int) -> Tree:
        """k independent chains (SpecInfer-style): chain i starts at depth-1 rank i and continues
        with rank 0; the n nodes are spread level by level, so chain lengths differ by at most one."""
        if k < 1:
            raise ValueError(f"beams need k >= 1, got {k}")
        n = _budget(n)
        paths = [(i,) + (0,) * d for d in range(n) for i in range(k)][:n]
        return cls.from_paths(paths)

    @classmethod
    def best_first(cls, n: int, acceptance: Sequence[float], max_depth: int | None = None) -> Tree:
        """The n nodes with the largest product of `acceptance[rank]` along their path.

        Under Sequoia's positional assumption (the rank-r child of an accepted node is accepted with
        probability acceptance[r]) that product is the probability the node is accepted, so this
        greedy expansion gives a tree with a high expected acceptance length; it is the exact
        optimum when `acceptance` is non-increasing (a node's value never exceeds its parent's nor
        its elder sibling's, so the top-n set is closed under both). Ties break by (depth, path).
        """
        n = _budget(n)
        acc = [float(a) for a in acceptance]
        if not acc or any(not 0.0 < a <= 1.0 for a in acc):
            raise ValueError(f"acceptance values must lie in (0, 1], got {acceptance!r}")
        # frontier: (-log value, depth, path); a node enters when its parent or elder sibling is taken
        frontier: list[tuple[float, int, Path]] = [(-math.log(acc[0]), 1, (0,))]
        chosen: list[Path] = []
        while frontier and len(chosen) < n:
            neg_log, depth, path = heapq.heappop(frontier)
            chosen.append(path)
            if max_depth is None or depth < max_depth:
                heapq.heappush(frontier, (neg_log - math.log(acc[0]), depth + 1, path + (0,)))
            nxt = path[-1] + 1
            if nxt < len(acc):
                step = math.log(acc[path[-1]]) - math.log(acc[nxt])
                heapq.heappush(frontier, (neg_log + step, depth, path[:-1] + (nxt,)))
        return cls.from_paths(chosen)

    @classmethod
    def preset(cls, name: str, n: int) -> Tree:
        """A preset by name, for parameter files: chain, wide, sparse, kary<k>, beams<k>."""
        if name in ("chain", "wide", "sparse"):
            return getattr(cls, name)(n)
        for prefix in ("kary", "beams"):
            if name.startswith(prefix) and name[len(prefix) :].isdigit():
                return getattr(cls, prefix)(int(name[len(prefix) :]), n)
        raise ValueError(
            f"unknown tree shape {name!r}; use chain, wide, sparse, kary<k> or beams<k> (e.g. kary2, beams4)"
        )

    @classmethod
    def sparse(cls, n: int) -> Tree:
        """Medusa-style sparse tree: best-first under `SPARSE_ACCEPTANCE`."""
        return cls.best_first(n, SPARSE_ACCEPTANCE)

    # ---- structure ----------------------------------------------------------------------------

    @property
    def num_nodes(self) -> int:
        return len(self.paths)

    def __len__(self) -> int:
        return len(self.paths)

    @cached_property
    def depths(self) -> tuple[int, ...]:
        """Depth of each node; depth-1 nodes are children of the root."""
        return tuple(len(p) for p in self.paths)

    @property
    def depth(self) -> int:
        """The deepest node's depth (0 for the empty tree)."""
        return max(self.depths, default=0)

    @cached_property
    def ranks(self) -> tuple[int, ...]:
        """Each node's sibling rank (the last entry of its path)."""
        return tuple(p[-1] for p in self.paths)

    @cached_property
    def children(self) -> tuple[tuple[int, ...], ...]:
        """children[0] = the root's children, children[i + 1] = node i's children, by rank."""
        kids: list[list[int]] = [[] for _ in range(self.num_nodes + 1)]
        for i, parent in enumerate(self.parents):
            kids[parent + 1].append(i)
        return tuple(tuple(sorted(k, key=lambda i: self.ranks[i])) for k in kids)

    @cached_property
    def has_rank_gaps(self) -> bool:
        """True if some node has a rank-r child but no rank r-1 sibling (Medusa allows it; lossless
        sampling, whose rank r is the r-th draw, does not)."""
        return any([self.ranks[c] for c in kids] != list(range(len(kids))) for kids in self.children)

    @cached_property
    def leaves(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.num_nodes) if not self.children[i + 1])

    @cached_property
    def leaf_paths(self) -> tuple[tuple[int, ...], ...]:
        """For each leaf, the node indices from depth 1 down to it (Medusa's retrieve indices,
        unpadded): one candidate sequence per leaf."""
        return tuple(self.node_path(leaf) for leaf in self.leaves)

    def node_path(self, i: int) -> tuple[int, ...]:
        """Node indices on the path from depth 1 down to node i, inclusive."""
        out: list[int] = []
        while i >= 0:
            out.append(i)
            i = self.parents[i]
        return tuple(reversed(out))

    def level(self, depth: int) -> range:
        """Indices of the nodes at `depth` (a contiguous range in canonical order)."""
        start = sum(1 for d in self.depths if d < depth)
        stop = sum(1 for d in self.depths if d <= depth)
        return range(start, stop)

    def truncated(self, max_depth: int) -> Tree:
        """The subtree of nodes with depth <= max_depth (a prefix of the canonical order)."""
        if max_depth >= self.depth:
            return self
        return Tree(tuple(p for p in self.paths if len(p) <= max(max_depth, 0)))

    @cached_property
    def is_chain(self) -> bool:
        """One node per depth, each the rank-0 child of the one before: its mask is causal."""
        return self.paths == tuple((0,) * d for d in range(1, self.num_nodes + 1))

    @cached_property
    def levels(self) -> tuple[Level, ...]:
        """The plan of a level-by-level draft (one draft forward per depth): for each depth, its
        nodes, each node's parent as a row of the previous level's logits, and the nodes fed to
        the draft so that the next level has logits (those with children)."""
        out: list[Level] = []
        slot = {-1: 0}  # node -> its row in the logits the next level reads; the root is row 0
        for depth in range(1, self.depth + 1):
            nodes = self.level(depth)
            fed = tuple(i for i in nodes if self.children[i + 1])
            out.append(
                Level(
                    depth=depth,
                    nodes=nodes,
                    parent_rows=tuple(slot[self.parents[i]] for i in nodes),
                    ranks=tuple(self.ranks[i] for i in nodes),
                    fed=fed,
                )
            )
            slot = {i: r for r, i in enumerate(fed)}
        return tuple(out)

    @cached_property
    def draft_widths(self) -> tuple[int, ...]:
        """Tokens of each draft forward of a level-by-level draft: the root's (1), then each level's
        fed nodes (leaves are only chosen, never fed)."""
        return (1, *(len(level.fed) for level in self.levels if level.fed))

    # ---- tensors ------------------------------------------------------------------------------

    @cached_property
    def ancestors(self) -> torch.Tensor:
        """Bool [N, N] on the CPU: row i is True at j iff node j is node i or one of its ancestors.
        Shared by every caller: do not modify it in place."""
        n = self.num_nodes
        mask = torch.zeros(n, n, dtype=torch.bool)  # host: `ancestor_mask(device)` moves it
        for i, parent in enumerate(self.parents):
            if parent >= 0:
                mask[i] = mask[parent]  # canonical order: the parent's row is already complete
            mask[i, i] = True
        return mask

    def ancestor_mask(self, device: torch.device | str | None = None) -> torch.Tensor:
        """`ancestors` as a new tensor on `device`."""
        return self.ancestors.to(device) if device is not None else self.ancestors.clone()

    def position_offsets(self, device: torch.device | str | None = None) -> torch.Tensor:
        """Long [N]: each node's depth, its position relative to the root."""
        return torch.tensor(self.depths, dtype=torch.long, device=device)

    def describe(self) -> str:
        return f"{self.num_nodes} nodes, depth {self.depth}, {len(self.leaves)} leaves"


class TokenTrie:
    """Distinct token paths grown one token at a time; `build` gives the tree and its tokens.

    Nodes are numbered in insertion order (a node after its parent); a node's rank is the number
    of siblings inserted before it, so ranks have no gaps.
    """

    def __init__(self) -> None:
        self._child: dict[tuple[int, int], int] = {}  # (parent, token) -> node; parent -1 = root
        self._paths: list[Path] = []
        self._tokens: list[int] = []
        self._num_children: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._tokens)

    def child(self, parent: int, token: int) -> int | None:
        """The node for `token` under `parent` (-1 = the root), if inserted."""
        return self._child.get((parent, token))

    def add(self, parent: int, token: int) -> int:
        """The node for `token` under `parent`, inserted if new."""
        node = self._child.get((parent, token))
        if node is None:
            node = len(self._tokens)
            rank = self._num_children.get(parent, 0)
            self._num_children[parent] = rank + 1
            self._paths.append((self._paths[parent] if parent >= 0 else ()) + (rank,))
            self._tokens.append(int(token))
            self._child[(parent, token)] = node
        return node

    def build(self, device: torch.device | str | None = None) -> tuple[Tree, torch.Tensor, tuple[int, ...]]:
        """(tree, tokens long [N] in the tree's canonical order, order): canonical node i is
        inserted node order[i]."""
        tree = Tree.from_paths(self._paths)
        position = {path: i for i, path in enumerate(self._paths)}
        order = tuple(position[path] for path in tree.paths)
        tokens = torch.tensor([self._tokens[i] for i in order], dtype=torch.long, device=device)
        return tree, tokens, order


@dataclass(frozen=True)
class Level:
    """One depth of a tree, as a level-by-level draft visits it (`Tree.levels`)."""

    depth: int
    nodes: range  # the level's node indices (contiguous in canonical order)
    # per node: its parent's row among the previous level's fed nodes (depth 1: 0, the root)
    parent_rows: tuple[int, ...]
    ranks: tuple[int, ...]  # per node: its sibling rank
    fed: tuple[int, ...]  # the level's nodes that have children, in order: fed to the draft for the next level

    @property
    def width(self) -> int:
        """Children to choose per parent: the highest rank + 1."""
        return max(self.ranks) + 1


def _budget(n: int) -> int:
    if n < 0:
        raise ValueError(f"a tree's budget must be >= 0 draft tokens, got {n}")
    return int(n)


def _check_paths(paths: tuple[Path, ...]) -> None:
    seen = set(paths)
    if len(seen) != len(paths):
        dupes = sorted({p for p in paths if paths.count(p) > 1})
        raise ValueError(f"duplicate tree paths: {dupes}")
    for p in paths:
        if len(p) == 0:
            raise ValueError("empty path (): the root is implicit and is not a tree node")
        if any(r < 0 for r in p):
            raise ValueError(f"negative rank in path {p}")
        if len(p) > 1 and p[:-1] not in seen:
            raise ValueError(f"path {p} has no parent: {p[:-1]} is missing")
