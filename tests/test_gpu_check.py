"""The CPU rehearsal of benchmarks/gpu.py (`--dry`): every part of the GPU check runs at tiny sizes, so
the one call a lent GPU machine gets cannot fail on a typo; and its outputs are what the closing note
and the docs read."""

import importlib.util
import json
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def gpu():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def dry(gpu, tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu")
    code = gpu.main(["--out", str(out), "--dry"])
    return code, out, json.loads((out / "summary.json").read_text())


def test_every_part_runs_on_the_cpu(dry, gpu):
    code, out, summary = dry
    assert {name: p["status"] for name, p in summary["parts"].items()} == {name: "ok" for name in gpu.PARTS}
    assert code == 0
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8, "the device tool brings back at most 8 files"
    assert files == sorted(
        [
            "summary.md",
            "summary.json",
            "exactness.csv",
            "attention.csv",
            "attention_check.csv",
            "curves.csv",
            "cost.csv",
        ]
    )


def test_exactness_is_exact_in_float32(dry):
    _, out, summary = dry
    rows = pd.read_csv(out / "exactness.csv")
    assert len(rows) == 3 * 2 * 3  # pairs (two stand-in pairs, one self-drafted) x prompts x trees
    assert set(rows["verdict"]) == {"exact"}
    itself = rows[rows["pair"].str.contains("itself")]
    assert len(itself) == 2 * 3 and (itself["tau"] > 2).all()  # an identical draft is accepted
    assert summary["parts"]["exactness"]["mismatch"] == 0
    assert (rows["tau"] >= 1).all()


def test_sampling_follows_the_target(dry):
    part = dry[2]["parts"]["sampling"]
    assert part["runs"] == 400 and part["cells"] == 49
    assert part["p_value"] > 1e-3


def test_attention_grid_and_checks(dry):
    _, out, summary = dry
    grid = pd.read_csv(out / "attention.csv")
    assert set(grid["impl"]) == {"sdpa", "per_sequence", "eager", "causal"}
    assert set(grid["batch"]) == {1, 2} and set(grid["status"]) == {"ok"}
    checks = pd.read_csv(out / "attention_check.csv")
    assert checks["ok"].all() and len(checks) == 2 * 3  # largest point of each batch x implementations
    assert summary["parts"]["attention"]["checks_failed"] == 0


def test_curves_cover_every_model_batch_and_cache(dry, gpu):
    _, out, _ = dry
    curves = pd.read_csv(out / "curves.csv")
    nf4 = {t + gpu.NF4 for t in gpu.TARGETS}  # bitsandbytes is a dependency: its CPU kernels run the rehearsal
    assert set(curves["model"]) == set(gpu.TARGETS) | set(gpu.DRAFTS) | nf4
    assert set(curves["batch"]) == {1, 2}
    target = curves[(curves["role"] == "target") & (curves["kind"] == "verify")]
    assert set(target["nodes"]) == {0, 2, 4}
    assert (curves["median_s"] > 0).all()


def test_cost_rows_name_their_borrowed_acceptance(dry, gpu):
    _, out, _ = dry
    cost = pd.read_csv(out / "cost.csv")
    borrowed = json.loads(gpu.ACCEPTANCE_FILE.read_text())
    assert set(cost["acceptance"]) == {v["label"] for v in borrowed["vectors"]}
    assert set(cost["shape"]) == set(gpu.COST_SHAPES)
    assert (cost["acceptance_note"] == borrowed["note"]).all()
    assert len(cost) == len(borrowed["vectors"]) * 2 * len(gpu.PAIRS) * len(gpu.COST_SHAPES)  # float16 and nf4
    assert {t + gpu.NF4 for _, t in gpu.PAIRS} <= set(cost["target"])


def test_a_failing_part_is_recorded_and_the_rest_run(gpu, tmp_path):
    report = gpu.Report(tmp_path, gpu.DRY)

    def broken(sizes, out, deadline):
        raise RuntimeError("typo")

    report.run("broken", broken)
    report.run("fine", lambda sizes, out, deadline: ({"x": 1}, "table"))
    summary = json.loads((tmp_path / "summary.json").read_text())["parts"]
    assert summary["broken"]["status"] == "failed" and "typo" in summary["broken"]["error"]
    assert summary["fine"]["status"] == "ok" and summary["fine"]["x"] == 1
