"""Held-out scoring of data-fitted trees on synthetic collections (no model): the split matters
where one prompt category differs, the folds follow the seed, the verdict needs an interval that
excludes 1, and notebook 01's results round-trip through the loader notebooks 03 and 06 use."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from specnb import Tree
from specnb.analysis import engine_choice, heldout, replay, spread
from specnb.analysis.collection import CollectConfig, Collection, PromptData
from specnb.experiments import replay_study
from specnb.io import tree_results
from specnb.io.engines import ENGINES, level_widths

LENGTH = 24


def prompt(pid: str, category: str, ranks: list[int]) -> PromptData:
    r = np.resize(np.array(ranks, dtype=np.int16), LENGTH)
    return PromptData(pid, category, np.zeros(3, dtype=np.int64), np.arange(LENGTH), False, {}, ranks=r)


def collection(odd: int = 1, same: int = 5) -> Collection:
    """`same` prompts whose next token is always the draft's first choice, `odd` prompts (another
    category) where it is always the second."""
    prompts = [prompt(f"s{i}", "same", [0]) for i in range(same)] + [prompt(f"o{i}", "odd", [1]) for i in range(odd)]
    return Collection(CollectConfig(max_new_tokens=LENGTH, top_k=4, eos_token_id=()), {}, tuple(prompts))


PRESETS = {("chain", 4): Tree.chain(4), ("kary2", 4): Tree.kary(2, 4)}


def test_folds_follow_the_seed():
    ids = [f"p{i}" for i in range(7)]
    a, b = heldout.folds(ids, 3, seed=1), heldout.folds(ids, 3, seed=1)
    assert a == b and len(a) == 3
    assert sorted(x for f in a for x in f) == sorted(ids)  # every prompt held out exactly once
    assert {len(f) for f in a} <= {2, 3}
    assert any(heldout.folds(ids, 3, seed=s) != a for s in range(2, 6))
    assert len(heldout.folds(ids[:2], 5, 0)) == 2  # k capped at the prompts
    assert heldout.folds(ids[:1], 3, 0) == ()  # one prompt: nothing can be held out


def test_a_tree_fitted_on_the_others_scores_lower_on_the_odd_category():
    c = collection(odd=2, same=4)
    odd = heldout.subset(c, ["o0"])
    others = heldout.subset(c, [p.prompt_id for p in c.prompts if p.category == "same"])
    # budgets where the design fitted on every prompt takes the odd category's rank-1 branch
    for design, n in ((heldout.sequoia_design, 4), (heldout.medusa_design, 8), (heldout.hindsight_design, 16)):
        fit_all, fit_others = design(c, [n])[n], design(others, [n])[n]
        tau = lambda t: replay.replay(odd, {("t", 4): t}, mode="trajectory")["tau"].iloc[0]  # noqa: E731
        assert tau(fit_others) < tau(fit_all), design.__name__
    held = heldout.score(c, PRESETS, [4, 16], k=3, seed=0)
    fitted = held.table[held.table["fitted"]].set_index(["shape", "budget"])
    for key in [("sequoia", 4), ("sequoia", 16), ("hindsight", 16)]:
        assert fitted.loc[key, "tau_heldout"] < fitted.loc[key, "tau_in_sample"], key
    presets = held.table[~held.table["fitted"]]
    assert (presets["tau_heldout"] == presets["tau_in_sample"]).all()  # fitted to nothing
    assert held.table.loc[held.table["shape"] == "hindsight", "note"].str.contains("ceiling").all()
    # every prompt is scored held out exactly once per design and budget
    out = held.per_prompt[held.per_prompt["scored"] == "heldout"]
    assert out.groupby(["shape", "budget"])["prompt_id"].apply(sorted).map(len).eq(len(c.prompts)).all()
    assert held.record()["splits"] == [list(f) for f in held.splits] and held.record()["seed"] == 0


def test_without_the_odd_category_held_out_equals_in_sample():
    held = heldout.score(collection(odd=0), PRESETS, [4], k=3, seed=0)
    fitted = held.table[held.table["fitted"]]
    assert np.allclose(fitted["tau_heldout"], fitted["tau_in_sample"])


def curve(verify: float = 1.0, slope: float = 0.02, spread: float = 0.0, draft: float = 0.05) -> pd.DataFrame:
    rows = [
        {"model": "t", "role": "target", "kind": "verify", "nodes": n, "median_s": verify + slope * n}
        for n in (0, 2, 4, 8)
    ] + [{"model": "d", "role": "draft", "kind": "plain", "tokens": w, "median_s": draft} for w in (1, 2, 4)]
    out = pd.DataFrame(rows)
    return out.assign(q25_s=out["median_s"] * (1 - spread), q75_s=out["median_s"] * (1 + spread))


@pytest.mark.parametrize(
    ("low", "high", "expected"),
    [
        (0.9, 1.2, "cannot tell"),
        (1.05, 1.3, "pays off"),
        (0.6, 0.95, "does not pay off"),
        (math.nan, math.nan, "cannot tell"),
    ],
)
def test_verdict_needs_an_interval_that_excludes_one(low, high, expected):
    assert spread.verdict(low, high, heldout.PAYS) == expected


def test_choice_straddling_one_cannot_tell():
    c = collection(odd=2, same=4)
    held = heldout.score(c, PRESETS, [2, 4], k=3, seed=0)
    # a slow draft: speculation is near break-even and the curves' spread is wide
    speed, choice = heldout.choose(held.table, held.trees, curve(spread=0.3, draft=0.6), "t", "d")
    assert choice is not None and (choice.shape, choice.budget) == tuple(speed.iloc[0][["shape", "budget"]])
    assert choice.speedup_low < 1 < choice.speedup_high and choice.verdict == "cannot tell"
    assert choice.tau == pytest.approx(
        held.table.set_index(["shape", "budget"]).loc[(choice.shape, choice.budget), "tau_heldout"]
    )
    _, sure = heldout.choose(held.table, held.trees, curve(verify=1.0, slope=0.0), "t", "d")
    assert sure.verdict == "pays off" and sure.speedup_low > 1
    folds = heldout.selection(held, curve(), "t", "d")
    assert len(folds) == len(held.splits) and folds["tau_heldout"].notna().all()


def fake_results(pair: str = "d -> t") -> tree_results.TreeResults:
    c = collection(odd=2, same=4)
    held = heldout.score(c, PRESETS, [2, 4], k=3, seed=5)
    _, choice = heldout.choose(held.table, held.trees, curve(), "t", "d")
    return replay_study.tree_results(pair, c, held, choice, device="cpu")


def test_results_round_trip_and_latest_run_by_pair(tmp_path):
    results = fake_results()
    assert results.acceptance[:2] == pytest.approx((4 / 6, 2 / 6), abs=0.02)
    assert results.split["seed"] == 5 and len(results.split["splits"]) == 3
    assert {t.name for t in results.trees} >= {"sequoia", "medusa", "hindsight"}
    older, newer, other = (tmp_path / "01_tree_shapes" / n for n in ("a", "b", "c"))
    from dataclasses import replace

    tree_results.write(older, replace(results, written="2025-01-01T00:00:00"))
    tree_results.write(newer, replace(results, written="2025-02-01T00:00:00"))
    tree_results.write(other, replace(results, pair="x -> y", written="2025-03-01T00:00:00"))
    back = tree_results.read(newer)
    assert back == replace(results, written="2025-02-01T00:00:00")
    assert json.loads((newer / tree_results.RESULTS_FILE).read_text())["deploy"] == results.deploy
    deploy = (newer / tree_results.DEPLOY_FILE).read_text()  # kary2:4 is no product tree: no vLLM line
    assert "# vLLM: vLLM's EAGLE proposer drafts the same number" in deploy and "speculative_token_tree" not in deploy
    assert "EagleDecodingConfig(eagle_choices=[[0], [1], [0, 0], [0, 1]])" in deploy
    assert "# SGLang: a budget, not this shape" in deploy
    assert tree_results.latest(tmp_path, "d -> t") == newer / tree_results.RESULTS_FILE
    assert tree_results.latest(tmp_path, "nobody") is None

    earlier = tree_results.acceptance_from("latest", "d -> t", tmp_path, [0.5, 0.1])
    assert earlier.acceptance == results.acceptance and str(newer) in earlier.note
    rec = results.recommendation.tree
    assert earlier.trees[(rec.name, rec.budget)] == rec.tree
    assert earlier.heldout_tau()[(rec.name, rec.budget)] == pytest.approx(rec.tau_heldout)
    named = tree_results.acceptance_from(str(other), "d -> t", tmp_path, [0.5])
    assert named.acceptance == results.acceptance and "not of this pair" in named.note
    fallback = tree_results.acceptance_from("latest", "nobody", tmp_path, [0.5, 0.1])
    assert fallback.acceptance == (0.5, 0.1) and fallback.trees == {} and "default" in fallback.note
    assert tree_results.acceptance_from("default", "d -> t", tmp_path, [0.3]).acceptance == (0.3,)
    with pytest.raises(FileNotFoundError, match="latest"):
        tree_results.acceptance_from(str(tmp_path / "missing"), "d -> t", tmp_path, [0.3])


def test_notebook_03_prices_01s_trees_and_the_readings_end_with_deploy_lines(tmp_path):
    from specnb.analysis.cost_model import cost_table
    from specnb.experiments.earlier import add_cost_rows
    from specnb.notebook import readings

    results = fake_results()
    tree_results.write(tmp_path / "01_tree_shapes" / "run", results)
    earlier = tree_results.acceptance_from("latest", "d -> t", tmp_path, [0.5])
    base = cost_table(curve(), ["chain"], earlier.acceptance, "t", "d")
    cost = add_cost_rows(base, earlier, curve(), "t", "d")
    ours = cost[cost["shape"].str.startswith("01:")]
    assert len(ours) == len(earlier.trees) and list(cost.columns) == list(base.columns)
    rec = results.recommendation.tree
    row = ours[ours["shape"] == f"01:{rec.name}"].iloc[0]
    assert row["expected_tau"] == pytest.approx(rec.tau_heldout)
    none = tree_results.acceptance_from("default", "d -> t", tmp_path, [0.5])
    assert add_cost_rows(base, none, curve(), "t", "d") is base

    c = collection(odd=2, same=4)
    held = heldout.score(c, PRESETS, [2, 4], k=3, seed=0)
    _, choice = heldout.choose(held.table, held.trees, curve(spread=0.3, draft=0.6), "t", "d")
    text = readings.verdict_reading(choice, None, heldout.selection(held, curve(), "t", "d"))
    assert "cannot tell" in text and "chosen on the other folds" in text
    assert "do **not** beat" in readings.heldout_note(held.table) or "every design" in readings.heldout_note(held.table)
    deploy = readings.deploy_reading(choice).splitlines()
    vllm = next(line for line in deploy if line.startswith("- vLLM:"))
    if level_widths(choice.tree) is None:
        assert "not accepted" in vllm
    else:
        assert "speculative_token_tree" in vllm
    assert len(deploy) == 2 + len(ENGINES) and deploy[-1].startswith("- llama.cpp server:")  # "", heading, engines


def test_a_measured_speed_outside_the_expected_interval_is_said():
    from specnb.notebook import readings

    assert readings.against_expected(1.10, 1.04, 1.27) == ""
    assert readings.against_expected(0.95, float("nan"), float("nan")) == ""
    below = readings.against_expected(0.95, 1.04, 1.27)
    assert below.startswith(", below the expected interval [1.04, 1.27]") and "disagree" in below
    assert readings.against_expected(1.40, 1.04, 1.27).startswith(", above the expected interval")


def test_each_engine_gets_the_fastest_tree_it_drafts_as_verified():
    """`engine_choice.static_trees`: per engine that takes a static tree, the fastest row whose tree it drafts
    as verified (`io.engines`), and what that gives up against the fastest row of all."""
    trees = {**PRESETS, ("wide", 4): Tree.wide(4), ("two_two", 4): Tree.from_branching([2, 1])}
    c = collection(odd=2, same=4)
    held = heldout.score(c, trees, [4], k=3, seed=0)
    speed, _ = heldout.choose(held.table, held.trees, curve(), "t", "d")
    table = engine_choice.static_trees(speed, held.trees).set_index("engine")
    assert list(table.index) == [*engine_choice.STATIC_ENGINES, "vllm_chain"]
    ranked = speed.sort_values("tokens_per_s", ascending=False)
    chains = ranked[ranked["shape"] == "chain"]  # current vLLM: the fastest chain, num_speculative_tokens
    assert (table.loc["vllm_chain", "shape"], table.loc["vllm_chain", "budget"]) == tuple(
        chains.iloc[0][["shape", "budget"]]
    )
    assert f"'num_speculative_tokens': {chains.iloc[0]['budget']}" in table.loc["vllm_chain", "line"]
    for engine, row in table.drop("vllm_chain").iterrows():
        takes = [
            ENGINES[engine](held.trees[(s, int(b))]).line is not None for s, b in zip(ranked["shape"], ranked["budget"])
        ]
        first = ranked[takes].iloc[0]
        assert (row["shape"], row["budget"]) == (first["shape"], first["budget"])
        assert row["speedup_given_up"] == pytest.approx(ranked.iloc[0]["speedup"] - first["speedup"])
        assert row["speedup_given_up"] >= 0
        assert row["line"] == ENGINES[engine](held.trees[(row["shape"], int(row["budget"]))]).line
    assert level_widths(held.trees[(table.loc["vllm", "shape"], int(table.loc["vllm", "budget"]))]) is not None
    assert table.loc["llama_cpp", "shape"] == "chain"  # its server drafts chains only
    assert "kary2" not in set(table.loc[["vllm", "llama_cpp"], "shape"])  # kary2:4 is no product tree
    from specnb.notebook import readings

    reading = readings.engine_reading(engine_choice.engine_table(held, speed, held.trees))
    assert "- vLLM (0.21 on (current); a chain" in reading and "- llama.cpp server (current; a chain" in reading
    assert "- SGLang (current; a dynamic tree: three flags): no tree of this pair's fits it" in reading


def test_deploy_txt_gives_an_engine_that_refuses_the_recommendation_its_own_fastest_tree(tmp_path):
    """The recommended kary2:4 is no product tree: vLLM's block in deploy.txt says so and gives the fastest
    tree vLLM drafts as verified (`engine_choice.static_trees`), with what it gives up and its line; the results
    file keeps it; an engine that takes the recommendation gets the recommendation's line."""
    trees = {("kary2", 4): Tree.kary(2, 4), ("chain", 4): Tree.chain(4)}
    c = collection(odd=2, same=4)
    held = heldout.score(c, trees, [4], k=3, seed=0)
    fast_tree_curve = curve(slope=0.0, draft=0.0)  # drafting and width cost nothing: the widest tree wins
    speed, choice = heldout.choose(held.table, held.trees, fast_tree_curve, "t", "d")
    engines = engine_choice.static_trees(speed, held.trees)
    results = replay_study.tree_results("d -> t", c, held, choice, device="cpu", engines=engines)
    tree_results.write(tmp_path, results)
    back = tree_results.read(tmp_path)
    assert back.engines == results.engines and set(back.engines) == {*engine_choice.STATIC_ENGINES, "vllm_chain"}
    deploy = (tmp_path / tree_results.DEPLOY_FILE).read_text()
    assert choice.shape == "kary2" and level_widths(choice.tree) is None  # the recommendation: no product tree
    vllm = engines.set_index("engine").loc["vllm"]
    assert f"the fastest tree it drafts as verified: {vllm['shape']} with {vllm['budget']} draft tokens" in deploy
    assert vllm["line"] in deploy and vllm["speedup_given_up"] >= 0
    assert ENGINES["tensorrt_llm"](choice.tree).line in deploy


