"""Trees a user writes, wherever a shape is taken: method specs naming them, the trees a sweep runs
(each at its node count, the presets beside it), pairs, notebook 03's attention grid and cost model,
05's static trees, and every notebook's set-up cell refusing a bad spec before any model loads.
(Replayed steps of a custom tree against real runs: tests/test_replay.py for one vocabulary,
tests/test_cross_tokenizer.py across tokenizers.)"""

from pathlib import Path

import nbformat
import pandas as pd
import pytest
from conftest import random_prompt, run_set_up_cells, tiny_model

import specnb.experiments.learned_study as learned_study
from specnb import Tree
from specnb.analysis.collection import CollectConfig
from specnb.analysis.cost_model import cost_table, expected_tau
from specnb.bench.attention_grid import GRID_KEY, GridConfig, HeadShape, grid, grid_table, run_grid, speedup_table
from specnb.bench.verify_curve import CURVE_KEY, CurveConfig, curve_table, verify_curve
from specnb.drafters.methods import budget_axis, method_of, method_trees, parse_method, trees_for, with_custom_trees
from specnb.experiments.collect import collect
from specnb.experiments.pairs import Pair
from specnb.io.storage import Sweep
from specnb.io.tree_spec import TreeSpecError, parse_custom_trees

ROOT = Path(__file__).resolve().parents[1]
CUSTOM = parse_custom_trees({"mine": [[0], [1], [0, 0], [0, 0, 0]], "two_one": {"branching": [2, 1]}})


def test_methods_name_a_custom_tree_and_its_budget_is_its_node_count():
    mine = CUSTOM["mine"]
    assert parse_method("mine", CUSTOM).tree == mine and parse_method("mine:4", CUSTOM).budget == 4
    m = parse_method("ngram/mine", CUSTOM)
    assert (m.drafter, m.label, m.spec, m.tree) == ("ngram", "ngram/mine", "ngram/mine:4", mine)
    assert parse_method("xtok/two_one", CUSTOM).tree == Tree.from_branching([2, 1])
    assert method_of(("merged/mine", 4), mine) == parse_method("merged/mine", CUSTOM)
    assert method_trees(["chain:2", "xtok/mine"], CUSTOM) == {("chain", 2): Tree.chain(2), ("xtok/mine", 4): mine}
    for bad, message in [
        ("mine:5", "has 4 nodes"),
        ("mine", "custom_trees: \\[\\]"),  # without custom trees
        ("chain", "shape:budget"),
        ("adaptive/mine", "chains"),
        ("yours:3", "custom_trees"),
    ]:
        with pytest.raises(ValueError, match=message):
            parse_method(bad, None if bad == "mine" else CUSTOM)
    # the trees a sweep runs: every preset at every budget and at each custom tree's node count
    assert budget_axis([8, 2], CUSTOM) == [2, 4, 8]
    assert set(trees_for(["chain", "kary2"], [2], CUSTOM)) == {
        ("chain", 2),
        ("chain", 4),
        ("kary2", 2),
        ("kary2", 4),
        ("mine", 4),
        ("two_one", 4),
    }
    # notebook 02: a custom tree no method names is filled by the draft model
    assert with_custom_trees(["chain:4", "ngram/mine"], CUSTOM) == ["chain:4", "ngram/mine", "two_one"]


def test_a_pair_takes_the_notebooks_custom_trees_and_its_own():
    pair = Pair.from_dict({"target": "t", "draft": "d", "methods": ["xtok/mine", "ours"]}, CUSTOM | {"ours": [[0]]})
    assert pair.trees["ours"] == Tree.chain(1) and pair.trees["mine"] == CUSTOM["mine"]
    assert hash(pair) == hash(
        Pair.from_dict({"target": "t", "draft": "d", "methods": ["xtok/mine", "ours"]}, pair.trees)
    )
    with pytest.raises(ValueError, match="custom_trees"):
        Pair.from_dict({"target": "t", "draft": "d", "methods": ["xtok/mine"]})
    with pytest.raises(TreeSpecError, match="no sibling of rank 1"):
        Pair.from_dict({"target": "t", "draft": "d", "custom_trees": {"gap": [[0], [2]]}})


@pytest.mark.parametrize("name, message", [("oracle", "other rows"), ("My-Tree", "methods cannot name it")])
def test_names_tables_or_methods_cannot_hold_are_refused(name, message):
    with pytest.raises(TreeSpecError, match=message):
        parse_custom_trees({name: [[0]]})
    with pytest.raises(TreeSpecError, match="maps names to specs"):
        parse_custom_trees([[0], [1]])


