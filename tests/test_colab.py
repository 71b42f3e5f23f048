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
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "parent-packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    check = subprocess.run([python, "-c", "import torch, transformers, importlib.util as u; print(u.find_spec('specnb'))"],
                           capture_output=True, text=True, cwd=tmp)
    assert check.returncode == 0 and check.stdout.strip() == "None", check.stdout + check.stderr
    kernels = tmp / "jupyter" / "kernels" / "bare"
    kernels.mkdir(parents=True)
    (kernels / "kernel.json").write_text(json.dumps({
        "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "bare", "language": "python"}))
    stub = tmp / "stub" / "google" / "colab"  # a namespace package: google.protobuf stays importable
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text('"""A stand-in for Colab\'s module."""\n')
    clone = tmp / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    return {"tmp": tmp, "clone": clone, "jupyter": tmp / "jupyter", "stub": tmp / "stub"}


def first_cells(name: str) -> nbformat.NotebookNode:
    """The notebook's parameters and set-up cells, and a cell that reports where specnb came from."""
    nb = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"][:2]
    code.append(nbformat.v4.new_code_cell(
        "import google.colab, specnb, sys\nprint('SPECNB', specnb.__file__)\nprint('RUN', run)"))
    nb.cells = code
    return nb


@pytest.mark.parametrize("how", ["folder", "git"])
def test_a_fresh_colab_kernel_finds_installs_and_imports_specnb(bare, how, tmp_path):
    elsewhere = tmp_path / "unrelated"
    elsewhere.mkdir()
    env = {"PATH": "/usr/bin:/bin:/usr/local/bin", "HOME": str(tmp_path),
           "PYTHONPATH": str(bare["stub"]), "SPECNB_OUTPUTS": str(tmp_path / "outputs"), "OMP_NUM_THREADS": "1"}
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
    NotebookClient(nb, km=kernel, timeout=600, resources={"metadata": {"path": str(elsewhere)}}).execute(env=env)
    printed = "".join(o.get("text", "") for o in nb.cells[-1].outputs if o.get("output_type") == "stream")
    assert f"SPECNB {expected / 'specnb' / '__init__.py'}" in printed, printed
    assert str(tmp_path / "outputs") in printed  # the run folder went where SPECNB_OUTPUTS says
    setup = "".join(o.get("text", "") for o in nb.cells[1].outputs if o.get("output_type") == "stream")
    assert "installing the runtime requirements" in setup and "torch==" in setup  # the installed torch pinned
