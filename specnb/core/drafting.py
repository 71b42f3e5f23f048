"""Drafters fill a `Tree` with tokens; `ModelDrafter` does it with a small causal LM.

Every drafter subclasses `Drafter` and implements `draft(tokens, tree, sampling, generator) ->
Draft`. The requested tree is a budget: a drafter that shapes its own tree (dynamic trees, adaptive
draft length, n-gram matches, merged drafts) returns it in `Draft.tree`, no deeper than the
requested one (the loop truncates the request so that no step overshoots `max_new_tokens`). The
base class has no-op hooks that `speculative_generate` calls on every drafter:

    reset()                      before a generation: forget the previous sequence
    check_request(tree, sampling)   before any compute: refuse a request the drafter cannot draft
    bind_target_cache(cache)     after the target's cache is made: a self-draft that shares the
                                 target's layers may read their keys/values (it must leave the
                                 cache as it found it before `draft` returns); such a drafter sets
                                 `shares_target_cache`, so the loop prefills the prompt for it
    observe(draft, acceptance)   after each verification (adaptive lengths learn, caches keep the
                                 accepted nodes)
    release()                    after a generation: let go of what bind_target_cache took (a hook)
and one attribute, `default_tree`: the tree used when the caller gives none.

`ModelDrafter` builds the tree level by level (`Tree.levels`): one draft forward per depth, all
nodes of that depth with children at once under the tree mask, on top of the draft's own KV cache.
The child at rank r of a node is the draft's r-th most likely token after that node's path
(greedy), or the r-th draw without replacement from q there (sampling, see `acceptance`). Leaves are
chosen but never fed. The cache persists across steps: it holds the sequence drafted from, then the
nodes fed for the deeper levels. At the next call the accepted nodes that were fed keep their
keys and values (their mask was the sequence itself, their positions the sequence's), the other
nodes are dropped (`cache.keep_positions`), and only the tokens the cache lacks are fed (the
accepted nodes never fed, and the bonus token).

`ModelDrafter(model, confidence_threshold=t)` drafts chains of adaptive length: it stops after the
first token whose draft probability is below t (transformers' `assistant_confidence_threshold`;
`drafters.draft_length` has the other adaptive-length rule and the reasoning for both).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from ..kernels.topk_head import TopKHead, draft_head
from .acceptance import Acceptance
from .cache import cache_length, crop, keep_positions, new_cache
from .forward import forward
from .masks import paths_visible
from .sampling import SamplingConfig, probabilities, sample_without_replacement, top_tokens
from .streaming import StreamingCache, kv_bytes
from .trees import Level, Tree


@dataclass(frozen=True)
class Draft:
    tokens: torch.Tensor  # long [N]: node i's token, canonical order
    q: torch.Tensor | None  # float [N + 1, V]: draft distribution at the root (row 0) and node i
    #                         (row i + 1); None when greedy, or when sampling with deterministic
    #                         proposals (see `acceptance`). Rows of leaves are unused zeros.
    tree: Tree | None = None  # the tree the drafter built, when it shapes its own; None: the
    #                           requested tree
    draft_tokens: int | None = None  # tokens drafted in the drafter's own vocabulary, when it is not
    #                                  the target's (cross-tokenizer drafts); None: the tree's nodes


class Drafter:
    """Base class of every drafter: `draft` to implement, hooks that do nothing by default."""

    default_tree: Tree | None = None  # used by speculative_generate when it is given no tree
    shares_target_cache: bool = False  # drafts on the target's own cache (needs the prompt in it)
    evictions: int = 0  # times a bounded draft cache was cut (`streaming.StreamingCache`)

    def draft(
        self, tokens: torch.Tensor, tree: Tree, sampling: SamplingConfig, generator: torch.Generator | None = None
    ) -> Draft:
        """tokens: long [1, T] or [T], the sequence so far; its last token is the tree's root."""
        raise NotImplementedError

    def reset(self) -> None:
        """Forget the previous generation."""

    def check_request(self, tree: Tree, sampling: SamplingConfig) -> None:
        """Raise ValueError, before any model runs, if `tree` cannot be drafted under `sampling`."""

    def bind_target_cache(self, cache: DynamicCache) -> None:
        """The target's cache, once per generation (see the module docstring)."""

    def observe(self, draft: Draft, acceptance: Acceptance) -> None:
        """What the target accepted of `draft`."""

    def release(self) -> None:
        """The generation is over (see the module docstring)."""

    def kv_bytes(self) -> int:
        """Bytes of the drafter's own KV cache now (0 for drafters without one)."""
        return 0


