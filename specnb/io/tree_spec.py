"""Trees as users write them (what serving engines take of a tree: `io.engines`).

A user names trees of their own (`custom_trees`: name -> spec) beside the presets. A spec is one of
    a list of rank paths (Medusa's and EAGLE-1's `choices`): [[0], [1], [0, 0]]
    {"paths": [[0], [1], [0, 0]]}
    {"branching": [3, 2, 1]}: `Tree.from_branching`
    {"widths": [3, 2, 1]}: a `ShapeRule`, a shape that fills any budget like a preset's
and is refused, with what to change, if it has a duplicate path, a path without its parent, an
empty tree, gaps in sibling ranks (a rank-r child without a rank r - 1 sibling: a draft's rank r is
its r-th choice, so a gap wastes a slot and breaks lossless sampling), or a name that is a preset's,
that tables use for other rows (`RESERVED`), or that a method spec cannot hold (`NAME`: methods name a
custom tree as `[drafter/]name`, its budget its node count), or more than `MAX_NODES` nodes.
A widths spec is a rule, not one tree: `parse_custom_shapes` reads the rules, `ShapeRule.fill(n)` gives
the tree of n nodes (the filling rule is stated once, in `ShapeRule`'s docstring), and
`parse_custom_trees` checks widths entries but returns only the fixed trees.
"""

from __future__ import annotations

import ast
import heapq
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..core.trees import Tree

MAX_NODES = 1024  # the most draft tokens per step a tree, budget or curve point may have (Sequoia's largest: 768)
PRESET = re.compile(r"^(chain|wide|sparse|kary\d+|beams\d+)$")
NAME = re.compile(r"^[a-z_]+\d*$")  # the shape part of a method spec (`drafters.methods`)
# The method names of `drafters.methods` (written here: core comes before drafters), then the names
# tables give other rows: dynamic trees, the designed trees, the oracle, the target alone. A custom
# tree may take none of them.
HF_METHODS = ("hf_assisted", "hf_uag", "hf_prompt_lookup")  # transformers' own decoders
DRAFTERS = (
    "draft",
    "ngram",
    "early_exit",
    "merged",
    "adaptive",
    "confidence",
    "xtok",
    "medusa",
    "medusa_typical_lossy",
)
RESERVED = (*HF_METHODS, *DRAFTERS, "dynamic", "oracle", "sequoia", "sequoia_per_depth", "hindsight", "autoregressive")


class TreeSpecError(ValueError):
    """A tree spec that cannot be used; the message says what to change."""


