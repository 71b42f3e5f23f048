"""One forward pass of new tokens on top of a KV cache, with explicit positions and visibility.

Every tree-shaped forward in specnb (verification, level-by-level drafting, dynamic trees, the
collection's super-trees) goes through `forward`. The mask and the position ids go in as forward
arguments of an unmodified transformers model (`masks`).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from ..kernels.topk_head import TopKHead
from .cache import cache_length
from .masks import model_mask


@torch.inference_mode()
def forward(
    model: torch.nn.Module,
    cache: DynamicCache,
    input_ids: torch.Tensor,
    positions: torch.Tensor | None = None,
    visible: torch.Tensor | None = None,
    logits_to_keep: int = 0,
    head: TopKHead | None = None,
    k: int = 0,
) -> torch.Tensor:
    """Logits [n, V] (model dtype) of n new tokens appended to `cache` (which keeps them).

    input_ids: long [n]. positions: long [n]; None continues the cache (L .. L + n - 1, L = its
    length). visible: bool [n, L + n], which cached and new tokens each new token attends to
    (ValueError for another shape); None = the model's own causal mask: pass None wherever the
    visibility is causal (a chain; one token that sees everything), decided from the tree's
    structure, so the model keeps its causal attention path.
    logits_to_keep: 0 = every row; k = the last k rows only (the LM head skips the others).
    head: a `topk_head.TopKHead` for the model's LM head (float32 logits whose top `k` per row are
    exact, `k` > 0); None: the model's own head.
    """
    device = model.device
    n = input_ids.shape[-1]
    mask = None
    if visible is not None:
        if visible.shape != (n, cache_length(cache) + n):
            raise ValueError(f"visible must be [{n}, {cache_length(cache) + n}], got {tuple(visible.shape)}")
        mask = model_mask(visible.to(device)[None, None], model, model.dtype)
    inputs = {
        "input_ids": input_ids.reshape(1, n).to(device),
        "position_ids": None if positions is None else positions.reshape(1, n).to(device),
        "attention_mask": mask,
        "cache": cache,
        "use_cache": True,
    }
    return logits(model, inputs, logits_to_keep, head, k)[0]


def logits(model: torch.nn.Module, inputs: dict, logits_to_keep: int, head: TopKHead | None, k: int) -> torch.Tensor:
    """Logits [B, M', V] of a forward with `inputs` (the model's keyword arguments): the model's own head
    on the last `logits_to_keep` positions (0: all), or the TopKHead `head` (top `k` exact) on them."""
    if head is None:
        return model(**inputs, logits_to_keep=logits_to_keep).logits
    hidden = model.model(**inputs).last_hidden_state  # [B, M, H]
    hidden = hidden[:, -logits_to_keep:] if logits_to_keep else hidden
    return head(hidden, k).reshape(*hidden.shape[:2], -1)
