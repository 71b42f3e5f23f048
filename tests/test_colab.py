"""The Colab bootstrap: a notebook's first cells, run in a fresh kernel started in an unrelated
folder, with a stub `google.colab` module, on a Python that has torch and transformers but not
specnb, and SPECNB_REPO pointing at a local clone (a folder; and a git URL, cloned into
SPECNB_HOME): `import specnb` works in that same kernel, from the clone, with no restart."""

import json
import subprocess
import sys
import sysconfig
from pathlib import Path

import nbformat
import pytest
import yaml
from conftest import user_clone
from jupyter_client import KernelManager
from jupyter_client.kernelspec import KernelSpecManager
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bare(tmp_path_factory):
    """A Python without specnb whose site sees this environment's packages (torch, transformers,
    ipykernel) through a path file: the editable install of specnb in it is a .pth of its own,
    which a path listed in another .pth file does not process."""
    tmp = tmp_path_factory.mktemp("bare")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    (site / "parent-packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    check = subprocess.run(
        [python, "-c", "import torch, transformers, importlib.util as u; print(u.find_spec('specnb'))"],
        capture_output=True,
        text=True,
        cwd=tmp,
    )
    assert check.returncode == 0 and check.stdout.strip() == "None", check.stdout + check.stderr
    kernels = tmp / "jupyter" / "kernels" / "bare"
    kernels.mkdir(parents=True)
    (kernels / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "bare",
                "language": "python",
            }
        )
    )
    stub = tmp / "stub" / "google" / "colab"  # a namespace package: google.protobuf stays importable
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text('"""A stand-in for Colab\'s module."""\n')
    clone = user_clone(tmp / "clone")  # the working tree as committing would land it
    return {"tmp": tmp, "clone": clone, "jupyter": tmp / "jupyter", "stub": tmp / "stub"}


def first_cells(name: str) -> nbformat.NotebookNode:
    """The notebook's parameters cell, the smoke profile's values for it (the models the test set-up
    installs: the set-up cell reads the target's tokenizer to say how prompts are encoded), the
    Colab cell (finds or clones the project, installs its runtime), the set-up cell, and a cell that
    reports where specnb came from."""
    nb = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"][:3]
    smoke = yaml.safe_load((ROOT / "notebooks" / "profiles" / "smoke.yaml").read_text())[name]
    code.insert(1, nbformat.v4.new_code_cell("\n".join(f"{k} = {v!r}" for k, v in smoke.items())))
    code.append(
        nbformat.v4.new_code_cell(
            "import google.colab, specnb, sys\nprint('SPECNB', specnb.__file__)\nprint('RUN', run)"
        )
    )
    nb.cells = code
    return nb


def execute(nb: nbformat.NotebookNode, kernel: KernelManager, folder: Path, env: dict) -> None:
    """Run `nb` in `kernel` started in `folder`, then shut the kernel down (nbclient leaves a kernel
    it was handed running) and check it is gone."""
    try:
        NotebookClient(nb, km=kernel, timeout=600, resources={"metadata": {"path": str(folder)}}).execute(env=env)
    finally:
        if kernel.has_kernel:
            kernel.shutdown_kernel()
    assert not kernel.is_alive(), "the kernel is still running"


@pytest.mark.parametrize("how", ["folder", "git"])
def test_a_fresh_colab_kernel_finds_installs_and_imports_specnb(bare, how, tmp_path):
    elsewhere = tmp_path / "unrelated"
    elsewhere.mkdir()
    env = {
        "PATH": "/usr/bin:/bin:/usr/local/bin",
        "HOME": str(tmp_path),
        "PYTHONPATH": str(bare["stub"]),
        "SPECNB_OUTPUTS": str(tmp_path / "outputs"),
        "OMP_NUM_THREADS": "1",
    }
    if how == "folder":
        env["SPECNB_REPO"] = str(bare["clone"])
        expected = bare["clone"]
    else:
        env["SPECNB_REPO"] = f"file://{bare['clone']}"
        env["SPECNB_HOME"] = str(tmp_path / "specnb")
        expected = tmp_path / "specnb"
    nb = first_cells("01_tree_shapes")
    specs = KernelSpecManager(kernel_dirs=[str(bare["jupyter"] / "kernels")])
    kernel = KernelManager(kernel_name="bare", kernel_spec_manager=specs)
    execute(nb, kernel, elsewhere, env)
    printed = "".join(o.get("text", "") for o in nb.cells[-1].outputs if o.get("output_type") == "stream")
    assert f"SPECNB {expected / 'specnb' / '__init__.py'}" in printed, printed
    assert str(tmp_path / "outputs") in printed  # the run folder went where SPECNB_OUTPUTS says
    setup = "".join(o.get("text", "") for o in nb.cells[2].outputs if o.get("output_type") == "stream")
    assert "installing the runtime requirements" in setup and "torch==" in setup  # the installed torch pinned


