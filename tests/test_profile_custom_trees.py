"""The memory table and the T4 time estimate count the user's custom trees where the notebooks run
them: a tree larger than every budget of the profile (given as a parameter file, as
`run_notebooks.sh -f` takes it) lengthens the caches where it is verified and grows notebook 03's
largest grid point, adds runs and curve points to 01, 03 and 06, and joins 02's grid (re-drafted for
the pair across tokenizers), the presets at its size too."""

from __future__ import annotations

import re

from specnb.notebook import estimate as est
from specnb.notebook.estimate import profile_memory

BIG = 12 + 12 * 12  # {"branching": [12, 12]}: more nodes than any tree of the t4 profile (128)


def test_a_custom_tree_larger_than_every_budget_costs_memory_and_time(tmp_path):
    mine = tmp_path / "big.yaml"
    mine.write_text("all:\n  custom_trees: {big: {branching: [12, 12]}}\n")
    plain = {r.notebook: r for r in profile_memory("t4")}
    big = {r.notebook: r for r in profile_memory("t4", files=[mine])}
    for notebook in (
        "01_tree_shapes",
        "02_model_pairs",
        "03_tree_attention_timing",
        "05_learned_drafters",
        "06_batch_size",
    ):
        assert big[notebook].kv_cache > plain[notebook].kv_cache and big[notebook].total > plain[notebook].total
    assert big["03_tree_attention_timing"].grid > plain["03_tree_attention_timing"].grid  # timed at every point
    assert big["04_long_generation"] == plain["04_long_generation"]  # 04 takes no trees of the user's

    table, more = est.t4_time("t4"), est.t4_time("t4", files=[mine])
    by, more_by = table.groupby("notebook")["seconds"].sum(), more.groupby("notebook")["seconds"].sum()
    for notebook in ("01", "03", "06"):
        assert more_by[notebook] > by[notebook], notebook
    assert more_by["04"] == by["04"]  # 04 takes no trees of the user's
    assert ((more["notebook"] == "01") & (more["part"] == "check runs: 1 custom trees")).any()
    assert more_by["02"] > by["02"]  # 02's grid takes it, and the presets at its size: re-drafted across tokenizers
    redrafted = lambda t: t.loc[t["part"].str.contains("re-drafted across tokenizers"), "part"].tolist()  # noqa: E731
    before, after = redrafted(table), redrafted(more)
    assert len(before) == len(after) == 1
    trees = lambda part: int(re.search(r"\((\d+) trees", part).group(1))  # noqa: E731
    assert trees(after[0]) == trees(before[0]) + 1 + len(est.profile_params("t4", [])["02_model_pairs"]["shapes"])
