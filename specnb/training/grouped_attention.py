"""sdpa for many query tokens per row under a dense mask without repeating grouped key/value heads:
what a batch of branches decoded together over one prompt needs (`training.distillation.continuations`).
Registered with transformers' attention interface as GROUPED_ATTENTION when this module is imported
(by the trainers that use it), switched on with `core.masks.use_attention`."""

from __future__ import annotations

import torch
from transformers import AttentionInterface

GROUPED_ATTENTION = "specnb_grouped_sdpa"


def grouped_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """sdpa of query [B, Hq, q, D] on key/value [B, Hkv, L, D] under a boolean mask [B, 1, q, L']
    (True = attend), for transformers' attention interface. The Hq / Hkv query heads that share a
    key head are stacked along the query axis, so grouped keys are read as they are (transformers'
    sdpa repeats them Hq / Hkv times for q > 1); keys past L' (a static cache's unwritten tail) are
    not read. ValueError for softcap, sliding windows or a mask that is not boolean 4D."""
    if kwargs.get("softcap") is not None or getattr(module, "sliding_window", None) is not None:
        raise ValueError("grouped_attention takes plain causal attention only (no softcap, no sliding window)")
    if attention_mask is None or attention_mask.dtype != torch.bool or attention_mask.dim() != 4:
        raise ValueError("grouped_attention needs a boolean 4D mask [B, 1, q, L'] (True = attend)")
    b, heads, q, dim = query.shape
    groups = heads // key.shape[1]
    length = attention_mask.shape[-1]
    out = torch.nn.functional.scaled_dot_product_attention(
        query.reshape(b, key.shape[1], groups * q, dim),
        key[:, :, :length],
        value[:, :, :length],
        attn_mask=attention_mask.repeat(1, 1, groups, 1),
        dropout_p=dropout,
        scale=scaling,
    )
    return out.reshape(b, heads, q, dim).transpose(1, 2).contiguous(), None


AttentionInterface.register(GROUPED_ATTENTION, grouped_attention)
