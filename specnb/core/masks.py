"""Putting a tree into a stock transformers model: 4D attention masks and position ids.

transformers passes a 4D `attention_mask` of shape [batch, 1, query, key] to the attention kernel
unchanged (`masking_utils._preprocess_mask_arguments`), so a tree needs no patched model: the mask
and the position ids go in as forward arguments.

`use_attention` switches a model to another registered attention implementation inside a block
(`training.grouped_attention`, for the trainers' distillation).

Pitfall (docs/how-a-step-works.md, "Verify"): `sdpa` reads a boolean mask as "True = attend", but `eager` adds
the mask to the scores, so a boolean mask there is silently wrong (True becomes +1). `model_mask`
therefore hands eager a float mask of 0 / dtype-min. Other implementations (flash attention,
flex attention with a dense tensor) cannot take an arbitrary mask and are refused.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch

from ..kernels.gqa_sdpa import GQA_SDPA

# attention implementations that take a dense 4D mask exactly as given
SUPPORTED_ATTENTION = ("sdpa", GQA_SDPA, "eager")  # GQA_SDPA: sdpa without repeated key/value heads (a CPU's)


def attention_implementation(model: torch.nn.Module) -> str:
    """The model's attention implementation, or a ValueError saying how to pick a supported one."""
    impl = getattr(model.config, "_attn_implementation", None) or "eager"
    if impl not in SUPPORTED_ATTENTION:
        raise ValueError(
            f"attention implementation {impl!r} cannot take a tree mask; specnb supports "
            f"{SUPPORTED_ATTENTION}. Load the model with attn_implementation='sdpa' "
            f"(or call model.set_attn_implementation('sdpa'))."
        )
    return impl


def prefix_tree_mask(tree_rows: torch.Tensor, prefix_len: int) -> torch.Tensor:
    """Bool [1, 1, Q, prefix_len + M]: every query sees the whole prefix, then `tree_rows`.

    tree_rows: bool [Q, M], which of the M tree tokens in the cache/query each query may see.
    """
    q = tree_rows.shape[0]
    prefix = torch.ones(q, prefix_len, dtype=torch.bool, device=tree_rows.device)
    return torch.cat([prefix, tree_rows], dim=1)[None, None]


def rooted_ancestor_mask(ancestors: torch.Tensor) -> torch.Tensor:
    """Bool [N+1, N+1] for [root, node_0..node_{N-1}]: the root is an ancestor of every node.

    ancestors: bool [N, N] from `Tree.ancestor_mask()`.
    """
    n = ancestors.shape[0]
    out = torch.zeros(n + 1, n + 1, dtype=torch.bool, device=ancestors.device)
    out[:, 0] = True
    out[1:, 1:] = ancestors
    return out


def causal_visible(new: int, cached: int, device: torch.device | None = None) -> torch.Tensor:
    """Bool [new, cached + new]: each new row sees every cached row, the new rows before it and itself."""
    return torch.ones(new, cached + new, dtype=torch.bool, device=device).tril(diagonal=cached)


def paths_visible(nodes: Sequence[tuple[int, ...]], fed: Sequence[tuple[int, ...] | None], cached: int) -> torch.Tensor:
    """Bool [len(nodes), cached + len(fed) + len(nodes)] on the host: tree nodes of one depth, named
    by their rank paths, fed on a cache that holds `cached` tokens of the sequence and then the tree
    nodes `fed` (in cache order, every ancestor of `nodes` among them; None: a padding column, seen by
    none). Each node sees the whole sequence, its ancestors and itself: the tree mask of
    level-by-level drafting."""
    slot = {p: cached + i for i, p in enumerate(fed)}
    rows, cols = [], []
    for i, path in enumerate(nodes):
        ancestors = [slot[path[:d]] for d in range(1, len(path))]
        rows += [i] * (len(ancestors) + 1)
        cols += ancestors + [cached + len(fed) + i]
    visible = torch.zeros(len(nodes), cached + len(fed) + len(nodes), dtype=torch.bool)  # host: moved by forward
    visible[:, :cached] = True
    visible[rows, cols] = True
    return visible


def model_mask(mask: torch.Tensor, model: torch.nn.Module, dtype: torch.dtype) -> torch.Tensor:
    """Convert a boolean "may attend" mask to what `model`'s attention implementation reads."""
    if attention_implementation(model) in ("sdpa", GQA_SDPA):
        return mask
    # eager: additive float mask, 0 where attending and the dtype's minimum elsewhere
    neg = torch.finfo(dtype).min
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, neg)


@contextmanager
def use_attention(model: torch.nn.Module, name: str) -> Iterator[None]:
    """`model` runs with attention implementation `name` inside the block, its own after it."""
    before = model.config._attn_implementation
    model.set_attn_implementation(name)
    try:
        yield
    finally:
        model.set_attn_implementation(before)
