"""Notebook parameters checked against their declared type and their range before any model loads.

Every name a numbered notebook declares in its parameters cell (`name: annotation = literal  # help`)
has one rule in `RULES` (or, where one notebook means something narrower, the rule of `NARROW` its
spec names: `registry`, "rules").
`check_parameters` checks a notebook's resolved values against the annotation's type, then each
name's rule, then the rules between parameters (`CROSSES`), and raises one `ParameterError` listing
every problem: the parameter, its value, its help, what is allowed and a value that works (the
notebook's own default, or its first items for a long list).

    MAX_TREE_NODES, MAX_NEW_TOKENS   stated limits: any budget, tree size or node count; tokens generated
    MAX_CHILDREN, MAX_DEPTH          stated limits: children per node and depth of grown trees, heads
    MODEL_DTYPES, EXECUTORS, LOSS_VOCABS, PAIR_TYPES
                                     choices the code accepts where it names no constant of its own
    Rule and its kinds               Whole, Real, OneOf, Text, Flag, Each, Shape, MethodSpec, HeadShape,
                                     CustomTrees, Pairs: frozen dataclasses saying what is `allowed` in
                                     words and what is wrong with a value (`fault`)
    Cross                            a rule between parameters (oracle_k <= top_k)
    RULES, NARROW, CROSSES           the table; `rule_for` looks a name up in it
    declared_types, annotation_fits  name -> annotation text of a notebook's parameters cell; a value
                                     against one (`Declared`: one line of that cell)
    check_parameters                 the check; ParameterError listing every problem

Types, from the annotation: int (a bool is not one), float (an int is one), str, bool, list, dict,
Optional[X] (None or X), Union[X, Y]. Values come from YAML, so `-p max_new_tokens abc` arrives as
the string "abc" and `-p lr 1e-3` as the string "1e-3" (YAML 1.1); both are refused by type.
Custom tree specs are `io.tree_spec`'s to check; here only that they come as a mapping.
"""

from __future__ import annotations

import ast
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar

from ..bench.attention import CAUSAL, IMPLEMENTATIONS
from ..bench.attention_grid import EXPLICIT_SHAPE, head_shape
from ..core.streaming import POSITIONS
from ..core.trees import Tree
from ..drafters.methods import parse_method
from ..experiments.checks import ParameterError
from ..experiments.long_generation import TARGET_ALONE
from ..io.models import QUANTIZATIONS
from ..io.prompts import SOURCES, source_prompts
from ..io.tree_spec import MAX_NODES, PRESET, ShapeRule, parse_custom_shapes, parse_custom_trees
from ..kernels.cpu_linear import LINEAR_PATHS
from . import registry
from .places import NOTEBOOKS

MAX_TREE_NODES = MAX_NODES  # any budget, tree size or node count (`io.tree_spec`)
MAX_NEW_TOKENS = 8192  # tokens generated per prompt (and distilled per training prompt)
MAX_CHILDREN = 64  # children per node of grown trees (super-trees, EAGLE-2's dynamic trees: 10)
MAX_DEPTH = 16  # depth of grown trees and Medusa heads (EAGLE-2: 6, Medusa's published heads: 5)
MODEL_DTYPES = ("float16", "bfloat16", "float32")  # `io.models.model_dtype`; torch dtypes of 03's grid
EXECUTORS = ("local", "ray")  # `experiments.executors.executor_for`
LOSS_VOCABS = ("sampled", "seen", "full")  # `training.medusa.TrainConfig.loss_vocab`
# a pair of 02's `pairs` (`experiments.pairs.Pair`, as the notebook documents it): key -> annotation
PAIR_TYPES: Mapping[str, str] = MappingProxyType(
    {
        "target": "str",
        "draft": "str",
        "target_quantization": "Optional[str]",
        "draft_quantization": "Optional[str]",
        "draft_layers": "Optional[int]",
        "methods": "Optional[list]",
        "shapes": "Optional[list]",  # this pair's grid, where it differs from the notebook's
        "budgets": "Optional[list]",
        "dynamic_budgets": "Optional[list]",
        "grid_prompts": "Optional[int]",
    }
)
EXAMPLE_CHARS = 80  # longest example and value shown in a message
MAX_SHOWN = 4  # bad items of one list shown in its message


