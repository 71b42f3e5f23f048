"""What a notebook's second cell does: resolve the profile, make the run folder, record the run.

    run = start_run("01_tree_shapes", globals())

- profile "auto" (interactive use): on a machine with CUDA, the `t4` profile's values for this
  notebook replace the parameters cell's values; without CUDA the cell's values (the `cpu`
  defaults) stand. Under `run_notebooks.sh` the profile is already concrete and applied.
- run_dir "" (interactive use): a new folder outputs/<notebook>/interactive-<time>/ is made and
  params.json written there (parameters, environment). Under the runner, run_dir is given and
  params.json was written by the runner.
- torch's global seed is set from `seed` when the notebook declares one.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, MutableMapping

import torch
import yaml

from ..io.storage import environment, write_json

ROOT = Path(__file__).resolve().parents[2]
SKIP = {"In", "Out", "exit", "quit", "get_ipython"}


def parameters_of(namespace: MutableMapping[str, Any]) -> dict[str, Any]:
    """The JSON-able user variables of a notebook namespace (its parameters, in the second cell)."""
    simple = (str, int, float, bool, list, dict, tuple, type(None))
    return {k: v for k, v in namespace.items() if not k.startswith("_") and k not in SKIP and isinstance(v, simple)}


def start_run(notebook: str, namespace: MutableMapping[str, Any], outputs: str | Path | None = None) -> Path:
    if namespace.get("profile") == "auto":
        resolved = "t4" if torch.cuda.is_available() else "cpu"
        section = yaml.safe_load((ROOT / "notebooks" / "profiles" / f"{resolved}.yaml").read_text()) or {}
        for name, value in {**(section.get("all") or {}), **(section.get(notebook) or {})}.items():
            if name in namespace:
                namespace[name] = value
        namespace["profile"] = resolved
    if "seed" in namespace:
        torch.manual_seed(int(namespace["seed"]))
    run_dir = namespace.get("run_dir") or ""
    if run_dir:
        folder = Path(run_dir)
        folder.mkdir(parents=True, exist_ok=True)
        return folder
    outputs = Path(outputs) if outputs is not None else ROOT / "outputs"
    folder = outputs / notebook / time.strftime("interactive-%Y%m%d-%H%M%S")
    folder.mkdir(parents=True, exist_ok=True)
    write_json(folder / "params.json", {
        "notebook": notebook, "profile": namespace.get("profile"), "parameters": parameters_of(namespace),
        "environment": environment(), "status": "interactive", "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    })
    namespace["run_dir"] = str(folder)
    return folder
