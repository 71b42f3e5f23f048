"""What the hindsight tree is a ceiling of, on a synthetic collection (no model): in-sample, its
tau_all (every position) is at least every static tree's of its budget (presets, a custom tree,
Sequoia's and Medusa's designs); its run-trajectory tau is not (another tree's run visits other
positions), and the labels say so."""

from __future__ import annotations

import numpy as np
import pandas as pd

from specnb.analysis import heldout
from specnb.analysis.collection import CollectConfig, Collection, PromptData
from specnb.drafters.methods import budget_axis, trees_for
from specnb.experiments import replay_study
from specnb.io.tree_spec import parse_custom_trees
from specnb.notebook import readings

LENGTH = 24


def collection(seed: int = 1, prompts: int = 3) -> Collection:
    """Continuation rank paths drawn with a seed: rank 0 most often, then 1, then 2."""
    rng = np.random.default_rng(seed)
    data = []
    for i in range(prompts):
        ranks = rng.choice(3, size=LENGTH, p=[0.6, 0.3, 0.1]).astype(np.int16)
        data.append(PromptData(f"p{i}", "c", np.zeros(3, dtype=np.int64), np.arange(LENGTH), False, {}, ranks=ranks))
    return Collection(CollectConfig(max_new_tokens=LENGTH, top_k=8, eos_token_id=()), {}, tuple(data))


def replayed(c: Collection) -> pd.DataFrame:
    mine = parse_custom_trees({"mine": [[0], [1], [0, 0], [0, 1], [0, 0, 0]]})
    budgets = budget_axis([3, 4], mine)
    table, _ = replay_study.replay_table(
        c, trees_for(["chain", "kary2", "wide", "sparse", "beams2"], budgets, mine), budgets, []
    )
    return table[table["shape"] != "oracle"]


def test_hindsight_tau_all_is_the_ceiling_of_static_trees_in_sample():
    for seed in range(4):
        table = replayed(collection(seed))
        for budget, rows in table.groupby("budget"):
            ceiling = rows.loc[rows["shape"] == "hindsight", "tau_all"].iloc[0]
            assert (rows["tau_all"] <= ceiling + 1e-12).all(), (seed, budget)
            assert (rows["tau_all_over_hindsight"] <= 1 + 1e-12).all()


def test_hindsight_trajectory_tau_is_no_ceiling_and_the_labels_say_so():
    table = replayed(collection(seed=1))
    rows = table[table["budget"] == 4]
    h = rows[rows["shape"] == "hindsight"].iloc[0]
    beaten_by = rows[(rows["shape"] != "hindsight") & (rows["tau"] > h["tau"])]
    assert len(beaten_by), "this seed has a static tree whose run-trajectory tau beats the hindsight tree's"
    text = readings.hindsight_reading(rows)
    assert f"tau_all (every position, in-sample): hindsight {h['tau_all']:.2f}" in text
    assert "is no ceiling" in text and all(s in text for s in beaten_by["shape"])
    assert "tau_all" in heldout.HINDSIGHT_NOTE and "no ceiling" in heldout.HINDSIGHT_NOTE
    held = heldout.score(collection(seed=1), {}, [4], k=3, seed=0)
    agreement = pd.DataFrame(
        [
            {
                "method": "chain:4",
                "source": "collection",
                "prompts": 3,
                "identical_steps": 1,
                "steps_compared": 1,
                "tie_steps": 0,
                "mismatched_steps": 0,
            }
        ]
    )
    reading = readings.replay_reading(table, agreement, held.table, None)
    assert "in-sample ceiling (hindsight)" not in reading  # the old label called the trajectory tau a ceiling
    assert "ceiling of static trees' tau_all" in reading
