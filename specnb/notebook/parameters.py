"""Notebook parameters checked against their declared type and range before any model loads, by
pydantic: a notebook's parameters become one pydantic model (`model_for`), its fields the names of its
parameters cell (`name: annotation = literal  # help`), each typed by its rule in `RULES` (or, where
one notebook means something narrower, the rule of `NARROW` its spec names: `registry`, "rules"),
strict (a bool is no int, a string no number). `check_parameters` checks a notebook's resolved values
against the cell's annotation, then the model, then the rules between parameters (`CROSSES`), and
raises one `ParameterError` listing every problem: the parameter, its value, its help, what is allowed
and a value that works (the notebook's own default, or its first items for a long list).

    MAX_TREE_NODES, MAX_NEW_TOKENS   stated limits: any budget, tree size or node count; tokens generated
    MAX_CHILDREN, MAX_DEPTH          stated limits: children per node and depth of grown trees, heads
    MODEL_DTYPES, EXECUTORS, LOSS_VOCABS, PAIR_TYPES
                                     choices the code accepts where it names no constant of its own
    Rule                             a pydantic type and what it allows in words; made by whole, real,
                                     one_of, text, each, method_spec and the validators below
    Cross                            a rule between parameters (oracle_k <= top_k)
    RULES, NARROW, CROSSES           the table; `rule_for` looks a name up in it
    declared, declared_types, annotation_fits
                                     a notebook's parameters cell read as papermill reads it; a value
                                     against an annotation's text
    model_for, check_parameters      the notebook's model; the check (ParameterError listing every problem)

Types, from the annotation: int, float (an int is one), str, bool, list, dict, Optional[X] (None or
X), Union[X, Y]. Values come from YAML, so `-p max_new_tokens abc` arrives as the string "abc" and
`-p lr 1e-3` as the string "1e-3" (YAML 1.1); both are refused by type. Custom tree specs are
`io.tree_spec`'s to check; here only that they come as a mapping.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, Literal, Optional

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidationInfo,
    create_model,
)

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
STRICT = ConfigDict(strict=True, extra="forbid")


@dataclass(frozen=True)
class Rule:
    """A parameter's range: the pydantic type that checks a value (`type`), what it allows in words,
    and the annotations (Optional stripped) it is written for. `none_ok`: None passes whatever the
    annotation (custom_trees)."""

    type: Any
    allowed: str
    types: tuple[str, ...]
    none_ok: bool = False


def whole(low: int, high: int | None = None) -> Rule:
    """An integer in low..high (high None: no upper bound)."""
    said = f"an integer in {low}..{high}" if high is not None else f"an integer >= {low}"
    return Rule(Annotated[StrictInt, Field(ge=low, le=high)], said, ("int",))


def real(low: float, high: float | None = None, above: bool = False) -> Rule:
    """A finite number from low (excluded where `above`) up to high (None: no upper bound)."""
    if high is not None:
        said = f"a number in {'(' if above else '['}{low:g}, {high:g}]"
    else:
        said = f"a number {'>' if above else '>='} {low:g}"
    bound = Field(gt=low, le=high, allow_inf_nan=False) if above else Field(ge=low, le=high, allow_inf_nan=False)
    return Rule(Annotated[float, bound], said, ("float",))


def one_of(options: tuple[str, ...]) -> Rule:
    said = ", ".join(map(repr, options))
    return Rule(Literal[options], said if len(options) == 1 else f"one of {said}", ("str",))


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("")
    return value


def text(nonempty: bool = False) -> Rule:
    """A string (a name, a path, an address); `nonempty`: not blank."""
    if nonempty:
        return Rule(Annotated[StrictStr, AfterValidator(_not_blank)], "a non-empty string", ("str",))
    return Rule(StrictStr, "a string", ("str",))


def each(item: Rule, nonempty: bool = True, includes: tuple[int, ...] = ()) -> Rule:
    """A list whose items each follow `item`; `nonempty`: at least one; `includes`: items it must hold."""

    def holds(value: list) -> list:
        lacking = [f"it lacks {v}" for v in includes if v not in value]
        if lacking:
            raise ValueError("; ".join(lacking))
        return value

    holding = f", holding {', '.join(map(str, includes))}" if includes else ""
    said = f"a {'non-empty ' if nonempty else ''}list, each item {item.allowed}{holding}"
    kind = Annotated[list[item.type], Field(min_length=1 if nonempty else 0), AfterValidator(holds)]
    return Rule(kind, said, ("list",))


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


def _valid(fault: Callable[..., str | None]) -> Callable[..., Any]:
    """A pydantic validator from a function saying what is wrong with a value (None: nothing)."""

    def check(value: Any, info: ValidationInfo) -> Any:
        why = fault(value, (info.context or {}).get("custom"))
        if why is not None:
            raise ValueError(why)
        return value

    return check


def _method_fault(extra: tuple[str, ...]) -> Callable[[Any, Any], str | None]:
    def fault(value: str, custom: Mapping[str, Tree | ShapeRule] | None) -> str | None:
        if not value.strip():
            return "not a method spec"
        if value in extra:
            return None
        head, _, budget = value.strip().partition(":")
        if budget.isdigit() and int(budget) > MAX_TREE_NODES:
            return f"budget {int(budget)} is above {MAX_TREE_NODES}"
        shape = head.rsplit("/", 1)[-1]
        if PRESET.match(shape) and _shape_fault(shape):
            return _shape_fault(shape)
        if custom is None:  # the custom trees do not parse: `io.tree_spec` says why, the spec stays a string
            return None
        try:
            parse_method(value, custom)
        except ValueError as e:
            return str(e)
        return None

    return fault


def method_spec(extra: tuple[str, ...] = ()) -> Rule:
    """A method spec `drafters.methods.parse_method` reads (custom trees by name included, the
    validation's context), its budget at most MAX_TREE_NODES; `extra`: other names the notebook
    takes (04: the target alone)."""
    also = f", or {' or '.join(map(repr, extra))}" if extra else ""
    said = (
        f"a method spec [drafter/]shape:budget with budget in 1..{MAX_TREE_NODES} (chain:4, ngram/kary2:8, "
        f"dynamic:16, hf_assisted:4, or a custom tree's name){also}"
    )
    return Rule(Annotated[StrictStr, AfterValidator(_valid(_method_fault(extra)))], said, ("str",))


def _head_fault(value: Any, custom: Any) -> str | None:
    """03's attention shape: "" (the target's config), a model name, or heads by hand
    (`bench.attention_grid.head_shape`, which reads no config for a mapping)."""
    if isinstance(value, str):
        return None
    try:
        head_shape(value)
    except (ValueError, TypeError) as e:
        return str(e)
    return None


def _prompts_fault(value: str, custom: Any) -> str | None:
    """A named prompt source or a JSONL file that exists and parses (`io.prompts.source_prompts`),
    read here so that a missing or malformed file is refused before any model loads."""
    if not value.strip():
        return ""
    if value in SOURCES:
        return None
    try:
        source_prompts(value)
    except (OSError, ValueError) as e:  # PromptRequestError is a ValueError
        return str(e)
    return None


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


TREE = whole(1, MAX_TREE_NODES)  # a budget: draft tokens per tree
COUNT = whole(1)  # prompts, repeats, rows, layers: at least one
SOME = whole(0)  # retries, warm-ups, workers, windows: zero allowed
POSITIVE = real(0.0, above=True)  # learning rates, epochs, temperatures
FLAG = Rule(StrictBool, "True or False", ("bool",))
SHAPE = Rule(
    Annotated[StrictStr, AfterValidator(_valid(lambda v, _: _shape_fault(v)))],
    f"a tree preset: chain, wide, sparse, kary<k> or beams<k> with k in 1..{MAX_TREE_NODES} (e.g. kary2)",
    ("str",),
)
METHODS = each(method_spec(), nonempty=False)
QUANTIZED = one_of(tuple(q for q in QUANTIZATIONS if q is not None))  # None comes from Optional[str]
PROMPTS = Rule(
    Annotated[StrictStr, AfterValidator(_valid(_prompts_fault))],
    f"{' or '.join(repr(s) for s in SOURCES)}, or the path of a Spec-Bench-style JSONL file",
    ("str",),
)
HEAD_SHAPE = Rule(
    Annotated[Any, AfterValidator(_valid(_head_fault))],
    f"'' (the target's config), a model's name, or a mapping like {EXPLICIT_SHAPE}",
    ("str", "dict"),
)
CUSTOM_TREES = Rule(
    dict,
    "a mapping of names to tree specs (io.tree_spec), e.g. {'mine': {'branching': [2, 1]}}",
    ("dict",),
    none_ok=True,
)

RULES: dict[str, Rule] = dict(
    {
        # the run (profile and run_dir are set by the runner)
        "profile": text(),
        "run_dir": text(),
        "run_01": text(),  # 07: the runs its report reads
        "run_02": text(),
        "run_03": text(),
        "seed": whole(0, 2**32 - 1),
        # models
        "target": text(nonempty=True),
        "draft": text(),
        "target_quantization": QUANTIZED,
        "draft_quantization": QUANTIZED,
        "draft_layers": COUNT,
        "model_dtype": one_of(MODEL_DTYPES),
        "cpu_linear": one_of(LINEAR_PATHS),
        # prompts and generation
        "prompts": PROMPTS,
        "categories": each(text(nonempty=True)),
        "per_category": COUNT,
        "max_prompts": COUNT,
        "max_prompt_tokens": COUNT,
        "max_new_tokens": whole(1, MAX_NEW_TOKENS),
        "rounds": COUNT,
        "stop_at_eos": FLAG,
        # trees and methods
        "shapes": each(SHAPE),
        "cost_shapes": each(SHAPE),
        "budgets": each(TREE),
        "nodes": each(TREE),
        "dynamic_budgets": each(TREE),
        "custom_trees": CUSTOM_TREES,
        "k": TREE,
        "speed_budget": TREE,
        "methods": METHODS,
        "measure": METHODS,
        "check_methods": METHODS,
        "replay": FLAG,
        "grid": FLAG,
        "super_k": whole(0, MAX_CHILDREN),
        "super_depth": whole(1, MAX_DEPTH),
        "super_prompts": COUNT,
        "top_k": TREE,
        "oracle_k": TREE,
        "check_prompts": SOME,
        "measure_prompts": COUNT,
        "heldout_folds": COUNT,
        "method_prompts": COUNT,
        "grid_prompts": COUNT,
        "run_tokens": whole(1, MAX_NEW_TOKENS),
        "batch": COUNT,
        # collection (01)
        "executor": one_of(EXECUTORS),
        "ray_address": text(),
        "ray_workers": SOME,
        "collection_folder": text(),
        "retries": SOME,
        # timing: attention grid (03), verify-cost and batch curves (01, 03, 06)
        "attention_shape": HEAD_SHAPE,
        "dtype": one_of(MODEL_DTYPES),
        "impls": each(one_of((*IMPLEMENTATIONS, CAUSAL))),
        "batches": each(COUNT),
        "prefixes": each(COUNT),
        "ragged": FLAG,
        "warmup": SOME,
        "repeats": COUNT,
        "verify_prefix": COUNT,
        "verify_nodes": each(whole(0, MAX_TREE_NODES), includes=(0,)),
        "verify_repeats": COUNT,
        "curve_prefix": COUNT,
        "curve_repeats": COUNT,
        "acceptance": each(real(0.0, 1.0)),
        "acceptance_from": text(nonempty=True),
        # bounded caches (04)
        "windows": each(SOME),
        "sink": SOME,
        "positions": one_of(POSITIONS),
        "draft_policy": FLAG,
        "bin_tokens": COUNT,
        # learned drafters (05)
        "heads": text(nonempty=True),
        "num_heads": whole(1, MAX_DEPTH),
        "train_prompts": COUNT,
        "distill_tokens": whole(1, MAX_NEW_TOKENS),
        "gen_batch": COUNT,
        "epochs": POSITIVE,
        "batch_size": COUNT,
        "lr": POSITIVE,
        "loss_vocab": one_of(LOSS_VOCABS),
        "share_lm_head": FLAG,
        "head_layers": COUNT,
        "soft_labels": FLAG,
        "samples": SOME,
        "distill_bfloat16": FLAG,
        "prompt_rows": FLAG,
        "test_prompts": COUNT,
        "typical_prompts": COUNT,
        "temperature": POSITIVE,
        "eagle_heads": text(nonempty=True),
        "eagle_epochs": POSITIVE,
        "eagle_lr": POSITIVE,
        "eagle_batch_rows": COUNT,
        "eagle_ce_rows": SOME,
        "eagle_depth": whole(1, MAX_DEPTH),
        "dynamic_top_k": whole(1, MAX_CHILDREN),
        "draft_dynamic": FLAG,
    }
)
RULES["pairs"] = Rule(
    Annotated[
        list[
            create_model(
                "Pair",
                __config__=STRICT,
                **{
                    key: (Optional[RULES[key].type], None)  # noqa: UP045 (a type built at run time)
                    if annotation.startswith("Optional")
                    else (RULES[key].type, ...)
                    for key, annotation in PAIR_TYPES.items()
                },
            )
        ],
        Field(min_length=1),
    ],
    "a non-empty list of mappings, each with target and draft, and optionally "
    + ", ".join(k for k in PAIR_TYPES if k not in ("target", "draft")),
    ("list",),
)
RULES = MappingProxyType(RULES)
# where one notebook means less than the name does elsewhere: its spec names the rule (`registry`, "rules")
NARROW: Mapping[str, Rule] = MappingProxyType(
    {
        "methods_or_target_alone": each(method_spec(extra=(TARGET_ALONE,)), nonempty=False),
        "model": text(nonempty=True),  # a draft model that fills every tree
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
    spec names (`NARROW`), else `RULES`'; None where neither has one (a name of yours: its annotation
    alone). ValueError where its spec names a rule `NARROW` lacks."""
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


