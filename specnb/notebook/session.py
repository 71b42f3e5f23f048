"""What a notebook's second cell does: resolve the profile, make the run folder, record the run.

    run = start_run(STEM, globals())        # STEM: the notebook's file name without .ipynb

- profile "auto" (interactive use, Jupyter or Colab): the `t4` profile where CUDA is present, else
  `cpu`, resolved by the runner's own checked path (`runner.resolve`). A parameter the user edited
  in the parameters cell (its value differs from the cell's committed literal) is kept; the others
  take the profile's values, and the cell prints which values the profile set and which edits it
  kept. Under `run_notebooks.sh` the profile is already concrete and applied.
- run_dir "" (interactive use): a new folder outputs/<notebook>/interactive-<time>/ is made
  ($SPECNB_OUTPUTS instead of outputs/ when set) and params.json written there (parameters,
  environment). Under the runner, run_dir is given and params.json was written by the runner.
- torch's global seed is set from `seed` when the notebook declares one, and pandas shows every row
  of a displayed table (`whole_tables`: the appendices show tables whole).

`record(run, key, value)` adds what the notebook learns while it runs to params.json (the runner
keeps it when it writes the run's status); `show_prompts(run, summary)` prints a prompt set's
summary (source, count, prompts per category) and records it under "prompts";
`show_trees(run, custom_trees)` parses the user's own trees (`io.tree_spec`: a bad spec is refused
there, before any model loads), prints them and records their rank paths under "custom_trees".

`interact(**options)` decorates a figure function: a widget (ipywidgets.interact) in Jupyter or
Colab; under the runner (headless: $SPECNB_HEADLESS, set by `run_notebooks.sh`) one call with the
function's defaults, no widget: nobody can move the slider, and a widget's comm messages are one
more thing a headless kernel can stall on.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
import time
from collections.abc import Callable, MutableMapping
from pathlib import Path
from typing import Any

import torch

from ..core.trees import Tree
from ..io.prompts import PromptSummary
from ..io.storage import environment, write_json
from ..io.tree_spec import ShapeRule, parse_custom_shapes, parse_custom_trees
from .estimate import check_run_memory
from .parameters import check_parameters
from .places import NOTEBOOKS, default_outputs
from .profiles import declared_parameters, resolve, strings_in
from .runner import SHARED_RUN_ENV

SHARED_NOTE = "shared_folder.txt"  # in a run folder: the name of the shared folder it used (`shared_folder`)

SKIP = {"In", "Out", "exit", "quit", "get_ipython"}


def parameters_of(namespace: MutableMapping[str, Any]) -> dict[str, Any]:
    """The JSON-able user variables of a notebook namespace (its parameters, in the second cell)."""
    simple = (str, int, float, bool, list, dict, tuple, type(None))
    return {k: v for k, v in namespace.items() if not k.startswith("_") and k not in SKIP and isinstance(v, simple)}


def apply_profile(
    notebook: str, namespace: MutableMapping[str, Any], profile: str, books: Path = NOTEBOOKS
) -> dict[str, list[str]]:
    """Set the parameters of `profile` in `namespace`, except those the user edited (their value
    differs from the parameters cell's literal). Returns {"set": [...], "kept": [...]}: the names the
    profile set, and the names where the user's edit won over a different profile value."""
    path = books / f"{notebook}.ipynb"
    defaults = declared_parameters(path)
    wanted = resolve(profile, {}, [], [path], books / "profiles")[notebook]
    report: dict[str, list[str]] = {"set": [], "kept": []}
    for name, value in wanted.items():
        if name == "profile" or name not in namespace or namespace[name] == value:
            continue
        if namespace[name] == defaults.get(name):
            namespace[name] = value
            report["set"].append(name)
        else:
            report["kept"].append(name)
    namespace["profile"] = profile
    return report


def shared_folder(run: Path) -> Path:
    """A folder beside the notebooks' run folders (outputs/_shared) for what several notebooks
    measure alike, e.g. the verify-cost curves, keyed by machine inside: under the runner, one per
    run of it (outputs/_shared/run-<start>: $SPECNB_SHARED_RUN), so a run never prices trees on
    curves timed hours before; run interactively, outputs/_shared itself (each row says when it was
    measured). The run folder keeps which one it used (`SHARED_NOTE`): a resumed run, by the runner
    or by hand, reads the curves its first part was priced on, and recomputes nothing."""
    note = Path(run) / SHARED_NOTE
    name = note.read_text().strip() if note.exists() else os.environ.get(SHARED_RUN_ENV, "")
    folder = Path(run).parent.parent / "_shared" / name
    folder.mkdir(parents=True, exist_ok=True)
    if not note.exists():
        note.write_text(name + "\n")
    return folder


def start_run(notebook: str, namespace: MutableMapping[str, Any], outputs: str | Path | None = None) -> Path:
    """A notebook's set-up, its first call: the profile applied where it is "auto" (t4 on a GPU, else cpu),
    the parameters and custom trees checked, the embedded models installed and the memory checked before
    anything loads, the seed set; returns the run folder (the runner's, or a new interactive one)."""
    if namespace.get("profile") == "auto":
        resolved = "t4" if torch.cuda.is_available() else "cpu"
        report = apply_profile(notebook, namespace, resolved)
        lines = [f"profile auto -> {resolved}"]
        if report["set"]:
            lines.append("  set by the profile: " + ", ".join(f"{k}={namespace[k]!r}" for k in report["set"]))
        if report["kept"]:
            lines.append("  your edits kept (the profile would change them): " + ", ".join(report["kept"]))
        print("\n".join(lines))
        if resolved == "cpu" and "google.colab" in sys.modules:
            print(NO_GPU_ON_COLAB)
    path = NOTEBOOKS / f"{notebook}.ipynb"
    declared = {k: namespace[k] for k in declared_parameters(path) if k in namespace} if path.exists() else {}
    if declared:  # a parameter out of its type or range: refused before any install
        check_parameters(path, declared)
    parse_custom_trees(namespace.get("custom_trees"))  # a bad tree of yours: refused before any install
    install_embedded(namespace)
    if declared:
        check_run_memory({notebook: declared})  # more than this machine has: refused before any load
    whole_tables()
    if "seed" in namespace:
        torch.manual_seed(int(namespace["seed"]))
    run_dir = namespace.get("run_dir") or ""
    if run_dir:
        folder = Path(run_dir)
        folder.mkdir(parents=True, exist_ok=True)
        return folder
    outputs = Path(outputs) if outputs is not None else default_outputs()
    folder = _new_folder(outputs / notebook / time.strftime("interactive-%Y%m%d-%H%M%S"))
    write_json(
        folder / "params.json",
        {
            "notebook": notebook,
            "profile": namespace.get("profile"),
            "parameters": parameters_of(namespace),
            "environment": environment(),
            "status": "interactive",
            "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        },
    )
    namespace["run_dir"] = str(folder)
    return folder


def _new_folder(base: Path) -> Path:
    """`base`, or `base-2`, `base-3`, ... : a folder no other run has (two kernels started in the same
    second each get their own)."""
    base.parent.mkdir(parents=True, exist_ok=True)
    n = 1
    while True:
        folder = base if n == 1 else base.with_name(f"{base.name}-{n}")
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            n += 1


NO_GPU_ON_COLAB = (
    "No GPU is attached to this Colab runtime, so the cpu profile's values are used (the embedded "
    "Qwen2.5-Coder-0.5B -> 1.5B pair, small sizes). For the course's Llama pairs on a T4: Runtime > "
    "Change runtime type > T4 GPU, then run all again (docs/colab.md)."
)


def install_embedded(namespace: MutableMapping[str, Any]) -> list[str]:
    """The embedded models the notebook's parameters name and this machine lacks, installed now (pip,
    then the one-time de-quantization), as `run_notebooks.sh`'s set-up does: a fresh Colab runtime
    or Jupyter kernel is not stopped by a model it can fetch itself. Returns the names installed."""
    from ..io.embedded import EMBEDDED_MODELS, install, missing_parts

    named = sorted({s for s in strings_in(parameters_of(namespace)) if s in EMBEDDED_MODELS})
    missing = [name for name in named if missing_parts(EMBEDDED_MODELS[name])]  # its packages: no hashing
    if missing:
        print(f"[specnb] installing the embedded models this notebook uses: {', '.join(missing)}", flush=True)
        install(missing)
    return missing


def whole_tables() -> None:
    """pandas shows every row and column of a table a notebook displays: its default (60 rows) would
    cut 01's 70-row table to rows 0-4 and 65-69, and the appendix (`report`) shows what was displayed."""
    import pandas as pd

    pd.set_option("display.max_rows", None)
    pd.set_option("display.max_columns", None)
    pd.set_option("display.width", None)


def record(run: str | Path, key: str, value: Any) -> None:
    """Add `key: value` to the run's params.json (read, updated, written back atomically)."""
    path = Path(run) / "params.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    write_json(path, {**data, key: value})


def show_prompts(run: str | Path, summary: PromptSummary, key: str = "prompts") -> None:
    """Print which prompts a notebook runs on and record them in params.json under `key`."""
    print(summary.line(key.replace("_", " ")))
    record(run, key, summary.record())


def show_trees(run: str | Path, specs: Any, rules: bool = False) -> dict[str, Tree | ShapeRule]:
    """The notebook's `custom_trees` (name -> spec) as trees, refused with what to change if a spec
    is not one (`io.tree_spec.TreeSpecError`); each printed with its size and rank paths and
    recorded in params.json under "custom_trees". `rules`: the notebook fills shape rules
    (`{widths: [...]}`, `io.tree_spec.ShapeRule`) to every budget, and they are returned beside the
    trees (recorded under "custom_shapes"); elsewhere a rule is named as not measured here."""
    trees, shapes = parse_custom_trees(specs), parse_custom_shapes(specs)
    if trees:
        print(
            "your trees: "
            + "; ".join(f"{n} ({t.num_nodes} nodes, depth {t.depth}): {t.to_choices()}" for n, t in trees.items())
        )
        record(run, "custom_trees", {n: t.to_choices() for n, t in trees.items()})
    if shapes and rules:
        print("your shapes, filled to every budget: " + "; ".join(f"{n}: {r.describe()}" for n, r in shapes.items()))
        record(run, "custom_shapes", {n: list(r.widths) for n, r in shapes.items()})
        return {**trees, **shapes}
    if shapes:
        names = ", ".join(shapes)
        print(f"your shape rules ({names}) are filled to every budget in notebooks 01 and 02; not measured here")
    return dict(trees)


def interact(**options: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """`ipywidgets.interact(**options)` as a decorator, or under the runner one call of the function
    with its defaults (see the module docstring)."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        if os.environ.get("SPECNB_HEADLESS"):
            defaults = {
                k: p.default
                for k, p in inspect.signature(fn).parameters.items()
                if p.default is not inspect.Parameter.empty
            }
            fn(**defaults)
            return fn
        from ipywidgets import interact as widget

        return widget(**options)(fn)

    return decorate