def test_sglang_flags_pass_into_the_results_and_deploy_txt(tmp_path):
    """The fastest of SGLang's replayed flags (`engine_choice.grown_tree`) is what tree_results.json and
    deploy.txt give for SGLang, in place of the flags of the recommended tree's size; a collection
    without super-trees has no SGLang rows."""
    c = collection(odd=2, same=4)
    assert engine_choice.grown_tree("sglang", c, [2, 4], curve(), "t", "d").empty
    held = heldout.score(c, PRESETS, [2, 4], k=3, seed=5)
    _, choice = heldout.choose(held.table, held.trees, curve(), "t", "d")
    flags = pd.DataFrame(
        [
            {
                "budget": n,
                "num_steps": s,
                "topk": k,
                "num_draft_tokens": n + 1,
                "tau_heldout": tau,
                "tau_heldout_ci_low": tau - 0.1,
                "tau_heldout_ci_high": tau + 0.1,
                "speedup": x,
                "speedup_ci_low": x - 0.1,
                "speedup_ci_high": x + 0.1,
                "verdict": "pays off",
                "line": f"--speculative-num-steps {s} --speculative-eagle-topk {k} "
                f"--speculative-num-draft-tokens {n + 1}",
            }
            for n, s, k, tau, x in ((2, 2, 1, 2.1, 1.2), (4, 3, 2, 2.6, 1.4))
        ]
    )
    results = replay_study.tree_results("d -> t", c, held, choice, device="cpu", grown={"sglang": flags})
    assert results.sglang["num_steps"] == 3 and results.deploy["sglang"].endswith("--speculative-num-draft-tokens 5")
    tree_results.write(tmp_path, results)
    back = tree_results.read(tmp_path)
    assert back.sglang == results.sglang and back.deploy == results.deploy
    deploy = (tmp_path / tree_results.DEPLOY_FILE).read_text()
    assert "# SGLang: its own tree each step, the flags chosen by replaying its rule" in deploy
    assert "held-out tau 2.60 [2.50, 2.70], expected 1.40x [1.30, 1.50]: pays off" in deploy
    assert "a budget, not this shape" not in deploy


