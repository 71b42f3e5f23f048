"""sdpa that reads grouped key/value heads as they are under a mask (torch's enable_gqa), for a CPU.

transformers' sdpa passes enable_gqa only without a mask (its CUDA kernels take no grouped heads with
one); with a mask and more than one query token (a tree's verify, a level of drafting, a prefill) it
copies every cached key and value Hq / Hkv times, in every layer, before the call. On a CPU, torch's
sdpa takes the grouped heads with the mask: the same output (a test compares them) without that copy.
`register` registers `gqa_sdpa` with transformers' attention interface, and sdpa's mask with its mask
interface, as GQA_SDPA (transformers is imported then, not with this module: the runner imports no
model code); `io.models.load_model` loads a model on a CPU with it where sdpa was asked for. Softcap and
position-bias attention go to transformers' own sdpa.

Rows of very different lengths (`core.ragged`: a batch's committed keys padded to its longest row)
read only the keys they need when the forward passes `row_spans` (`RowSpans`): each run of rows its
committed columns up to its own longest row, every row the scratch columns after `base`, the two
parts joined by their log-sum-exp. The same attention, up to float rounding; on a CPU sdpa reads every
key of every row, masked or not, so this is what a batch with a few long prompts costs less.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

GQA_SDPA = "specnb_gqa_sdpa"


@dataclass(frozen=True)
class RowSpans:
    """What each run of rows reads (`split_sdpa`): rows [start, stop) their first `width` columns,
    every row the columns from `base` on; the masks additive, made once per forward for all layers."""

    runs: tuple[tuple[int, int, int], ...]  # (start, stop, width)
    base: int
    masks: tuple[torch.Tensor, ...]  # per run, float [stop - start, 1, M, width]
    seen: tuple[torch.Tensor, ...]  # per run, bool [stop - start, 1, M]: a query that sees a column there
    tail: torch.Tensor  # float [B, 1, M, L - base]: every query sees at least itself there

    @classmethod
    def of(cls, runs: list[tuple[int, int, int]], base: int, mask: torch.Tensor, dtype: torch.dtype) -> RowSpans:
        """The spans of `runs` under the boolean mask [B, 1, M, L] ("may attend")."""

        def additive(m: torch.Tensor) -> torch.Tensor:
            return torch.zeros(m.shape, dtype=dtype, device=m.device).masked_fill_(~m, float("-inf"))

        parts = [mask[a:b, :, :, :w] for a, b, w in runs]
        return cls(
            tuple(runs), base, tuple(map(additive, parts)), tuple(p.any(-1) for p in parts), additive(mask[..., base:])
        )


def split_sdpa(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, spans: RowSpans, scale: float | None
) -> torch.Tensor:
    """Attention [B, Hq, q, D] as sdpa gives it under the mask `spans` was made from, each run of rows
    reading its own committed width and the columns from `spans.base` (module docstring)."""
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu  # output and log-sum-exp
    tail, tail_lse = flash(
        query, key[:, :, spans.base :], value[:, :, spans.base :], 0.0, False, attn_mask=spans.tail, scale=scale
    )[:2]
    out = torch.empty_like(query)
    for (a, b, w), mask, seen in zip(spans.runs, spans.masks, spans.seen):
        part, lse = flash(query[a:b], key[a:b, :, :w], value[a:b, :, :w], 0.0, False, attn_mask=mask, scale=scale)[:2]
        lse = lse.masked_fill(~seen, float("-inf"))  # a query that sees nothing here: weight 0 (flash gives lse 0)
        top = torch.maximum(lse, tail_lse[a:b])
        x, y = torch.exp(lse - top)[..., None], torch.exp(tail_lse[a:b] - top)[..., None]
        out[a:b] = (x * part + y * tail[a:b]) / (x + y)
    return out


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
    spans = kwargs.get("row_spans")
    if spans is not None and attention_mask is not None and query.device.type == "cpu" and dropout == 0.0:
        return split_sdpa(query, key, value, spans, scaling).transpose(1, 2).contiguous(), None
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
