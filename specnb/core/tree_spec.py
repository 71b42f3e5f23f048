"""Trees as users write them and as serving engines read them.

A user names trees of their own (`custom_trees`: name -> spec) beside the presets. A spec is one of
    a list of rank paths (Medusa's and EAGLE-1's `choices`): [[0], [1], [0, 0]]
    {"paths": [[0], [1], [0, 0]]}
    {"branching": [3, 2, 1]}: `Tree.from_branching`
and is refused, with what to change, if it has a duplicate path, a path without its parent, an
empty tree, gaps in sibling ranks (a rank-r child without a rank r - 1 sibling: a draft's rank r is
its r-th choice, so a gap wastes a slot and breaks lossless sampling), or a name that is a preset's,
that tables use for other rows (`RESERVED`), or that a method spec cannot hold (`NAME`: methods name a
custom tree as `[drafter/]name`, its budget its node count), or more than `MAX_NODES` nodes.

Exports (`deploy_lines`): vLLM's `speculative_config` takes `speculative_token_tree`, the string of
the tree's rank-path tuples in (depth, path) order, with `num_speculative_tokens` = its node count;
Medusa and EAGLE-1 take the `choices` list; SGLang builds its own tree every step (EAGLE-2 style),
so only its nearest flags are given, labelled approximate: steps = depth, topk = the widest node's
children, num-draft-tokens = nodes + 1 (SGLang counts the root).
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Mapping
from typing import Any

from .trees import Tree

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


def parse_tree(name: str, spec: Any) -> Tree:
    """The `Tree` a user's spec describes (module docstring); TreeSpecError if it cannot be one."""
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
                f"custom tree {name!r}: a mapping spec holds one key, 'paths' or 'branching', got {sorted(spec)}"
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
    """Every custom tree by name (an empty mapping or None: none); refused before any model loads."""
    if specs is not None and not isinstance(specs, Mapping):
        raise TreeSpecError(
            f"custom_trees maps names to specs, e.g. {{'mine': {{'branching': [2, 1]}}}}, got {specs!r}"
        )
    return {str(name): parse_tree(str(name), spec) for name, spec in (specs or {}).items()}


def vllm_config(tree: Tree) -> dict[str, Any]:
    """The `speculative_config` fields vLLM reads for a static tree (add "method" and "model")."""
    return {"num_speculative_tokens": tree.num_nodes, "speculative_token_tree": str([tuple(p) for p in tree.paths])}


def sglang_flags(tree: Tree) -> dict[str, int]:
    """SGLang's nearest flags (APPROXIMATE: SGLang grows its own tree each step; only the depth, the
    widest branching and the budget carry over, not this shape)."""
    width = max((len(kids) for kids in tree.children), default=0)
    return {
        "speculative_num_steps": tree.depth,
        "speculative_eagle_topk": width,
        "speculative_num_draft_tokens": tree.num_nodes + 1,
    }


def deploy_lines(tree: Tree) -> dict[str, str]:
    """One line to paste per engine: vLLM, Medusa / EAGLE-1 choices, SGLang (approximate)."""
    sglang = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in sglang_flags(tree).items())
    return {
        "vllm": f"speculative_config={vllm_config(tree)!r}",
        "medusa_eagle_choices": repr(tree.to_choices()),
        "sglang_approximate": f"{sglang}  # approximate: SGLang builds its own tree each step",
    }
