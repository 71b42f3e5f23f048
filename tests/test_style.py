"""The tree is formatted and lint-clean by the one configuration in pyproject.toml ([tool.ruff]):
`ruff format --check` and `ruff check` over the package, benchmarks, scripts and tests."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def ruff() -> list[str]:
    found = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if found is None:
        pytest.fail("ruff is not installed: it comes with requirements-dev.txt (scripts/setup_env.sh installs it)")
    return [found]


@pytest.mark.parametrize("command", [["format", "--check"], ["check"]], ids=["format", "lint"])
def test_the_tree_is_clean(command):
    out = subprocess.run([*ruff(), *command, "."], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"`ruff {' '.join(command)} .` found:\n{out.stdout[-4000:]}{out.stderr[-2000:]}"
