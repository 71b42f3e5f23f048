"""Install specnb's runtime requirements into the running Python, keeping its torch (Colab).

    python /path/to/specnb/scripts/install_runtime.py

Used by the notebooks' set-up cell in a kernel that cannot import specnb (a fresh Colab runtime):
it installs requirements.txt (the runtime only: no jupyter, papermill or pytest) with the torch
already installed pinned by a constraints file, so pip never replaces Colab's CUDA build of torch
(where that torch is older than requirements.txt allows, pip stops and says so instead). specnb itself
is not pip-installed: an editable install becomes visible only after a runtime restart, so the
notebook puts the project folder on sys.path instead. Standard library only.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    if sys.version_info < (3, 11):  # noqa: UP036 -- this script may run on an older Python: say so, then stop
        print(f"specnb needs Python >= 3.11, this is {sys.version.split()[0]}", file=sys.stderr)
        return 2
    pins = []
    try:
        pins.append(f"torch=={importlib.metadata.version('torch')}")
    except importlib.metadata.PackageNotFoundError:
        pass  # no torch yet: requirements.txt's range decides
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as constraints:
        constraints.write("\n".join(pins) + "\n")
    command = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "-q",
        "-r",
        str(ROOT / "requirements.txt"),
        "-c",
        constraints.name,
    ]
    print(
        f"[specnb] installing the runtime requirements ({', '.join(pins) or 'torch from requirements.txt'} kept)",
        flush=True,
    )
    return subprocess.run(command).returncode


if __name__ == "__main__":
    sys.exit(main())
