"""What a new user sees: the project cloned into an empty folder (nothing beside it: no `shared`
folder, as in every user's clone), specnb's model cache empty, and the README's main command run
there with the smoke profile. CI's own checkout has more beside it; only this test sees a user's
first hour. The set-up is the README's too: `.venv` made from nothing in the clone (pip's download
cache is the machine's), the embedded model installed and de-quantized into the empty cache.

The main command runs notebook 01 here (`--notebook 01_tree_shapes`): what is particular to a clone
is the set-up and the first load from the empty cache, the same for every notebook. The others run
in the suite's shared smoke run (conftest.py `smoke`, tests/test_notebooks.py) as they would here:
offline with an empty Hugging Face home, nothing in specnb's cache but the installed models (no
trained heads, no distilled data), the prompts from the package (Spec-Bench ships in specnb).

The first run of the main command is killed (its whole process group, with SIGKILL) as soon as its
collection has written one unit, and the command is run again once nothing of the first is left (its
kernel, in a session of its own, ends by itself within seconds): it resumes that run, keeps the
units written and writes the rest, with nothing lost and nothing duplicated, whatever the number
the first run finished (one on a slow machine, sometimes both on a fast one)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from conftest import user_clone, wait_for_no_process_under

from specnb.analysis.collection import Collection


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
    env.update(PYTHONDONTWRITEBYTECODE="1")  # as on this workplace's machines: the set-up must write the bytecode
    killed_and_resumed(clone, env, tmp_path)
    # the set-up wrote the environment's bytecode once (else each kernel compiles torch and transformers)
    (site,) = (clone / ".venv" / "lib").glob("python3*/site-packages")
    assert (site / "torch" / "__pycache__" / f"__init__.{sys.implementation.cache_tag}.pyc").exists()
    assert list((site / "transformers" / "models" / "llama" / "__pycache__").glob("modeling_llama.*.pyc"))


def killed_and_resumed(clone: Path, env: dict[str, str], logs: Path) -> None:
    """The main command killed as soon as its collection wrote a unit, run again, and its run checked
    (the module docstring). Also run ten times in a row on one clone to look for races: python
    tests/test_user_clone.py CLONE LOGS (the clone's .venv and models set up by a first run)."""
    tmp_path = logs
    cmd = ["./run_notebooks.sh", "smoke", "--notebook", "01_tree_shapes"]
    with open(tmp_path / "first-run.log", "w") as log:  # a file: a pipe nobody reads would fill and stall it
        first = subprocess.Popen(cmd, cwd=clone, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        collected, deadline = [], time.time() + 1800
        while not collected and first.poll() is None and time.time() < deadline:
            collected = list(clone.glob("outputs/_shared/*/collections/*/*.npz"))  # a unit's file is its record
            time.sleep(0.2)
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    assert collected, "the collection never started: " + (tmp_path / "first-run.log").read_text()[-4000:]
    # the kernel runs in a session of its own (jupyter_client starts it so): the process group's kill
    # does not reach it, its parent poller ends it within about a second, and until then it may write
    # another unit; the units kept are those present once nothing of the run is left
    assert wait_for_no_process_under(clone, 30), "the killed run's kernel outlived it by 30 s"
    kept = sorted(p.name for p in collected[0].parent.glob("*.npz"))
    proc = subprocess.run(cmd, cwd=clone, env=env, capture_output=True, text=True, timeout=2400)
    log = proc.stdout[-4000:] + proc.stderr[-4000:]
    assert proc.returncode == 0, log
    assert "== 01_tree_shapes: resuming" in proc.stdout, log
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
    # the local executor's collection (the suite's smoke run collects 01 on Ray), written in the
    # notebook's process: every unit once, the killed run's kept as they were, the rest written on
    # resuming (how many the killed run finished depends on the machine's speed, not on specnb)
    assert record["parameters"]["executor"] == "local"
    table = pd.read_csv(folder / "collection_units.csv")
    files = sorted(p.name for p in Path(record["collection"]).glob("*.npz"))  # the run's shared collection
    assert sorted(table["unit"]) == files and len(files) == 2 and set(kept) <= set(files)
    assert table.set_index("unit")["status"].to_dict() == {u: "present" if u in kept else "written" for u in files}
    assert len({p.prompt_id for p in Collection.load(record["collection"]).prompts}) == 2
    # its replay equal to the real runs step by step; the first check_prompts (2) prompts run end to
    # end, each once: the target alone, 3 methods, smoke's own tree and its shape rule (at 4 nodes);
    # greedy output the target's
    agreement = pd.read_csv(folder / "replay_agreement.csv")
    assert (agreement["steps_compared"] > 0).all()
    assert (agreement["identical_steps"] == agreement["steps_compared"]).all()
    units = pd.read_csv(folder / "units.csv")
    assert len(units) == 2 * (1 + 3 + 2) and not units.duplicated(["shape", "budget", "prompt_id"]).any()
    assert units["greedy_equal"].all()


if __name__ == "__main__":  # ten kills and resumes in a row on one clone (see killed_and_resumed)
    clone, logs = Path(sys.argv[1]), Path(sys.argv[2])
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIRTUAL_ENV")}
    for i in range(10):
        for folder in (clone / "outputs").glob("*"):
            subprocess.run(["rm", "-rf", str(folder)], check=True)
        (logs / str(i)).mkdir(parents=True, exist_ok=True)
        start = time.time()
        killed_and_resumed(clone, env, logs / str(i))
        print(f"run {i + 1}: passed in {time.time() - start:.0f} s", flush=True)