def test_the_attention_grid_times_a_custom_tree_and_the_cost_model_compares_it(tmp_path):
    points = grid([1, 2], [37], [4], ["sparse"], CUSTOM)
    assert {(p.shape, p.nodes) for p in points} == {("sparse", 4), ("mine", 4), ("two_one", 4)}
    assert next(p for p in points if p.shape == "mine").tree() == CUSTOM["mine"]
    store = Sweep(tmp_path / "grid.jsonl", GRID_KEY)
    config = GridConfig(("sdpa", "per_sequence", "causal"), warmup=0, repeats=2, progress=False)
    run_grid(store, points, HeadShape("tiny", 4, 2, 8), config)
    table = grid_table(store)
    mine = table[table["shape"] == "mine"]
    assert len(mine) == 2 * 3 and (mine["status"] == "ok").all() and (mine["depth"] == 3).all()
    assert (speedup_table(table).set_index("shape").loc["mine", "per_sequence_over_tree"] > 0).all()
    # the cost model: each custom tree at its own node count, beside the presets at every measured size
    target, draft = tiny_model(0), tiny_model(1, layers=1)
    curves = Sweep(tmp_path / "curve.jsonl", CURVE_KEY)
    quick = CurveConfig(warmup=0, repeats=2, progress=False)
    verify_curve(curves, target, "tiny-target", 11, [0, 2, 5], config=quick)
    verify_curve(curves, draft, "tiny-draft", 11, [1, 2, 4], "draft", quick)
    cost = cost_table(curve_table(curves), ["chain"], [0.6, 0.2], "tiny-target", "tiny-draft", CUSTOM)
    assert list(zip(cost["shape"], cost["nodes"])) == [("chain", 2), ("chain", 5), ("mine", 4), ("two_one", 4)]
    row = cost.set_index("shape").loc["mine"]
    assert row["expected_tau"] == pytest.approx(expected_tau(CUSTOM["mine"], [0.6, 0.2])) and row["depth"] == 3


def test_learned_drafters_replay_custom_trees_beside_their_own(tmp_path, tiny_target, tiny_draft):
    trees = learned_study.budget_trees([4], 4, [[0.5, 0.2]] * 4, CUSTOM)
    assert trees[("mine", 4)] == CUSTOM["mine"] and ("medusa", 4) in trees and ("kary2", 4) in trees
    collection = collect(
        tmp_path, tiny_target, tiny_draft, {"p": random_prompt(3)}, CollectConfig(8, top_k=12, eos_token_id=())
    )
    taus = learned_study.tau_table({"draft": (collection, trees)}, {}).set_index("shape")
    assert taus.loc["mine", "kind"] == "custom" and taus.loc["mine", "nodes"] == 4
    assert taus.loc["kary2", "kind"] == "preset" and taus.loc["medusa", "kind"] == "designed"


NOTEBOOKS = ["01_tree_shapes", "02_model_pairs", "03_tree_attention_timing", "05_learned_drafters", "06_batch_size"]


@pytest.mark.parametrize("stem", NOTEBOOKS)
def test_a_bad_spec_is_refused_in_the_set_up_cell_before_any_model_loads(stem, tmp_path, monkeypatch):
    """The notebook's own parameters and set-up cells, run with a tree whose sibling ranks have a gap:
    TreeSpecError with what to change, and nothing installed, loaded or looked up first."""
    cells = nbformat.read(ROOT / "notebooks" / f"{stem}.ipynb", as_version=4).cells
    namespace: dict = {}
    exec(next(c.source for c in cells if c.cell_type == "code"), namespace)  # the parameters cell
    assert namespace["custom_trees"] == {}, "the default: no trees of one's own"
    before = ("load_model", "load_pair", "load_tokenizer", "check_sources", "check_models", "install")
    with pytest.raises(TreeSpecError, match="no sibling of rank 1: sibling ranks must run 0, 1, 2"):
        run_set_up_cells(
            stem, {"profile": "", "run_dir": str(tmp_path), "custom_trees": {"gap": [[0], [2]]}}, monkeypatch, before
        )


def test_the_batch_study_measures_a_custom_tree_and_compares_it_with_the_cost_model(tiny_target, tiny_draft):
    from specnb.experiments import batch_study as bs

    prompts = [random_prompt(i)[0] for i in range(2)]
    methods = bs.BatchMethods(tiny_target, tiny_draft, pad_token_id=0, k=2, custom=CUSTOM)
    measured = bs.measure_batches(methods, prompts, [1, 2], {1: ["mine"], 2: ["mine"]}, 6, rounds=1)
    mine = measured[measured["method"] == "mine"]
    assert len(mine) == 2 and (mine["status"] == "measured").all() and (mine["greedy_equal"] == mine["rows"]).all()
    cost = pd.DataFrame({"batch": [1, 2], "shape": "mine", "budget": 4, "tokens_per_s": 10.0, "tau": 1.5})
    versus = bs.predicted_vs_measured(cost, measured, CUSTOM)
    assert list(versus["method"]) == ["mine", "mine"] and (versus["predicted_over_measured"] > 0).all()
