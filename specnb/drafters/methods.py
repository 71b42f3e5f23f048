"""Methods by name: the strings parameter files use for every drafter, tree and baseline.

A method spec is `[drafter/]shape:budget`:

    chain:4, kary2:8, sparse:16     the pair's draft model fills the `Tree.preset` (ModelDrafter)
    ngram/chain:4, ngram/kary2:8    prompt lookup: n-gram continuations fill the tree (NgramDrafter)
    early_exit12/chain:4            the target's first 12 layers on its own KV cache (EarlyExitDrafter)
    merged/kary2:8                  the draft model's tree and the n-gram tree merged (MergedDrafter)
    adaptive/chain:4                the draft model, chain length from 4 by transformers' +2 / -1
                                    rule (AdaptiveLength, reset per prompt), at most 2 x 4 deep
    confidence0.4/chain:8           the draft model's chain, stopped at the first token with
                                    q < 0.4 (transformers' assistant_confidence_threshold)
    medusa/sparse:32                Medusa heads on the target's hidden states fill the preset
                                    (MedusaDrafter; the heads are given to build_drafter; depth <= K)
    medusa_typical_lossy/sparse:32  the same with Medusa's typical acceptance: LOSSY when sampling
                                    (`acceptance.TypicalAcceptance`; greedy stays exact)
    dynamic:16                      EAGLE-2-style dynamic tree of 16 nodes (top 8 children, depth
                                    at most 6) from the draft model (DynamicTreeDrafter)
    xtok/chain:4, xtok/sparse:16    a draft model of ANOTHER tokenizer fills the tree in its own
    xtok/dynamic:16                 tokens; the paths are re-encoded into one target-token tree of
                                    at most 4 (16) nodes (CrossTokenizerDrafter)
    hf_assisted:4                   transformers assisted generation, 4 draft tokens per step
    hf_uag:4                        transformers universal assisted generation: a draft of another
                                    tokenizer, 4 of its own tokens per step
    hf_prompt_lookup:4              transformers prompt lookup, 4 draft tokens per step

A tree the user writes (`io.tree_spec`: `custom_trees`, name -> spec) is a shape like a preset's,
given to the parser as `custom` (name -> `Tree`): "mine", "ngram/mine", "xtok/mine" fill it; its
budget is its node count, so the budget may be left out ("mine" = "mine:6" for a 6-node tree). A
shape rule of the user's (`io.tree_spec.ShapeRule`, `{widths: [...]}`) is given the same way
(name -> `ShapeRule`) and behaves as a preset: "grow:8" is its fill of 8 nodes.

Methods that put the draft model's token ids in the target's tree need the two to share a
vocabulary (`Method.shared_vocabulary`); xtok and hf_uag pair any two causal LMs.

In tables, a method's `shape` is the spec before the colon ("ngram/kary2", "dynamic") and its
`budget` the number after it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..core.drafting import Drafter, ModelDrafter
from ..core.sampling import TypicalAcceptance
from ..core.streaming import StreamingCache
from ..core.trees import Tree
from ..io.tree_spec import DRAFTERS, HF_METHODS, PRESET, ShapeRule
from .cross_tokenizer import CrossTokenizerDrafter
from .draft_length import AdaptiveLength
from .dynamic import DynamicTreeDrafter
from .medusa import MedusaDrafter, MedusaHeads
from .merging import MergedDrafter
from .ngram import NgramDrafter
from .self_draft import EarlyExitDrafter

CROSS = "xtok"
MEDUSA = ("medusa", "medusa_typical_lossy")
DYNAMIC = "dynamic"
DYNAMIC_TOP_K, DYNAMIC_MAX_DEPTH = 8, 6


@dataclass(frozen=True)
class Method:
    drafter: str  # one of DRAFTERS, DYNAMIC or HF_METHODS
    shape: str  # Tree.preset name or a custom tree's; "dynamic" or the transformers method name otherwise
    budget: int
    arg: float | None = None  # early_exit: layers; confidence: threshold
    custom: Tree | None = field(default=None, repr=False)  # the custom tree `shape` names; None: a preset

    @property
    def label(self) -> str:
        """The `shape` column of tables: the spec without its budget."""
        if self.drafter in HF_METHODS or self.drafter == DYNAMIC:
            return self.drafter
        if self.drafter == "draft":
            return self.shape
        arg = "" if self.arg is None else f"{self.arg:g}"
        return f"{self.drafter}{arg}/{self.shape}"

    @property
    def spec(self) -> str:
        return f"{self.label}:{self.budget}"

    @property
    def tree(self) -> Tree:
        """The tree requested each step (for dynamic and adaptive methods, a depth cap; for
        transformers' methods, the chain they draft at most)."""
        if self.drafter in HF_METHODS:
            return Tree.chain(self.budget)
        if self.drafter == DYNAMIC or (self.drafter == CROSS and self.shape == DYNAMIC):
            return Tree.chain(DYNAMIC_MAX_DEPTH)
        if self.drafter == "adaptive":
            return Tree.chain(2 * self.budget)
        if self.custom is not None:
            return self.custom
        return Tree.preset(self.shape, self.budget)

    @property
    def replayable(self) -> bool:
        """A collection of the pair answers it exactly (`analysis.replay`): the draft model's static
        trees and dynamic trees; the other drafters (n-gram, early exit, merged, adaptive,
        confidence) and transformers' methods must run end to end."""
        return self.drafter in ("draft", DYNAMIC)

    @property
    def needs_draft_model(self) -> bool:
        return self.drafter not in ("ngram", "early_exit", "hf_prompt_lookup", *MEDUSA)

    @property
    def lossy(self) -> bool:
        """Its sampled output does not follow the target's distribution (typical acceptance)."""
        return self.drafter == "medusa_typical_lossy"

    @property
    def typical(self) -> TypicalAcceptance | None:
        """The acceptance rule to pass to `speculative_generate(typical=...)`; None: greedy / lossless."""
        return TypicalAcceptance() if self.lossy else None

    @property
    def shared_vocabulary(self) -> bool:
        """The draft model's token ids go into the target's tree: draft and target must share one
        vocabulary (`io.models.check_pair`). False for xtok and hf_uag (any two tokenizers) and
        for the methods without a draft model."""
        return self.needs_draft_model and self.drafter not in (CROSS, "hf_uag")


_SPEC = re.compile(r"^(?:(?P<drafter>[a-z_]+?)(?P<arg>\d+(?:\.\d+)?)?/)?(?P<shape>[a-z_]+\d*)(?::(?P<budget>\d+))?$")


Custom = Mapping[str, "Tree | ShapeRule"]  # the user's trees and shape rules by name


def parse_method(spec: str, custom: Custom | None = None) -> Method:
    """A `Method` from its spec (module docstring); a ValueError names the accepted forms.
    custom: the user's trees and shape rules by name (`io.tree_spec.parse_custom_trees`,
    `parse_custom_shapes`), shapes beside the presets."""
    m = _SPEC.match(spec.strip())
    if not m:
        raise ValueError(
            f"method {spec!r} must be [drafter/]shape:budget, e.g. chain:4, ngram/kary2:8, dynamic:16, hf_assisted:4"
        )
    drafter, arg, shape = m["drafter"] or "draft", m["arg"], m["shape"]
    tree = None if PRESET.match(shape) or shape in (DYNAMIC, *HF_METHODS) else (custom or {}).get(shape)
    if isinstance(tree, ShapeRule):  # a rule fills the budget, as a preset does
        if m["budget"] is None:
            raise ValueError(
                f"method {spec!r}: {shape!r} is a shape rule ({tree.describe()}); give it a budget, e.g. {spec}:8"
            )
        tree = tree.fill(int(m["budget"]))
    if tree is not None and m["budget"] is not None and int(m["budget"]) != tree.num_nodes:
        raise ValueError(
            f"method {spec!r}: custom tree {shape!r} has {tree.num_nodes} nodes, its budget: write "
            f"{spec.split(':')[0]} or {spec.split(':')[0]}:{tree.num_nodes}"
        )
    if tree is None and m["budget"] is None:
        raise ValueError(
            f"method {spec!r} must be [drafter/]shape:budget, e.g. chain:4, ngram/kary2:8 (only a custom tree's "
            f"name may go without its budget; custom_trees: {sorted(custom or {})})"
        )
    budget = tree.num_nodes if tree is not None else int(m["budget"])
    if budget < 1:
        raise ValueError(f"method {spec!r}: the budget must be >= 1")
    if m["drafter"] is None and (shape in HF_METHODS or shape == DYNAMIC):
        return Method(shape, shape, budget)
    if drafter == CROSS and shape in HF_METHODS:
        raise ValueError(f"method {spec!r}: transformers' cross-tokenizer method is hf_uag:{budget}")
    if drafter not in DRAFTERS:
        raise ValueError(
            f"method {spec!r}: unknown drafter {drafter!r}; use one of {DRAFTERS[1:]} (or none for the draft model)"
        )
    needs_arg = drafter in ("early_exit", "confidence")
    if needs_arg != (arg is not None):
        raise ValueError(
            f"method {spec!r}: early_exit and confidence take a number (early_exit12, confidence0.4), the others none"
        )
    value = None if arg is None else (int(arg) if drafter == "early_exit" else float(arg))
    method = Method(drafter, shape, budget, value, tree)
    try:
        _ = method.tree  # an unknown shape fails here
    except ValueError as e:
        raise ValueError(f"method {spec!r}: {e}, or a name in custom_trees ({sorted(custom or {})})") from None
    if drafter in ("adaptive", "confidence") and shape != "chain":
        raise ValueError(f"method {spec!r}: {drafter} drafts chains; use {drafter}{arg or ''}/chain:N")
    return method


def method_trees(specs: Iterable[str], custom: Custom | None = None) -> dict[tuple[str, int], Tree]:
    """Method specs keyed (shape, budget) as tables name them (`Method.label`, `Method.budget`),
    with the tree each requests per step; a bad spec raises before anything runs. custom: the
    user's trees by name, which specs may name (`parse_method`)."""
    methods = [parse_method(spec, custom) for spec in specs]
    return {(m.label, m.budget): m.tree for m in methods}


def with_custom_trees(specs: Sequence[str], custom: Custom | None = None) -> list[str]:
    """`specs` and, for each custom tree or shape rule that none of them names, the draft model filling
    it: a tree by its name, a rule at the largest budget the specs use (4 where they use none)."""
    methods = [parse_method(spec, custom) for spec in specs]
    named, largest = {m.shape for m in methods}, max((m.budget for m in methods), default=4)
    return list(specs) + [
        name if isinstance(item, Tree) else f"{name}:{largest}"
        for name, item in (custom or {}).items()
        if name not in named
    ]


def method_of(key: tuple[str, int], tree: Tree) -> Method:
    """The method of a (label, budget) key of `method_trees`, `tree` its tree: a label that names a
    custom tree (e.g. "mine", "ngram/mine") resolves to `tree`."""
    label, budget = key
    return parse_method(f"{label}:{budget}", {label.rsplit("/", 1)[-1]: tree})


def budget_axis(budgets: Iterable[int], custom: Custom | None = None) -> list[int]:
    """The budgets, with each custom tree's node count (its budget) added, sorted (a shape rule adds
    none: it fills every budget)."""
    return sorted({int(b) for b in budgets} | {t.num_nodes for t in (custom or {}).values() if isinstance(t, Tree)})


def trees_for(
    shapes: Sequence[str], budgets: Iterable[int], custom: Custom | None = None
) -> dict[tuple[str, int], Tree]:
    """The named trees a sweep runs, filled by the draft model: every preset shape and every shape
    rule at every budget of `budget_axis` (so they are also measured at each custom tree's size), and
    each custom tree keyed (name, its node count)."""
    axis = budget_axis(budgets, custom)
    rules = [name for name, item in (custom or {}).items() if isinstance(item, ShapeRule)]
    fixed = [name for name, item in (custom or {}).items() if isinstance(item, Tree)]
    return method_trees([f"{s}:{b}" for s in [*shapes, *rules] for b in axis] + fixed, custom)


@dataclass(frozen=True)
class DrafterInputs:
    """What a drafter may be built from (`build_drafter`'s arguments): each builder of BUILDERS takes
    what its drafter needs."""

    target: torch.nn.Module
    draft: torch.nn.Module | None
    cache_policy: StreamingCache | None
    dynamic: tuple[int, int]  # (children per node, depth) of dynamic trees
    target_tokenizer: Any = None
    draft_tokenizer: Any = None
    medusa_heads: MedusaHeads | None = None

    def model(self, **options: Any) -> ModelDrafter:
        return ModelDrafter(self.draft, cache_policy=self.cache_policy, **options)

    def dynamic_tree(self, budget: int) -> DynamicTreeDrafter:
        top_k, depth = self.dynamic
        return DynamicTreeDrafter(self.draft, n=budget, top_k=top_k, max_depth=depth, cache_policy=self.cache_policy)


def _cross(method: Method, x: DrafterInputs) -> Drafter:
    if x.target_tokenizer is None or x.draft_tokenizer is None:
        raise ValueError(f"method {method.spec} needs the target's and the draft's tokenizers")
    inner = x.dynamic_tree(method.budget) if method.shape == DYNAMIC else x.model()
    return CrossTokenizerDrafter(inner, x.draft_tokenizer, x.target_tokenizer)


def _medusa(method: Method, x: DrafterInputs) -> Drafter:
    if x.medusa_heads is None:
        raise ValueError(f"method {method.spec} needs Medusa heads (medusa_heads=)")
    return MedusaDrafter(x.target, x.medusa_heads)


# a method's drafter name -> how its drafter is built (every specnb method; transformers' run in `bench.baselines`)
BUILDERS: dict[str, Callable[[Method, DrafterInputs], Drafter]] = {
    "draft": lambda m, x: x.model(),
    "ngram": lambda m, x: NgramDrafter(),
    "early_exit": lambda m, x: EarlyExitDrafter(x.target, int(m.arg)),
    "merged": lambda m, x: MergedDrafter([(x.model(), m.tree), (NgramDrafter(), m.tree)]),
    "adaptive": lambda m, x: AdaptiveLength(x.model(), start=m.budget, schedule="heuristic_transient"),
    "confidence": lambda m, x: x.model(confidence_threshold=float(m.arg)),
    DYNAMIC: lambda m, x: x.dynamic_tree(m.budget),
    CROSS: _cross,
    **dict.fromkeys(MEDUSA, _medusa),
}


def build_drafter(
    method: Method,
    target: torch.nn.Module,
    draft: torch.nn.Module | None,
    cache_policy: StreamingCache | None = None,
    dynamic: tuple[int, int] = (DYNAMIC_TOP_K, DYNAMIC_MAX_DEPTH),
    target_tokenizer: Any = None,
    draft_tokenizer: Any = None,
    medusa_heads: MedusaHeads | None = None,
) -> Drafter:
    """The drafter object of a specnb method (BUILDERS; not for transformers' methods). cache_policy:
    a bounded cache for the draft model's own cache (`core.streaming`), where the method has one.
    dynamic: (children per node, depth) of dynamic trees; a replay of dynamic trees matches the
    drafter only with the collection's (super_k, super_depth). xtok methods need both tokenizers
    (or `retokenize.TokenText`s of them); medusa methods the heads (`drafters.medusa.MedusaHeads`)."""
    if method.drafter in HF_METHODS:
        raise ValueError(f"{method.spec} is a transformers method, run by `baselines`, not a drafter")
    if method.needs_draft_model and draft is None:
        raise ValueError(f"method {method.spec} needs the pair's draft model")
    inputs = DrafterInputs(target, draft, cache_policy, dynamic, target_tokenizer, draft_tokenizer, medusa_heads)
    return BUILDERS[method.drafter](method, inputs)
