"""Draft -> target pairs as parameter files name them: `Pair` (a `ModelPair` with its own
methods and the labels tables use) and `pair_keys` (which loaded models two pairs share)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ..core.trees import Tree
from ..drafters.methods import method_trees
from ..drafters.retokenize import TokenText
from ..io.models import ModelPair
from ..io.tree_spec import ShapeRule, parse_custom_shapes, parse_custom_trees


@dataclass(frozen=True)
class Pair(ModelPair):
    """A draft -> target pair as named in parameter files (`ModelPair`), with its own methods."""

    methods: tuple[str, ...] | None = None  # this pair's method specs; None: the sweep's own
    # this pair's grid where it differs from the notebook's (None: the notebook's): a pair whose trees cost
    # more to answer (a draft of another tokenizer is re-drafted, one draft forward per level) may ask less
    shapes: tuple[str, ...] | None = None
    budgets: tuple[int, ...] | None = None
    dynamic_budgets: tuple[int, ...] | None = None
    grid_prompts: int | None = None  # the grid on the first N prompts only
    # the user's trees and shape rules its methods may name ((name, Tree or ShapeRule) pairs; given
    # as a mapping of names to those or to specs, `io.tree_spec`)
    custom_trees: tuple[tuple[str, Tree | ShapeRule], ...] = ()

    def __post_init__(self) -> None:
        given = dict(self.custom_trees)
        specs = {str(n): t for n, t in given.items() if not isinstance(t, (Tree, ShapeRule))}
        trees = {str(n): t for n, t in given.items() if isinstance(t, (Tree, ShapeRule))}
        trees |= {**parse_custom_trees(specs), **parse_custom_shapes(specs)}
        object.__setattr__(self, "custom_trees", tuple(sorted(trees.items())))
        if self.methods is not None:
            object.__setattr__(self, "methods", tuple(self.methods))
            method_trees(self.methods, trees)  # refuse a bad spec before any model loads
        for name in ("shapes", "budgets", "dynamic_budgets"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, tuple(getattr(self, name)))

    @property
    def draft_label(self) -> str:
        """The draft as tables name it: its name, quantization and kept layers."""
        out = self.draft + (f"[{self.draft_quantization}]" if self.draft_quantization else "")
        return out + (f"[:{self.draft_layers} layers]" if self.draft_layers else "")

    @property
    def target_label(self) -> str:
        return self.target + (f"[{self.target_quantization}]" if self.target_quantization else "")

    @property
    def label(self) -> str:
        return f"{self.draft_label} -> {self.target_label}"

    @property
    def trees(self) -> dict[str, Tree | ShapeRule]:
        """The custom trees and shape rules by name."""
        return dict(self.custom_trees)

    @classmethod
    def from_dict(cls, d: dict, custom_trees: Mapping[str, Tree | ShapeRule] | None = None) -> Pair:
        """A pair from a parameter file's mapping; custom_trees: the notebook's, beside the pair's own."""
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown pair fields {sorted(unknown)}; allowed: {sorted(cls.__dataclass_fields__)}")
        return cls(**{**d, "custom_trees": {**(custom_trees or {}), **dict(d.get("custom_trees") or {})}})


def pair_keys(pair: Pair) -> tuple[tuple, tuple]:
    """(target, draft) as (name, quantization, kept layers): equal keys are one loaded model."""
    return (pair.target, pair.target_quantization, None), (pair.draft, pair.draft_quantization, pair.draft_layers)


@dataclass(frozen=True)
class PairModels:
    """A pair as one run uses it, loaded: its models and both tokenizers, each loaded once."""

    label: str  # the pair as tables name it (`Pair.label`)
    target: torch.nn.Module | None  # None only where workers load the pair themselves (`collect_pair`)
    draft: torch.nn.Module | None  # None when no unit needs the draft model
    tokenizer: Any  # the target's
    draft_tokenizer: Any = None  # the draft's: needed by the cross-tokenizer methods (xtok, hf_uag) only
    texts: tuple[TokenText, TokenText] | None = None  # both tokenizers read as bytes (`TokenText`), when already made

    @property
    def target_label(self) -> str:
        """The target as tables name it (`Pair.target_label`: the label's part after the arrow)."""
        return self.label.rsplit(" -> ", 1)[-1]
