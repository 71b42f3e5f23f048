"""Medusa-1 head checkpoints in the published layout (FasterDecoding/medusa-vicuna-7b-v1.3).

A checkpoint folder holds
    config.json          {"medusa_num_heads": K, "medusa_num_layers": L, "base_model_name_or_path": ...}
                         (specnb adds hidden_size and vocab_size, which converters read)
    medusa_lm_head.pt    torch.save of the heads' state dict, no prefix: for each head h,
                         `{h}.{l}.linear.weight` [H, H] and `{h}.{l}.linear.bias` [H] for l < L, and
                         `{h}.{L}.weight` [V, H] (the projection, no bias)
(`medusa_lm_head.safetensors` is read when the .pt is absent, as TensorRT-LLM's loader does). The
published config's `medusa_num_heads` is wrong (2, while its .pt holds 5 heads; Medusa forces 5 and
loads with strict=False): K and L are read from the keys, and a disagreeing config is reported in
the returned config under "config_disagrees". A hub id is downloaded with huggingface_hub
(`io.checkpoints`). `PUBLISHED` lists the published checkpoints specnb plans for (download
estimates, the dry run's stand-in in the same layout and dtype).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from . import checkpoints
from .checkpoints import CONFIG, PublishedCheckpoint, read_config, read_state, write_config, write_state


@dataclass(frozen=True)
class PublishedHeads(PublishedCheckpoint):
    """A published Medusa checkpoint, as far as specnb plans for it (download size, the dry run's
    stand-in): its base model (a hub id with a committed config, `io.model_configs`), heads and
    blocks per head as its weights hold them, and their dtype."""

    num_heads: int
    num_layers: int


# Medusa-1 for Vicuna-7B v1.3 (Cai et al. 2024): 5 heads of one block (its config says 2 heads: see above)
PUBLISHED = {
    h.repo_id: h
    for h in (
        PublishedHeads(
            "FasterDecoding/medusa-vicuna-7b-v1.3", "lmsys/vicuna-7b-v1.3", "float16", num_heads=5, num_layers=1
        ),
    )
}

WEIGHTS = "medusa_lm_head.pt"
WEIGHTS_SAFETENSORS = "medusa_lm_head.safetensors"
_KEY = re.compile(r"^(\d+)\.(\d+)\.(linear\.weight|linear\.bias|weight)$")


def checkpoint_folder(name_or_path: str | os.PathLike) -> Path:
    """A local folder as given, else the hub snapshot of the repository id (downloaded once)."""
    return checkpoints.checkpoint_folder(name_or_path, [CONFIG, WEIGHTS, WEIGHTS_SAFETENSORS])


def check_layout(state: Mapping[str, torch.Tensor]) -> tuple[int, int]:
    """(K heads, L blocks per head) of a state dict in the published layout; ValueError otherwise."""
    bad = [k for k in state if not _KEY.match(k)]
    if bad:
        raise ValueError(
            f"not a Medusa head state dict: keys {bad[:4]} are not {{h}}.{{l}}.linear.weight/bias or {{h}}.{{L}}.weight"
        )
    heads = 1 + max(int(_KEY.match(k)[1]) for k in state)
    layers = max(int(_KEY.match(k)[2]) for k in state)
    want = {f"{h}.{l}.linear.{w}" for h in range(heads) for l in range(layers) for w in ("weight", "bias")}
    want |= {f"{h}.{layers}.weight" for h in range(heads)}
    if set(state) != want:
        raise ValueError(
            f"Medusa state dict of {heads} heads x {layers} layers: missing {sorted(want - set(state))[:4]}, "
            f"extra {sorted(set(state) - want)[:4]}"
        )
    return heads, layers


def save_checkpoint(
    folder: str | os.PathLike,
    state: Mapping[str, torch.Tensor],
    base_model: str,
    dtype: torch.dtype | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Path:
    """Write config.json and medusa_lm_head.pt (atomically: a temporary name, then a rename).
    dtype: cast the tensors (e.g. torch.float16, as published); default as they are."""
    heads, layers = check_layout(state)
    folder = Path(folder)
    projection = state[f"0.{layers}.weight"]
    write_state(folder, WEIGHTS, state, dtype)
    config = {
        "base_model_name_or_path": base_model,
        "medusa_num_heads": heads,
        "medusa_num_layers": layers,
        "hidden_size": projection.shape[1],
        "vocab_size": projection.shape[0],
        **(extra or {}),
    }
    write_config(folder, config)
    return folder


def load_checkpoint(name_or_path: str | os.PathLike) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(state dict, config) of a checkpoint folder or hub id; tensors as stored (cast them on use)."""
    folder = checkpoint_folder(name_or_path)
    state, _ = read_state(folder, [WEIGHTS, WEIGHTS_SAFETENSORS])
    heads, layers = check_layout(state)
    config = read_config(folder)
    said = (config.get("medusa_num_heads"), config.get("medusa_num_layers"))
    if said != (heads, layers):
        config["config_disagrees"] = f"config says {said} (heads, layers); the weights hold ({heads}, {layers})"
    config["medusa_num_heads"], config["medusa_num_layers"] = heads, layers
    return state, config