def _run(store, shape: str, budget: int, prompts: int, tokens: int, draft_s: float, verify_s: float) -> None:
    """Units of a measured run: per prompt a first step (its prefill: slow) and steady steps."""
    for i in range(prompts):
        rows = [{"position": 0, "num_tokens": 1, "num_drafted": budget, "draft_time": 9.0, "verify_time": 9.0}]
        rows += [
            {
                "position": 1 + j * tokens,
                "num_tokens": tokens,
                "num_drafted": budget,
                "draft_time": draft_s,
                "verify_time": verify_s,
            }
            for j in range(5)
        ]
        store.add({"pair": "d -> t", "shape": shape, "budget": budget, "prompt_id": f"p{i}"}, rows)


def test_a_measurement_is_checked_against_the_prediction_priced_while_it_ran(tmp_path):
    """`heldout.measurement_prediction`: the held-out tau priced on the points timed during the run, with
    the interval of a mean over the prompts run (wider for fewer); `sweeps.prediction_check` sets it
    against the run's steady steps (each prompt's first, its prefill, left out) and says "confirmed"
    only inside the interval and within 10%."""
    from specnb.analysis.cost_model import step_cost
    from specnb.experiments import sweeps
    from specnb.io.storage import Sweep
    from specnb.notebook import readings

    c = collection(odd=2, same=4)
    held = heldout.score(c, PRESETS, [4], k=3, seed=0)
    _, choice = heldout.choose(held.table, held.trees, curve(), "t", "d")
    points = curve(verify=0.5, slope=0.01, spread=0.1)  # the machine during the runs: not as the curve was
    cost = step_cost(points, "t", "d")
    t_draft, t_verify = cost.t_draft(choice.tree), cost.t_verify(choice.tree.num_nodes)
    two = heldout.measurement_prediction(held, choice, points, "t", "d", prompts=2)
    six = heldout.measurement_prediction(held, choice, points, "t", "d", prompts=6)
    assert two["tau"] == six["tau"] == choice.tau and two["t_decode_s"] == 0.5
    assert two["speedup"] == pytest.approx(choice.tau * 0.5 / (t_draft + t_verify))
    assert two["tau_low"] < six["tau_low"] <= choice.tau <= six["tau_high"] <= two["tau_high"]  # tau: 3 at most here
    assert two["speedup_low"] < two["speedup"] < two["speedup_high"] and "mean over 2 prompts" in two["interval"]
    from dataclasses import replace as with_

    cross = heldout.measurement_prediction(with_(held, per_prompt=pd.DataFrame()), choice, points, "t", "d", 2)
    assert (cross["tau_low"], cross["tau_high"]) == (choice.tau_low, choice.tau_high)  # no per-prompt taus (xtok)
    assert "every prompt" in cross["interval"]

    tokens = round(choice.tau)
    for name, slower, expect in (("as_predicted", 1.0, None), ("slow", 1.5, "off by -")):
        store = Sweep(tmp_path / f"{name}.jsonl", key=sweeps.UNIT_KEY)
        _run(store, "autoregressive", 0, 6, 1, 0.0, 0.5)
        _run(store, choice.shape, choice.budget, 6, tokens, t_draft * slower, t_verify * slower)
        measured = pd.DataFrame([{"prompts": 6, "tau": 26 / 6, "speedup": 1.1}])
        check = sweeps.prediction_check(held, choice, points, store, measured, ("t", "d")).set_index("quantity")
        steady = check.loc["speed-up, steady state"]
        assert steady["measured"] == pytest.approx(tokens * 0.5 / (t_draft + t_verify) / slower)
        assert steady["measured_over_predicted"] == pytest.approx(tokens / choice.tau / slower)
        assert check.loc["draft seconds per step", "measured"] == pytest.approx(t_draft * slower)
        assert check.loc["target alone, seconds per token", "measured"] == pytest.approx(0.5)
        assert check.loc["speed-up with each prompt's prefill", "measured"] == 1.1
        ok = (
            abs(steady["measured_over_predicted"] - 1) <= 0.10 and steady["low"] <= steady["measured"] <= steady["high"]
        )
        assert (steady["check"] == "confirmed") == ok
        if expect:
            assert steady["check"].startswith(expect)
        text = readings.check_reading(check.reset_index())
        assert f"{steady['measured']:.2f}x against {steady['predicted']:.2f}x" in text and steady["check"] in text
    assert sweeps.prediction_check(held, None, points, store, measured, ("t", "d")).empty


def test_the_choice_is_set_against_the_runner_up_paired():
    """The choice's and the runner-up's expected speed-ups, their difference computed from per-prompt
    counts (each tree's held-out tau priced by its cost factor) equal to the difference of the rows, and
    its paired interval: on prompts where both trees accept alike the difference is a constant, so the
    interval is a point; a verdict of "ahead" or "tied"."""
    c = collection(odd=2, same=4)
    held = heldout.score(c, PRESETS, [2, 4], k=3, seed=0)
    speed, choice = heldout.choose(held.table, held.trees, curve(), "t", "d")
    row = heldout.versus_runner_up(held, speed).iloc[0]
    assert row["choice"] == f"{choice.shape}:{choice.budget}" and row["prompts"] == 6
    assert row["difference"] == pytest.approx(speed.iloc[0]["speedup"] - speed.iloc[1]["speedup"])
    assert row["difference_ci_low"] <= row["difference"] <= row["difference_ci_high"]
    assert row["verdict"] in ("ahead", "tied")
    assert (row["verdict"] == "tied") == (row["difference_ci_low"] <= 0 <= row["difference_ci_high"])
    assert heldout.versus_runner_up(held, speed.head(1)).empty