@dataclass(frozen=True)
class ShapeRule:
    """A shape of the user's that fills any budget of 1..`MAX_NODES` draft tokens, like a preset's.

    Filling rule (stated here once): `widths[d]` is the number of children of every node at depth d
    (the root is depth 0), as in `Tree.from_branching`, and depths past the list repeat its last width;
    `fill(n)` takes the first n nodes of this rule's tree in one fixed order: level by level (every
    node of depth d before any of depth d + 1), and within a level by the sum of the path's ranks,
    then by the path (lexicographic).

    What the order guarantees: `fill(n)` has exactly n nodes; a level is started only once the
    previous one is complete, so every node's parent is present; a node's elder sibling has a rank
    sum one lower, so it comes first and siblings' ranks run 0, 1, 2, ... (no gaps); `fill(n)` is a
    prefix of one order, so it is a subtree of `fill(n + 1)`; and when n is the size of the listed
    levels, `fill(n) == Tree.from_branching(widths)`. Within a partial level, children of
    better-ranked parents come first when their own rank is the same, but a low rank sum wins over
    giving every parent a child: widths (3, 2) at 5 nodes take (0, 0) and (0, 1), not (0, 0) and (1, 0).
    """

    widths: tuple[int, ...]

    def __post_init__(self) -> None:
        try:
            widths = tuple(_rank(w) for w in self.widths)
        except (TypeError, ValueError):
            raise TreeSpecError(
                f"shape widths take whole numbers >= 1 per depth, e.g. (3, 2, 1), got {self.widths!r}"
            ) from None
        if not widths or min(widths) < 1:
            raise TreeSpecError(
                f"shape widths take at least one whole number and each >= 1 (the children of every node at "
                f"that depth), e.g. (3, 2, 1), got {list(widths)}"
            )
        object.__setattr__(self, "widths", widths)

    def width(self, depth: int) -> int:
        """Children of every node at `depth` (the root is depth 0); past the list, its last width."""
        return self.widths[min(depth, len(self.widths) - 1)]

    @property
    def full_size(self) -> int:
        """Nodes of the listed levels: `Tree.from_branching(widths).num_nodes` (may exceed MAX_NODES)."""
        return sum(math.prod(self.widths[: d + 1]) for d in range(len(self.widths)))

    def fill(self, budget: int) -> Tree:
        """The tree of exactly `budget` nodes (1 <= budget <= MAX_NODES) this rule fills (class docstring)."""
        if isinstance(budget, bool) or not isinstance(budget, int) or not 1 <= budget <= MAX_NODES:
            raise TreeSpecError(f"a shape fills a budget of 1 to {MAX_NODES} draft tokens, got {budget!r}")
        paths: list[tuple[int, ...]] = []
        level: list[tuple[int, tuple[int, ...]]] = [(0, ())]  # the last complete level: (rank sum, path)
        depth = 0
        while len(paths) < budget:
            width = self.width(depth)
            # Merge each parent's children, whose keys (rank sum, path) increase with their rank: a
            # child enters the heap when its elder sibling leaves it, so the merge is the sorted level.
            heap = [(total, path + (0,)) for total, path in level]
            heapq.heapify(heap)
            nxt: list[tuple[int, tuple[int, ...]]] = []
            while heap and len(paths) + len(nxt) < budget:
                total, path = heapq.heappop(heap)
                nxt.append((total, path))
                if path[-1] + 1 < width:
                    heapq.heappush(heap, (total + 1, path[:-1] + (path[-1] + 1,)))
            paths += [path for _, path in nxt]
            level, depth = nxt, depth + 1
        return Tree.from_paths(paths)

    def describe(self) -> str:
        """One line, e.g. "widths 3, 2, 1 per depth (then 1), filled level by level in rank order"."""
        listed = ", ".join(str(w) for w in self.widths)
        return f"widths {listed} per depth (then {self.widths[-1]}), filled level by level in rank order"


def parse_tree(name: str, spec: Any) -> Tree:
    """The `Tree` a user's spec describes (module docstring); TreeSpecError if it cannot be one.

    A widths spec gives its rule's tree at the size of its listed levels (`Tree.from_branching(widths)`),
    capped at `MAX_NODES` nodes (the rule's fill at that budget); `parse_custom_shapes` reads the rule."""
    _check_name(name)
    if isinstance(spec, Mapping) and "widths" in spec:
        rule = _parse_rule(name, spec)
        return rule.fill(min(rule.full_size, MAX_NODES))
    if isinstance(spec, Mapping):
        if set(spec) == {"branching"}:
            try:
                widths = [_rank(w) for w in spec["branching"]]
            except (TypeError, ValueError):
                raise TreeSpecError(
                    f"custom tree {name!r}: branching takes whole numbers >= 1 per depth, e.g. [2, 1], "
                    f"got {spec['branching']!r}"
                ) from None
            _check_size(name, sum(math.prod(widths[: d + 1]) for d in range(len(widths))))
            try:
                return Tree.from_branching(widths)
            except ValueError as e:
                raise TreeSpecError(f"custom tree {name!r}: {e}") from None
        if set(spec) != {"paths"}:
            raise TreeSpecError(
                f"custom tree {name!r}: a mapping spec holds one key, 'paths', 'branching' or 'widths', "
                f"got {sorted(spec)}"
            )
        spec = spec["paths"]
    if isinstance(spec, str):
        try:
            spec = ast.literal_eval(spec)
        except (ValueError, SyntaxError):
            raise TreeSpecError(
                f"custom tree {name!r}: {spec!r} is not a list of rank paths; write one like [[0], [1], [0, 0]] "
                "or {'branching': [2, 1]}"
            ) from None
    try:
        paths = [tuple(_rank(r) for r in p) for p in spec]
    except (TypeError, ValueError):
        raise TreeSpecError(
            f"custom tree {name!r}: expected a list of rank paths of whole numbers like [[0], [1], [0, 0]], "
            f"got {spec!r}"
        ) from None
    if not paths:
        raise TreeSpecError(f"custom tree {name!r} is empty: give at least one path, e.g. [[0]]")
    _check_size(name, len(paths))
    try:
        tree = Tree.from_paths(paths)
    except ValueError as e:
        raise TreeSpecError(f"custom tree {name!r}: {e}") from None
    if tree.has_rank_gaps:
        gap = next(tree.paths[c] for kids in tree.children for i, c in enumerate(kids) if tree.ranks[c] != i)
        raise TreeSpecError(
            f"custom tree {name!r}: path {list(gap)} has no sibling of rank {gap[-1] - 1}: "
            "sibling ranks must run 0, 1, 2, ... under each node"
        )
    return tree