@dataclass(frozen=True)
class Context:
    """What some rules need besides the value: the notebook, and its custom trees by name (None where
    they do not parse: `io.tree_spec` reports that, and method specs are then checked as strings)."""

    notebook: str
    custom: Mapping[str, Tree | ShapeRule] | None


class Rule:
    """A parameter's range. `fault` is None for a good value, else what is wrong ("" where showing
    the value says it); its type was already checked against the annotation (list items were not)."""

    types: ClassVar[tuple[str, ...]] = ()  # the annotations (Optional stripped) the rule is written for
    none_ok: ClassVar[bool] = False  # None passes whatever the annotation

    def allowed(self) -> str:
        raise NotImplementedError

    def fault(self, value: Any, ctx: Context) -> str | None:
        raise NotImplementedError


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class Whole(Rule):
    """An integer in low..high (high None: no upper bound)."""

    low: int
    high: int | None = None
    types: ClassVar[tuple[str, ...]] = ("int",)

    def allowed(self) -> str:
        return f"an integer in {self.low}..{self.high}" if self.high is not None else f"an integer >= {self.low}"

    def fault(self, value: Any, ctx: Context) -> str | None:
        if not _is_int(value):
            return "not an integer"
        return "" if value < self.low or (self.high is not None and value > self.high) else None


@dataclass(frozen=True)
class Real(Rule):
    """A finite number from low (excluded where `above`) up to high (None: no upper bound)."""

    low: float
    high: float | None = None
    above: bool = False
    types: ClassVar[tuple[str, ...]] = ("float",)

    def allowed(self) -> str:
        if self.high is not None:
            return f"a number in {'(' if self.above else '['}{self.low:g}, {self.high:g}]"
        return f"a number {'>' if self.above else '>='} {self.low:g}"

    def fault(self, value: Any, ctx: Context) -> str | None:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return "not a number"
        if not math.isfinite(value):
            return "not finite"
        low_ok = value > self.low if self.above else value >= self.low
        return None if low_ok and (self.high is None or value <= self.high) else ""


@dataclass(frozen=True)
class OneOf(Rule):
    """One of a few strings."""

    options: tuple[str, ...]
    types: ClassVar[tuple[str, ...]] = ("str",)

    def allowed(self) -> str:
        said = ", ".join(map(repr, self.options))
        return said if len(self.options) == 1 else f"one of {said}"

    def fault(self, value: Any, ctx: Context) -> str | None:
        return None if isinstance(value, str) and value in self.options else ""


@dataclass(frozen=True)
class Typed(Rule):
    """Whatever the annotation allows: a parameter the table does not name (a notebook of your own;
    every parameter of specnb's notebooks has a rule, tests/test_parameters.py)."""

    def allowed(self) -> str:
        return "a value of the annotated type"

    def fault(self, value: Any, ctx: Context) -> str | None:
        return None


@dataclass(frozen=True)
class Text(Rule):
    """A string (a name, a path, an address); `nonempty`: not blank."""

    nonempty: bool = False
    types: ClassVar[tuple[str, ...]] = ("str",)

    def allowed(self) -> str:
        return "a non-empty string" if self.nonempty else "a string"

    def fault(self, value: Any, ctx: Context) -> str | None:
        if not isinstance(value, str):
            return "not a string"
        return "" if self.nonempty and not value.strip() else None


@dataclass(frozen=True)
class PromptSource(Rule):
    """A named prompt source or a JSONL file that exists and parses (`io.prompts.source_prompts`),
    read here so that a missing or malformed file is refused before any model loads."""

    types: ClassVar[tuple[str, ...]] = ("str",)

    def allowed(self) -> str:
        return f"{' or '.join(repr(s) for s in SOURCES)}, or the path of a Spec-Bench-style JSONL file"

    def fault(self, value: Any, ctx: Context) -> str | None:
        if not isinstance(value, str) or not value.strip():
            return ""
        if value in SOURCES:
            return None
        try:
            source_prompts(value)
        except (OSError, ValueError) as e:  # PromptRequestError is a ValueError
            return str(e)
        return None


