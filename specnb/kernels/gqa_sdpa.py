"""sdpa that reads grouped key/value heads as they are under a mask (torch's enable_gqa), for a CPU.

transformers' sdpa passes enable_gqa only without a mask (its CUDA kernels take no grouped heads with
one); with a mask and more than one query token (a tree's verify, a level of drafting, a prefill) it
copies every cached key and value Hq / Hkv times, in every layer, before the call. On a CPU, torch's
sdpa takes the grouped heads with the mask: the same output (a test compares them) without that copy.
`register` registers `gqa_sdpa` with transformers' attention interface, and sdpa's mask with its mask
interface, as GQA_SDPA (transformers is imported then, not with this module: the runner imports no
model code); `io.models.load_model` loads a model on a CPU with it where sdpa was asked for. Softcap and
position-bias attention go to transformers' own sdpa.
"""

from __future__ import annotations

import torch

GQA_SDPA = "specnb_gqa_sdpa"


def gqa_sdpa(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' sdpa (query [B, Hq, q, D], key and value [B, Hkv, L, D], the mask [B, 1, q, L] or
    None) with the key/value heads shared by Hq / Hkv query heads read in place; returns [B, q, Hq, D]."""
    if kwargs.get("softcap") is not None or kwargs.get("position_bias") is not None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, is_causal, **kwargs)
    q_length = query.shape[2]
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = q_length > 1 and attention_mask is None and causal
    if causal and key.shape[2] > q_length:  # as transformers' sdpa: no mask, a longer (static) cache
        key, value = key[:, :, :q_length], value[:, :, :q_length]
    out = torch.nn.functional.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout,
        scale=scaling,
        is_causal=causal,
        enable_gqa=query.shape[1] != key.shape[1],
    )
    return out.transpose(1, 2).contiguous(), None


def register() -> str:
    """GQA_SDPA, registered with transformers' attention and mask interfaces (again: a no-op)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(GQA_SDPA, gqa_sdpa)
    AttentionMaskInterface.register(GQA_SDPA, sdpa_mask)
    return GQA_SDPA
