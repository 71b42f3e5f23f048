"""Method specs (`specnb.drafters.methods`): parsing with clear refusals, and every drafter and baseline
running as units of one sweep, each output checked against the target's greedy output."""

import pytest
import torch

from specnb import Tree
from specnb.drafters.methods import budget_axis, method_trees, parse_method, trees_for, with_custom_trees
from specnb.experiments import sweeps as ex
from specnb.experiments import tables
from specnb.experiments.pairs import PairModels
from specnb.io.prompts import Prompt
from specnb.io.storage import Sweep
from specnb.io.tree_spec import ShapeRule, parse_custom_shapes, parse_custom_trees


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


def test_every_drafter_name_has_a_builder_and_a_transformers_method_none():
    """`methods.BUILDERS` is the registry `build_drafter` dispatches on: one builder per drafter name a
    spec can carry, and transformers' methods refused (they run in `bench.baselines`)."""
    from specnb.drafters.methods import BUILDERS, DYNAMIC, build_drafter
    from specnb.io.tree_spec import DRAFTERS, HF_METHODS

    assert set(BUILDERS) == {*DRAFTERS, DYNAMIC} and not set(BUILDERS) & set(HF_METHODS)
    with pytest.raises(ValueError, match="transformers method"):
        build_drafter(parse_method("hf_assisted:4"), None, None)
    with pytest.raises(ValueError, match="needs the pair's draft model"):
        build_drafter(parse_method("chain:4"), None, None)
    with pytest.raises(ValueError, match="needs Medusa heads"):
        build_drafter(parse_method("medusa/chain:2"), None, None)


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


def test_the_recommended_tree_runs_with_a_round_of_its_cost_points_per_prompt_kept_on_resuming(
    tmp_path, tiny_target, tiny_draft, monkeypatch
):
    """`sweeps.measure_choice`: per prompt, one round of the chosen tree's cost points, then the tree and the
    target alone; each round stored with its prompt's runs, so a resumed run times no round for a prompt
    it already ran (old runs are never priced by new rounds)."""
    from specnb.analysis.heldout import Choice
    from specnb.bench import verify_curve

    class Tok:
        chat_template = None

        def __call__(self, text, return_tensors=None, add_special_tokens=True):
            return {"input_ids": torch.tensor([[3 + (ord(c) % 50) for c in text]])}

    tree = Tree.kary(2, 4)
    choice = Choice("kary2", 4, tree, False, 2.0, 1.5, 2.5, 1.2, 1.0, 1.4, "cannot tell")
    pair = PairModels("tiny", tiny_target, tiny_draft, Tok())
    prompts = [Prompt("a", "writing", "abcabcabcab"), Prompt("b", "qa", "xyzzy xyz")]
    rounds = []
    real = verify_curve.StepPoints.round
    monkeypatch.setattr(verify_curve.StepPoints, "round", lambda self: rounds.append(1) or real(self))
    store = Sweep(tmp_path / "recommended.jsonl", key=ex.UNIT_KEY)
    config = ex.SweepConfig(8, progress=False)
    measured, points = ex.measure_choice(store, pair, prompts[:1], choice, config, names=("t", "d"), prefix=7)
    assert len(rounds) == 1 and int(measured.iloc[0]["prompts"]) == 1
    store = Sweep(tmp_path / "recommended.jsonl", key=ex.UNIT_KEY)  # resumed: the first prompt is kept
    measured, points = ex.measure_choice(store, pair, prompts, choice, config, names=("t", "d"), prefix=7)
    assert len(rounds) == 2 and int(measured.iloc[0]["prompts"]) == 2 and bool(measured.iloc[0]["greedy_equal"])
    target = points[points["role"] == "target"].set_index("nodes")
    assert sorted(target.index) == [0, 4] and (points["repeats"] == 2).all()  # one round per prompt
    assert sorted(points.loc[points["role"] == "draft", "tokens"]) == sorted(set(tree.draft_widths))
