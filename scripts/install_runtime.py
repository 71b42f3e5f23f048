"""Install specnb's runtime requirements into the running Python, keeping its torch (Colab).

    python /path/to/specnb/scripts/install_runtime.py               install the runtime
    python /path/to/specnb/scripts/install_runtime.py --list [EXTRA...]   print the requirements, one per line

The requirements are pyproject.toml's: `[project] dependencies`, plus the named extras
(`[project.optional-dependencies]`, an extra that names specnb's own extras expanded). Used by the
notebooks' set-up cell in a kernel that cannot import specnb (a fresh Colab runtime): it installs the
runtime only (no jupyter, papermill or pytest) with the torch already installed pinned by a
constraints file, so pip never replaces Colab's CUDA build of torch (where that torch is older than
the runtime allows, pip stops and says so instead). specnb itself is not pip-installed: an editable
install becomes visible only after a runtime restart, so the notebook puts the project folder on
sys.path instead. Standard library only.
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def requirements(extras: list[str] | tuple[str, ...] = ()) -> list[str]:
    """pyproject.toml's runtime dependencies and those of `extras`, in order, without repeats."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    optional = project.get("optional-dependencies", {})
    out: list[str] = []

    def add(lines: list[str]) -> None:
        for line in lines:
            own = re.fullmatch(r"specnb\[([\w,\s-]+)\]", line.strip())
            if own:  # specnb[a,b]: the project's own extras
                for extra in own.group(1).split(","):
                    add(optional[extra.strip()])
            elif line not in out:
                out.append(line)

    add(project["dependencies"])
    for extra in extras:
        if extra not in optional:
            raise SystemExit(f"no extra {extra!r} in pyproject.toml (it has: {', '.join(optional)})")
        add(optional[extra])
    return out


def main(argv: list[str]) -> int:
    if sys.version_info < (3, 11):  # noqa: UP036 -- this script may run on an older Python: say so, then stop
        print(f"specnb needs Python >= 3.11, this is {sys.version.split()[0]}", file=sys.stderr)
        return 2
    if argv[:1] == ["--list"]:
        print("\n".join(requirements(argv[1:])))
        return 0
    pins = []
    try:
        pins.append(f"torch=={importlib.metadata.version('torch')}")
    except importlib.metadata.PackageNotFoundError:
        pass  # no torch yet: pyproject.toml's range decides
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as constraints:
        constraints.write("\n".join(pins) + "\n")
    command = [sys.executable, "-m", "pip", "install", "-q", *requirements(), "-c", constraints.name]
    print(
        f"[specnb] installing the runtime requirements ({', '.join(pins) or 'torch from pyproject.toml'} kept)",
        flush=True,
    )
    return subprocess.run(command).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
