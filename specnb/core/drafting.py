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
nodes fed for the deeper levels. `observe` keeps the accepted nodes that were fed (their mask was
the sequence itself, their positions the sequence's) and drops the others (`cache.keep_positions`);
the next call feeds only the tokens the cache lacks (the accepted nodes never fed, and the bonus
token). The same drafter drafts B >= 1 rows at once (`ModelDrafter.draft_rows`, the batch loop's
drafting side): the same levels, one draft forward per depth for every row, on a ragged cache
(`core.ragged`), where `observe_rows` keeps each row's accepted nodes that were fed as `observe` does.

`ModelDrafter(model, confidence_threshold=t)` drafts chains of adaptive length: it stops after the
first token whose draft probability is below t (transformers' `assistant_confidence_threshold`;
`drafters.draft_length` has the other adaptive-length rule and the reasoning for both).
"""

from __future__ import annotations

import functools
import itertools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache

from ..kernels.topk_head import TopKHead, draft_head
from .acceptance import Acceptance
from .cache import cache_length, crop, keep_positions, new_cache
from .forward import forward
from .masks import paths_visible
from .ragged import RaggedCache, block_forward, causal_block, commit, discard, select_rows, truncate
from .sampling import SamplingConfig, probabilities, sample_without_replacement, top_tokens
from .streaming import StreamingCache, kv_bytes
from .trees import Level, Path, Tree


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


class NoDraft(Drafter):
    """Drafts nothing (an empty tree): the generation loop with it is the target's own decoding."""

    empty = Tree.chain(0)

    def draft(
        self, tokens: torch.Tensor, tree: Tree, sampling: SamplingConfig, generator: torch.Generator | None = None
    ) -> Draft:
        return Draft(torch.zeros(0, dtype=torch.long), None, self.empty)  # host: the loop moves drafts


class ModelDrafter(Drafter):
    """Drafts with a transformers causal LM that shares the target's vocabulary, for one sequence
    (`draft`) or for B >= 1 rows at once (`draft_rows`, the batch loop's `generation.RowDrafting`).

    One sequence: the draft's own `DynamicCache`, advanced to the sequence each step; `observe` keeps
    the accepted nodes that were fed (module docstring). Rows: a ragged cache (`core.ragged`) whose
    row b holds row b's sequence; each step feeds every row what its cache lacks (the accepted tokens
    never fed and the next root; at the batch's first step, the prompts) in one forward, then one
    forward per depth feeds the batch's nodes of that depth; `observe_rows` keeps each row's accepted
    nodes that were fed and drops the rest (`keep_rows`: rows leaving the batch). Either way the
    per-level feeding is `_feed_nodes` and the tree is filled by `fill_levels`; a row's draft equals
    its own `draft`, up to the float rounding of another batch shape.

    confidence_threshold: 0 (default) fills the requested tree. t > 0 needs a chain request and
    stops the chain after the first token x with q(x) < t, q the draft's distribution at its
    position after the sampling transforms (plain softmax when greedy, where x is the argmax), as
    transformers' `ConfidenceCriteria` does (stopping_criteria.py): the token that fell below t is
    kept, so t = 1 drafts one token per step (unless q(x) rounds to exactly 1) and t = 0 never
    stops early. The shorter chain is returned in `Draft.tree`. Under sampling q is still returned:
    see `drafters.draft_length` for why stopping on q(x) keeps the output distribution exact.
    One sequence only: `draft_rows` refuses it (one tree shape per step for every row).

    cache_policy: a bounded draft cache (`streaming.StreamingCache`), cut when the cache is advanced
    to the next sequence (between steps, never while a tree is drafted), independently of the
    target's. It changes only what the draft proposes, never the output. One sequence only:
    `draft_rows` refuses it (a ragged cache is never cut).

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
        self._shift = 0  # subtracted from a sequence index to get its position id (policy positions "cache")
        self._fed: list[Path] = []  # the tree nodes fed after them, by rank path, in cache order
        self._tree = Tree(())  # the last tree drafted (`draft`)
        self._rows: RaggedCache | None = None  # `draft_rows`: row b's sequence in row b
        self._rows_committed: list[list[int]] = []  # each row's sequence in `_rows`
        self._rows_fed: list[list[Path | None]] = []  # each row's scratch columns this step: its nodes, None padding
        self.evictions = 0

    def kv_bytes(self) -> int:
        return kv_bytes(self._cache) + kv_bytes(None if self._rows is None else self._rows.cache)

    @property
    def _held(self) -> int:
        """Positions of the committed sequence the cache holds."""
        return len(self._committed) - self._evicted

    def check_request(self, tree: Tree, sampling: SamplingConfig) -> None:
        if not sampling.greedy and tree.has_rank_gaps:
            raise ValueError(
                "sampling needs a tree whose sibling ranks have no gaps (0..k-1): a model "
                "drafter's rank-r child is its r-th draw without replacement from q"
            )
        if self.confidence_threshold > 0.0 and tree != Tree.chain(tree.num_nodes):
            raise ValueError(f"confidence_threshold applies to chains; got a tree of {tree.describe()}")

    def check_rows(self) -> None:
        """Raise ValueError if this drafter cannot draft rows together (`draft_rows`)."""
        check_batched(self)
        if self.cache_policy is not None:
            raise ValueError(
                f"cache_policy ({self.cache_policy}) bounds the draft cache of one sequence; rows drafted "
                "together (draft_rows, speculative_generate_batch) share a ragged cache that is never cut: "
                "leave cache_policy out, or generate each prompt alone (speculative_generate)"
            )
        if self.confidence_threshold > 0.0:
            raise ValueError(
                f"confidence_threshold ({self.confidence_threshold}) shapes one sequence's chain; rows drafted "
                "together (draft_rows, speculative_generate_batch) fill one tree shape: leave it at 0, or "
                "generate each prompt alone (speculative_generate)"
            )

    def _head_k(self, tree: Tree, sampling: SamplingConfig) -> list[int]:
        """k at each depth's parents (and 0 after the last): the TopKHead's exact top k, the children
        chosen there, where it ranks (greedy, no confidence threshold); 0: the model's own head."""
        ranked = self.head is not None and sampling.greedy and self.confidence_threshold == 0.0
        return [lv.width if ranked else 0 for lv in tree.levels] + [0]

    @torch.inference_mode()
    def draft(
        self, tokens: torch.Tensor, tree: Tree, sampling: SamplingConfig, generator: torch.Generator | None = None
    ) -> Draft:
        """tokens: long [1, T] or [T], the sequence so far; its last token is the tree's root."""
        self.check_request(tree, sampling)
        k, self._tree, self._rows = self._head_k(tree, sampling), tree, None  # one sequence: its own cache

        def feed(level: Level, ids: torch.Tensor) -> torch.Tensor:  # ids long [F] -> logits [F, V]
            paths = [[tree.paths[i] for i in level.fed]]
            return self._feed_nodes(paths, ids[None], level.depth, k[level.depth], causal=True)[0]

        root = self._advance(tokens.reshape(-1).tolist(), k[0])  # [V]
        return fill_levels(tree, root[None], sampling, generator, feed, self.confidence_threshold, self.draw)

    @torch.inference_mode()
    def draft_rows(
        self,
        sequences: Sequence[Sequence[int]],
        tree: Tree,
        sampling: SamplingConfig,
        generators: Sequence[torch.Generator | None],
        depths: Sequence[int] | None = None,
    ) -> list[Draft]:
        """Each row's draft (tokens long [N], q float32 [N + 1, V] or None when greedy) for the rows'
        sequences (each ending with its root), one tree shape for all. The first call after `reset`
        starts the batch: its rows' prompts go into the ragged cache. depths: unused (a row's draft of
        a cut tree is the first nodes of its draft of the whole: the loop cuts them)."""
        self.check_rows()
        self.check_request(tree, sampling)
        k = self._head_k(tree, sampling)

        def feed(level: Level, ids: torch.Tensor) -> torch.Tensor:  # ids long [B, F] -> logits [B, F, V]
            paths = [tree.paths[i] for i in level.fed]
            return self._feed_nodes([paths] * len(sequences), ids, level.depth, k[level.depth])

        logits = self._advance_rows(sequences, k[0])  # [B, V]
        self._tree = tree
        draft = fill_levels(tree, logits[:, None], sampling, generators, feed, draw=self._draw_rows)
        return [Draft(draft.tokens[r], None if draft.q is None else draft.q[r]) for r in range(len(sequences))]

    def keep_rows(self, rows: list[int]) -> None:
        """Only these rows stay in the batch (`draft_rows`), in this order."""
        if self._rows is None:  # nothing drafted yet: the first `draft_rows` makes the batch of its rows
            return
        discard(self._rows)  # the nodes of a draft no `observe_rows` kept
        select_rows(self._rows, rows)
        self._rows_committed = [self._rows_committed[b] for b in rows]
        self._rows_fed = [self._rows_fed[b] for b in rows]

    def observe_rows(self, drafts: list[Draft], results: list[Acceptance]) -> None:
        """`observe` row by row: each row's accepted nodes that were fed this step join its sequence
        (`ragged.commit` moves their columns after its tokens) and the rest of the step's columns go,
        so the next `draft_rows` feeds a row only its root. A caller that does not observe loses
        nothing: the next `draft_rows` drops the step's columns and feeds what each row lacks."""
        keep = []
        for r, (draft, result) in enumerate(zip(drafts, results)):
            paths = (self._tree if draft.tree is None else draft.tree).paths
            slot = {path: column for column, path in enumerate(self._rows_fed[r]) if path is not None}
            kept = list(itertools.takewhile(slot.__contains__, (paths[i] for i in result.path)))
            keep.append([slot[path] for path in kept])
            self._rows_committed[r] += result.tokens[: len(kept)]
        commit(self._rows, keep)
        self._rows_fed = [[] for _ in keep]

    def draw(self, probs: torch.Tensor, level: Level, generator: torch.Generator | None) -> torch.Tensor:
        """Sampling: the children of `level`'s parents (`draw_children`); a subclass may draw otherwise."""
        return draw_children(probs, level, generator)

    def _draw_rows(
        self, probs: torch.Tensor, level: Level, generators: Sequence[torch.Generator | None]
    ) -> torch.Tensor:
        """Sampling, rows drafted together (probs [B, P, V]): each row's `draw` with its own generator."""
        return torch.stack([self.draw(probs[i], level, g) for i, g in enumerate(generators)])

    def _feed_nodes(
        self, levels: list[list[Path]], ids: torch.Tensor, depth: int, k: int = 0, causal: bool = False
    ) -> torch.Tensor:
        """Feed in one forward each row's tree nodes of `depth` (levels[r], by rank path; ids long [B, W],
        row r's first len(levels[r]) its nodes' tokens, the rest padding) at its root's position +
        depth: each sees its row's sequence, its fed ancestors and itself. Returns logits [B, W, V],
        from the TopKHead with its top k exact where k > 0, else the model's head's (model dtype).
        One sequence (`draft`): B = 1 on the draft's own cache, where causal=True lets a single node
        that sees all the cache, at its next position, take the model's own causal path."""
        head = self.head if k else None
        if self._rows is not None:
            return self._feed_rows(levels, ids, depth, head, k)
        (paths,) = levels
        visible = paths_visible(paths, self._fed, self._held)  # [F, cache + F]
        position = len(self._committed) - 1 + depth - self._shift
        self._fed += paths
        if causal and visible.all() and position == cache_length(self._cache):
            visible = None
        positions = torch.full((len(paths),), position)  # host: moved by forward
        return forward(self.model, self._cache, ids[0], positions, visible, head=head, k=k)[None]

    def _feed_rows(
        self, levels: list[list[Path]], ids: torch.Tensor, depth: int, head: TopKHead | None, k: int
    ) -> torch.Tensor:
        """`_feed_nodes` on the ragged cache: the block appended to the step's scratch columns."""
        b, width = ids.shape
        scratch = self._rows.width - self._rows.base  # columns fed earlier this step
        visible = torch.zeros(b, width, scratch + width, dtype=torch.bool)  # host: moved by block_forward
        valid = torch.zeros(b, width, dtype=torch.bool)  # host
        masks: dict[tuple, torch.Tensor] = {}  # rows of one tree shape share their level's mask
        for r, paths in enumerate(levels):
            key = (tuple(paths), tuple(self._rows_fed[r]))
            if key not in masks:
                masks[key] = paths_visible(paths, self._rows_fed[r], 0)
            visible[r, : len(paths), : scratch + len(paths)] = masks[key]
            valid[r, : len(paths)] = True
            self._rows_fed[r] += paths + [None] * (width - len(paths))
        positions = (torch.tensor(self._rows.lengths) - 1 + depth)[:, None].expand(b, width)  # host
        return block_forward(self.model, self._rows, ids, positions, visible, valid, head=head, k=k)

    def _advance(self, seq: list[int], k: int = 0) -> torch.Tensor:
        """Bring the cache to `seq`, feeding only what it lacks (the root, seq[-1], always: its logits
        are read); float32 logits [V] at the root (top `k` exact from the TopKHead where k > 0, else
        the model's own head's)."""
        keep = len(os.path.commonprefix([self._committed, seq[:-1]]))  # committed tokens `seq` shares
        if self._cache is None or (self._evicted and keep < len(self._committed)):  # a cut cache cannot be rewound
            self._cache, self._committed, self._evicted, self._shift, keep = new_cache(self.model), [], 0, 0, 0
        crop(self._cache, keep - self._evicted)  # drops the last tree's nodes and anything not shared
        self._committed, self._fed = seq[:keep], []
        if self.cache_policy is not None:
            self._cut()
        positions = torch.arange(keep, len(seq)) - self._shift  # host: moved by forward
        new = torch.tensor(seq[keep:])  # host: moved by forward
        logits = forward(self.model, self._cache, new, positions, logits_to_keep=1, head=self.head if k else None, k=k)
        self._committed = list(seq)
        return logits[-1].float()

    def _advance_rows(self, sequences: Sequence[Sequence[int]], k: int = 0) -> torch.Tensor:
        """`_advance` for every row on the ragged cache (made at the batch's first call), in one
        forward: float32 logits [B, V] at each root. A row whose sequence departs from what its row
        holds (a text re-encoded from an earlier point) keeps the common prefix and is fed from there."""
        if self._rows is None:
            self._rows = RaggedCache.empty(self.model, len(sequences))
            self._rows_committed = [[] for _ in sequences]
        discard(self._rows)  # the nodes of a draft no `observe_rows` kept
        new = []
        for b, seq in enumerate(sequences):
            keep = len(os.path.commonprefix([self._rows_committed[b], list(seq[:-1])]))  # the root is fed again
            if keep < len(self._rows_committed[b]):
                truncate(self._rows, b, keep)
            new.append(list(seq[keep:]))
        block, columns = causal_block(self._rows, new)
        logits = block_forward(self.model, self._rows, *block, logits_to_keep=1, head=self.head if k else None, k=k)
        commit(self._rows, columns)
        self._rows_committed = [list(seq) for seq in sequences]
        self._rows_fed = [[] for _ in sequences]
        return logits[:, -1].float()

    def _cut(self) -> None:
        """The cache policy's cut, between steps (never while a tree is drafted)."""
        cut = self.cache_policy.cut(self.model, self._cache)
        self._evicted, self.evictions = self._evicted + cut, self.evictions + (cut > 0)
        self._shift += cut if self.cache_policy.positions == "cache" else 0

    def observe(self, draft: Draft, acceptance: Acceptance) -> None:
        """The accepted nodes that were fed join the committed sequence: their keys and values are the
        ones the sequence gives them (they saw the sequence and their ancestors, at its positions)."""
        paths = (self._tree if draft.tree is None else draft.tree).paths
        slot = {path: self._held + i for i, path in enumerate(self._fed)}
        kept = list(itertools.takewhile(slot.__contains__, (paths[i] for i in acceptance.path)))
        if kept:
            keep_positions(self._cache, [*range(self._held), *(slot[path] for path in kept)])
            self._committed += acceptance.tokens[: len(kept)]
        self._fed = []


def check_batched(drafter: Drafter) -> None:
    """Raise ValueError for a drafter that drafts on the target's own cache (a batch has none)."""
    if drafter.shares_target_cache:
        raise ValueError(
            f"{type(drafter).__name__} drafts on the target's own cache, which a batch does not have "
            "(its rows share one ragged cache); run it at batch size 1 (speculative_generate)"
        )


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
    generator: Any,
    feed: Callable[[Level, torch.Tensor], torch.Tensor],
    confidence_threshold: float = 0.0,
    draw: Callable[[torch.Tensor, Level, Any], torch.Tensor] | None = None,
) -> Draft:
    """Fill `tree` level by level (`Tree.levels`), for every drafter that drafts from a model of its own.

    logits: float [..., 1, V] at the root, for one sequence ([1, V]) or a batch of rows ([B, 1, V],
    `core.batch`). At each depth the children of every parent are chosen at once from the logits at
    the parents: greedy, the top `width` tokens (`top_tokens`: rank r = the r-th largest); sampling,
    draws without replacement from q (`draw(probs, level, generator)`, default `draw_children`; the
    generator is passed through as given). Then `feed(level, tokens)` runs the level's nodes that
    have children (long [..., F]) and returns their logits [..., F, V]; leaves are chosen, never fed.
    Returns tokens [..., N] and q [..., N + 1, V]. confidence_threshold > 0 (one chain): stop after
    the first token whose q is below it."""
    n, device, draw = tree.num_nodes, logits.device, draw or draw_children
    rows_shape = logits.shape[:-2]  # () for one sequence, (B,) for a batch
    out = torch.zeros(*rows_shape, n, dtype=torch.long, device=device)
    q = None
    if not sampling.greedy:
        q = torch.zeros(*rows_shape, n + 1, logits.shape[-1], dtype=torch.float32, device=device)
    rows = torch.zeros(1, dtype=torch.long, device=device)  # the parents' rows in q (0 = the root)
    for level, (parents, ranks, fed) in zip(tree.levels, level_indices(tree, device)):
        if q is None:
            choices = top_tokens(logits, level.width)  # [..., P, width]
        else:
            q[..., rows, :] = probabilities(logits, sampling)
            choices = draw(q[..., rows, :], level, generator)
        out[..., level.nodes.start : level.nodes.stop] = choices[..., parents, ranks]
        if confidence_threshold > 0.0 and level.depth < n:  # one chain: one node per level
            row = torch.softmax(logits[0], -1) if q is None else q[rows[0]]
            if float(row[out[level.depth - 1]]) < confidence_threshold:
                depth = level.depth
                return Draft(out[:depth], None if q is None else q[: depth + 1], Tree.chain(depth))
        if not level.fed:
            break
        logits = feed(level, out[..., fed]).float()
        rows = fed + 1
    return Draft(out, q)


def draw_children(probs: torch.Tensor, level: Level, generator: torch.Generator | None) -> torch.Tensor:
    """Long [P, width]: `level.width` draws without replacement from each parent's row of q (probs
    [P, V]; rank r = the r-th draw, Sequoia's rule, so `acceptance.speculative_accept` stays lossless)."""
    return sample_without_replacement(probs, level.width, generator)
