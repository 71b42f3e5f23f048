"""Putting a tree into a stock transformers model: 4D attention masks and position ids.

transformers passes a 4D `attention_mask` of shape [batch, 1, query, key] to the attention kernel
unchanged (`masking_utils._preprocess_mask_arguments`), so a tree needs no patched model: the mask
and the position ids go in as forward arguments.

Pitfall (shared/docs/ANCHORS.md): `sdpa` reads a boolean mask as "True = attend", but `eager` adds
the mask to the scores, so a boolean mask there is silently wrong (True becomes +1). `model_mask`
therefore hands eager a float mask of 0 / dtype-min. Other implementations (flash attention,
flex attention with a dense tensor) cannot take an arbitrary mask and are refused.
"""

from __future__ import annotations

import torch

# attention implementations that take a dense 4D mask exactly as given
SUPPORTED_ATTENTION = ("sdpa", "eager")


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


def model_mask(mask: torch.Tensor, model: torch.nn.Module, dtype: torch.dtype) -> torch.Tensor:
    """Convert a boolean "may attend" mask to what `model`'s attention implementation reads."""
    if attention_implementation(model) == "sdpa":
        return mask
    # eager: additive float mask, 0 where attending and the dtype's minimum elsewhere
    neg = torch.finfo(dtype).min
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, neg)