def _message(where: Where, rule: Rule | None, value: Any, fault: str) -> str:
    optional = where.annotation.startswith("Optional") or (rule is not None and rule.none_ok)
    allowed = ("None or " if optional else "") + (rule.allowed if rule is not None else "a value of its type")
    said = f" ({where.help})" if where.help else ""
    why = f" ({fault})" if fault else ""
    fix = f"; e.g. {where.label}={where.example}" if where.example else ""
    return f"{where.label}={_show(value)}{said}: must be {allowed}{why}{fix}"


# pydantic's error types in the words of a message ("" where showing the value says it)
REASONS = {
    "int_type": "not an integer",
    "float_type": "not a number",
    "string_type": "not a string",
    "bool_type": "not True or False",
    "dict_type": "not a mapping",
    "model_type": "not a mapping",
    "finite_number": "not finite",
    "too_short": "it is empty",
}


def _reason(error: Mapping[str, Any]) -> str:
    if error["type"] == "value_error":  # one of this module's validators: its own words
        return str(error["ctx"]["error"])
    quiet = error["type"] == "literal_error" or "than" in error["type"]  # the value and the range say it
    return REASONS.get(error["type"], "" if quiet else error["msg"])


def _problems(where: Where, rule: Rule, value: Any, errors: list[Mapping[str, Any]]) -> list[str]:
    """The messages of one value's pydantic errors (their locations within the value): one for the
    value, its bad items named (at most MAX_SHOWN); each key of a pair (02's `pairs`) a message of its own."""
    said: list[str] = []
    keyed: dict[tuple[int, str], list[Mapping[str, Any]]] = {}
    unknown: dict[int, list[str]] = {}
    lacking: dict[int, list[str]] = {}
    for e in errors:
        loc = e["loc"]
        if not loc:
            said.append(_reason(e))
        elif len(loc) > 1 and e["type"] in ("extra_forbidden", "missing"):
            (unknown if e["type"] == "extra_forbidden" else lacking).setdefault(loc[0], []).append(loc[1])
        elif len(loc) > 1:  # a pair's key
            keyed.setdefault((loc[0], loc[1]), []).append({**e, "loc": loc[2:]})
        elif e["type"] == "model_type":
            said.append(f"item {loc[0]} is {_show(e['input'])}, not a mapping")
        else:
            why = _reason(e)
            said.append(f"item {loc[0]} is {_show(e['input'])}" + (f": {why}" if why else ""))
    said += [f"item {i} has unknown keys {sorted(keys)}" for i, keys in unknown.items()]
    said += [f"item {i} lacks {' and '.join(keys)}" for i, keys in lacking.items()]
    out = []
    if said or not keyed:
        shown = [s for s in said if s]
        more = ["..."] if len(shown) > MAX_SHOWN else []
        out.append(_message(where, rule, value, "; ".join(shown[:MAX_SHOWN] + more)))
    for (i, key), found in keyed.items():
        out += _problems(Where(f"{where.label}[{i}].{key}", PAIR_TYPES[key]), RULES[key], value[i][key], found)
    return out


