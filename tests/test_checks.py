"""Impossible notebook parameters are refused before any model loads, with a message that names what
to change (`specnb.experiments.checks`), and what a notebook records about its prompts reaches the
run's params.json."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_set_up_cells

from specnb.experiments import checks
from specnb.io.prompts import describe_prompts, load_prompts
from specnb.notebook.session import record, show_prompts

ROOT = Path(__file__).resolve().parents[1]


def test_study_prompts_refuses_a_short_split_and_keeps_them_disjoint():
    from specnb.experiments.learned_study import study_prompts

    tokenizer = "smollm2-135m"  # only its tokenizer loads
    with pytest.raises(
        checks.ParameterError, match=r"train_prompts=120 \(heads='train'\) but the training split holds 0: 13 prompts"
    ):
        study_prompts(tokenizer, "builtin", 128, 120, 2, training=True)  # one prompt per category: all held out
    with pytest.raises(checks.ParameterError, match="test_prompts=24 but the test split holds"):
        study_prompts(tokenizer, "spec_bench", 16, 4, 24, training=True)
    train, test, encoded = study_prompts(tokenizer, "spec_bench", 128, 40, 6, training=True)
    assert encoded == "the tokenizer's chat template"  # SmolLM2-Instruct's own
    assert len(train) == 40 and len(test) == 6 and not {p[0] for p in train} & {p[0] for p in test}
    assert len({p[1] for p in test}) == 6 and all(len(p[2]) <= 128 for p in train + test)
    loaded, test, _ = study_prompts(
        tokenizer, "spec_bench", 512, 10_000, 6, training=False
    )  # published heads: no training split
    assert loaded == [] and len(test) == 6


def test_record_adds_to_params_json(tmp_path, capsys):
    (tmp_path / "params.json").write_text(json.dumps({"status": "running", "parameters": {"a": 1}}))
    record(tmp_path, "note", [1, 2])
    show_prompts(tmp_path, describe_prompts(load_prompts("builtin", limit=3), "builtin"), key="test_prompts")
    assert (
        "test prompts: specnb's built-in prompts, 3 prompts (writing 1, roleplay 1, reasoning 1)"
        in capsys.readouterr().out
    )
    data = json.loads((tmp_path / "params.json").read_text())
    assert data == {
        "status": "running",
        "parameters": {"a": 1},
        "note": [1, 2],
        "test_prompts": {
            "source": "builtin",
            "count": 3,
            "per_category": {"writing": 1, "roleplay": 1, "reasoning": 1},
        },
    }


IMPOSSIBLE = [
    (
        "02_model_pairs",
        {"max_prompts": 9},
        "max_prompts=9, but prompts 'spec_bench' with categories=['coding', 'writing']",
    ),
    ("05_learned_drafters", {"prompts": "builtin"}, "train_prompts=16 (heads='train') but the training split holds"),
    ("05_learned_drafters", {"speed_budget": 16}, "speed_budget=16 is not one of budgets=[4, 8]"),
    # every model a run names is resolved in its set-up cell: 03's target (once checked only after its
    # attention grid) and 05's heads repository (once resolved only after the 7B target had loaded)
    ("03_tree_attention_timing", {"target": "nobody/no-such-target"}, "model 'nobody/no-such-target' cannot be loaded"),
    ("05_learned_drafters", {"heads": "nobody/no-such-heads"}, "model 'nobody/no-such-heads' cannot be loaded"),
    ("05_learned_drafters", {"eagle_heads": "nobody/no-such-eagle"}, "model 'nobody/no-such-eagle' cannot be loaded"),
]


@pytest.mark.parametrize("notebook, overrides, message", IMPOSSIBLE)
def test_a_notebook_refuses_impossible_parameters_before_loading_a_model(
    tmp_path, monkeypatch, notebook, overrides, message
):
    """The smoke profile with one parameter made impossible, through the notebook's own first cells
    (`conftest.run_set_up_cells`, in this process: no kernel to start): its set-up cell raises the
    message, with no model loaded. Offline, as a user's first run (no hub here)."""
    from specnb.notebook import runner

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    params = runner.resolve("smoke", overrides, [], [ROOT / "notebooks" / f"{notebook}.ipynb"])[notebook]
    with pytest.raises(Exception) as refused:
        run_set_up_cells(notebook, {**params, "run_dir": str(tmp_path / "run")}, monkeypatch)
    assert message in str(refused.value), f"{type(refused.value).__name__}: {refused.value}"


def test_a_refusal_fails_the_run_in_its_set_up_cell(tmp_path):
    """End to end, once (the cases above run the same cells in this process): the runner's papermill
    run of a notebook whose set-up cell refuses a parameter fails in that cell (cell 3: after the
    title, the parameters and the Colab cell; papermill's injected parameters come after the
    parameters cell), the message in params.json. The outputs already hold a finished run of the
    same id (profile and parameters, `runner.run_id`; made here: the runner reads only its status):
    that run is kept as it was and the new one gets the folder beside it, `-2`, as any run again of
    a finished run does."""
    from specnb.notebook import runner

    notebook, overrides, message = IMPOSSIBLE[4]  # 03: its set-up cell is the quickest to reach
    params = runner.resolve("smoke", overrides, [], [ROOT / "notebooks" / f"{notebook}.ipynb"])[notebook]
    finished = tmp_path / "outputs" / notebook / runner.run_id("smoke", params)
    finished.mkdir(parents=True)
    (finished / "params.json").write_text(json.dumps({"status": "finished", "parameters": params}))
    (finished / "table.csv").write_text("a\n1\n")
    before = {p.name: p.read_bytes() for p in finished.iterdir()}
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "empty-hf-home")}  # no hub here
    args = [a for name, value in overrides.items() for a in ("-p", name, str(value))]
    proc = subprocess.run(
        [sys.executable, "-m", "specnb.notebook.runner", "run", "smoke", "--notebook", notebook, *args]
        + ["--outputs", str(tmp_path / "outputs")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 1
    assert sorted(p.name for p in finished.parent.iterdir()) == [finished.name, finished.name + "-2"]
    assert {p.name: p.read_bytes() for p in finished.iterdir()} == before, "the finished run kept as it was"
    params = json.loads((finished.parent / f"{finished.name}-2" / "params.json").read_text())
    assert params["status"] == "failed" and message in params["error"], params.get("error")
    injected = 1
    assert params["error"].startswith(f"cell {3 + injected} "), params["error"]
