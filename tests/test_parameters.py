"""Notebook parameters are checked against their declared type and range before any model loads
(`specnb.notebook.parameters`): every declared name has a rule, every profile passes, and each bad
value is refused with a message naming the parameter, what is allowed and a fix."""

import ast
from pathlib import Path

import pytest
import torch

from specnb.experiments.checks import ParameterError
from specnb.experiments.executors import executor_for
from specnb.io.models import model_dtype
from specnb.notebook import places, runner
from specnb.notebook.parameters import (
    EXECUTORS,
    LOSS_VOCABS,
    MAX_NEW_TOKENS,
    MAX_TREE_NODES,
    MODEL_DTYPES,
    annotation_fits,
    check_parameters,
    declared_types,
    model_for,
    rule_for,
)
from specnb.training.medusa import TrainConfig

BOOKS = runner.notebooks()
BY_STEM = {nb.stem: nb for nb in BOOKS}
PROFILE_NAMES = sorted(p.stem for p in places.PROFILES.glob("*.yaml"))
TREES_EXAMPLE = runner.NOTEBOOKS / "my_trees.example.yaml"


def defaults(stem: str, **changed) -> dict:
    """A notebook's own literals, with some changed: what the runner resolves for the cpu profile."""
    return {**runner.declared_parameters(BY_STEM[stem]), **changed}


def refusal(stem: str, **changed) -> str:
    with pytest.raises(ParameterError) as e:
        check_parameters(BY_STEM[stem], defaults(stem, **changed))
    return str(e.value)


def annotation_bases(annotation: str) -> set[str]:
    """The type names an annotation admits besides None: Optional[int] -> {int}."""
    node = ast.parse(annotation, mode="eval").body
    if isinstance(node, ast.Subscript):
        inner = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        return {ast.unparse(a) for a in inner if not (isinstance(a, ast.Constant) and a.value is None)}
    return {ast.unparse(node)}


def test_the_notebooks_are_found():
    assert [nb.stem[:2] for nb in BOOKS] == ["01", "02", "03", "04", "05", "06", "07"]


@pytest.mark.parametrize("notebook", BOOKS, ids=lambda p: p.stem)
def test_every_declared_parameter_has_a_rule_for_its_type(notebook: Path):
    types = declared_types(notebook)
    assert set(types) == set(runner.declared_parameters(notebook))
    for name, annotation in types.items():
        rule = rule_for(notebook.stem, name)
        assert rule is not None, f"{notebook.stem}: {name} has no rule in specnb.notebook.parameters.RULES"
        assert annotation_bases(annotation) == set(rule.types), f"{notebook.stem}: {name}: {annotation} vs {rule}"
        assert annotation_fits(annotation, runner.declared_parameters(notebook)[name]), name


@pytest.mark.parametrize("notebook", BOOKS, ids=lambda p: p.stem)
def test_each_notebook_is_a_pydantic_model_of_its_parameters_cell(notebook: Path):
    """The model's fields are the cell's names, its defaults the cell's literals; the literals pass."""
    model = model_for(notebook)
    cell = runner.declared_parameters(notebook)
    assert set(model.model_fields) == set(cell)
    assert {name: field.default for name, field in model.model_fields.items()} == cell
    assert model.model_validate(cell, context={"custom": {}}).model_dump(exclude_unset=True) == cell
    assert set(model.model_json_schema()["properties"]) == set(cell)


def profile_cases() -> list[tuple[str, list[Path]]]:
    return [(name, extra) for name in PROFILE_NAMES for extra in ([], [TREES_EXAMPLE])]


@pytest.mark.parametrize("profile,extra", profile_cases(), ids=lambda c: c if isinstance(c, str) else str(len(c)))
def test_every_profile_passes(profile: str, extra: list[Path]):
    chosen = runner.runner_settings(profile).notebooks
    books = runner.notebooks(only=list(chosen) or None)
    resolved = runner.resolve(profile, {}, extra, books, places.PROFILES)
    for nb in books:
        check_parameters(nb, resolved[nb.stem])


