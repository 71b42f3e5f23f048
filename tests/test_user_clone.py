"""What a new user sees: the project cloned into an empty folder (nothing beside it: no `shared`
folder, as in every user's clone), specnb's model cache empty, and the README's main command run
there with the smoke profile. CI's own checkout has more beside it; only this test sees a user's
first hour. The set-up is the README's too: `.venv` made from nothing in the clone (pip's download
cache is the machine's), the embedded model installed and de-quantized into the empty cache.

The main command runs notebook 01 here (`--notebook 01_tree_shapes`): what is particular to a clone
is the set-up and the first load from the empty cache, the same for every notebook. The others run
in the suite's shared smoke run (conftest.py `smoke`, tests/test_notebooks.py) as they would here:
offline with an empty Hugging Face home, nothing in specnb's cache but the installed models (no
trained heads, no distilled data), the prompts from the package (Spec-Bench ships in specnb)."""

import json
import os
import subprocess

import pandas as pd
import pytest
from conftest import user_clone


@pytest.mark.slow
def test_a_users_clone_runs_the_main_command(tmp_path):
    home = tmp_path / "user"
    clone = user_clone(home / "specnb")
    assert sorted(p.name for p in home.iterdir()) == ["specnb"], "nothing beside the clone"
    cache = tmp_path / "empty-specnb-cache"
    cache.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPECNB_", "VIRTUAL_ENV"))}
    env.update(
        SPECNB_CACHE=str(cache), HF_HOME=str(tmp_path / "empty-hf-home"), HF_HUB_OFFLINE="1", SPECNB_CELL_TIMEOUT="900"
    )
    proc = subprocess.run(
        ["./run_notebooks.sh", "smoke", "--notebook", "01_tree_shapes"],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=2400,
    )
    log = proc.stdout[-4000:] + proc.stderr[-4000:]
    assert proc.returncode == 0, log
    assert (clone / ".venv" / "bin" / "python").exists(), "the clone set up its own .venv"
    assert any(cache.glob("smollm2-135m-float32/*.safetensors")), "the model was de-quantized into the empty cache"

    ran = sorted(p.name for p in (clone / "outputs").iterdir() if p.is_dir() and not p.name.startswith("_"))
    assert ran == ["01_tree_shapes"]  # (_shared: the runner's own folder)
    (folder,) = (clone / "outputs" / "01_tree_shapes").iterdir()
    record = json.loads((folder / "params.json").read_text())
    assert record["status"] == "finished", record.get("error")
    # it says which prompts it ran on, how many, and how many per category (the other notebooks'
    # records: tests/test_notebooks.py, test_smoke_runs_say_which_prompts_they_ran_on)
    assert record["prompts"] == {
        "source": "builtin",
        "count": 2,
        "per_category": {"writing": 1, "roleplay": 1},
        "prompt_format": "the tokenizer's chat template",
    }
    # the local executor's collection (the suite's smoke run collects 01 on Ray): written in the
    # notebook's process, its replay equal to the real runs step by step, greedy output the target's
    assert record["parameters"]["executor"] == "local"
    assert list(pd.read_csv(folder / "collection_units.csv")["status"]) == ["written", "written"]
    agreement = pd.read_csv(folder / "replay_agreement.csv")
    assert (agreement["steps_compared"] > 0).all()
    assert (agreement["identical_steps"] == agreement["steps_compared"]).all()
    assert pd.read_csv(folder / "units.csv")["greedy_equal"].all()
