"""EAGLE-2-style dynamic draft trees: the tree is rebuilt every step from the draft's confidence.

Definition (the one `replay` uses too). Below every node, the child at rank r is the draft's r-th
most likely token there (`top_k` children per node, depth at most `max_depth`). A node's *score* is
its cumulative draft log-probability, the sum of log q (softmax of the draft's logits, temperature
1) over its path. The dynamic tree of budget n is the n nodes with the highest scores, ties broken
by canonical (depth, path) order. A child never scores above its parent, nor a sibling above its
elder sibling, so the chosen set is closed under both: a gap-free rank-path `Tree`.

Construction, level by level with one draft forward per depth (EAGLE-2, Li et al. 2024, keeps the
global top nodes by cumulative confidence in the same way): after depth d, only the depth-d nodes
inside the top n among all nodes of depth <= d can have children in the final top n (adding deeper
nodes can only push nodes out), so only those are fed. The result is the exact top n, not a beam
approximation.

The proposals are chosen, not sampled, so under sampling the draft is deterministic (`q=None`) and
the acceptance rule treats each proposal as a one-hot draw (see `acceptance`): lossless.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core.drafting import Draft, ModelDrafter
from ..core.sampling import SamplingConfig, top_tokens
from ..core.streaming import StreamingCache
from ..core.trees import Path, Tree


@dataclass(frozen=True)
class ScoredTree:
    """A dynamic tree with its draft tokens and node scores, in the tree's canonical order."""

    tree: Tree
    tokens: torch.Tensor  # long [N]
    scores: torch.Tensor  # float [N]: cumulative draft log-probability of each node


def top_n(scores: dict[Path, float], n: int) -> list[Path]:
    """The n paths with the highest scores, ties broken by canonical (depth, path) order."""
    return sorted(scores, key=lambda p: (-scores[p], len(p), p))[:n]


