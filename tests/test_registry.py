"""Each notebook declared once (`specnb.notebook.registry`): the specs the notebooks carry are the ones
the runner, the parameter check, the estimates, the index and the report read, and a new notebook is
the notebook with its spec, nothing else."""

from __future__ import annotations

import json
import re

import nbformat
import pytest
from conftest import ROOT, tiny_notebook

from specnb.notebook import estimate, parameters, registry, runner
from specnb.notebook.places import NOTEBOOKS
from specnb.notebook.profiles import RunnerError, declared_parameters

SPECS = registry.specs()


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.stem)
def test_every_notebook_declares_a_spec_the_code_can_read(spec):
    declared = declared_parameters(NOTEBOOKS / f"{spec.stem}.ipynb")
    assert spec.declared and spec.purpose and spec.title, spec.stem
    assert spec.estimate in estimate.RULES
    assert set(spec.rules.values()) <= set(parameters.NARROW) and set(spec.rules) <= set(declared)
    assert set(spec.lower) <= set(estimate.PART_NAMES)
    named = {n for names in spec.lower.values() for n in names if n.isidentifier()}
    assert named <= set(declared), f"{spec.stem}: lower names {sorted(named - set(declared))}, not its parameters"
    assert all(registry.stem(name) for name in spec.reads)
    assert spec.headline in spec.writes and (spec.written_last is None or spec.written_last in spec.writes)


def test_one_notebook_times_the_decode_step_and_one_is_published():
    assert [s.stem for s in SPECS if s.decode] == [registry.decode_notebook().stem]
    assert [s.stem for s in SPECS if s.publish] == [registry.report_notebook().stem]
    assert "target" in declared_parameters(NOTEBOOKS / f"{registry.decode_notebook().stem}.ipynb")


def test_no_notebook_is_named_by_its_number_in_the_package():
    """A notebook's stem appears in no string of the package's code outside the registry (which shows
    one in its docstring): code asks the registry."""
    stem = re.compile(r"""["'][0-9][0-9]_[a-z_]+["']""")
    found = [
        f"{path.relative_to(ROOT)}:{i}: {line.strip()}"
        for folder in ("specnb", "benchmarks")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path != ROOT / "specnb" / "notebook" / "registry.py"
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if stem.search(line)
    ]
    assert not found, "\n".join(found)


def test_a_spec_with_an_unknown_key_is_refused_with_what_is_allowed(tmp_path):
    path = tiny_notebook(tmp_path / "01_odd.ipynb", 'run_dir: str = ""  # folder')
    nb = nbformat.read(path, as_version=4)
    nb.metadata["specnb"] = {"purpose": "odd", "estimat": "generation"}
    nbformat.write(nb, path)
    with pytest.raises(registry.SpecError, match=r"unknown keys \['estimat'\]; allowed: .*'estimate'"):
        registry.read_spec(path)
    nb.metadata["specnb"] = {"purpose": "odd", "memory": "generation", "t4": "generation"}  # the keys of before
    nbformat.write(nb, path)
    with pytest.raises(registry.SpecError, match='became one "estimate"'):
        registry.read_spec(path)
    nb.metadata["specnb"] = {"headline": "x.png"}  # a headline alone: an undeclared notebook, its figure kept
    nbformat.write(nb, path)
    assert registry.read_spec(path).headline == "x.png" and not registry.read_spec(path).declared


MINE = {
    "purpose": "a notebook of mine: one table",
    "title": "mine",
    "headline": "mine.png",
    "writes": ["mine.csv", "mine.png"],
    "written_last": "mine.csv",
    "estimate": "generation",
    "lower": {"weights": ["target", "draft"], "kv_cache": ["max_new_tokens"]},
    "rules": {"draft": "model"},
}


