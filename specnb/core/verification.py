"""Verification: one target forward pass over [root + tree nodes] on top of the target's KV cache.

Invariant between steps: the target's cache holds every token of the sequence but the last (the
root of the next tree). A step appends the root and the N nodes (positions prefix + depth, mask =
whole prefix + ancestors), reads the target's logits at the root and every node, and after
acceptance keeps the prefix, the root and the accepted branch only (`commit`), restoring the
invariant with nothing to recompute.

The first step may also carry the prompt (`verify(..., pending=prompt)`): the tokens not yet in
the cache go in front of the root in the same forward, causally among themselves, so the prompt
costs no forward of its own (transformers' assisted generation does the same).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from .cache import cache_length, keep_positions
from .forward import forward
from .masks import attention_implementation, causal_visible, rooted_ancestor_mask
from .trees import Tree


@torch.inference_mode()
def prefill(
    model: torch.nn.Module, cache: DynamicCache, tokens: torch.Tensor, positions: torch.Tensor | None = None
) -> torch.Tensor:
    """Append `tokens` (long [1, T], T >= 1) to the cache; returns float32 logits [1, V] at the last
    token only (the LM head over the rest is wasted work; transformers' generate skips it too).
    positions: long [T], default the cache's continuation (a bounded cache with original positions
    passes the true indices)."""
    return forward(model, cache, tokens.reshape(-1), positions, logits_to_keep=1).float()


@torch.inference_mode()
def verify(
    target: torch.nn.Module,
    cache: DynamicCache,
    root: int,
    tree: Tree,
    tokens: torch.Tensor,
    pending: torch.Tensor | None = None,
    position_offset: int = 0,
) -> torch.Tensor:
    """Float32 logits [N + 1, V]: the target's logits at the root (row 0) and each node (row i+1).

    tokens: long [N], the draft tokens in the tree's canonical order. pending: long [P], tokens of
    the sequence before the root that the cache does not hold yet (the prompt, in the first step);
    they are appended first, causally. After the call the cache holds them, the root and the tree.
    position_offset: added to every position id: a bounded cache with original positions
    (`streaming`) holds fewer positions than the sequence's length.
    """
    attention_implementation(target)  # refused before any compute, chain or tree
    cached = cache_length(cache)
    pending = tokens[:0] if pending is None else pending.reshape(-1).to(tokens.device)
    before, n = pending.numel(), tree.num_nodes
    prefix_len = cached + before  # every token before the root
    ids = torch.cat([pending, torch.tensor([root], device=tokens.device), tokens])
    # the pending tokens at their own indices, then the root and each node at prefix_len + depth
    positions = torch.cat([torch.arange(cached, prefix_len), prefix_len + torch.tensor((0, *tree.depths))])  # host
    visible = None  # a chain: the model's own causal mask
    if not tree.is_chain:  # causal over the pending tokens, each node sees its ancestors: [P + N + 1, L + P + N + 1]
        visible = causal_visible(before + n + 1, cached)  # host: moved by forward
        visible[before:, prefix_len:] = rooted_ancestor_mask(tree.ancestors)
    return forward(target, cache, ids, positions + position_offset, visible, logits_to_keep=n + 1).float()


def commit(cache: DynamicCache, prefix_len: int, path: tuple[int, ...]) -> None:
    """Keep the prefix, the root and the accepted nodes `path` of a verified tree.

    prefix_len: the number of tokens before the root (the cache length before `verify`, plus the
    pending tokens it was given).
    """
    keep = list(range(prefix_len + 1)) + [prefix_len + 1 + i for i in path]
    if len(keep) < cache_length(cache):
        keep_positions(cache, keep)
