"""The timing harness and the cost model: what gets called and stored, hand-checked cost-model
arithmetic, resumable grids and curves on tiny models. No time is asserted (timing is measured, not
tested)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pandas as pd
import pytest
import torch
from conftest import tiny_model
from transformers import LlamaConfig

from specnb import Tree
from specnb.analysis.cost_model import cost_table, draft_seconds, draft_widths, expected_tau
from specnb.bench.attention_grid import (
    GRID_KEY,
    GridConfig,
    HeadShape,
    grid,
    grid_table,
    head_shape,
    run_grid,
    speedup_table,
    visiting_order,
)
from specnb.bench.timing import environment_row, fastest_rounds, measure, measure_interleaved
from specnb.bench.verify_curve import CURVE_KEY, CurveConfig, curve_shape, curve_table, verify_curve
from specnb.io.storage import Sweep
from specnb.notebook.readings import curve_reading, recommendation


def test_measure_warms_up_repeats_and_sets_up_each_run():
    calls = []
    t = measure(lambda: calls.append("run"), "cpu", warmup=2, repeats=5, setup=lambda: calls.append("setup"))
    assert calls == ["setup", "run"] * 7
    assert t.repeats == 5 and t.warmup == 2
    assert t.min_s <= t.q25_s <= t.median_s <= t.q75_s <= t.max_s
    with pytest.raises(ValueError):
        measure(lambda: None, "cpu", repeats=0)


def test_measure_interleaved_runs_each_in_every_round():
    calls = []
    fns = {name: (lambda name=name: calls.append(name)) for name in "abc"}
    timings = measure_interleaved(fns, "cpu", warmup=1, repeats=4, setups={"b": lambda: calls.append("setup b")})
    assert set(timings) == set("abc") and all(t.repeats == 4 for t in timings.values())
    assert [calls.count(n) for n in "abc"] == [5, 5, 5] and calls.count("setup b") == 5
    rounds = [c for c in calls if c != "setup b"]
    assert all(sorted(rounds[i : i + 3]) == list("abc") for i in range(0, 15, 3))
    assert calls[calls.index("setup b") + 1] == "b"


def test_measure_interleaved_warms_up_until_every_callable_settles(monkeypatch):
    # a callable whose first calls are slow (a kernel chosen for new shapes): warm-up goes on until
    # its last two untimed calls are within 10% of each other, then the timed rounds start
    clock = iter(range(10**6))
    monkeypatch.setattr("specnb.bench.timing.time.perf_counter", lambda: next(clock) * 0.001)
    slow = iter([50, 30, 10, 1, 1] + [1] * 100)  # a call's cost in clock ticks
    fns = {"cold": lambda: [next(clock) for _ in range(next(slow))], "warm": lambda: None}
    timings = measure_interleaved(fns, "cpu", warmup=2, repeats=3, settle=0.1)
    assert timings["cold"].warmup == 5  # 50, 30, 10, 1 still falling; the 5th equals the 4th
    assert timings["cold"].max_s < 0.003  # no slow call among the timed ones
    fixed = measure_interleaved({"a": lambda: None}, "cpu", warmup=2, repeats=3)  # settle=None: as given
    assert fixed["a"].warmup == 2
    never = iter([5, 4] * 100)
    capped = measure_interleaved(
        {"x": lambda: [next(clock) for _ in range(next(never))]}, "cpu", 1, 2, settle=0.01, most_warmup=6
    )
    assert capped["x"].warmup == 6  # an alternating cost never settles: the cap ends warm-up


def test_fastest_rounds_rotates_the_order_and_keeps_each_keys_fastest_result():
    calls, times = [], iter([3.0, 2.0, 9.0, 1.0])  # b, a, b, a: c is refused (no time)

    def run(key):
        calls.append(key)
        return "refused" if key == "c" else SimpleNamespace(total_time=next(times), key=key)

    best, seconds = fastest_rounds(["a", "b", "c"], run, rounds=2, rotation=1)
    assert calls == ["b", "c", "a"] * 2  # rotated by 1, the same order every round
    assert list(seconds) == ["a", "b", "c"] and seconds == {"a": [2.0, 1.0], "b": [3.0, 9.0], "c": []}
    assert best["a"].total_time == 1.0 and best["b"].total_time == 3.0 and best["c"] == "refused"
    assert fastest_rounds([], run, rounds=3, rotation=5) == ({}, {})


def test_environment_row_names_device_dtype_and_torch():
    row = environment_row("cpu", torch.float16)
    assert row["dtype"] == "float16" and row["torch"] == torch.__version__ and row["device"].startswith("cpu")


def test_expected_tau_hand_checked():
    assert expected_tau(Tree.chain(3), [0.5]) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert expected_tau(Tree.wide(3), [0.5, 0.2]) == pytest.approx(1.7)  # rank 2 is beyond the vector
    # root -> (0) -> (0,0), (0,1); (1): 1 + .6 + .6*.6 + .6*.3 + .3
    assert expected_tau(Tree.from_paths([(0,), (1,), (0, 0), (0, 1)]), [0.6, 0.3]) == pytest.approx(2.44)


def test_draft_seconds_one_forward_per_depth():
    tree = Tree.kary(2, 6)  # levels of width 2 and 4: the root's forward, then level 1 is fed
    assert draft_seconds(tree, lambda w: w) == 1 + 2
    assert draft_seconds(Tree.chain(5), lambda w: 1.0) == 5  # depth x t_draft for a chain
    gappy = Tree.from_paths([(0,), (1,), (0, 0)])  # (1,) is a leaf: chosen, never fed
    assert draft_seconds(gappy, lambda w: w) == 1 + 1


def test_draft_widths_cover_the_widest_level():
    assert draft_widths([Tree.chain(8)]) == [1]
    assert draft_widths([Tree.kary(2, 6)]) == [1, 2]  # depth 1 (2 nodes) is fed; depth 2 is only chosen
    assert draft_widths([Tree.kary(2, 14)]) == [1, 2, 4]  # depths 1 and 2 fed (2 and 4 nodes)
    assert draft_widths([Tree.wide(5)]) == [1]  # leaves only: nothing is fed beyond the root


def test_grid_is_the_product_cheapest_first():
    points = grid([1, 4], [128, 1024], [4, 64], ["sparse", "chain"])
    assert len(points) == 16 and len(set(points)) == 16
    costs = [p.batch * (p.prefix + p.nodes) * p.nodes for p in points]
    assert costs == sorted(costs)
    shuffled = visiting_order(points, 3)
    assert sorted(shuffled, key=points.index) == points and shuffled != points  # every point, once
    assert visiting_order(points, 3) == shuffled and visiting_order(points, None) == points  # a seed is an order


def test_head_shapes_from_config():
    config = tiny_model(0).config
    shape = HeadShape.from_config(config, "tiny")
    assert (shape.heads, shape.kv_heads, shape.head_dim) == (4, 2, 12)
    # kv heads default to the heads, head size to hidden size / heads
    bare = SimpleNamespace(num_attention_heads=24, hidden_size=3072, num_hidden_layers=28, model_type="llama")
    assert HeadShape.from_config(bare, "bare") == HeadShape("bare", 24, 24, 128, 28)


LLAMA_32_3B = dict(  # meta-llama/Llama-3.2-3B's config.json, the numbers the grid reads
    hidden_size=3072, num_attention_heads=24, num_key_value_heads=8, head_dim=128, num_hidden_layers=28
)


def test_head_shape_of_a_local_config_llama_3_2_3b(tmp_path, monkeypatch):
    """Any model's heads come from its config.json: a folder, the file itself, no network."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    LlamaConfig(**LLAMA_32_3B, intermediate_size=8192, vocab_size=128256).save_pretrained(tmp_path)
    for name in (str(tmp_path), str(tmp_path / "config.json")):
        assert head_shape(name) == HeadShape(name, 24, 8, 128, 28)


