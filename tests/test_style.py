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


def _imports() -> dict[str, set[str]]:
    """Each specnb module -> the specnb modules it imports, at the top or inside a function alike."""
    import ast

    files = {}
    for path in (ROOT / "specnb").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                module = ".".join(base + ([node.module] if node.module else [])) if node.level else node.module or ""
                found.update(m for m in (module, *(f"{module}.{a.name}" for a in node.names)) if m in files)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name in files)
        graph[name] = found - {name}
    return graph


def test_no_import_circle_even_through_an_import_inside_a_function():
    """No module of specnb reaches itself through its imports, counting those inside functions: a
    deferred import may save start-up time, never hide a circle."""
    graph = _imports()
    assert "specnb.notebook.report" in graph["specnb.notebook.runner"]  # imported inside a function: read too
    circles = []
    for start in graph:
        stack, seen = [(start, (start,))], set()
        while stack:
            node, path = stack.pop()
            for nxt in graph[node]:
                if nxt == start:
                    circles.append(" -> ".join((*path, start)))
                elif nxt not in seen and not nxt.startswith(start + "."):
                    seen.add(nxt)
                    stack.append((nxt, (*path, nxt)))
    assert not circles, "import circles:\n" + "\n".join(sorted(set(circles))[:10])