@dataclass(frozen=True)
class Flag(Rule):
    """True or False (the annotation's type is the whole rule)."""

    types: ClassVar[tuple[str, ...]] = ("bool",)

    def allowed(self) -> str:
        return "True or False"

    def fault(self, value: Any, ctx: Context) -> str | None:
        return None if isinstance(value, bool) else ""


@dataclass(frozen=True)
class Each(Rule):
    """A list whose items each follow `item`; `nonempty`: at least one; `includes`: items it must hold."""

    item: Rule
    nonempty: bool = True
    includes: tuple[int, ...] = ()
    types: ClassVar[tuple[str, ...]] = ("list",)

    def allowed(self) -> str:
        holding = f", holding {', '.join(map(str, self.includes))}" if self.includes else ""
        return f"a {'non-empty ' if self.nonempty else ''}list, each item {self.item.allowed()}{holding}"

    def fault(self, value: Any, ctx: Context) -> str | None:
        if not isinstance(value, list):
            return "not a list"
        if self.nonempty and not value:
            return "it is empty"
        faults = ((i, v, self.item.fault(v, ctx)) for i, v in enumerate(value))
        bad = [f"item {i} is {_show(v)}" + (f": {why}" if why else "") for i, v, why in faults if why is not None]
        bad += [f"it lacks {v}" for v in self.includes if v not in value]
        return "; ".join(bad[:MAX_SHOWN] + (["..."] if len(bad) > MAX_SHOWN else [])) or None


def _shape_fault(shape: Any) -> str | None:
    """What is wrong with a tree preset name (`io.tree_spec.PRESET`, `Tree.preset`), its k bounded."""
    if not isinstance(shape, str) or not PRESET.match(shape):
        return f"{_show(shape)} is not a preset"
    k = shape.lstrip("abcdefghijklmnopqrstuvwxyz")
    if k and not 1 <= int(k) <= MAX_TREE_NODES:
        return f"k={int(k)} is not in 1..{MAX_TREE_NODES}"
    try:
        Tree.preset(shape, 1)
    except ValueError as e:
        return str(e)
    return None


@dataclass(frozen=True)
class Shape(Rule):
    """A `Tree.preset` name: chain, wide, sparse, kary<k>, beams<k>."""

    types: ClassVar[tuple[str, ...]] = ("str",)

    def allowed(self) -> str:
        return f"a tree preset: chain, wide, sparse, kary<k> or beams<k> with k in 1..{MAX_TREE_NODES} (e.g. kary2)"

    def fault(self, value: Any, ctx: Context) -> str | None:
        return _shape_fault(value)


@dataclass(frozen=True)
class MethodSpec(Rule):
    """A method spec `drafters.methods.parse_method` reads (custom trees by name included), its
    budget at most MAX_TREE_NODES; `extra`: other names the notebook takes (04: the target alone)."""

    extra: tuple[str, ...] = ()
    types: ClassVar[tuple[str, ...]] = ("str",)

    def allowed(self) -> str:
        extra = f", or {' or '.join(map(repr, self.extra))}" if self.extra else ""
        return (
            f"a method spec [drafter/]shape:budget with budget in 1..{MAX_TREE_NODES} (chain:4, ngram/kary2:8, "
            f"dynamic:16, hf_assisted:4, or a custom tree's name){extra}"
        )

    def fault(self, value: Any, ctx: Context) -> str | None:
        if not isinstance(value, str) or not value.strip():
            return "not a method spec"
        if value in self.extra:
            return None
        head, _, budget = value.strip().partition(":")
        if budget.isdigit() and int(budget) > MAX_TREE_NODES:
            return f"budget {int(budget)} is above {MAX_TREE_NODES}"
        shape = head.rsplit("/", 1)[-1]
        if PRESET.match(shape) and _shape_fault(shape):
            return _shape_fault(shape)
        if ctx.custom is None:
            return None
        try:
            parse_method(value, ctx.custom)
        except ValueError as e:
            return str(e)
        return None


@dataclass(frozen=True)
class HeadShape(Rule):
    """03's attention shape: "" (the target's config), a model name, or heads by hand
    (`bench.attention_grid.head_shape`, which reads no config for a mapping)."""

    types: ClassVar[tuple[str, ...]] = ("str", "dict")

    def allowed(self) -> str:
        return f"'' (the target's config), a model's name, or a mapping like {EXPLICIT_SHAPE}"

    def fault(self, value: Any, ctx: Context) -> str | None:
        if isinstance(value, str):
            return None
        try:
            head_shape(value)
        except (ValueError, TypeError) as e:
            return str(e)
        return None


