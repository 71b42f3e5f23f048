"""KV caches that keep exactly the accepted path of a tree.

After a tree is verified, the cache holds the prefix, the root and all N tree nodes. Only the
accepted branch may stay, and a branch is not contiguous in the cache, so cropping is not enough
(docs/how-a-step-works.md, "Commit"): the kept positions are gathered in every layer. The same gather serves the
draft model's cache. A self-draft that runs the target's first layers on the target's own cache
saves those layers' state before it drafts and puts it back after (`layer_states`,
`restore_layers`), so the target finds its cache as it left it.

On a CPU a layer appends into spare columns after its last one (`GrowingLayer`) instead of
concatenating a new tensor at every forward: a stock `DynamicLayer` copies the whole cache in every
layer at every call, which in a batch of drafting rows cost as much as the attention itself.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


class GrowingLayer(DynamicLayer):
    """A `DynamicLayer` whose keys and values are views of buffers with spare columns (on a CPU).

    `update` writes the new columns in place after the layer's last column when the buffer has room
    and `keys` is still its view (cropping keeps it one; a gather that replaces `keys` does not, and
    the next update copies into a new buffer with `SPARE` more columns). The columns a layer holds are
    never written by an update: only those after them, which no view the layer handed out includes.
    Elsewhere (CUDA) it concatenates, as `DynamicLayer` does.
    """

    SPARE = 256

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if key_states.device.type != "cpu":
            return super().update(key_states, value_states, *args, **kwargs)
        self.keys = self._append("_key_room", self.keys, key_states)
        self.values = self._append("_value_room", self.values, value_states)
        return self.keys, self.values

    def _append(self, name: str, held: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        room = getattr(self, name, None)
        length, adding = (held.shape[-2] if held.numel() else 0), new.shape[-2]
        in_place = (
            room is not None
            and held.numel()
            and held.data_ptr() == room.data_ptr()
            and held.stride() == room.stride()
            and held.shape[:2] == room.shape[:2] == new.shape[:2]
            and length + adding <= room.shape[2]
        )
        if not in_place:
            room = new.new_empty(*new.shape[:2], length + adding + self.SPARE, new.shape[3])
            if length:
                room[:, :, :length] = held
            setattr(self, name, room)
        room[:, :, length : length + adding] = new
        return room[:, :, : length + adding]


def new_cache(model: torch.nn.Module) -> DynamicCache:
    """An empty dynamic cache for `model` (its full-attention layers `GrowingLayer`s), refusing layer
    kinds a tree cannot be kept in."""
    cache = DynamicCache(config=model.config)
    cache.layers = [GrowingLayer() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    check_cache(cache)
    return cache


def check_cache(cache: DynamicCache) -> None:
    for i, layer in enumerate(cache.layers):
        if type(layer) not in (DynamicLayer, GrowingLayer):
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

    Model calls never write into the columns a layer holds (`DynamicLayer.update` concatenates into
    new tensors, `GrowingLayer.update` writes only after them), so `restore_layers` with this brings
    those layers back bit for bit, at no cost.
    """
    return [dict(layer.__dict__) for layer in cache.layers[:layers]]


def restore_layers(cache: DynamicCache, states: list[dict]) -> None:
    """Put back the first len(states) layers as `layer_states` saw them."""
    for layer, state in zip(cache.layers, states):
        layer.__dict__.clear()
        layer.__dict__.update(state)