class ModelDrafter(Drafter):
    """Drafts with a transformers causal LM that shares the target's vocabulary.

    confidence_threshold: 0 (default) fills the requested tree. t > 0 needs a chain request and
    stops the chain after the first token x with q(x) < t, q the draft's distribution at its
    position after the sampling transforms (plain softmax when greedy, where x is the argmax), as
    transformers' `ConfidenceCriteria` does (stopping_criteria.py): the token that fell below t is
    kept, so t = 1 drafts one token per step (unless q(x) rounds to exactly 1) and t = 0 never
    stops early. The shorter chain is returned in `Draft.tree`. Under sampling q is still returned:
    see `drafters.draft_length` for why stopping on q(x) keeps the output distribution exact.

    cache_policy: a bounded draft cache (`streaming.StreamingCache`), cut when the cache is advanced
    to the next sequence (between steps, never while a tree is drafted), independently of the
    target's. It changes only what the draft proposes, never the output.

    head: "auto" (default) ranks greedy drafts (no confidence threshold) with a `topk_head.TopKHead`
    where one pays (a float32 CPU draft with a large LM head: `topk_head.draft_head`): the same
    top-k tokens as the model's own head at about half its memory traffic; sampled and
    confidence-threshold drafts use the model's own head. None: always the model's own head; or a
    TopKHead to use.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        confidence_threshold: float = 0.0,
        cache_policy: StreamingCache | None = None,
        head: TopKHead | str | None = "auto",
    ) -> None:
        if not 0.0 <= confidence_threshold <= 1.0:
            raise ValueError(f"confidence_threshold must lie in [0, 1], got {confidence_threshold}")
        if isinstance(head, str) and head != "auto":
            raise ValueError(f"head must be 'auto', None or a TopKHead, got {head!r}")
        self.model = model
        self.head = draft_head(model) if head == "auto" else head
        self.confidence_threshold = confidence_threshold
        self.cache_policy = cache_policy
        self.reset()

    def reset(self) -> None:
        self._cache: DynamicCache | None = None
        self._committed: list[int] = []  # the sequence whose keys/values open the cache, in order
        self._evicted = 0  # of them, cut out of the cache after its first `sink` (a cache policy)
        self._fed: list[Hashable] = []  # the tree nodes fed after them, in cache order
        self._accepted: tuple[tuple[Hashable, ...], tuple[int, ...]] = ((), ())  # last observed: nodes, tokens
        self.evictions = 0

    def kv_bytes(self) -> int:
        return kv_bytes(self._cache)

    @property
    def _held(self) -> int:
        """Positions of the committed sequence the cache holds."""
        return len(self._committed) - self._evicted

    @property
    def _shift(self) -> int:
        """Subtracted from a token's sequence index to get its position id: the positions cut out,
        under a policy with positions inside the cache; else 0 (original positions)."""
        policy = self.cache_policy
        return self._evicted if policy is not None and policy.positions == "cache" else 0

    def check_request(self, tree: Tree, sampling: SamplingConfig) -> None:
        if not sampling.greedy and tree.has_rank_gaps:
            raise ValueError(
                "sampling needs a tree whose sibling ranks have no gaps (0..k-1): a model "
                "drafter's rank-r child is its r-th draw without replacement from q"
            )
        if self.confidence_threshold > 0.0 and tree != Tree.chain(tree.num_nodes):
            raise ValueError(f"confidence_threshold applies to chains; got a tree of {tree.describe()}")

    def observe(self, draft: Draft, acceptance: Acceptance) -> None:
        self._accepted = (acceptance.path, acceptance.tokens)

    @torch.inference_mode()
    def draft(
        self,
        tokens: torch.Tensor,
        tree: Tree,
        sampling: SamplingConfig,
        generator: torch.Generator | None = None,
        copies: int = 1,
    ) -> Draft:
        """tokens: long [1, T] or [T], the sequence so far; its last token is the tree's root.

        copies > 1 (sampling only): `tree` is a forest of that many copies of one tree side by side
        under the root, copy s's depth-1 ranks being s * w .. s * w + w - 1; each copy is an
        independent sample (the root's children are drawn without replacement within a copy, not
        across copies). `experiments.collect` drafts many samples in one pass this way."""
        self.check_request(tree, sampling)
        if copies > 1 and sampling.greedy:
            raise ValueError("copies > 1 draws independent samples: it needs sampling (temperature > 0)")
        seq = tokens.reshape(-1).tolist()
        ranked = self.head is not None and sampling.greedy and self.confidence_threshold == 0.0  # top-k only
        widths = [lv.width for lv in tree.levels] + [0]

        def k(depth: int) -> int:  # the TopKHead's exact top k at a depth's parents (0: the model's head)
            return widths[depth] if ranked else 0

        def feed(level: Level, ids: torch.Tensor) -> torch.Tensor:
            return self._feed(tree, list(level.fed), ids, len(seq) - 1 + level.depth - self._shift, k(level.depth))

        root_logits = self._advance(seq, k(0))  # [V]
        return fill_levels(tree, root_logits[None], sampling, generator, feed, copies, self.confidence_threshold)

    def _feed(self, tree: Tree, nodes: list[int], ids: torch.Tensor, position: int, k: int = 0) -> torch.Tensor:
        """Feed tree nodes of one depth (their tokens `ids`, all at `position`); each sees the
        sequence, its fed ancestors and itself. Returns their logits [len(nodes), V], from the
        TopKHead with its top `k` exact where k > 0, else from the model's own head."""
        head = self.head if k else None
        chain_so_far = len(nodes) == 1 and list(tree.node_path(nodes[0])[:-1]) == self._fed
        if chain_so_far and position == cache_length(self._cache):  # sees everything cached, at the cache's
            self._fed += nodes  # own next position: the model's unmasked path
            return forward(self.model, self._cache, ids, head=head, k=k)
        visible = paths_visible([tree.paths[i] for i in nodes], [tree.paths[i] for i in self._fed], self._held)
        self._fed += nodes
        positions = torch.full((len(nodes),), position)  # host: moved by forward
        return forward(self.model, self._cache, ids, positions, visible, head=head, k=k)

    def _advance(self, seq: list[int], k: int = 0) -> torch.Tensor:
        """Bring the cache to `seq`, feeding only what it lacks; float32 logits [V] at seq[-1] (top
        `k` exact from the TopKHead where k > 0, else the model's own head's)."""
        held = len(self._committed)
        extends = len(seq) > held and seq[:held] == self._committed
        if self._cache is None or (self._evicted and not extends):  # a cut cache cannot be rewound
            self._cache = new_cache(self.model)
            self._committed, self._fed, self._evicted = [], [], 0
            held, extends = 0, len(seq) > 0
        kept: list[Hashable] = []
        if extends:
            # an extension: keep the accepted nodes that were fed, while they match the sequence
            # (never the root, seq[-1]: its logits are needed)
            slot = {node: i for i, node in enumerate(self._fed)}
            for node, token in zip(*self._accepted):
                at = held + len(kept)
                if at >= len(seq) - 1 or node not in slot or seq[at] != token:
                    break
                kept.append(node)
            keep = held
        else:
            keep, limit = 0, min(held, len(seq) - 1)
            while keep < limit and self._committed[keep] == seq[keep]:
                keep += 1
        if kept:
            slot = {node: i for i, node in enumerate(self._fed)}
            cached = self._held
            keep_positions(self._cache, list(range(cached)) + [cached + slot[node] for node in kept])
        else:
            crop(self._cache, keep - self._evicted)  # drops the last tree's nodes and anything not shared
        start = keep + len(kept)  # the sequence index of the first token fed now
        self._committed, self._fed, self._accepted = list(seq[:start]), [], ((), ())
        if self.cache_policy is not None:  # between steps: the only place a draft cache is cut
            cut = self.cache_policy.cut(self.model, self._cache)
            self._evicted, self.evictions = self._evicted + cut, self.evictions + (cut > 0)
        new = torch.tensor(seq[start:], dtype=torch.long)  # host: moved by forward
        positions = None
        if self._evicted and self.cache_policy.positions == "original":
            positions = torch.arange(start, len(seq))  # host: their true indices
        logits = forward(self.model, self._cache, new, positions, logits_to_keep=1, head=self.head if k else None, k=k)[
            -1
        ]
        self._committed = list(seq)
        return logits.float()


