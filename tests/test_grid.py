"""The brief's grid across pairs (`experiments.grid`, notebook 02): one collection per pair answers
every shape x budget, and on every kind of pair (same tokenizer, another tokenizer, a self-draft)
its rows equal real end-to-end runs of the same trees, step by step, the target's continuations decoded
once for the three pairs; every row's metrics are its counts' ratios; the shapes ranked paired and the
headline's winner one could deploy; a user's shape rule is filled to each budget."""

from __future__ import annotations

import numpy as np
import pytest
from vocabularies import D_VOCAB, T_VOCAB, TEXT, bigram_llama, draft_tokenizer, target_tokenizer

from specnb.analysis import ranking
from specnb.drafters.methods import DYNAMIC_MAX_DEPTH, DYNAMIC_TOP_K
from specnb.experiments import grid, tables
from specnb.experiments import sweeps as ex
from specnb.experiments.pairs import Pair
from specnb.experiments.replay_study import PairCollectConfig
from specnb.io.prompts import Prompt
from specnb.io.storage import Sweep
from specnb.io.tree_spec import ShapeRule, parse_custom_shapes
from specnb.notebook import readings

OTHER_TEXT = " the cat sat on the mat hello the"  # a second bigram text: a draft that disagrees at places
PROMPTS = [Prompt("p", "a", " hello the"), Prompt("q", "b", " the cat sat on"), Prompt("r", "a", " the mat")]
MAX_NEW = 14


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, str]:
    t, d = target_tokenizer(), draft_tokenizer()
    out = {}
    for name, tokenizer, text, vocab in (
        ("target", t, TEXT, T_VOCAB),
        ("same", t, OTHER_TEXT, T_VOCAB),
        ("other", d, TEXT, D_VOCAB),
    ):
        folder = tmp_path_factory.mktemp(name)
        bigram_llama(tokenizer, text, vocab, hot=3.0, seed=1).save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        out[name] = str(folder)
    return out