@dataclass(frozen=True)
class CustomTrees(Rule):
    """Trees by name: None or a mapping. Each spec (its paths, its size) is `io.tree_spec`'s to
    check, before any model loads (the runner's check and the notebooks' `show_trees`)."""

    types: ClassVar[tuple[str, ...]] = ("dict",)
    none_ok: ClassVar[bool] = True

    def allowed(self) -> str:
        return "a mapping of names to tree specs (io.tree_spec), e.g. {'mine': {'branching': [2, 1]}}"

    def fault(self, value: Any, ctx: Context) -> str | None:
        return None if isinstance(value, dict) else ""


@dataclass(frozen=True)
class Pairs(Rule):
    """02's pairs: mappings with the keys of `PAIR_TYPES` (target and draft required); each value is
    then checked by the rule of its name in `RULES`."""

    types: ClassVar[tuple[str, ...]] = ("list",)

    def allowed(self) -> str:
        optional = ", ".join(k for k in PAIR_TYPES if k not in ("target", "draft"))
        return f"a non-empty list of mappings, each with target and draft, and optionally {optional}"

    def fault(self, value: Any, ctx: Context) -> str | None:
        if not isinstance(value, list) or not value:
            return "it is empty" if isinstance(value, list) else "not a list"
        bad = []
        for i, pair in enumerate(value):
            if not isinstance(pair, dict):
                bad.append(f"item {i} is {_show(pair)}, not a mapping")
                continue
            unknown = sorted(set(map(str, pair)) - set(PAIR_TYPES))
            missing = [k for k in ("target", "draft") if k not in pair]
            bad += [f"item {i} has unknown keys {unknown}"] if unknown else []
            bad += [f"item {i} lacks {' and '.join(missing)}"] if missing else []
        return "; ".join(bad) or None


@dataclass(frozen=True)
class Cross:
    """A rule between parameters, checked once each has passed its own; `message` is formatted with
    the values by name and names every one of them."""

    names: tuple[str, ...]
    holds: Callable[..., bool]
    message: str

    def problem(self, values: Mapping[str, Any]) -> str | None:
        if not all(n in values for n in self.names):
            return None
        given = {n: values[n] for n in self.names}
        return None if self.holds(**given) else self.message.format(**given)


TREE = Whole(1, MAX_TREE_NODES)  # a budget: draft tokens per tree
COUNT = Whole(1)  # prompts, repeats, rows, layers: at least one
SOME = Whole(0)  # retries, warm-ups, workers, windows: zero allowed
POSITIVE = Real(0.0, above=True)  # learning rates, epochs, temperatures
METHODS = Each(MethodSpec(), nonempty=False)
QUANTIZED = OneOf(tuple(q for q in QUANTIZATIONS if q is not None))  # None comes from Optional[str]

