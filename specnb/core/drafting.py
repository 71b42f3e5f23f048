"""Drafters fill a `Tree` with tokens.

A drafter is any object with `draft(tokens, tree, sampling, generator) -> Draft` and `reset()`.
The requested tree is a budget: a drafter that shapes its own tree (dynamic trees, adaptive draft
length, n-gram matches, merged drafts) returns it in `Draft.tree`, no deeper than the requested
one (the loop truncates the request so that no step overshoots `max_new_tokens`). Two optional
hooks, called by `speculative_generate` when a drafter defines them:

    observe(draft, acceptance)   after each verification (adaptive draft length learns here)
    bind_target_cache(cache)     once, after the target's prefill: a self-draft that shares the
                                 target's layers may read their keys/values; it must leave the
                                 cache as it found it (same length) before `draft` returns
`ModelDrafter` wraps a small causal LM and builds the tree level by level: one draft forward pass
per depth, all nodes of that depth at once under the tree mask, on top of the draft's own KV cache.
The child at rank r of a node is the draft's r-th most likely token after that node's path
(greedy), or the r-th draw without replacement from q there (sampling, see `acceptance`).

The draft's cache persists across steps. It holds the committed sequence plus, after a draft, the
tree nodes fed for the deeper levels; at the next call the tree tail is cropped (it is contiguous)
and only the tokens accepted since are fed.

`ModelDrafter(model, confidence_threshold=t)` drafts chains of adaptive length: it stops after the
first token whose draft probability is below t (transformers' `assistant_confidence_threshold`;
`draft_length` has the other adaptive-length rule and the reasoning for both).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from .cache import crop, new_cache
from .masks import model_mask, prefix_tree_mask
from .sampling import SamplingConfig, probabilities, sample_without_replacement
from .trees import Tree


@dataclass(frozen=True)
class Draft:
    tokens: torch.Tensor  # long [N]: node i's token, canonical order
    q: torch.Tensor | None  # float [N + 1, V]: draft distribution at the root (row 0) and node i
    #                         (row i + 1); None when greedy, or when sampling with deterministic
    #                         proposals (see `acceptance`). Rows of leaves are unused zeros.
    tree: Tree | None = None  # the tree the drafter built, when it shapes its own; None: the
    #                           requested tree


@runtime_checkable
class Drafter(Protocol):
    def draft(
        self,
        tokens: torch.Tensor,
        tree: Tree,
        sampling: SamplingConfig,
        generator: torch.Generator | None,
    ) -> Draft: ...

    def reset(self) -> None: ...


class ModelDrafter:
    """Drafts with a transformers causal LM that shares the target's vocabulary.

    confidence_threshold: 0 (default) fills the requested tree. t > 0 needs a chain request and
    stops the chain after the first token x with q(x) < t, q the draft's distribution at its
    position after the sampling transforms (plain softmax when greedy, where x is the argmax), as
    transformers' `ConfidenceCriteria` does (stopping_criteria.py): the token that fell below t is
    kept, so t = 1 drafts one token per step (unless q(x) rounds to exactly 1) and t = 0 never
    stops early. The shorter chain is returned in `Draft.tree`. Under sampling q is still returned:
    see `draft_length` for why stopping on q(x) keeps the output distribution exact.
    """

    def __init__(self, model: torch.nn.Module, confidence_threshold: float = 0.0) -> None:
        if not 0.0 <= confidence_threshold <= 1.0:
            raise ValueError(f"confidence_threshold must lie in [0, 1], got {confidence_threshold}")
        self.model = model
        self.confidence_threshold = confidence_threshold
        self.reset()

    def reset(self) -> None:
        self._cache = None
        self._committed: list[int] = []  # tokens whose keys/values the cache holds, in order

    @torch.inference_mode()
    def draft(
        self,
        tokens: torch.Tensor,
        tree: Tree,
        sampling: SamplingConfig,
        generator: torch.Generator | None = None,
    ) -> Draft:
        """tokens: long [1, T] or [T], the sequence so far; its last token is the tree's root."""
        n = tree.num_nodes
        stop_early = self.confidence_threshold > 0.0
        if stop_early and tree != Tree.chain(n):
            raise ValueError(f"confidence_threshold applies to chains; got a tree of {tree.describe()}")
        seq = tokens.reshape(-1).tolist()
        device = self.model.device
        root_logits = self._advance(seq)  # [V]
        out = torch.zeros(n, dtype=torch.long, device=device)
        q = None
        if not sampling.greedy:
            q = torch.zeros(n + 1, root_logits.shape[-1], dtype=torch.float32, device=device)
        if n == 0:
            return Draft(out, q)

        prefix_len = len(seq)  # cache length before the tree; the root sits at prefix_len - 1
        ancestors = tree.ancestor_mask(device)
        parents = torch.tensor(tree.parents, device=device)
        ranks = torch.tensor(tree.ranks, device=device)
        level_logits = root_logits[None]  # logits at the parents of the next level, [P, V]
        level_rows = torch.zeros(1, dtype=torch.long, device=device)  # their rows (0 = root)
        for depth in range(1, tree.depth + 1):
            nodes = tree.level(depth)
            # each node's parent as an index into level_logits
            parent_rows = parents[nodes.start : nodes.stop] + 1
            local = torch.searchsorted(level_rows, parent_rows)
            k = int(ranks[nodes.start : nodes.stop].max()) + 1
            if sampling.greedy:
                choices = torch.topk(level_logits, k, dim=-1).indices  # [P, k]
            else:
                probs = probabilities(level_logits, sampling)
                q[level_rows] = probs
                choices = sample_without_replacement(probs, k, generator)
            out[nodes.start : nodes.stop] = choices[local, ranks[nodes.start : nodes.stop]]
            if stop_early and depth < n:
                # a chain: one node per level, one parent row
                row = torch.softmax(level_logits[0], -1) if sampling.greedy else probs[0]
                if float(row[out[depth - 1]]) < self.confidence_threshold:
                    return Draft(out[:depth], None if q is None else q[: depth + 1], Tree.chain(depth))
            if depth == tree.depth:
                break
            # feed this level: it sees the prefix, the nodes fed before it, and its own ancestors
            rows = ancestors[nodes.start : nodes.stop, : nodes.stop]
            # one query that sees every cached token (a chain so far) needs no mask: the model's
            # own mask for a single query is all-visible, and it keeps the fast attention path
            visible_to_all = len(nodes) == 1 and bool(rows.all())
            mask = None if visible_to_all else model_mask(prefix_tree_mask(rows, prefix_len), self.model, self.model.dtype)
            positions = (prefix_len - 1 + depth) * torch.ones(len(nodes), dtype=torch.long)
            logits = self.model(
                input_ids=out[None, nodes.start : nodes.stop],
                position_ids=positions[None].to(device),
                attention_mask=mask,
                past_key_values=self._cache,
                use_cache=True,
            ).logits[0]
            level_logits = logits.float()
            level_rows = torch.arange(nodes.start + 1, nodes.stop + 1, device=device)
        return Draft(out, q)

    def _advance(self, seq: list[int]) -> torch.Tensor:
        """Bring the cache to `seq` minus nothing, feeding only what it lacks; logits at seq[-1]."""
        if self._cache is None:
            self._cache = new_cache(self.model)
        keep = 0
        limit = min(len(self._committed), len(seq) - 1)  # always feed the root: we need its logits
        while keep < limit and self._committed[keep] == seq[keep]:
            keep += 1
        crop(self._cache, keep)  # drops last step's tree nodes and anything not shared
        new = torch.tensor([seq[keep:]], dtype=torch.long, device=self.model.device)
        logits = self.model(
            input_ids=new, past_key_values=self._cache, use_cache=True, logits_to_keep=1
        ).logits[0, -1]
        self._committed = list(seq)
        return logits.float()


def as_drafter(drafter: Drafter | torch.nn.Module) -> Drafter:
    """A drafter as given, or a transformers model wrapped in `ModelDrafter`."""
    if isinstance(drafter, torch.nn.Module):
        return ModelDrafter(drafter)
    if isinstance(drafter, Drafter):
        return drafter
    raise TypeError(f"expected a Drafter or a transformers model, got {type(drafter).__name__}")