def test_the_grid_of_every_kind_of_pair_equals_real_runs(folders, tmp_path):
    real = {  # the trees each pair also runs end to end
        "same": ["kary2:4", "chain:3", "grow:4", "dynamic:4"],
        "other": ["xtok/kary2:4", "xtok/chain:3", "xtok/grow:3", "xtok/dynamic:4"],
        "target": ["chain:3"],
    }
    custom = parse_custom_shapes({"grow": {"widths": [2, 1]}})
    pairs = [Pair(folders["target"], folders[name], methods=specs, custom_trees=custom) for name, specs in real.items()]
    collect = PairCollectConfig(
        MAX_NEW, super_k=DYNAMIC_TOP_K, super_depth=DYNAMIC_MAX_DEPTH, dynamic_budgets=(4,), top_k=8
    )
    config = grid.GridConfig(("chain", "kary2"), (3, 4), collect, heldout_folds=3)
    parts: list[grid.PairGrid] = []
    store = Sweep(tmp_path / "sweep.jsonl", key=ex.UNIT_KEY)
    ex.run_pairs(
        store,
        pairs,
        PROMPTS,
        {},
        ex.SweepConfig(MAX_NEW, progress=False),
        each_pair=lambda pair, models: parts.append(
            grid.pair_grid(
                models, pair, PROMPTS, custom, config, tmp_path / "grid", tmp_path / "continuations", store, MAX_NEW
            )
        ),
    )
    table = grid.grid_table(parts)
    assert list(table.columns) == grid.COLUMNS
    assert list(dict.fromkeys(table["pair"])) == [p.label for p in pairs]
    kinds = dict(zip(table["pair"], table["kind"]))
    assert [kinds[p.label] for p in pairs] == [grid.SAME_FAMILY, grid.OTHER_TOKENIZER, grid.SELF_DRAFT]

    # every pair: each tree run end to end took the steps the grid replayed (or re-drafted)
    measured = tables.shape_table(tables.unit_table(store))
    measured = measured[measured["source"] == "measured"]
    compared = 0
    for row in measured.itertuples():
        if row.shape == "autoregressive":
            continue
        mine = table[
            (table["pair"] == row.pair)
            & (table["shape"] == row.shape.removeprefix("xtok/"))
            & (table["budget"] == row.budget)
        ]
        assert len(mine) == 1, (row.pair, row.shape, row.budget)
        assert mine.iloc[0]["tau"] == pytest.approx(row.tau) and mine.iloc[0]["acceptance_rate"] == pytest.approx(
            row.acceptance_rate
        ), (row.pair, row.shape, row.budget)
        compared += 1
    assert compared == sum(len(v) for v in real.values())
    assert measured["greedy_equal"].astype(bool).all()
    # the same runs, step by step (the pairs sharing a target read one set of continuations, decoded once)
    agreement = grid.agreement(parts)
    assert set(agreement["pair"]) == {p.label for p in pairs}
    assert (agreement["identical_steps"] == agreement["steps_compared"]).all() and agreement["steps_compared"].gt(
        0
    ).all()
    assert len(list((tmp_path / "continuations").glob("*.npz"))) == len(PROMPTS)
    assert all(p.report.collection.config.continuation == "target" for p in parts)

    # the user's shape rule, filled to every budget as the presets are
    grow = table[table["shape"] == "grow"]
    assert set(grow["budget"]) == {3, 4}
    for n in (3, 4):
        assert grow[grow["budget"] == n]["nodes"].eq(ShapeRule((2, 1)).fill(n).num_nodes).all()

    # no silent blanks: a tree's metrics are there, or its row says why not
    for pair in pairs:
        mine = table[table["pair"] == pair.label]
        missing = mine[mine["tau"].isna()]
        assert (missing["note"].str.len() > 0).all()
        assert mine[mine["shape"].isin(["chain", "kary2", "grow"])]["tau"].notna().all()
    across = table[table["kind"] == grid.OTHER_TOKENIZER]
    for shape in ("sequoia", "medusa", "hindsight", "oracle"):
        assert across[across["shape"] == shape]["note"].str.contains("across tokenizers").all()
        assert len(across[across["shape"] == shape]) > 0
    same = table[table["kind"] == grid.SAME_FAMILY]
    assert same[same["shape"] == "sequoia"]["tau_heldout"].notna().all()  # designs scored held out
    assert same[same["shape"] == "oracle"]["tau"].notna().all()
    # intervals: three prompts give every preset row one, around its value
    presets = table[table["shape"].isin(["chain", "kary2"])]
    for metric in grid.METRICS:
        assert (presets[f"{metric}_ci_low"] <= presets[metric] + 1e-9).all()
        assert (presets[metric] <= presets[f"{metric}_ci_high"] + 1e-9).all()
    self_draft = table[(table["kind"] == grid.SELF_DRAFT) & table["shape"].isin(["chain", "kary2"])]
    assert (self_draft["acceptance_rate"] > 0).all()

    # acceptance by sibling rank, why a shape wins: a share per rank on a shared vocabulary, a note across
    ranks = grid.rank_table(parts)
    across = ranks[ranks["kind"] == grid.OTHER_TOKENIZER]
    assert len(across) == 1 and across["share"].isna().all() and "across tokenizers" in across["note"].iloc[0]
    shared = ranks[ranks["kind"] != grid.OTHER_TOKENIZER]
    assert len(shared) == 2 * grid.RANKS and shared["share"].between(0, 1).all()
    assert shared.groupby("pair")["share"].sum().le(1 + 1e-9).all()
    self_ranks = shared[shared["kind"] == grid.SELF_DRAFT].set_index("rank")["share"]
    assert self_ranks[0] == pytest.approx(1.0)  # the target drafting for itself: its top token is always next

    # every row's metrics are its counts' ratios: rate = accepted / drafted, tau = 1 + length - no bonus
    counted = table[table["steps"] > 0]
    assert len(counted) == table["tau"].notna().sum()
    assert np.allclose(counted["acceptance_rate"], counted["accepted"] / counted["drafted"])
    assert np.allclose(counted["acceptance_length"], counted["accepted"] / counted["steps"])
    assert np.allclose(counted["tau"], 1 + counted["acceptance_length"] - counted["no_bonus_steps"] / counted["steps"])

    # shapes ranked paired on the same prompts; per pair and budget the headline's winner, one one could deploy
    ranked = grid.shape_ranking(parts)
    best = grid.best_per_budget(table, ranking.headline(ranked))
    usable = table[~table["shape"].isin(["hindsight", "oracle"]) & table["tau_heldout"].notna()]
    assert sorted(zip(best["pair"], best["budget"])) == sorted(set(zip(usable["pair"], usable["budget"])))
    reading = readings.grid_reading(best, ranks)
    assert reading.count("**") == 2 * len(parts) and "going deeper pays first" in reading
    for row in best.itertuples():
        assert row.best_shape not in ("hindsight", "oracle") and row.verdict in ("wins", "tied", "")
        mine = ranked[(ranked["pair"] == row.pair) & (ranked["budget"] == row.budget)]
        assert mine.iloc[0]["shape"] == row.best_shape and (mine["difference"] <= 1e-12).all()
    # a preset's tau in the ranking is its grid row's (the same prompts, the same counts)
    merged = ranked.merge(table, on=["pair", "shape", "budget"], suffixes=("", "_grid"))
    presets = merged[merged["shape"].isin(["chain", "kary2"])]
    assert len(presets) and np.allclose(presets["tau"], presets["tau_grid"])
