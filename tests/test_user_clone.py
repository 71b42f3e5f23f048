"""What a new user sees: the project cloned into an empty folder (nothing beside it: no `shared`
folder, as in every user's clone), specnb's model cache empty, and the README's main command run
there with the smoke profile. CI's own checkout has more beside it; only this test sees a user's
first hour. The set-up is the README's too: `.venv` made from nothing in the clone (pip's download
cache is the machine's), the embedded model installed and de-quantized into the empty cache."""

import json
import os
import subprocess

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
        ["./run_notebooks.sh", "smoke"], cwd=clone, env=env, capture_output=True, text=True, timeout=2400
    )
    log = proc.stdout[-4000:] + proc.stderr[-4000:]
    assert proc.returncode == 0, log
    assert (clone / ".venv" / "bin" / "python").exists(), "the clone set up its own .venv"
    assert any(cache.glob("smollm2-135m-float32/*.safetensors")), "the model was de-quantized into the empty cache"

    books = sorted(p.stem for p in (clone / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    records = {}
    for stem in books:
        (folder,) = (clone / "outputs" / stem).iterdir()
        records[stem] = json.loads((folder / "params.json").read_text())
        assert records[stem]["status"] == "finished", (stem, records[stem].get("error"))
    # every notebook that runs prompts says which, how many, and how many per category
    assert records["01_tree_shapes"]["prompts"] == {
        "source": "builtin",
        "count": 2,
        "per_category": {"writing": 1, "roleplay": 1},
        "prompt_format": "the tokenizer's chat template",
    }
    assert records["02_model_pairs"]["prompts"] == {
        "source": "spec_bench",
        "count": 6,
        "per_category": {"coding": 3, "writing": 3},
    }
    assert records["04_long_generation"]["prompts"]["count"] == 1
    medusa = records["05_learned_drafters"]
    assert medusa["training_prompts"]["source"] == "spec_bench" and medusa["training_prompts"]["count"] == 16
    assert medusa["test_prompts"]["count"] == 2
    by_category = (next((clone / "outputs" / "02_model_pairs").iterdir()) / "by_category.csv").read_text()
    assert "coding" in by_category and "writing" in by_category
