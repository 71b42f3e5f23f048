"""Method specs (`specnb.drafters.methods`): parsing with clear refusals, and every drafter and baseline
running as units of one sweep, each output checked against the target's greedy output."""

import pytest
import torch

from specnb import Tree
from specnb.core.tree_spec import ShapeRule, parse_custom_shapes, parse_custom_trees
from specnb.drafters.methods import budget_axis, method_trees, parse_method, trees_for, with_custom_trees
from specnb.experiments import sweeps as ex
from specnb.experiments import tables
from specnb.experiments.pairs import PairModels
from specnb.io.prompts import Prompt
from specnb.io.storage import Sweep


def test_method_specs_parse_and_refuse_clearly():
    assert parse_method("chain:4").label == "chain"
    assert parse_method("ngram/kary2:8").tree == Tree.kary(2, 8)
    m = parse_method("early_exit12/chain:4")
    assert (m.drafter, m.arg, m.label) == ("early_exit", 12, "early_exit12/chain")
    assert parse_method("confidence0.4/chain:8").arg == 0.4
    assert parse_method("dynamic:16").tree.depth == 6 and parse_method("dynamic:16").label == "dynamic"
    assert parse_method("adaptive/chain:4").tree == Tree.chain(8)
    assert parse_method("hf_assisted:4").tree == Tree.chain(4)
    for bad, msg in [
        ("chain", "shape:budget"),
        ("foo/chain:4", "unknown drafter"),
        ("early_exit/chain:4", "number"),
        ("adaptive/kary2:4", "chains"),
        ("ngram/blob:3", "unknown tree shape"),
    ]:
        with pytest.raises(ValueError, match=msg):
            parse_method(bad)


def test_every_method_runs_in_a_sweep_and_equals_greedy(tmp_path, tiny_target, tiny_draft):
    class Tok:  # prompt text -> ids, as a tokenizer would
        chat_template = None

        def __call__(self, text, return_tensors=None, add_special_tokens=True):
            return {"input_ids": torch.tensor([[3 + (ord(c) % 50) for c in text]])}

    specs = [
        "chain:3",
        "ngram/kary2:6",
        "early_exit1/chain:3",
        "merged/kary2:4",
        "adaptive/chain:2",
        "confidence0.5/chain:4",
        "dynamic:6",
        "hf_assisted:3",
        "hf_prompt_lookup:3",
    ]
    store = Sweep(tmp_path / "s.jsonl", key=ex.UNIT_KEY)
    prompts = [Prompt("a", "writing", "abcabcabcab"), Prompt("b", "qa", "xyzzy xyz")]
    pair = PairModels("tiny", tiny_target, tiny_draft, Tok())
    ex.run_sweep(store, pair, prompts, method_trees(specs), ex.SweepConfig(12, progress=False))
    units = tables.unit_table(store)
    assert len(units) == len(prompts) * (len(specs) + 1)
    assert units["greedy_equal"].all(), units[~units["greedy_equal"]][["shape", "budget", "prompt_id"]]
    assert set(units["shape"]) == {tables.BASELINE} | {s.split(":")[0] for s in specs}


def test_a_shape_rule_fills_every_budget_as_a_preset_does():
    """A shape rule of the user's ({widths: [...]}) is a shape beside the presets: every budget of the
    axis, its trees its fills; a fixed tree keeps its one budget; a check names a rule at the
    largest budget the methods use; a rule without a budget is refused saying so."""
    specs = {"mine": [[0], [1], [0, 0], [0, 0, 0]], "grow": {"widths": [2, 1]}}
    custom = {**parse_custom_trees(specs), **parse_custom_shapes(specs)}
    assert budget_axis([2, 8], custom) == [2, 4, 8]  # mine's 4 nodes join the axis, the rule adds none
    trees = trees_for(["chain"], [2, 8], custom)
    assert sorted(trees) == [
        ("chain", 2),
        ("chain", 4),
        ("chain", 8),
        ("grow", 2),
        ("grow", 4),
        ("grow", 8),
        ("mine", 4),
    ]
    assert all(trees[("grow", n)] == ShapeRule((2, 1)).fill(n) for n in (2, 4, 8))
    assert with_custom_trees(["chain:2", "kary2:8"], custom) == ["chain:2", "kary2:8", "mine", "grow:8"]
    assert parse_method("ngram/grow:3", custom).tree == ShapeRule((2, 1)).fill(3)
    with pytest.raises(ValueError, match="shape rule .* give it a budget, e.g. grow:8"):
        parse_method("grow", custom)