def test_a_new_notebook_is_the_notebook_and_its_spec(tmp_path, monkeypatch, capsys):
    """A project of one new notebook and a profile: its spec, its parameter check (the shared rules and
    the narrower one its spec names), its memory and T4 time estimates by the rules its spec names, a
    run, and the index naming its purpose, with no module of specnb told about it."""
    books = tmp_path / "notebooks"
    (books / "profiles").mkdir(parents=True)
    (books / "profiles" / "mine.yaml").write_text("all:\n")
    cell = (
        'target: str = "JackFram/llama-160m"  # target\n'
        'draft: str = "JackFram/llama-160m"  # draft\n'
        "max_new_tokens: int = 64  # tokens\n"
        "max_prompts: int = 3  # prompts\n"
        'methods: list = ["chain:4"]  # methods\n'
        'run_dir: str = ""  # folder'
    )
    write = (
        "import pathlib, matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n"
        "plt.plot([0, 1]); plt.savefig(pathlib.Path(run_dir, 'mine.png'))\n"
        "pathlib.Path(run_dir, 'mine.csv').write_text('a\\n1\\n')"
    )
    path = tiny_notebook(books / "08_mine.ipynb", cell, write)
    nb = nbformat.read(path, as_version=4)
    nb.metadata["specnb"] = MINE
    nbformat.write(nb, path)

    (spec,) = registry.specs(books)  # the report notebook comes later
    assert (spec.stem, spec.name, spec.label, registry.stem("mine", books)) == ("08_mine", "mine", "08 mine", "08_mine")
    params = {k: v.default for k, v in parameters.declared(path).items() if k != "run_dir"}

    runner.check_parameters([path], {"08_mine": params})  # its defaults pass
    with pytest.raises(RunnerError) as refused:
        runner.check_parameters([path], {"08_mine": params | {"draft": "", "max_new_tokens": 0}})
    assert "draft=''" in str(refused.value) and "max_new_tokens=0" in str(refused.value)
    nb.metadata["specnb"] = {k: v for k, v in MINE.items() if k != "rules"}  # the shared rule: no draft is fine
    nbformat.write(nb, path)
    runner.check_parameters([path], {"08_mine": params | {"draft": ""}})
    nb.metadata["specnb"] = MINE
    nbformat.write(nb, path)

    memory = estimate.notebook_memory("08_mine", params, device="cpu", folder=books)
    larger = estimate.notebook_memory("08_mine", params | {"max_new_tokens": 4096}, device="cpu", folder=books)
    assert memory.weights > 0 and larger.kv_cache > memory.kv_cache and not memory.notes, memory.describe()
    said = estimate.refusal(memory, memory.total // 2, "a test", books)
    assert "weights" in said and "target, draft" in said, said

    table = estimate.t4_time("mine", folder=books)
    mine = table[table["stem"] == "08_mine"]
    assert set(mine["notebook"]) == {"08"} and mine["seconds"].sum() > 0
    assert "chain:4: 64 tokens x 1 caches" in set(mine["part"])

    report = tiny_notebook(books / "09_summary.ipynb", 'run_dir: str = ""  # folder', "pass")
    nb = nbformat.read(report, as_version=4)
    nb.metadata["specnb"] = {"purpose": "my report", "reads": ["mine"], "publish": True, "estimate": "none"}
    nbformat.write(nb, report)
    assert registry.report_notebook(books).stem == "09_summary"

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the hub target is never loaded: the notebook loads no model
    assert runner.run("mine", {}, [], ["08_mine"], tmp_path / "outputs", books_folder=books) == 0
    assert "./run_notebooks.sh mine --notebook 09_summary (after 08_mine)" in capsys.readouterr().out
    (folder,) = (tmp_path / "outputs" / "08_mine").iterdir()
    assert json.loads((folder / "params.json").read_text())["status"] == "finished"
    index = (tmp_path / "outputs" / "index.md").read_text()
    assert "- **08_mine**: a notebook of mine: one table" in index
    page = (tmp_path / "outputs" / "index.html").read_text()
    assert "a notebook of mine: one table" in page and f'src="08_mine/{folder.name}/mine.png"' in page


def test_the_t4_profile_estimates_every_notebook_that_runs_a_model():
    """The runner's estimate for a T4 profile takes the T4 time estimate's rows by their stems."""
    plan = estimate.plan("t4", ["t4"], [s.stem for s in SPECS])
    for spec in SPECS:
        assert (plan.estimates[spec.stem] or 0) > 0 or spec.estimate == "none", spec.stem