def _check_name(name: str) -> None:
    """Refuse a custom tree's or shape rule's name that a preset, a table row or a method spec owns."""
    if PRESET.match(str(name)):
        raise TreeSpecError(
            f"custom tree {name!r}: the name is a preset's (chain, wide, sparse, kary<k>, "
            "beams<k>); give your tree another name"
        )
    if str(name) in RESERVED:
        raise TreeSpecError(
            f"custom tree {name!r}: tables use that name for other rows ({', '.join(RESERVED)}); "
            "give your tree another name"
        )
    if not NAME.match(str(name)):
        raise TreeSpecError(
            f"custom tree {name!r}: methods cannot name it ([drafter/]name); use lowercase letters and "
            "underscores, digits only at the end (e.g. mine, my_tree2)"
        )


def _check_size(name: str, nodes: int) -> None:
    if nodes > MAX_NODES:
        raise TreeSpecError(
            f"custom tree {name!r} has {nodes:,} nodes, above the limit of {MAX_NODES} draft tokens per step "
            "(its verify forward and replay arrays grow with the node count); give it fewer branches or levels"
        )


def _rank(value: Any) -> int:
    """A rank as written: a whole number (an int, or a float or string that is one); ValueError for
    1.9 or "one", TypeError for a bool (True is not rank 1)."""
    if isinstance(value, bool):
        raise TypeError(value)
    number = float(value)
    if not number.is_integer():
        raise ValueError(value)
    return int(number)


def parse_custom_trees(specs: Mapping[str, Any] | None) -> dict[str, Tree]:
    """Every fixed custom tree by name (an empty mapping or None: none); refused before any model loads.

    Widths entries are rules, not fixed trees: they are checked here (a bad one is refused) but left
    out of the result; `parse_custom_shapes` returns them."""
    _check_mapping(specs)
    out: dict[str, Tree] = {}
    for name, spec in (specs or {}).items():
        if _is_rule(spec):
            _check_name(str(name))
            _parse_rule(str(name), spec)
        else:
            out[str(name)] = parse_tree(str(name), spec)
    return out


def parse_custom_shapes(specs: Mapping[str, Any] | None) -> dict[str, ShapeRule]:
    """The shape rules among the custom trees by name (the entries with a "widths" key); the other
    forms are not read here (`parse_custom_trees` reads them)."""
    _check_mapping(specs)
    out: dict[str, ShapeRule] = {}
    for name, spec in (specs or {}).items():
        if _is_rule(spec):
            _check_name(str(name))
            out[str(name)] = _parse_rule(str(name), spec)
    return out


def _check_mapping(specs: Any) -> None:
    if specs is not None and not isinstance(specs, Mapping):
        raise TreeSpecError(
            f"custom_trees maps names to specs, e.g. {{'mine': {{'branching': [2, 1]}}}}, got {specs!r}"
        )


def _is_rule(spec: Any) -> bool:
    return isinstance(spec, Mapping) and "widths" in spec


def _parse_rule(name: str, spec: Mapping[str, Any]) -> ShapeRule:
    """The `ShapeRule` of a widths spec ({"widths": [3, 2, 1]}); TreeSpecError saying what to change."""
    if set(spec) != {"widths"}:
        raise TreeSpecError(
            f"custom tree {name!r}: a widths spec holds the one key 'widths' (a rule that fills any budget), "
            f"got {sorted(spec)}; write {{'widths': [3, 2, 1]}} or use 'paths' or 'branching' alone for a fixed tree"
        )
    widths = spec["widths"]
    if isinstance(widths, (str, bytes)) or not isinstance(widths, Sequence):
        raise TreeSpecError(
            f"custom tree {name!r}: widths takes a list of whole numbers >= 1 per depth, e.g. [3, 2, 1], got {widths!r}"
        )
    try:
        return ShapeRule(tuple(widths))
    except TreeSpecError as e:
        raise TreeSpecError(f"custom tree {name!r}: {e}") from None