BAD = [
    # (notebook, changed, what the message must hold)
    ("01_tree_shapes", {"budgets": [0]}, ["budgets=[0]", f"1..{MAX_TREE_NODES}", "e.g. budgets="]),
    ("01_tree_shapes", {"budgets": [-4, 8]}, ["budgets=[-4, 8]", f"1..{MAX_TREE_NODES}", "item 0 is -4"]),
    ("01_tree_shapes", {"budgets": [100000]}, ["budgets=[100000]", f"1..{MAX_TREE_NODES}"]),
    ("01_tree_shapes", {"budgets": []}, ["budgets=[]", "non-empty"]),
    ("01_tree_shapes", {"max_new_tokens": 0}, ["max_new_tokens=0", f"1..{MAX_NEW_TOKENS}", "e.g. max_new_tokens=128"]),
    ("01_tree_shapes", {"max_new_tokens": "abc"}, ["max_new_tokens='abc'", f"1..{MAX_NEW_TOKENS}", "string"]),
    ("01_tree_shapes", {"max_new_tokens": 100_000}, ["max_new_tokens=100000", f"1..{MAX_NEW_TOKENS}"]),
    ("01_tree_shapes", {"top_k": 1}, ["oracle_k=8", "top_k=1", "1..top_k"]),
    ("01_tree_shapes", {"top_k": 0}, ["top_k=0", f"1..{MAX_TREE_NODES}"]),
    ("01_tree_shapes", {"oracle_k": 0}, ["oracle_k=0", f"1..{MAX_TREE_NODES}"]),
    ("01_tree_shapes", {"target_quantization": "3bit"}, ["target_quantization='3bit'", "None or '4bit'"]),
    ("01_tree_shapes", {"draft_quantization": "8bit"}, ["draft_quantization='8bit'", "'4bit'"]),
    ("01_tree_shapes", {"model_dtype": "float64"}, ["model_dtype='float64'", "'bfloat16'"]),
    ("01_tree_shapes", {"cpu_linear": "mkl"}, ["cpu_linear='mkl'", "'stock', 'onednn'"]),
    ("01_tree_shapes", {"executor": "dask"}, ["executor='dask'", "'local', 'ray'"]),
    ("01_tree_shapes", {"shapes": ["chain", "tree9"]}, ["shapes=", "kary<k>", "item 1 is 'tree9'"]),
    ("01_tree_shapes", {"shapes": ["kary0"]}, ["shapes=['kary0']", "k=0"]),
    ("01_tree_shapes", {"dynamic_budgets": [4, 2000]}, ["dynamic_budgets=", f"1..{MAX_TREE_NODES}"]),
    ("01_tree_shapes", {"verify_nodes": [4, 8]}, ["verify_nodes=[4, 8]", "holding 0"]),
    ("01_tree_shapes", {"verify_nodes": [0, -1]}, ["verify_nodes=", f"0..{MAX_TREE_NODES}"]),
    ("01_tree_shapes", {"super_k": 65}, ["super_k=65", "0..64"]),
    ("01_tree_shapes", {"super_depth": 0}, ["super_depth=0", "1..16"]),
    ("01_tree_shapes", {"super_prompts": 0}, ["super_prompts=0", "None or an integer >= 1"]),
    ("01_tree_shapes", {"retries": -1}, ["retries=-1", ">= 0"]),
    ("01_tree_shapes", {"ray_workers": -2}, ["ray_workers=-2", ">= 0"]),
    ("01_tree_shapes", {"per_category": 0}, ["per_category=0", ">= 1"]),
    ("01_tree_shapes", {"draft": ""}, ["draft=''", "non-empty string"]),
    ("01_tree_shapes", {"draft_layers": 0}, ["draft_layers=0", "None or an integer >= 1"]),
    ("01_tree_shapes", {"check_methods": ["chain:4000"]}, ["check_methods=", f"budget 4000 is above {MAX_TREE_NODES}"]),
    ("01_tree_shapes", {"check_methods": ["wat/chain:4"]}, ["check_methods=", "unknown drafter 'wat'"]),
    ("02_model_pairs", {"methods": ["chain:4", "kary2"]}, ["methods=", "item 1 is 'kary2'"]),
    ("02_model_pairs", {"measure": [4]}, ["measure=[4]", "method spec"]),
    ("02_model_pairs", {"rounds": 0}, ["rounds=0", ">= 1"]),
    ("02_model_pairs", {"categories": []}, ["categories=[]", "None or a non-empty list"]),
    ("02_model_pairs", {"pairs": []}, ["pairs=[]", "non-empty list of mappings"]),
    ("02_model_pairs", {"pairs": [{"target": "a", "draft": "b", "dtype": "float16"}]}, ["unknown keys ['dtype']"]),
    ("02_model_pairs", {"pairs": [{"target": "a"}]}, ["pairs=", "item 0 lacks draft"]),
    (
        "02_model_pairs",
        {"pairs": [{"target": "a", "draft": "b", "target_quantization": "3bit"}]},
        ["pairs[0].target_quantization='3bit'", "None or '4bit'"],
    ),
    ("02_model_pairs", {"pairs": [{"target": "a", "draft": "b", "draft_layers": -1}]}, ["pairs[0].draft_layers=-1"]),
    ("02_model_pairs", {"pairs": [{"target": "a", "draft": "b", "methods": ["chain:0"]}]}, ["pairs[0].methods="]),
    ("03_tree_attention_timing", {"impls": ["sdpa", "fast"]}, ["impls=", "'per_sequence'", "item 1 is 'fast'"]),
    ("03_tree_attention_timing", {"nodes": [0, 8]}, ["nodes=[0, 8]", f"1..{MAX_TREE_NODES}"]),
    ("03_tree_attention_timing", {"cost_shapes": ["chain", "beams0"]}, ["cost_shapes=", "k=0"]),
    ("03_tree_attention_timing", {"batches": [0]}, ["batches=[0]", ">= 1"]),
    ("03_tree_attention_timing", {"prefixes": [64, 0]}, ["prefixes=", ">= 1"]),
    ("03_tree_attention_timing", {"warmup": -1}, ["warmup=-1", ">= 0"]),
    ("03_tree_attention_timing", {"repeats": 0}, ["repeats=0", ">= 1"]),
    ("03_tree_attention_timing", {"acceptance": [0.5, 1.5]}, ["acceptance=", "[0, 1]", "item 1 is 1.5"]),
    ("03_tree_attention_timing", {"dtype": "int8"}, ["dtype='int8'", "'float16'"]),
    (
        "03_tree_attention_timing",
        {"attention_shape": {"heads": 24, "kv_heads": 7, "head_dim": 128}},
        ["attention_shape=", "multiple of kv_heads"],
    ),
    ("03_tree_attention_timing", {"attention_shape": {"heads": 24}}, ["attention_shape=", "head_dim"]),
    ("04_long_generation", {"positions": "rope"}, ["positions='rope'", "'cache', 'original'"]),
    ("04_long_generation", {"windows": [0, -16]}, ["windows=", ">= 0"]),
    ("04_long_generation", {"sink": -1}, ["sink=-1", ">= 0"]),
    ("04_long_generation", {"methods": ["autoregressive", "chain4"]}, ["methods=", "item 1 is 'chain4'"]),
    ("04_long_generation", {"bin_tokens": 0}, ["bin_tokens=0", ">= 1"]),
    ("05_learned_drafters", {"loss_vocab": "all"}, ["loss_vocab='all'", "'sampled', 'seen', 'full'"]),
    ("05_learned_drafters", {"lr": 0.0}, ["lr=0.0", "a number > 0"]),
    ("05_learned_drafters", {"lr": "1e-3"}, ["lr='1e-3'", "a number > 0", "unquoted"]),
    ("05_learned_drafters", {"epochs": -1.0}, ["epochs=-1.0", "> 0"]),
    ("05_learned_drafters", {"temperature": float("inf")}, ["temperature=inf", "not finite"]),
    ("05_learned_drafters", {"eagle_lr": float("nan")}, ["eagle_lr=nan", "> 0"]),
    ("05_learned_drafters", {"num_heads": 0}, ["num_heads=0", "1..16"]),
    ("05_learned_drafters", {"eagle_depth": 40}, ["eagle_depth=40", "1..16"]),
    ("05_learned_drafters", {"dynamic_top_k": 0}, ["dynamic_top_k=0", "1..64"]),
    ("05_learned_drafters", {"samples": -1}, ["samples=-1", ">= 0"]),
    ("05_learned_drafters", {"eagle_ce_rows": -1}, ["eagle_ce_rows=-1", ">= 0"]),
    ("05_learned_drafters", {"heads": ""}, ["heads=''", "non-empty string"]),
    ("05_learned_drafters", {"speed_budget": 0}, ["speed_budget=0", f"1..{MAX_TREE_NODES}"]),
    ("05_learned_drafters", {"distill_tokens": 0}, ["distill_tokens=0", f"1..{MAX_NEW_TOKENS}"]),
    ("06_batch_size", {"k": 0}, ["k=0", f"1..{MAX_TREE_NODES}"]),
    ("06_batch_size", {"curve_repeats": 0}, ["curve_repeats=0", ">= 1"]),
    ("06_batch_size", {"seed": -1}, ["seed=-1", "0..4294967295"]),
]


