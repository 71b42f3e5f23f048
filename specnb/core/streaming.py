"""A bounded KV cache under speculative decoding: StreamingLLM's attention sinks + a recent window.

StreamingLLM (Xiao et al. 2024) keeps the first `sink` cache positions (the attention sinks, 4 in
the paper) and the most recent `window`, and evicts the rest. `StreamingCache(sink, window, slack)`
applies that policy to the target's cache (`speculative_generate`, `autoregressive_generate`) and,
independently, to a draft's (`ModelDrafter(model, cache_policy=...)`).

Schedule. Let M = sink + window + slack. Before a *generated* token is fed (the prompt goes in
whole), a cache holding n >= M positions is cut to its first `sink` and last `window`. In a
speculative step the cut happens before the root is fed and the tree is cut to depth M - 1 - n'
(n' = positions held after the cut), so eviction happens between steps, never inside a tree (the
tree and its whole prefix stay visible to every node). Eviction then falls every `slack` tokens, at
indices that depend only on the prompt length and the three sizes, so by induction the cache before
any index t (which positions are kept, and what each computed when fed) is a function of t and the
tokens alone: the same in a speculative run as in the streaming model's own autoregressive run.
Hence (tested): with the same policy, greedy speculative output equals the streaming model's greedy
autoregressive output token for token, and sampled output follows its distribution. `slack` must be
at least the tree's depth for full trees (with slack 1, the paper's eviction after every token,
every step would be cut to the root alone).

Positions:
    "cache"     StreamingLLM's: a token's position is its index in the cache, so after a cut the
                kept window's keys are re-rotated by -delta (delta = positions removed before them):
                RoPE composes, R(a) R(b) = R(a + b), so k' = k cos(delta theta) - rotate_half(k)
                sin(delta theta), theta the model's inverse frequencies, in float32. Positions stay
                below sink + window + slack + depth however long the generation.
    "original"  keys keep the positions they were fed at and new tokens get their true index:
                nothing is re-rotated (no rounding), but positions grow without bound (past the
                model's training length the model runs out of range).
Both are exact in the sense above; tables say which they use.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache

from .cache import cache_length

POSITIONS = ("cache", "original")


@dataclass(frozen=True)
class StreamingCache:
    sink: int = 4  # first positions always kept (the attention sinks)
    window: int = 256  # most recent positions kept
    slack: int = 8  # positions gathered between cuts (>= the tree depth for full trees)
    positions: str = "cache"  # "cache" (StreamingLLM's, keys re-rotated) or "original"

    def __post_init__(self) -> None:
        if self.sink < 0 or self.window < 1 or self.slack < 1:
            raise ValueError(f"need sink >= 0, window >= 1, slack >= 1; got {self.sink}, {self.window}, {self.slack}")
        if self.positions not in POSITIONS:
            raise ValueError(f"positions must be one of {POSITIONS}, got {self.positions!r}")

    @property
    def limit(self) -> int:
        """M: a cache holding this many positions is cut before the next generated token."""
        return self.sink + self.window + self.slack

    def describe(self) -> str:
        return f"sink {self.sink} + window {self.window} (slack {self.slack}, positions {self.positions})"

    def depth_cap(self, held: int) -> int:
        """The deepest tree a step may verify after the root when the cache holds `held` positions
        before the root is fed (the cut done): its nodes must not reach the limit."""
        return max(self.limit - 1 - held, 0)

    def cut(self, model: torch.nn.Module, cache: DynamicCache) -> int:
        """Keep the first `sink` and the last `window` positions of every layer, re-rotating the
        window's keys under "cache" positions. Returns the positions removed (0 when the cache holds
        fewer than the limit)."""
        held = cache_length(cache)
        if held < self.limit:
            return 0
        delta = held - self.sink - self.window
        rotation = _rotation(model, delta) if self.positions == "cache" else None
        for layer in cache.layers:
            if not layer.is_initialized or layer.keys.numel() == 0:
                continue
            keys, values = layer.keys, layer.values  # [B, H, S, D]
            window = keys[..., held - self.window :, :]
            if rotation is not None:
                window = _rotate(window, *rotation)
            layer.keys = torch.cat([keys[..., : self.sink, :], window], dim=-2)
            layer.values = torch.cat([values[..., : self.sink, :], values[..., held - self.window :, :]], dim=-2)
        return delta


def kv_bytes(cache: DynamicCache | None) -> int:
    """Bytes of the keys and values a cache holds: numel x element size, every layer (exact, from
    the tensors themselves; a cropped layer counts what it holds, not the storage it came from)."""
    if cache is None:
        return 0
    return int(
        sum(
            t.numel() * t.element_size()
            for layer in cache.layers
            if layer.is_initialized
            for t in (layer.keys, layer.values)
        )
    )


def _rotation(model: torch.nn.Module, delta: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of -delta times the model's rotary angles, float32, over the head dimension."""
    rotary = getattr(model.get_decoder(), "rotary_emb", None)
    inv_freq = getattr(rotary, "inv_freq", None)
    if inv_freq is None:
        raise ValueError(f"{type(model).__name__} has no rotary embedding to re-rotate: use positions='original'")
    if getattr(rotary, "rope_type", "default") in ("dynamic", "longrope"):
        raise ValueError(
            "rotary scaling that depends on the sequence length cannot be re-rotated: use positions='original'"
        )
    angles = -float(delta) * inv_freq.float()
    angles = torch.cat([angles, angles])  # the model's cat(freqs, freqs) layout
    return angles.cos(), angles.sin()


def _rotate(keys: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE by the angles of (cos, sin) on keys [B, H, S, D] (rotate_half layout), in float32.
    A partial rotary (fewer dims than D) rotates the first dims only."""
    dim = cos.shape[-1]
    k = keys[..., :dim].float()
    half = dim // 2
    rotated = torch.cat([-k[..., half:], k[..., :half]], dim=-1)
    out = (k * cos.to(k.device) + rotated * sin.to(k.device)).to(keys.dtype)
    return torch.cat([out, keys[..., dim:]], dim=-1) if dim < keys.shape[-1] else out