RULES: Mapping[str, Rule] = MappingProxyType(
    {
        # the run (profile and run_dir are set by the runner)
        "profile": Text(),
        "run_dir": Text(),
        "run_01": Text(),  # 07: the runs its report reads
        "run_02": Text(),
        "run_03": Text(),
        "seed": Whole(0, 2**32 - 1),
        # models
        "target": Text(nonempty=True),
        "draft": Text(),
        "target_quantization": QUANTIZED,
        "draft_quantization": QUANTIZED,
        "draft_layers": COUNT,
        "model_dtype": OneOf(MODEL_DTYPES),
        "cpu_linear": OneOf(LINEAR_PATHS),
        "pairs": Pairs(),
        # prompts and generation
        "prompts": PromptSource(),
        "categories": Each(Text(nonempty=True)),
        "per_category": COUNT,
        "max_prompts": COUNT,
        "max_prompt_tokens": COUNT,
        "max_new_tokens": Whole(1, MAX_NEW_TOKENS),
        "rounds": COUNT,
        "stop_at_eos": Flag(),
        # trees and methods
        "shapes": Each(Shape()),
        "cost_shapes": Each(Shape()),
        "budgets": Each(TREE),
        "nodes": Each(TREE),
        "dynamic_budgets": Each(TREE),
        "custom_trees": CustomTrees(),
        "k": TREE,
        "speed_budget": TREE,
        "methods": METHODS,
        "measure": METHODS,
        "check_methods": METHODS,
        "replay": Flag(),
        "grid": Flag(),
        "super_k": Whole(0, MAX_CHILDREN),
        "super_depth": Whole(1, MAX_DEPTH),
        "super_prompts": COUNT,
        "top_k": TREE,
        "oracle_k": TREE,
        "check_prompts": SOME,
        "measure_prompts": COUNT,
        "heldout_folds": COUNT,
        "method_prompts": COUNT,
        "grid_prompts": COUNT,
        "run_tokens": Whole(1, MAX_NEW_TOKENS),
        "batch": COUNT,
        # collection (01)
        "executor": OneOf(EXECUTORS),
        "ray_address": Text(),
        "ray_workers": SOME,
        "collection_folder": Text(),
        "retries": SOME,
        # timing: attention grid (03), verify-cost and batch curves (01, 03, 06)
        "attention_shape": HeadShape(),
        "dtype": OneOf(MODEL_DTYPES),
        "impls": Each(OneOf((*IMPLEMENTATIONS, CAUSAL))),
        "batches": Each(COUNT),
        "prefixes": Each(COUNT),
        "ragged": Flag(),
        "warmup": SOME,
        "repeats": COUNT,
        "verify_prefix": COUNT,
        "verify_nodes": Each(Whole(0, MAX_TREE_NODES), includes=(0,)),
        "verify_repeats": COUNT,
        "curve_prefix": COUNT,
        "curve_repeats": COUNT,
        "acceptance": Each(Real(0.0, 1.0)),
        "acceptance_from": Text(nonempty=True),
        # bounded caches (04)
        "windows": Each(SOME),
        "sink": SOME,
        "positions": OneOf(POSITIONS),
        "draft_policy": Flag(),
        "bin_tokens": COUNT,
        # learned drafters (05)
        "heads": Text(nonempty=True),
        "num_heads": Whole(1, MAX_DEPTH),
        "train_prompts": COUNT,
        "distill_tokens": Whole(1, MAX_NEW_TOKENS),
        "gen_batch": COUNT,
        "epochs": POSITIVE,
        "batch_size": COUNT,
        "lr": POSITIVE,
        "loss_vocab": OneOf(LOSS_VOCABS),
        "share_lm_head": Flag(),
        "head_layers": COUNT,
        "soft_labels": Flag(),
        "samples": SOME,
        "distill_bfloat16": Flag(),
        "prompt_rows": Flag(),
        "test_prompts": COUNT,
        "typical_prompts": COUNT,
        "temperature": POSITIVE,
        "eagle_heads": Text(nonempty=True),
        "eagle_epochs": POSITIVE,
        "eagle_lr": POSITIVE,
        "eagle_batch_rows": COUNT,
        "eagle_ce_rows": SOME,
        "eagle_depth": Whole(1, MAX_DEPTH),
        "dynamic_top_k": Whole(1, MAX_CHILDREN),
        "draft_dynamic": Flag(),
    }
)
# where one notebook means less than the name does elsewhere: its spec names the rule (`registry`, "rules")
NARROW: Mapping[str, Rule] = MappingProxyType(
    {
        "methods_or_target_alone": Each(MethodSpec(extra=(TARGET_ALONE,)), nonempty=False),
        "model": Text(nonempty=True),  # a draft model that fills every tree
    }
)
CROSSES: tuple[Cross, ...] = (
    Cross(
        ("run_tokens", "max_new_tokens"),
        lambda run_tokens, max_new_tokens: run_tokens <= max_new_tokens,
        "run_tokens={run_tokens} with max_new_tokens={max_new_tokens}: the end-to-end runs are checked against the "
        "replay cut to their length, which the collection must hold; set run_tokens to at most {max_new_tokens}",
    ),
    Cross(
        ("oracle_k", "top_k"),
        lambda oracle_k, top_k: oracle_k <= top_k,
        "oracle_k={oracle_k} with top_k={top_k}: the oracle draws from the ranks stored, so oracle_k must lie "
        "in 1..top_k; set oracle_k to at most {top_k}, or top_k to at least {oracle_k}",
    ),
)


