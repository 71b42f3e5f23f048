"""Result storage: run folders, their parameters and environment, and resumable sweeps.

Only this module (and `plots`) writes files. A sweep stores each finished unit of work (e.g. one
shape x budget x prompt) as one JSON line holding its key and its rows; a rerun skips every key
already stored, and a line cut short by an interrupted write is dropped, so an interrupted sweep
resumes with every finished row exactly once. `write_arrays` / `read_arrays` keep named numpy
arrays in one compressed .npz, written atomically (a unit's bulky data, e.g. a replay collection's
per-prompt arrays). `ResultFolder` is a folder that several processes, on one machine or many, may
write into at once: a local path (a shared file system for a cluster) or an fsspec URL; each file is
written whole under a temporary name of its own and then renamed, so a reader sees a whole file or
none, and two writers of one name leave one whole file.
"""

from __future__ import annotations

import io
import json
import os
import platform
import subprocess
import sys
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

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
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def read_json(path: str | Path) -> dict[str, Any]:
    """The JSON object in `path`, or {} if it is missing, unreadable, half-written or not an object."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_json(path: str | Path, data: Mapping[str, Any]) -> Path:
    """Write JSON atomically (a temporary file of this writer's own, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_name(path)
    try:
        tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
        os.replace(tmp, path)
    except OSError as e:
        if e.filename:
            raise
        raise OSError(e.errno, e.strerror or str(e), str(path)) from e  # a full disk names no file: this one
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_arrays(path: str | Path, arrays: Mapping[str, np.ndarray]) -> Path:
    """Write named arrays as one compressed .npz, atomically (a temporary file of this writer's own,
    then rename): a reader sees the whole file or none of it, and concurrent writers of one path
    leave one whole file (the last rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_name(path)
    try:
        with tmp.open("wb") as f:
            np.savez_compressed(f, **{k: np.asarray(v) for k, v in arrays.items()})
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def temporary_name(path: Path) -> Path:
    """Where one writer stages `path`: hidden, beside it (a rename stays on one file system), unique
    to the writer (two writers never share a temporary file). A writer killed midway leaves it
    behind; readers skip such names (`is_temporary`)."""
    return path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")


def is_temporary(name: str) -> bool:
    return name.startswith(".") and name.endswith(".tmp")


def read_arrays(path: str | Path, keys: Iterable[str] | None = None) -> dict[str, np.ndarray]:
    """The arrays `write_arrays` wrote (only `keys` when given), loaded into memory."""
    with np.load(Path(path), allow_pickle=False) as data:
        return {k: data[k] for k in (data.files if keys is None else keys)}


@dataclass(frozen=True)
class ResultFolder:
    """A folder of result files that many writers share: a local path or an fsspec URL.

    location: a path ("outputs/x/collection", or a folder on a file system every worker mounts, e.g.
    NFS or a Colab Drive), or an fsspec URL ("s3://bucket/run", "gs://...", "file:///mnt/shared";
    the protocol's package installed, e.g. s3fs). Files are written whole and renamed into place
    (`write_arrays`; for a URL, `fs.mv`: on an object store a copy that appears whole), so any
    number of writers and restarts leave one whole file per name. Picklable: Ray workers get it."""

    location: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "location", str(self.location))

    @property
    def is_url(self) -> bool:
        return "://" in self.location

    def __str__(self) -> str:
        return self.location

    def path(self, name: str) -> str:
        return f"{self.location.rstrip('/')}/{name}" if self.is_url else str(Path(self.location) / name)

    def exists(self, name: str) -> bool:
        if self.is_url:
            fs, root = self._fs()
            return fs.exists(f"{root}/{name}")
        return (Path(self.location) / name).exists()

    def names(self, suffix: str = "") -> list[str]:
        """The whole files in the folder whose names end with `suffix`, sorted (temporaries skipped)."""
        if self.is_url:
            fs, root = self._fs()
            found = [p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(root, detail=False)] if fs.exists(root) else []
        else:
            folder = Path(self.location)
            found = [p.name for p in folder.iterdir()] if folder.is_dir() else []
        return sorted(n for n in found if n.endswith(suffix) and not is_temporary(n))

    def write_arrays(self, name: str, arrays: Mapping[str, np.ndarray]) -> None:
        """`write_arrays` into the folder (the same atomic write for a URL)."""
        if not self.is_url:
            write_arrays(Path(self.location) / name, arrays)
            return
        buffer = io.BytesIO()
        np.savez_compressed(buffer, **{k: np.asarray(v) for k, v in arrays.items()})
        self._put(name, buffer.getvalue())

    def read_arrays(self, name: str, keys: Iterable[str] | None = None) -> dict[str, np.ndarray]:
        if not self.is_url:
            return read_arrays(Path(self.location) / name, keys)
        fs, root = self._fs()
        with np.load(io.BytesIO(fs.cat_file(f"{root}/{name}")), allow_pickle=False) as data:
            return {k: data[k] for k in (data.files if keys is None else keys)}

    def read_json(self, name: str) -> dict | None:
        """The stored JSON, or None if there is no such file."""
        if not self.exists(name):
            return None
        if self.is_url:
            fs, root = self._fs()
            return json.loads(fs.cat_file(f"{root}/{name}"))
        return json.loads((Path(self.location) / name).read_text())

    def create_json(self, name: str, data: Mapping[str, Any]) -> dict:
        """Store `data` unless the file exists; returns what is stored (the first writer's data).
        Local folders: exclusive (a hard link of a whole temporary file; where the file system has
        no hard links, e.g. some FUSE mounts, a plain rename). URLs: written when absent."""
        text = json.dumps(data, indent=2, default=str) + "\n"
        if self.is_url:
            if not self.exists(name):
                self._put(name, text.encode())
        else:
            path = Path(self.location) / name
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = temporary_name(path)
            try:
                tmp.write_text(text)
                try:
                    os.link(tmp, path)
                except FileExistsError:
                    pass
                except OSError:  # no hard links here
                    if not path.exists():
                        os.replace(tmp, path)
            finally:
                tmp.unlink(missing_ok=True)
        return self.read_json(name) or {}

    def _put(self, name: str, payload: bytes) -> None:
        fs, root = self._fs()
        fs.makedirs(root, exist_ok=True)
        tmp = f"{root}/.{name}.{uuid.uuid4().hex[:12]}.tmp"
        fs.pipe_file(tmp, payload)
        fs.mv(tmp, f"{root}/{name}")

    def _fs(self) -> tuple[Any, str]:
        import fsspec  # a dependency of huggingface_hub, so present wherever transformers is

        fs, root = fsspec.core.url_to_fs(self.location)
        return fs, root.rstrip("/")


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

    def add(
        self, key: Mapping[str, Any], rows: Iterable[Mapping[str, Any]], meta: Mapping[str, Any] | None = None
    ) -> None:
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
