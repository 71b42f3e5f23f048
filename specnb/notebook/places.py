"""Where the project's notebooks and profiles are, and where runs are written. It imports nothing of
specnb (profiles' imports bring torch), so the report and the figure check find runs without loading
torch (the estimate sizes models from their configs: it loads torch)."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
PROFILES = NOTEBOOKS / "profiles"


def default_outputs() -> Path:
    """Where runs are written: $SPECNB_OUTPUTS (e.g. a folder on Google Drive, so a Colab run survives
    a disconnect and resumes), else outputs/ in the project."""
    return Path(os.environ.get("SPECNB_OUTPUTS") or ROOT / "outputs").expanduser()