def rule_for(notebook: str, name: str, folder: Path = NOTEBOOKS) -> Rule | None:
    """The rule of parameter `name` in notebook `notebook` (its stem in `folder`): the narrower one its
    spec names (`NARROW`), else `RULES`'; None where neither has one. ValueError where its spec names
    a rule `NARROW` lacks."""
    narrow = registry.spec(notebook, folder).rules.get(name)
    if narrow is not None and narrow not in NARROW:
        raise ValueError(f"{notebook}: its spec's rules name {narrow!r} for {name!r}; known: {sorted(NARROW)}")
    return NARROW[narrow] if narrow is not None else RULES.get(name)


@dataclass(frozen=True)
class Declared:
    """One line of a parameters cell: `name: annotation = default  # help`."""

    annotation: str  # "int", "Optional[str]", "Union[str, dict]"; "" where the line has none
    default: Any
    help: str


def declared(notebook: Path) -> dict[str, Declared]:
    """The notebook's parameters cell (the first code cell tagged 'parameters'), name by name, as
    papermill reads it; ParameterError where there is none or a value is not a literal."""
    cells = json.loads(Path(notebook).read_text()).get("cells", [])
    tagged = [
        c for c in cells if c.get("cell_type") == "code" and "parameters" in c.get("metadata", {}).get("tags", [])
    ]
    if not tagged:
        raise ParameterError(f"{Path(notebook).name}: no cell tagged 'parameters'")
    source = "".join(tagged[0]["source"])
    lines = source.splitlines()
    out = {}
    for node in ast.parse(source).body:
        annotated = isinstance(node, ast.AnnAssign)
        target = node.target if annotated else (node.targets[0] if isinstance(node, ast.Assign) else None)
        if not isinstance(target, ast.Name) or getattr(node, "value", None) is None:
            continue
        annotation = ""
        if annotated:
            text = node.annotation
            annotation = text.value if isinstance(text, ast.Constant) else ast.unparse(text)
        comment = lines[node.end_lineno - 1][node.end_col_offset :].strip().removeprefix("#").strip()
        try:
            value = ast.literal_eval(node.value)
        except ValueError as e:
            raise ParameterError(f"{Path(notebook).name}: parameter {target.id} is not a literal ({e})") from None
        out[target.id] = Declared(str(annotation), value, comment)
    return out


def declared_types(notebook: Path) -> dict[str, str]:
    """Name -> the annotation text of each parameter in the notebook's parameters cell."""
    return {name: d.annotation for name, d in declared(notebook).items()}


_BASES: Mapping[str, tuple[type, ...]] = MappingProxyType(
    {"int": (int,), "float": (int, float), "str": (str,), "bool": (bool,), "list": (list,), "dict": (dict,)}
)


def _fits(annotation: ast.expr, value: Any) -> bool:
    """Whether `value` has the annotation's type: a bool is no int or float, an int is a float."""
    if isinstance(annotation, ast.Constant) and annotation.value is None:
        return value is None
    if isinstance(annotation, ast.Subscript) and isinstance(annotation.value, ast.Name):
        args = annotation.slice.elts if isinstance(annotation.slice, ast.Tuple) else [annotation.slice]
        if annotation.value.id == "Optional":
            return value is None or _fits(args[0], value)
        if annotation.value.id == "Union":
            return any(_fits(a, value) for a in args)
    if isinstance(annotation, ast.Name) and annotation.id in _BASES:
        if isinstance(value, bool) and annotation.id != "bool":
            return False
        return isinstance(value, _BASES[annotation.id])
    raise ValueError(f"annotation {ast.unparse(annotation)!r}: use int, float, str, bool, list, dict, Optional, Union")


def annotation_fits(annotation: str, value: Any) -> bool:
    """Whether `value` has the type the annotation text names (ValueError for an annotation this
    module does not read, or none)."""
    if not annotation:
        raise ValueError("a parameter without an annotation: write `name: type = value  # help`")
    return _fits(ast.parse(annotation, mode="eval").body, value)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= EXAMPLE_CHARS else text[: EXAMPLE_CHARS - 3] + "..."