def test_head_shape_of_hub_ids_and_embedded_models_without_the_hub(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # committed configs (io/configs): exact, offline
    assert head_shape("meta-llama/Llama-3.2-3B") == HeadShape("meta-llama/Llama-3.2-3B", 24, 8, 128, 28)
    assert head_shape("meta-llama/Llama-2-7b-hf") == HeadShape("meta-llama/Llama-2-7b-hf", 32, 32, 128, 32)
    assert head_shape("smollm2-135m") == HeadShape("smollm2-135m", 9, 3, 64, 30)


def test_embedded_config_from_the_gguf_where_no_float_folder_is_built(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECNB_CACHE", str(tmp_path))  # no float32 folder here: the GGUF's metadata (seconds)
    assert head_shape("smollm2-135m") == HeadShape("smollm2-135m", 9, 3, 64, 30)
    assert not (tmp_path / "smollm2-135m-float32").exists()  # nothing de-quantized


def test_head_shape_given_by_hand_and_refusals(monkeypatch):
    assert head_shape({"heads": 24, "kv_heads": 8, "head_dim": 128}) == HeadShape("given", 24, 8, 128)
    assert head_shape({"heads": 4, "head_dim": 16, "layers": 2, "name": "mine"}) == HeadShape("mine", 4, 4, 16, 2)
    with pytest.raises(ValueError, match="by hand looks like"):
        head_shape({"heads": 24, "dim": 128})
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        head_shape({"heads": 24, "kv_heads": 7, "head_dim": 128})
    with pytest.raises(ValueError, match="(?s)not a hub id.*by hand"):  # the old table's names are no model
        head_shape("llama-2-7b")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match="(?s)offline mode is set.*needs the hub once.*by hand"):
        head_shape("nobody-here/no-such-model-7b")


def test_grid_rows_and_resume(tmp_path):
    path = tmp_path / "grid.jsonl"
    points = grid([1, 2], [37], [4, 9], ["sparse"])
    impls = ("sdpa", "per_sequence", "eager", "causal")
    heads = HeadShape("tiny", 4, 2, 8)
    config = GridConfig(impls, warmup=0, repeats=2, progress=False)
    run_grid(Sweep(path, GRID_KEY), points[:2], heads, config)
    store = Sweep(path, GRID_KEY)
    run_grid(store, points, heads, config)  # resumes: 2 more points
    lines = path.read_text().splitlines()
    assert len(lines) == 4 and len({json.dumps(json.loads(l)["key"]) for l in lines}) == 4
    table = grid_table(store)
    assert len(table) == 4 * len(impls) and (table["status"] == "ok").all()
    assert {"device", "dtype", "torch", "median_ms", "q25_ms", "q75_ms", "leaves", "depth"} <= set(table.columns)
    assert (table[table["batch"] == 2]["prefix_lens"] == "37/18").all()  # ragged: 37 down to about half
    speed = speedup_table(table)
    assert len(speed) == 4 and (speed["per_sequence_over_tree"] > 0).all() and (speed["mask_overhead"] > 0).all()


def test_unsupported_implementation_is_stored_as_skipped(tmp_path, monkeypatch):
    import specnb.bench.attention as attention

    monkeypatch.setattr(attention, "flex_unsupported", lambda device, dtype: "not here, for this test")
    store = Sweep(tmp_path / "g.jsonl", GRID_KEY)
    config = GridConfig(("sdpa", "flex"), warmup=0, repeats=1, progress=False)
    run_grid(store, grid([1], [5], [3], ["chain"]), HeadShape("tiny", 2, 2, 8), config)
    table = grid_table(store).set_index("impl")
    assert table.loc["flex", "status"] == "skipped" and table.loc["flex", "note"] == "not here, for this test"
    assert table.loc["sdpa", "status"] == "ok"


def test_verify_curve_cost_table_and_recommendation(tmp_path):
    target, draft = tiny_model(0), tiny_model(1, layers=1)
    store = Sweep(tmp_path / "curve.jsonl", CURVE_KEY)
    quick = CurveConfig(warmup=0, repeats=2, progress=False)
    verify_curve(store, target, "tiny-target", 11, [0, 2, 5], config=quick)
    verify_curve(store, draft, "tiny-draft", 11, [1, 2, 4], "draft", quick)
    before = len(store)
    verify_curve(store, target, "tiny-target", 11, [0, 2, 5], config=quick)
    assert len(store) == before == 3 * 2 + 3, "a finished curve point is never measured twice"
    curve = curve_table(store)
    verify_rows = curve[curve["kind"] == "verify"].sort_values("nodes")
    assert verify_rows["tokens"].tolist() == [1, 3, 6] and (curve["median_s"] > 0).all()
    assert {"device", "dtype", "torch"} <= set(curve.columns)
    cost = cost_table(curve, ["chain", "kary2"], [0.6, 0.2], "tiny-target", "tiny-draft")
    assert len(cost) == 4 and set(cost["nodes"]) == {2, 5}
    row = cost[(cost["shape"] == "chain") & (cost["nodes"] == 5)].iloc[0]
    assert row["expected_tau"] == pytest.approx(expected_tau(Tree.chain(5), [0.6, 0.2]))
    assert row["tokens_per_s"] == pytest.approx(row["expected_tau"] / (row["t_draft_s"] + row["t_verify_s"]))
    assert row["speedup"] == pytest.approx(row["tokens_per_s"] / row["baseline_tokens_per_s"])
    assert "Best on this device" in recommendation(cost)
    with pytest.raises(ValueError, match="n = 0"):
        cost_table(curve[curve["nodes"] != 0], ["chain"], [0.5], "tiny-target", "tiny-draft")


def _curve(points: dict[int, float], model: str = "m") -> pd.DataFrame:
    return pd.DataFrame(
        [{"model": model, "role": "target", "kind": "verify", "tokens": t, "median_ms": ms} for t, ms in points.items()]
    )


def test_curve_shape_reads_a_step_and_a_slope_from_the_points():
    step = _curve({1: 492, 2: 1022, 5: 1121, 9: 1215, 17: 1202})  # the Qwen-1.5B curve
    c = curve_shape(step)
    assert c["decode_ms"] == 492 and c["first_tokens"] == 2 and c["step_ms"] == 530
    assert c["last_tokens"] == 17 and c["last_ms"] == 1202
    assert abs(c["step_share"] - 530 / 710) < 1e-9
    assert 0 < c["slope_ms"] < 15  # flat after the step
    text = curve_reading(step)
    assert "mostly a step" in text and "492 ms" in text and "2.44x a decode" in text

    line = _curve({1: 100, 5: 140, 9: 180, 17: 260, 33: 420})  # 10 ms per token throughout
    c = curve_shape(line)
    assert abs(c["slope_ms"] - 10) < 1e-9 and abs(c["step_per_token_ms"] - 10) < 1e-9
    assert "mostly a slope" in curve_reading(line)


def test_curve_shape_refuses_what_it_cannot_read():
    with pytest.raises(ValueError, match="1-token point"):
        curve_shape(_curve({2: 10, 5: 20}))
    both = pd.concat([_curve({1: 1, 2: 2}), _curve({1: 1, 2: 3}, model="other")])
    with pytest.raises(ValueError, match="name one"):
        curve_shape(both)
    assert curve_shape(both, model="other")["step_ms"] == 2


def test_verify_curve_times_every_point_in_the_same_rounds(tmp_path, monkeypatch):
    """A curve is timed round-robin over all its points (a change of the machine's speed during it moves
    every point alike, not the curve's shape): one interleaved measurement holding every missing point."""
    from specnb.bench import verify_curve as vc

    calls = []

    def spy(fns, device, warmup, repeats, setups=None):
        calls.append(sorted(fns))
        return measure_interleaved(fns, device, warmup, repeats, setups)

    monkeypatch.setattr(vc, "measure_interleaved", spy)
    store = Sweep(tmp_path / "curve.jsonl", CURVE_KEY)
    verify_curve(store, tiny_model(0), "t", 11, [0, 2, 5], config=CurveConfig(warmup=0, repeats=2, progress=False))
    assert calls == [sorted((kind, n) for n in (0, 2, 5) for kind in ("verify", "plain"))]
    assert (curve_table(store)["repeats"] == 2).all()


def test_step_points_time_what_the_tree_needs_and_price_it():
    """The points one tree's step needs, a round at a time: the target's verification of the tree and of
    the root alone, the draft's forward at each width the tree feeds; read back as curve rows, they price
    the tree as the cost model does (one draft forward per fed width, the verification at its node count)."""
    from specnb.analysis.cost_model import step_cost
    from specnb.bench.verify_curve import StepPoints

    tree = Tree.kary(2, 6)
    points = StepPoints(tiny_model(0), tiny_model(1, layers=1), tree, 11, ("tiny-target", "tiny-draft"))
    rounds = [points.round() for _ in range(3)]
    assert all(len(r) == 2 + len(set(tree.draft_widths)) for r in rounds)  # two verifications, a forward per width
    table = points.table([row for r in rounds for row in r])
    target = table[table["role"] == "target"].set_index("nodes")
    assert sorted(target.index) == [0, 6] and target.loc[6, "tokens"] == 7 and (target["kind"] == "verify").all()
    draft = table[table["role"] == "draft"].set_index("tokens")
    assert sorted(draft.index) == sorted(set(tree.draft_widths)) == [1, 2]
    assert (table["repeats"] == 3).all() and (table["q25_s"] <= table["median_s"]).all()
    cost = step_cost(table, "tiny-target", "tiny-draft")
    assert cost.t_verify(6) == target.loc[6, "median_s"]
    assert cost.t_draft(tree) == pytest.approx(sum(draft.loc[w, "median_s"] for w in tree.draft_widths))
    assert tree.draft_widths == (1, 2)  # the root, then the two depth-1 nodes (depth 2: leaves, never fed)


def test_cost_curves_read_each_models_points_on_its_own_linear_path(tmp_path):
    """A 4-bit draft keeps stock linear layers beside a oneDNN target: the pair's curve holds the target's
    points of the oneDNN path and the draft's of the stock path (read, not measured: none is missing)."""
    from specnb.bench.timing import environment_row
    from specnb.bench.verify_curve import curve_key
    from specnb.experiments.pairs import Pair
    from specnb.experiments.replay_study import cost_curves

    store = Sweep(tmp_path / "curve.jsonl", CURVE_KEY)
    env = environment_row("cpu", torch.float32)
    pair = Pair("t", "d", None, "4bit", cpu_linear="onednn")
    points = [("t", "target", kind, n) for n in (0, 4) for kind in ("verify", "plain")]
    points += [("d[4bit]", "draft", "plain", w) for w in (1, 2)]
    for i, (model, role, kind, n) in enumerate(points):
        for linear in ("onednn", "stock"):  # both paths stored: each model must read its own
            key = curve_key(model, role, kind, 16, n, "sparse", {**env, "linear": linear})
            store.add(key, [{"median_s": (1.0 if linear == "onednn" else 2.0) + i, "tokens": max(n, 1)}])
    curve = cost_curves(store, pair, 16, [0, 4], [Tree.chain(2)], repeats=1)
    got = {(r.model, r.role, r.kind, r.nodes): r.linear for r in curve.itertuples()}
    assert got == {p: ("onednn" if p[1] == "target" else "stock") for p in points}