def _custom_trees(specs: Any) -> Mapping[str, Tree | ShapeRule] | None:
    """The custom trees and shape rules by name; None where they do not parse (their own check says why)."""
    try:
        return {**parse_custom_trees(specs), **parse_custom_shapes(specs)}
    except (ValueError, TypeError, SyntaxError):
        return None


def model_for(notebook: Path) -> type[BaseModel]:
    """The notebook's parameters as a strict pydantic model: a field per name of its parameters cell
    that has a rule (`rule_for`), of the rule's type (None allowed where the annotation is Optional),
    the cell's literal its default. Validate with context={"custom": custom trees by name}."""
    notebook = Path(notebook)
    fields = {}
    for name, d in declared(notebook).items():
        rule = rule_for(notebook.stem, name, notebook.parent)
        if rule is not None:
            optional = d.annotation.startswith("Optional") or rule.none_ok
            fields[name] = (Optional[rule.type] if optional else rule.type, d.default)  # noqa: UP045
    return create_model(f"Parameters_{notebook.stem}", __config__=STRICT, **fields)


def check_parameters(notebook: Path, params: Mapping[str, Any]) -> None:
    """Refuse, before any model loads, resolved parameters of `notebook` that do not fit their
    declared type, their rule (`model_for`) or a rule between them (`CROSSES`): one ParameterError
    listing every problem, each naming the parameter, its value, what is allowed and a fix."""
    notebook = Path(notebook)
    cell = declared(notebook)
    model = model_for(notebook)
    problems: list[str] = []
    typed: dict[str, Any] = {}
    for name, value in params.items():
        if name not in cell:
            problems.append(f"{name}: not a parameter of {notebook.stem}; it declares {sorted(cell)}")
            continue
        rule = rule_for(notebook.stem, name, notebook.parent)
        none_ok = value is None and rule is not None and rule.none_ok
        try:
            fits = none_ok or annotation_fits(cell[name].annotation, value)
        except (ValueError, SyntaxError):  # an annotation this module does not read: the rule alone
            fits = True
        if not fits:
            problems.append(_message(_where(name, cell[name]), rule, value, _type_fault(value)))
        else:
            typed[name] = value
    errors: dict[str, list[Mapping[str, Any]]] = {}
    try:
        model.model_validate(
            {k: v for k, v in typed.items() if k in model.model_fields},
            context={"custom": _custom_trees(params.get("custom_trees"))},
        )
    except ValidationError as e:
        for error in e.errors():
            errors.setdefault(error["loc"][0], []).append({**error, "loc": error["loc"][1:]})
    for name, found in errors.items():
        problems += _problems(
            _where(name, cell[name]), rule_for(notebook.stem, name, notebook.parent), typed[name], found
        )
    passed = {k: v for k, v in typed.items() if k not in errors}
    problems += [p for p in (c.problem(passed) for c in CROSSES) if p]
    if problems:
        raise ParameterError(
            f"{notebook.stem}: {len(problems)} parameter value{'s' if len(problems) > 1 else ''} to change "
            "(nothing was loaded):\n" + "\n".join(f"  {p}" for p in problems)
        )


def _where(name: str, d: Declared) -> Where:
    return Where(name, d.annotation, _gist(d.help), _example(d.default))