def _gist(help: str) -> str:
    """A help comment's first clause, short enough for a message."""
    first = help.split("; ")[0]
    return first if len(first) <= EXAMPLE_CHARS else first[: EXAMPLE_CHARS - 3] + "..."


def _example(default: Any) -> str:
    """The default as a fix to suggest; a long list cut to its first items (still a good value)."""
    if isinstance(default, list) and len(repr(default)) > EXAMPLE_CHARS:
        kept = next((n for n in range(len(default), 0, -1) if len(repr(default[:n])) <= EXAMPLE_CHARS), 1)
        return repr(default[:kept])
    return repr(default)


@dataclass(frozen=True)
class Where:
    """A value's place in a message: its label (name, or pairs[1].draft), annotation, help, example."""

    label: str
    annotation: str
    help: str = ""
    example: str = ""


def _type_fault(value: Any) -> str:
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return "got a string"
        return f"got the string {value!r}: write the number unquoted, e.g. {number!r}"
    return f"got a {type(value).__name__}"


def _message(where: Where, rule: Rule, value: Any, fault: str) -> str:
    optional = where.annotation.startswith("Optional") or rule.none_ok
    allowed = ("None or " if optional else "") + rule.allowed()
    said = f" ({where.help})" if where.help else ""
    why = f" ({fault})" if fault else ""
    fix = f"; e.g. {where.label}={where.example}" if where.example else ""
    return f"{where.label}={_show(value)}{said}: must be {allowed}{why}{fix}"


def _check(where: Where, rule: Rule, value: Any, ctx: Context) -> list[str]:
    """The problems of one value: its type against the annotation, then its rule."""
    if value is None and rule.none_ok:
        return []
    if isinstance(rule, Typed):  # a notebook of yours: its annotation, where this module reads it
        try:
            return (
                [] if annotation_fits(where.annotation, value) else [_message(where, rule, value, _type_fault(value))]
            )
        except (ValueError, SyntaxError):
            return []
    if where.annotation and not annotation_fits(where.annotation, value):  # no annotation: the rule alone
        return [_message(where, rule, value, _type_fault(value))]
    if value is None:
        return []
    fault = rule.fault(value, ctx)
    if fault is not None:
        return [_message(where, rule, value, fault)]
    if isinstance(rule, Pairs):
        return [
            problem
            for i, pair in enumerate(value)
            for key, item in pair.items()
            for problem in _check(Where(f"{where.label}[{i}].{key}", PAIR_TYPES[key]), RULES[key], item, ctx)
        ]
    return []


def _custom_trees(specs: Any) -> Mapping[str, Tree | ShapeRule] | None:
    """The custom trees and shape rules by name; None where they do not parse (their own check says why)."""
    try:
        return {**parse_custom_trees(specs), **parse_custom_shapes(specs)}
    except (ValueError, TypeError, SyntaxError):
        return None


def check_parameters(notebook: Path, params: Mapping[str, Any]) -> None:
    """Refuse, before any model loads, resolved parameters of `notebook` that do not fit their
    declared type, their rule (`RULES`) or a rule between them (`CROSSES`): one ParameterError
    listing every problem, each naming the parameter, its value, what is allowed and a fix."""
    notebook = Path(notebook)
    cell = declared(notebook)
    ctx = Context(notebook.stem, _custom_trees(params.get("custom_trees")))
    problems: list[str] = []
    passed: dict[str, Any] = {}
    for name, value in params.items():
        if name not in cell:
            problems.append(f"{name}: not a parameter of {notebook.stem}; it declares {sorted(cell)}")
            continue
        d = cell[name]
        where = Where(name, d.annotation, _gist(d.help), _example(d.default))
        rule = rule_for(notebook.stem, name, notebook.parent) or Typed()  # Typed: a name of yours without a rule
        found = _check(where, rule, value, ctx)
        problems += found
        if not found:
            passed[name] = value
    problems += [p for p in (c.problem(passed) for c in CROSSES) if p]
    if problems:
        raise ParameterError(
            f"{notebook.stem}: {len(problems)} parameter value{'s' if len(problems) > 1 else ''} to change "
            "(nothing was loaded):\n" + "\n".join(f"  {p}" for p in problems)
        )