def test_a_restarted_colab_kernel_in_the_clones_parent_still_imports_specnb(bare, tmp_path):
    """Colab's kernel runs in /content, which is on sys.path, and the clone lands in /content/specnb
    (no __init__.py at its top). After a runtime restart (the README's "rerun to resume", and the
    automatic restart after a RAM crash) `find_spec("specnb")` finds that folder as a namespace
    package, not None: the set-up cell must still put the real package on sys.path. A fresh kernel
    in the clone's parent clones and imports; a second fresh kernel there (the restart, with
    SPECNB_REPO no longer set) finds the namespace, then the clone, and imports from it."""
    content = tmp_path / "content"
    content.mkdir()
    env = {
        "PATH": "/usr/bin:/bin:/usr/local/bin",
        "HOME": str(tmp_path),
        "PYTHONPATH": str(bare["stub"]),
        "SPECNB_OUTPUTS": str(tmp_path / "outputs"),
        "OMP_NUM_THREADS": "1",
        "SPECNB_HOME": str(content / "specnb"),
    }
    seen = []
    for repo in (f"file://{bare['clone']}", None):
        nb = first_cells("01_tree_shapes")
        nb.cells.insert(
            1,
            nbformat.v4.new_code_cell(
                "import importlib.util\nfound = importlib.util.find_spec('specnb')\n"
                "print('FOUND', found if found is None else "
                "(found.origin, list(found.submodule_search_locations or [])))"
            ),
        )
        kernel = KernelManager(
            kernel_name="bare", kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(bare["jupyter"] / "kernels")])
        )
        run_env = dict(env, SPECNB_REPO=repo) if repo else env
        execute(nb, kernel, content, run_env)
        printed = "".join(o.get("text", "") for c in nb.cells for o in c.outputs if o.get("output_type") == "stream")
        seen.append(printed)
        assert f"SPECNB {content / 'specnb' / 'specnb' / '__init__.py'}" in printed, printed
    assert "FOUND None" in seen[0].splitlines()  # nothing yet: the first run clones
    namespace = f"FOUND (None, [{str(content / 'specnb')!r}])"
    assert namespace in seen[1].splitlines(), f"the restart should see only the folder, as a namespace: {seen[1]}"
    assert (content / "specnb" / ".git").is_dir() and sorted(p.name for p in content.iterdir()) == ["specnb"]


def test_colab_set_up_installs_the_runtime_and_the_headless_runner_only():
    """`./run_notebooks.sh` on Colab installs into Colab's own Python: pyproject.toml's dependencies
    plus its extra [notebooks] (papermill, nbconvert, nbformat, ipykernel), never jupyterlab, ray or
    pytest, which take minutes and can upgrade the Jupyter server and tornado Colab's kernel pins."""
    import os

    env = {**os.environ, "COLAB_RELEASE_TAG": "release-colab-test"}
    plan = subprocess.run(
        ["bash", "scripts/setup_env.sh", "--plan"], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    ).stdout
    installs = next(line for line in plan.splitlines() if line.startswith("installs: ")).split()[1:]
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert installs == project["dependencies"] + project["optional-dependencies"]["notebooks"]
    assert not any(word in plan for word in ("[dev]", "jupyterlab", "ray", "pytest"))
    here = subprocess.run(
        ["bash", "scripts/setup_env.sh", "--plan"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "COLAB_RELEASE_TAG"},
        check=True,
    ).stdout
    assert f"installs: -e {ROOT}[dev]" in here  # elsewhere: everything, tests included


def test_every_notebooks_colab_cell_is_the_one_in_scripts():
    """The Colab cell must run before specnb can be imported, so each notebook carries its text; it is
    written once, in scripts/colab_cell.py, and every numbered notebook's copy is that file's text."""
    cell = (ROOT / "scripts" / "colab_cell.py").read_text().rstrip("\n")
    books = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert len(books) >= 7
    for book in books:
        code = [c for c in nbformat.read(book, as_version=4).cells if c.cell_type == "code"]
        assert code[1].source == cell, f"{book.name}: its Colab cell differs from scripts/colab_cell.py"
