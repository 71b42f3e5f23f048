"""Verification: one target forward pass over [root + tree nodes] on top of the target's KV cache.

Invariant between steps: the target's cache holds every token of the sequence but the last (the
root of the next tree). A step appends the root and the N nodes (positions prefix + depth, mask =
whole prefix + ancestors), reads the target's logits at every row, and after acceptance keeps the
prefix, the root and the accepted branch only (`commit`), restoring the invariant with nothing to
recompute.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from .cache import cache_length, keep_positions
from .masks import model_mask, prefix_tree_mask, rooted_ancestor_mask
from .trees import Tree


@torch.inference_mode()
def prefill(model: torch.nn.Module, cache: DynamicCache, tokens: torch.Tensor) -> torch.Tensor:
    """Append `tokens` (long [1, T], T >= 1) to the cache; returns float32 logits [1, V] at the last
    token only (`logits_to_keep=1`, as transformers' generate does: the LM head over a whole prompt
    is wasted work, about 11% of a 700-token prefill of Qwen2.5-1.5B on CPU)."""
    return model(input_ids=tokens, past_key_values=cache, use_cache=True, logits_to_keep=1).logits[0].float()


@torch.inference_mode()
def verify(
    target: torch.nn.Module,
    cache: DynamicCache,
    root: int,
    tree: Tree,
    tokens: torch.Tensor,
) -> torch.Tensor:
    """Float32 logits [N + 1, V]: the target's logits at the root (row 0) and each node (row i+1).

    tokens: long [N], the draft tokens in the tree's canonical order.
    """
    device = target.device
    prefix_len = cache_length(cache)
    ids = torch.cat([torch.tensor([root], device=device), tokens.to(device)])[None]
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), tree.position_offsets()])
    positions = (prefix_len + offsets)[None].to(device)
    mask = prefix_tree_mask(rooted_ancestor_mask(tree.ancestor_mask(device)), prefix_len)
    out = target(
        input_ids=ids,
        position_ids=positions,
        attention_mask=model_mask(mask, target, target.dtype),
        past_key_values=cache,
        use_cache=True,
    )
    return out.logits[0].float()


def commit(cache: DynamicCache, prefix_len: int, path: tuple[int, ...]) -> None:
    """Keep the prefix, the root and the accepted nodes `path` of a verified tree.

    prefix_len: the cache length before `verify` appended the root and the tree.
    """
    keep = list(range(prefix_len + 1)) + [prefix_len + 1 + i for i in path]
    if len(keep) < cache_length(cache):
        keep_positions(cache, keep)
