"""What every published draft-head checkpoint layout shares (`io.medusa_checkpoint`, `io.eagle_checkpoint`).

What it holds:
    PublishedCheckpoint   a published checkpoint specnb plans for: repository, base model, the dtype
                          of its tensors (each layout's entry adds what its sizes need)
    checkpoint_folder     a local folder as given, or the hub snapshot of a repository id (downloaded
                          once with huggingface_hub, only the files named)
    read_state            the state dict of the first weights file a folder holds, of several names
                          (torch.save files, or .safetensors)
    write_state           a state dict written with torch.save, cast and on the host, atomically
    read_config, write_config   config.json

Tensors are read onto the host as stored (their dtype untouched): the loaders cast them on use, into
the dtype and device of the target they serve.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

CONFIG = "config.json"


@dataclass(frozen=True)
class PublishedCheckpoint:
    repo_id: str
    base_model: str  # the hub id of the model the heads were trained on
    dtype: str  # of the published tensors, a torch dtype's name ("float16", "float32")

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)


def checkpoint_folder(name_or_path: str | os.PathLike, files: Sequence[str]) -> Path:
    """A local folder as given, else the hub snapshot of the repository id with `files` only
    (huggingface_hub's cache: downloaded once; in offline mode the cached snapshot)."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(str(name_or_path), allow_patterns=list(files)))


def read_state(folder: Path, names: Sequence[str]) -> tuple[dict[str, torch.Tensor], Path]:
    """(state dict on the host, the file read): the first of `names` that `folder` holds, a
    .safetensors file through safetensors, any other through torch.load (tensors only)."""
    for name in names:
        path = Path(folder) / name
        if path.exists():
            if path.suffix == ".safetensors":
                from safetensors.torch import load_file

                return load_file(path), path
            return torch.load(path, map_location="cpu", weights_only=True), path
    raise FileNotFoundError(f"{folder} holds none of {', '.join(names)}")


def write_state(folder: Path, name: str, state: Mapping[str, torch.Tensor], dtype: torch.dtype | None = None) -> Path:
    """torch.save of `state` on the host (cast to `dtype` when given, else as they are), written
    under a temporary name and then renamed: a reader never sees half a file."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {k: (v if dtype is None else v.to(dtype)).detach().cpu().contiguous() for k, v in state.items()}
    tmp = folder / (name + ".tmp")
    torch.save(tensors, tmp)
    tmp.replace(folder / name)
    return folder / name


def read_config(folder: Path) -> dict[str, Any]:
    """config.json of `folder`, {} where it has none."""
    path = Path(folder) / CONFIG
    return json.loads(path.read_text()) if path.exists() else {}


def write_config(folder: Path, config: Mapping[str, Any]) -> None:
    (Path(folder) / CONFIG).write_text(json.dumps(dict(config), indent=1) + "\n")