@pytest.mark.parametrize(
    "stem,changed,said", BAD, ids=[f"{s[:2]}-{next(iter(c))}-{i}" for i, (s, c, _) in enumerate(BAD)]
)
def test_a_bad_value_is_refused_naming_the_parameter_and_its_range(stem: str, changed: dict, said: list[str]):
    message = refusal(stem, **changed)
    for text in said:
        assert text in message, f"{text!r} not in:\n{message}"


@pytest.mark.parametrize(
    "stem,changed,said",
    [
        ("01_tree_shapes", {"max_new_tokens": True}, "got a bool"),  # a bool is no int
        ("01_tree_shapes", {"seed": False}, "got a bool"),
        ("01_tree_shapes", {"max_new_tokens": 40.0}, "got a float"),  # a float where an int is wanted
        ("01_tree_shapes", {"budgets": [4.0, 8]}, "item 0 is 4.0: not an integer"),
        ("01_tree_shapes", {"budgets": [True]}, "item 0 is True: not an integer"),
        ("01_tree_shapes", {"budgets": "4, 8"}, "got a string"),  # a string where a list is wanted
        ("01_tree_shapes", {"budgets": 8}, "got a int"),
        ("01_tree_shapes", {"shapes": "chain"}, "got a string"),
        ("01_tree_shapes", {"custom_trees": [[0]]}, "got a list"),
        ("02_model_pairs", {"replay": "yes"}, "got a string"),
        ("02_model_pairs", {"replay": 1}, "got a int"),
        ("05_learned_drafters", {"lr": True}, "got a bool"),
        ("05_learned_drafters", {"epochs": "4"}, "write the number unquoted, e.g. 4.0"),
        ("03_tree_attention_timing", {"attention_shape": 24}, "got a int"),
    ],
)
def test_a_value_of_the_wrong_type_is_refused(stem: str, changed: dict, said: str):
    assert said in refusal(stem, **changed)


