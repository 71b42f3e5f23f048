"""KV caches that keep exactly the accepted path of a tree.

After a tree is verified, the cache holds the prefix, the root and all N tree nodes. Only the
accepted branch may stay, and a branch is not contiguous in the cache, so cropping is not enough
(docs/how-a-step-works.md, "Commit"): the kept positions are gathered in every layer. The same gather serves the
draft model's cache. A self-draft that runs the target's first layers on the target's own cache
saves those layers' state before it drafts and puts it back after (`layer_states`,
`restore_layers`), so the target finds its cache as it left it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


def new_cache(model: torch.nn.Module) -> DynamicCache:
    """An empty dynamic cache for `model`, refusing layer kinds a tree cannot be kept in."""
    cache = DynamicCache(config=model.config)
    check_cache(cache)
    return cache


def check_cache(cache: DynamicCache) -> None:
    for i, layer in enumerate(cache.layers):
        if type(layer) is not DynamicLayer:
            raise ValueError(
                f"cache layer {i} is a {type(layer).__name__}; specnb keeps tree branches only in "
                "full-attention DynamicLayer caches (sliding-window and quantized layers drop or "
                "merge positions, so a branch cannot be gathered exactly)"
            )


def cache_length(cache: DynamicCache) -> int:
    return cache.get_seq_length()


def keep_positions(cache: DynamicCache, keep: torch.Tensor | Sequence[int]) -> None:
    """Keep only the cache positions `keep` (ascending), in every layer, in place.

    keep: K positions along the sequence axis of each layer's keys/values [B, H, S, D].
    A contiguous prefix (a chain's accepted path) is cropped, not gathered: no copy of the cache.
    """
    keep = [int(k) for k in keep]
    if keep and keep[-1] == len(keep) - 1:  # ascending and distinct, so exactly 0..K-1
        crop(cache, len(keep))
        return
    index: dict[torch.device, torch.Tensor] = {}  # one host-to-device copy, not one per layer
    for layer in cache.layers:
        if not layer.is_initialized or layer.keys.numel() == 0:
            continue
        device = layer.keys.device
        if device not in index:
            index[device] = torch.tensor(keep, dtype=torch.long, device=device)
        layer.keys = layer.keys.index_select(2, index[device])
        layer.values = layer.values.index_select(2, index[device])


def crop(cache: DynamicCache, length: int) -> None:
    """Drop every position from `length` on (a contiguous tail)."""
    for layer in cache.layers:
        if layer.is_initialized and layer.keys.shape[-2] > length:
            layer.keys = layer.keys[..., :length, :]
            layer.values = layer.values[..., :length, :]


def layer_states(cache: DynamicCache, layers: int) -> list[dict]:
    """The state of the first `layers` cache layers (their tensors by reference, not copied).

    Model calls never write into a layer's tensors (`DynamicLayer.update` concatenates into new
    ones), so `restore_layers` with this brings those layers back bit for bit, at no cost.
    """
    return [dict(layer.__dict__) for layer in cache.layers[:layers]]


def restore_layers(cache: DynamicCache, states: list[dict]) -> None:
    """Put back the first len(states) layers as `layer_states` saw them."""
    for layer, state in zip(cache.layers, states):
        layer.__dict__.clear()
        layer.__dict__.update(state)
