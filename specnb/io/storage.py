"""Result storage: run folders, their parameters and environment, and resumable sweeps.

Only this module (and `plots`) writes files. A sweep stores each finished unit of work (e.g. one
shape x budget x prompt) as one JSON line holding its key and its rows; a rerun skips every key
already stored, and a line cut short by an interrupted write is dropped, so an interrupted sweep
resumes with every finished row exactly once. `write_arrays` / `read_arrays` keep named numpy
arrays in one compressed .npz, written atomically (a unit's bulky data, e.g. a replay collection's
per-prompt arrays, beside its sweep line).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
import torch

PACKAGES = ("specnb", "torch", "transformers", "accelerate", "bitsandbytes", "gguf", "pandas", "papermill")


def environment() -> dict[str, Any]:
    """Versions, device and commit, for params.json."""
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    cuda = torch.cuda.is_available()
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "packages": versions,
        "device": torch.cuda.get_device_name(0) if cuda else f"cpu ({os.cpu_count()} cores)",
        "cuda": torch.version.cuda if cuda else None,
        "torch_threads": torch.get_num_threads(),
        "git_commit": git_commit(),
    }


def git_commit() -> str | None:
    root = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def write_json(path: str | Path, data: Mapping[str, Any]) -> Path:
    """Write JSON atomically (temp file + rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    os.replace(tmp, path)
    return path


def write_arrays(path: str | Path, arrays: Mapping[str, np.ndarray]) -> Path:
    """Write named arrays as one compressed .npz, atomically (temp file + rename): a reader sees
    the whole file or none of it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as f:
        np.savez_compressed(f, **{k: np.asarray(v) for k, v in arrays.items()})
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def read_arrays(path: str | Path) -> dict[str, np.ndarray]:
    """The arrays `write_arrays` wrote, loaded into memory."""
    with np.load(Path(path), allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


def run_folder(outputs: str | Path, notebook: str, run_id: str) -> Path:
    """outputs/<notebook>/<run_id>/, created if needed."""
    folder = Path(outputs) / notebook / run_id
    folder.mkdir(parents=True, exist_ok=True)
    return folder


class Sweep:
    """A resumable store of units of work, one JSON line each:
    {"key": {...}, "rows": [...], "meta": {...}}: rows are the unit's tidy rows (e.g. one per step),
    meta its one-row summary."""

    def __init__(self, path: str | Path, key: Sequence[str]) -> None:
        self.path = Path(path)
        self.key = tuple(key)
        self._units: dict[tuple, list[dict]] = {}
        self._meta: dict[tuple, dict] = {}
        self._load()

    def _load(self) -> None:
        if not self.path.exists():
            return
        good = 0
        with self.path.open("rb") as f:
            for line in f:
                try:
                    unit = json.loads(line)
                    k = tuple(unit["key"][name] for name in self.key)
                except (json.JSONDecodeError, KeyError, UnicodeDecodeError):
                    break  # a line cut short by an interruption: it and anything after is dropped
                if not line.endswith(b"\n"):
                    break
                if k not in self._units:
                    self._units[k] = unit["rows"]
                    self._meta[k] = unit.get("meta") or {}
                good += len(line)
        if good < self.path.stat().st_size:
            with self.path.open("r+b") as f:
                f.truncate(good)

    def __contains__(self, key: Mapping[str, Any] | tuple) -> bool:
        return self._key(key) in self._units

    def __len__(self) -> int:
        return len(self._units)

    def add(self, key: Mapping[str, Any], rows: Iterable[Mapping[str, Any]], meta: Mapping[str, Any] | None = None) -> None:
        """Store a finished unit (no-op if its key is already stored); durable on return."""
        k = self._key(key)
        if k in self._units:
            return
        rows = [{c: _jsonable(v) for c, v in r.items()} for r in rows]
        meta = {c: _jsonable(v) for c, v in (meta or {}).items()}
        line = json.dumps({"key": dict(zip(self.key, k)), "rows": rows, "meta": meta}) + "\n"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        self._units[k] = rows
        self._meta[k] = meta

    def rows(self, key: Mapping[str, Any] | tuple) -> list[dict] | None:
        """A stored unit's rows, or None if the unit is not stored."""
        return self._units.get(self._key(key))

    def meta(self, key: Mapping[str, Any] | tuple) -> dict | None:
        """A stored unit's summary, or None if the unit is not stored."""
        k = self._key(key)
        return self._meta.get(k) if k in self._units else None

    def meta_frame(self) -> pd.DataFrame:
        """One row per unit: its key columns and its summary."""
        return pd.DataFrame([{**dict(zip(self.key, k)), **self._meta[k]} for k in self._units])

    def frame(self) -> pd.DataFrame:
        """All rows, each with its unit's key columns, in the order the units finished."""
        records = []
        for k, rows in self._units.items():
            for r in rows:
                records.append({**dict(zip(self.key, k)), **r})
        return pd.DataFrame(records)

    def _key(self, key: Mapping[str, Any] | tuple) -> tuple:
        if isinstance(key, tuple):
            return key
        missing = [name for name in self.key if name not in key]
        if missing:
            raise KeyError(f"sweep key is missing {missing}")
        return tuple(_jsonable(key[name]) for name in self.key)


def _jsonable(value: Any) -> Any:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, (tuple, list)):
        return "/".join(map(str, value))
    return str(value)