def as_drafter(drafter: Drafter | torch.nn.Module) -> Drafter:
    """A drafter as given, or a transformers model wrapped in `ModelDrafter`."""
    if isinstance(drafter, Drafter):
        return drafter
    if isinstance(drafter, torch.nn.Module):
        return ModelDrafter(drafter)
    raise TypeError(
        f"expected a specnb Drafter (a subclass of specnb.Drafter) or a transformers model, "
        f"got {type(drafter).__name__}"
    )


@functools.lru_cache(maxsize=64)  # trees shaped per step (adaptive lengths) come and go
def level_indices(tree: Tree, device: torch.device) -> tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor], ...]:
    """Per level of `tree`: its parents' rows, its nodes' ranks and its fed nodes, as long tensors on
    `device`, made once per (tree, device), so that a step copies nothing to the device to index."""
    return tuple(
        tuple(torch.tensor(v, dtype=torch.long, device=device) for v in (lv.parent_rows, lv.ranks, lv.fed))
        for lv in tree.levels
    )


def fill_levels(
    tree: Tree,
    logits: torch.Tensor,
    sampling: SamplingConfig,
    generator: torch.Generator | None,
    feed: Callable[[Level, torch.Tensor], torch.Tensor],
    copies: int = 1,
    confidence_threshold: float = 0.0,
) -> Draft:
    """Fill `tree` level by level (`Tree.levels`), for every drafter that drafts from a model of its own.

    logits: float [1, V] at the root. At each depth the children of every parent are chosen at once
    from the logits at the parents: greedy, the top `width` tokens (`top_tokens`: rank r = the r-th
    largest); sampling, draws without replacement from q (rank r = the r-th draw, Sequoia's rule, so
    `acceptance.speculative_accept` stays lossless). Then `feed(level, tokens)` runs the level's nodes
    that have children (long [F]) and returns their logits [F, V]; leaves are chosen, never fed.
    copies > 1 (sampling): the root's children are that many independent samples side by side.
    confidence_threshold > 0 (a chain): stop after the first token whose q is below it."""
    n, device = tree.num_nodes, logits.device
    out = torch.zeros(n, dtype=torch.long, device=device)
    q = None if sampling.greedy else torch.zeros(n + 1, logits.shape[-1], dtype=torch.float32, device=device)
    parent_rows = torch.zeros(1, dtype=torch.long, device=device)  # the parents' rows in q (0 = the root)
    for level, (parents, ranks, fed) in zip(tree.levels, level_indices(tree, device)):
        if sampling.greedy:
            choices = top_tokens(logits, level.width)  # [P, width]
        else:
            probs = probabilities(logits, sampling)  # [P, V]
            q[parent_rows] = probs
            if level.depth == 1 and copies > 1:  # the root's row, once per copy
                choices = sample_without_replacement(probs.expand(copies, -1), level.width // copies, generator)
                choices = choices.reshape(1, -1)
            else:
                choices = sample_without_replacement(probs, level.width, generator)
        out[level.nodes.start : level.nodes.stop] = choices[parents, ranks]
        if confidence_threshold > 0.0 and level.depth < n:  # a chain: one node per level
            row = torch.softmax(logits[0], -1) if sampling.greedy else probs[0]
            if float(row[out[level.depth - 1]]) < confidence_threshold:
                depth = level.depth
                return Draft(out[:depth], None if q is None else q[: depth + 1], Tree.chain(depth))
        if not level.fed:
            break
        logits = feed(level, out[fed]).float()
        parent_rows = fed + 1
    return Draft(out, q)