def test_every_problem_is_reported_in_one_error():
    message = refusal(
        "01_tree_shapes", budgets=[0], max_new_tokens="abc", top_k=1, oracle_k=4, target_quantization="3bit", seed=True
    )
    assert message.startswith("01_tree_shapes: 5 parameter values to change")
    for name in ("budgets=", "max_new_tokens=", "oracle_k=4 with top_k=1", "target_quantization=", "seed="):
        assert name in message
    assert len(message.splitlines()) == 6  # the heading and one line per problem


def test_a_cross_rule_waits_for_its_parameters_own_checks():
    message = refusal("01_tree_shapes", top_k=0, oracle_k=8)
    assert "top_k=0" in message and "oracle_k=8 with" not in message


def test_every_bad_item_of_a_list_is_named():
    message = refusal("01_tree_shapes", budgets=[0, 4, -1, 2000])
    assert "item 0 is 0" in message and "item 2 is -1" in message and "item 3 is 2000" in message


@pytest.mark.parametrize(
    "stem,changed",
    [
        ("01_tree_shapes", {"draft_layers": None, "super_prompts": None, "model_dtype": "bfloat16", "super_k": 0}),
        ("01_tree_shapes", {"custom_trees": None, "check_methods": [], "top_k": 8, "oracle_k": 8}),
        ("02_model_pairs", {"custom_trees": {"mine": [[0], [1]]}, "methods": ["ngram/mine", "xtok/mine:2", "mine"]}),
        ("02_model_pairs", {"categories": None, "measure": [], "rounds": 3}),
        ("02_model_pairs", {"pairs": [{"target": "a", "draft": "b", "draft_layers": None, "methods": None}]}),
        ("03_tree_attention_timing", {"attention_shape": {"heads": 32, "kv_heads": 8, "head_dim": 128}}),
        ("03_tree_attention_timing", {"attention_shape": "meta-llama/Llama-2-7b-hf", "warmup": 0}),
        ("04_long_generation", {"methods": ["autoregressive"], "windows": [0], "sink": 0, "positions": "original"}),
        ("05_learned_drafters", {"lr": 1, "epochs": 1, "temperature": 1e-3, "eagle_ce_rows": 0, "samples": 0}),
        ("06_batch_size", {"target_quantization": "4bit", "draft_quantization": "4bit", "k": MAX_TREE_NODES}),
    ],
)
def test_good_values_pass(stem: str, changed: dict):
    check_parameters(BY_STEM[stem], defaults(stem, **changed))


