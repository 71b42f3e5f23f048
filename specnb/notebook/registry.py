"""Each notebook declared once: its spec, in the notebook's own metadata ("specnb"), read by everything
that needs to know the notebooks. Nothing else in the package names a notebook by its number: code asks
for a notebook by its name (the stem without its number, `stem("model_pairs")`).

    {"specnb": {
        "purpose": "one line: what the notebook answers",
        "title": "a few words (the report names its runs by them)",
        "headline": "tau_vs_budget.png",        the index's figure for a run
        "writes": ["replay.csv", ...],          the tables and figures of its run folder
        "written_last": "tree_results.json",    a run that holds it ran to its end (interactive runs too)
        "reads": ["tree_shapes", ...],          notebooks whose runs it reads (by name)
        "decode": true,                         its target's decode step scales the time estimates
        "publish": true,                        the report: its executed copy is published (outputs/report.*)
        "estimate": "tree_shapes",              its memory and T4 time rule (`estimate.RULES`)
        "lower": {"weights": ["target", ...]},  the parameters that size each memory part (a refusal names them)
        "rules": {"draft": "model"}}}           parameter rules narrower than the shared ones (`parameters.NARROW`)

Who reads it: the runner (which notebook times the decode step, which one is published), the parameter
check (`rules`), the memory and time estimates (`estimate`, `lower`), the index (`purpose`,
`headline`) and the report (`reads`, `title`, `written_last`). Adding a notebook is the notebook with
its spec; a notebook without one is sized by the generic rules (`DEFAULT`), and says so.

    NotebookSpec         one notebook's spec
    specs(folder)        every numbered notebook's, in order
    spec(stem, folder)   one notebook's (a notebook not in `folder`: `DEFAULT` under its stem)
    stem(name, folder)   the stem of the notebook called `name`
    decode_notebook, report_notebook   the notebook that times the decode step, the one published

It imports nothing of specnb but `places` (a notebook kernel and the report read it without torch).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from .places import NOTEBOOKS

KEY = "specnb"  # the notebook metadata key holding its spec
PATTERN = "[0-9][0-9]_*.ipynb"  # a numbered notebook


@dataclass(frozen=True)
class NotebookSpec:
    """One notebook's spec (module docstring); `declared` says whether its metadata holds one."""

    stem: str
    purpose: str = ""
    title: str = ""
    headline: str | None = None
    writes: tuple[str, ...] = ()
    written_last: str | None = None
    reads: tuple[str, ...] = ()
    decode: bool = False
    publish: bool = False
    estimate: str = "generation"
    lower: dict[str, tuple[str, ...]] = field(default_factory=dict)
    rules: dict[str, str] = field(default_factory=dict)
    declared: bool = True

    @property
    def name(self) -> str:
        """The stem without its number: how code names the notebook."""
        return self.stem.split("_", 1)[1] if "_" in self.stem and self.stem[:2].isdigit() else self.stem

    @property
    def number(self) -> str:
        return self.stem[:2] if self.stem[:2].isdigit() else ""

    @property
    def label(self) -> str:
        """'02 model pairs': the number and the title (or the name)."""
        return f"{self.number} {self.title or self.name.replace('_', ' ')}".strip()


DEFAULT = NotebookSpec("", purpose="(no spec in its metadata)", declared=False)
FIELDS = {f.name for f in fields(NotebookSpec)} - {"stem", "declared"}


class SpecError(ValueError):
    """A notebook's spec that cannot be read: the notebook, the key and what is allowed."""


def read_spec(path: Path) -> NotebookSpec:
    """The spec in `path`'s metadata (`DEFAULT`'s fields for what it leaves out)."""
    try:
        metadata = json.loads(Path(path).read_text()).get("metadata", {})
    except (OSError, json.JSONDecodeError) as e:
        raise SpecError(f"{path}: not a readable notebook ({e})") from None
    given = metadata.get(KEY)
    if not isinstance(given, dict) or set(given) <= {"headline"}:
        headline = given.get("headline") if isinstance(given, dict) else None
        return replace(DEFAULT, stem=Path(path).stem, headline=headline)
    unknown = sorted(set(given) - FIELDS)
    if unknown:
        renamed = ' ("memory" and "t4" became one "estimate")' if {"memory", "t4"} & set(unknown) else ""
        raise SpecError(f"{path}: metadata {KEY!r} has unknown keys {unknown}{renamed}; allowed: {sorted(FIELDS)}")
    values: dict[str, Any] = dict(given)
    for name in ("writes", "reads"):
        values[name] = tuple(values.get(name) or ())
    values["lower"] = {part: tuple(names) for part, names in (values.get("lower") or {}).items()}
    return NotebookSpec(Path(path).stem, **values)


@lru_cache(maxsize=32)
def _specs(folder: str, stamps: tuple[tuple[str, int], ...]) -> tuple[NotebookSpec, ...]:
    return tuple(read_spec(Path(folder) / name) for name, _ in stamps)


def specs(folder: Path = NOTEBOOKS) -> tuple[NotebookSpec, ...]:
    """Every numbered notebook's spec in `folder`, in the notebooks' order (read again when one changes)."""
    paths = sorted(Path(folder).glob(PATTERN))
    return _specs(str(Path(folder).resolve()), tuple((p.name, p.stat().st_mtime_ns) for p in paths))


def spec(stem: str, folder: Path = NOTEBOOKS) -> NotebookSpec:
    """The spec of the notebook `stem` (a notebook not in `folder`: `DEFAULT` under that stem)."""
    return next((s for s in specs(folder) if s.stem == stem), replace(DEFAULT, stem=stem))


def stem(name: str, folder: Path = NOTEBOOKS) -> str:
    """The stem of the notebook called `name` ("model_pairs" -> "02_model_pairs"); KeyError where none is."""
    found = [s.stem for s in specs(folder) if s.name == name or s.stem == name]
    if not found:
        raise KeyError(f"no notebook called {name!r} in {folder}; have {[s.name for s in specs(folder)]}")
    return found[0]


def decode_notebook(folder: Path = NOTEBOOKS) -> NotebookSpec | None:
    """The notebook whose target times this machine's decode step (spec "decode")."""
    return next((s for s in specs(folder) if s.decode), None)


def report_notebook(folder: Path = NOTEBOOKS) -> NotebookSpec | None:
    """The notebook whose executed copy is published as the report (spec "publish")."""
    return next((s for s in specs(folder) if s.publish), None)
