"""The README is a front page and docs/ holds the rest: size limits, links that resolve, the two commands,
and no reference to a folder a user's clone lacks."""

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    """GitHub's anchors for a Markdown page's headings: lower case, punctuation dropped, spaces to hyphens."""
    out = set()
    for line in page.read_text().split("\n"):
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


def test_readme_is_a_front_page():
    text = README.read_text()
    lines = text.split("\n")
    assert len(text.splitlines()) <= 300, f"README.md has {len(text.splitlines())} lines: move content to docs/"
    assert len(text.encode()) <= 25_000, f"README.md is {len(text.encode())} bytes: move content to docs/"
    long = [i + 1 for i, line in enumerate(lines) if len(line) > 200]
    assert not long, f"README.md lines over 200 characters: {long}"


def test_readme_gives_the_two_commands_first():
    """`.ci/run` runs exactly the README's test command; both commands open the README."""
    text = README.read_text()
    block = text[text.index("```bash") : text.index("```", text.index("```bash") + 3)]
    assert text.index("```bash") < text.index("\n## ")
    assert "./run_notebooks.sh      # the main job" in block and "./run_tests.sh          # the tests" in block
    assert "./run_tests.sh" in (ROOT / ".ci" / "run").read_text()


@pytest.mark.parametrize("page", [README, *DOCS], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(page):
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL or an anchor on the same page
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve()
        if not file.exists() or (anchor and file.suffix == ".md" and anchor not in anchors(file)):
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)}: links to missing files or headings: {broken}"


def test_nothing_points_at_a_folder_a_clone_lacks():
    """A user's clone has no `shared/` beside it; only tests may name it (this one does)."""
    try:
        files = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    found = []
    for name in files:
        if name.startswith("tests/"):
            continue
        path = ROOT / name
        if not path.is_file():
            continue
        text = path.read_bytes().decode("utf-8", errors="ignore")
        for needle in ("../" + "shared", "shared/" + "docs"):  # written apart: the project-wide scan skips this file
            if needle in text:
                found.append(f"{name}: {needle}")
    assert not found, f"references to a folder a user's clone lacks: {found}"


def test_the_api_page_lists_every_public_name_once():
    """docs/api.md: one line per name of `specnb.__all__`, and no other name."""
    import specnb

    page = (ROOT / "docs" / "api.md").read_text()
    listed = re.findall(r"^- `(\w+)`:", page, flags=re.M)
    assert sorted(listed) == sorted(specnb.__all__) and len(listed) == len(set(listed))


def test_notebooks_import_public_names_from_the_public_api():
    """A name `specnb` exports is imported from `specnb`, never from its module, in every cell of every
    numbered notebook; and each set-up cell's specnb imports fit in a few lines (the public API, then at
    most five study modules or packages)."""
    import nbformat

    import specnb

    statement = re.compile(r"^\s*from (specnb[\w.]*) import (?:\(([^)]*)\)|([^\n]+))", flags=re.M)
    for book in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        code = [c.source for c in nbformat.read(book, as_version=4).cells if c.cell_type == "code"]
        for cell in code:
            for module, wrapped, names in statement.findall(cell):
                if module != "specnb":
                    names = wrapped or names
                    named = {n.split(" as ")[0].strip() for n in names.split(",")} & set(specnb.__all__)
                    assert not named, f"{book.name}: import {sorted(named)} from specnb, not from {module}"
        setup = statement.findall(code[2])  # parameters, the Colab cell, the set-up cell
        assert setup[0][0] == "specnb" and len(setup) <= 6, f"{book.name}: {[m for m, _, _ in setup]}"


def test_every_name_a_notebook_calls_is_in_the_lab_api():
    """docs/api.md's lab section (scripts/lab_api.py) names every specnb name the notebooks import or
    read from a module they import, and each has a line of its own docstring there."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("lab_api", ROOT / "scripts" / "lab_api.py")
    lab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lab)
    page = (ROOT / "docs" / "api.md").read_text()
    names = lab.lab_names()
    assert len(names) > 100, "the notebooks' imports were not read"
    missing = [f"{m}.{n}" for m, n in names if f"- `{m}.{n}` (" not in page]
    assert not missing, f"called by a notebook, not in docs/api.md (python scripts/lab_api.py --write): {missing}"
    undocumented = [line for line in page.splitlines() if line.endswith(("(no docstring)", "(not found)"))]
    assert not undocumented, undocumented