def test_methods_may_name_the_notebooks_custom_trees_only():
    mine = {"mine": [[0], [1]]}
    assert "custom_trees: ['mine']" in refusal("02_model_pairs", custom_trees=mine, methods=["ngram/other"])
    assert "custom tree 'mine' has 2 nodes" in refusal("02_model_pairs", custom_trees=mine, methods=["mine:3"])
    assert "pairs[0].methods=['mine']" in refusal(
        "02_model_pairs", pairs=[{"target": "a", "draft": "b", "methods": ["mine"]}]
    )


def test_a_bad_custom_tree_spec_is_left_to_tree_spec():
    # a rank gap is io.tree_spec's to report (the runner and show_trees do); methods are then checked as strings
    gap = {"mine": [[0], [2]]}
    check_parameters(BY_STEM["02_model_pairs"], defaults("02_model_pairs", custom_trees=gap, methods=["mine"]))


def test_a_name_the_notebook_does_not_declare_is_refused():
    assert "lr: not a parameter of 01_tree_shapes" in refusal("01_tree_shapes", lr=0.1)


def test_the_choices_written_here_are_the_codes():
    for name in MODEL_DTYPES:
        assert model_dtype(name) == getattr(torch, name)
    with pytest.raises(ValueError):
        model_dtype("float64")
    for vocab in LOSS_VOCABS:
        TrainConfig(loss_vocab=vocab)
    with pytest.raises(ValueError):
        TrainConfig(loss_vocab="all")
    assert "local" in EXECUTORS and executor_for("local") is not None
    with pytest.raises(ValueError):
        executor_for("dask")


@pytest.mark.parametrize(
    "annotation,value,fits",
    [
        ("int", 3, True),
        ("int", True, False),
        ("int", 3.0, False),
        ("float", 3, True),
        ("float", False, False),
        ("str", "", True),
        ("bool", 0, False),
        ("list", (1, 2), False),
        ("dict", {}, True),
        ("Optional[int]", None, True),
        ("Optional[int]", "1", False),
        ("Union[str, dict]", {"heads": 1}, True),
        ("Union[str, dict]", 1, False),
        ("Optional[list]", [], True),
    ],
)
def test_annotations_are_read_as_types(annotation: str, value, fits: bool):
    assert annotation_fits(annotation, value) is fits


def test_an_annotation_it_cannot_read_is_an_error_of_the_notebook():
    with pytest.raises(ValueError, match="annotation"):
        annotation_fits("tuple", (1,))
    with pytest.raises(ValueError, match="annotation"):
        annotation_fits("", 1)