class DynamicTreeDrafter(ModelDrafter):
    """Drafts the global top-`n` tree by cumulative draft probability each step, for one sequence
    (`draft`) or for B >= 1 rows at once (`draft_rows`: each row's own top-n tree, with one draft
    forward per depth for the whole batch on `ModelDrafter`'s ragged cache, a depth's nodes of every
    row in one block, each row's padded to the widest row's). A row's draft equals its own `draft`,
    up to the float rounding of another batch shape.

    n: nodes per tree; top_k: children considered below each node; max_depth: deepest level.
    The tree passed to `speculative_generate` only caps the depth (the loop shortens it near
    `max_new_tokens`; the top-n tree is then cut at that depth, as `replay` replays it); leave it
    out and the drafter's `default_tree` (depth `max_depth`) is used. cache_policy: as
    `ModelDrafter`'s (one sequence only).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        n: int = 32,
        top_k: int = 8,
        max_depth: int = 6,
        cache_policy: StreamingCache | None = None,
    ) -> None:
        if n < 1 or top_k < 1 or max_depth < 1:
            raise ValueError(f"n, top_k and max_depth must be >= 1, got {n}, {top_k}, {max_depth}")
        # scores read every child's log q: the model's own head, not a TopKHead
        super().__init__(model, cache_policy=cache_policy, head=None)
        self.n, self.top_k, self.max_depth = n, top_k, max_depth
        self.default_tree = Tree.chain(max_depth)

    @torch.inference_mode()
    def draft(
        self, tokens: torch.Tensor, tree: Tree, sampling: SamplingConfig, generator: torch.Generator | None = None
    ) -> Draft:
        scored = self.expand(tokens, self.max_depth)
        if scored.tree.depth > tree.depth:  # near max_new_tokens: cut the same top-n tree
            cut = scored.tree.truncated(tree.depth)
            return Draft(scored.tokens[: cut.num_nodes], None, cut)
        return Draft(scored.tokens, None, scored.tree)

    @torch.inference_mode()
    def expand(self, tokens: torch.Tensor, max_depth: int, n: int | None = None) -> ScoredTree:
        """The top-n tree (default `self.n`) after `tokens`, at most `max_depth` deep."""
        n = self.n if n is None else n
        if max_depth < 1:
            return ScoredTree(
                Tree(()), torch.zeros(0, dtype=torch.long, device=self.model.device), torch.zeros(0)
            )  # host: scores
        self._rows = None  # one sequence: its own cache
        root_logits = self._advance(tokens.reshape(-1).tolist())
        (chosen,), (scores,), (token,) = self._grow(root_logits[None], max_depth, n)
        tree = Tree.from_paths(chosen)
        return ScoredTree(
            tree,
            torch.tensor([token[p] for p in tree.paths], dtype=torch.long, device=root_logits.device),
            torch.tensor([scores[p] for p in tree.paths], dtype=torch.float32),  # host: scores
        )

    @torch.inference_mode()
    def draft_rows(
        self,
        sequences: list[list[int]],
        tree: Tree,
        sampling: SamplingConfig,
        generators: list,
        depths: list[int] | None = None,
    ) -> list[Draft]:
        """Each row's top-n tree after its sequence, cut to `tree`'s depth (or to depths[r]: as the row
        drafts alone near its end). `sampling` and `generators` are unused: the proposals are chosen."""
        self.check_rows()
        root_logits = self._advance_rows(sequences)  # [B, V]
        chosen, _, token = self._grow(root_logits, self.max_depth, self.n)
        out = []
        for r in range(len(sequences)):
            own = Tree.from_paths(chosen[r])
            own = own.truncated(min(own.depth, tree.depth if depths is None else depths[r]))
            out.append(Draft(torch.tensor([token[r][p] for p in own.paths], dtype=torch.long), None, own))  # host
        return out

    def _grow(
        self, root_logits: torch.Tensor, max_depth: int, n: int
    ) -> tuple[list[list[Path]], list[dict[Path, float]], list[dict[Path, int]]]:
        """Each row's top-n paths (at most `max_depth` deep), with every scored path's score and token,
        from the rows' root logits [B, V] (the cache advanced to each row's sequence): one draft forward
        per depth feeds every row's chosen nodes of that depth (`ModelDrafter._feed_nodes`)."""
        b = root_logits.shape[0]
        scores: list[dict[Path, float]] = [{} for _ in range(b)]
        token: list[dict[Path, int]] = [{} for _ in range(b)]
        for r in range(b):
            add_children([()], [0.0], root_logits[r][None], self.top_k, scores[r], token[r])
        chosen = [top_n(s, n) for s in scores]
        for depth in range(1, max_depth):
            levels = [[p for p in c if len(p) == depth] for c in chosen]
            width = max(map(len, levels))
            if not width:
                break
            ids = torch.zeros(b, width, dtype=torch.long)  # host: moved by the forward
            for r, level in enumerate(levels):
                ids[r, : len(level)] = torch.tensor([token[r][p] for p in level], dtype=torch.long)  # host
            logits = self._feed_nodes(levels, ids, depth)  # [B, W, V]
            for r, level in enumerate(levels):
                if level:
                    add_children(
                        level, [scores[r][p] for p in level], logits[r, : len(level)], self.top_k, scores[r], token[r]
                    )
                    chosen[r] = top_n(scores[r], n)
        return chosen, scores, token


def add_children(
    paths: list[Path], base: list[float], logits: torch.Tensor, top_k: int, scores: dict, token: dict
) -> None:
    """Score the top_k children of each path (its score in `base`) from its logits (rows of `logits`),
    into `scores` and `token` by child path; one device read."""
    logq = torch.log_softmax(logits.float(), dim=-1)
    top = top_tokens(logq, top_k)  # [k, top_k], ties to the lower token id
    for path, score, values, indices in zip(paths, base, logq.gather(-1, top).tolist(), top.tolist()):
        for rank, (lq, tok) in enumerate(zip(values, indices)):
            scores[path + (rank,)] = score + lq
            token[path + (rank,)] = tok
