"""Replay many: the acceptance of every tree shape and budget from one collection, no model run.

Greedy decoding. The output of exact speculative decoding is the target's greedy continuation
c_0, c_1, ... whatever the tree. At a step that starts with t tokens generated, `greedy_accept`
walks down from the root taking the child whose token is c_t, then c_{t+1}, ...; the child of
rank r is the draft's r-th most likely token there. So the step accepts the longest prefix of the
*continuation rank path* (r_t, r_{t+1}, ...) that is a node path of the tree, where r_j is the rank
of c_j under the draft after c_{<j}, collected once (`experiments.collect`). That gives the acceptance
of every rank-path tree at every position without running the target on any tree. The real loop's
two caps are replayed too: the tree is truncated to depth max_new_tokens - t - 1, and a step ends
at EOS (ranks past the continuation's end count as no match). "Run trajectory" positions are those
a real run visits (t = 0, then t += tokens added); "all positions" are every t.

Medusa heads fill depth d of a step with head d's ranks, all read from the hidden state before
the step's root, so the rank path of a step starting at t is (R[t, 0], R[t, 1], ...) with R[t, d-1]
= the rank of c_{t+d-1} under head d there, not a shift of one sequence; an EAGLE head's R[t, d-1]
is the rank of c_{t+d-1} at depth d of its chain along the continuation. A collection of heads
stores R (`PromptData.head_ranks`, `analysis.head_collection`; depth <= the collected depth, a
deeper static tree is refused) and every static-tree replay, the oracle, the acceptance vector
(depth 1's) and the prefix counts read it in place of the shift.

Dynamic trees (EAGLE-2-style, Li et al. 2024) need the collected super-trees: the dynamic tree of
budget n is *defined* as the top-n nodes of the super-tree in the order (cumulative log q
descending, then canonical (depth, path)); a child never precedes its parent in that order, so
every top-n is a tree and, for n <= M, the top-n of the pruned super-tree equal those of the full
expansion. `DynamicTreeDrafter` builds the same trees (a test checks it step by step). Greedy replay
of a dynamic tree accepts the leading on-path nodes (tokens c_t, c_{t+1}, ...) among its n nodes.

The per-position oracle (`oracle`) accepts, at each position, the longest prefix of the
continuation's rank path whose ranks are all below K (a parameter, at most the collection's top_k),
capped at the budget n: what the best tree of n nodes drawn from the draft's top-K children could
accept there, chosen with hindsight per position. No static or dynamic tree within those ranks can
accept more; a large K makes the bound loose.

Sampling. Node v of a gap-free subtree of the cover tree is accepted with probability P(v) =
P(parent) * prod_{j<i}(1 - alpha_j) * alpha_i at its parent (alphas from `experiments.collect`), so
the expected accepted length of any gap-free subtree of the sampled tree is sum_v P(v); replay
averages over samples and positions, with a normal-approximation confidence interval over
positions. EOS inside a step is not modelled in sampling mode.

Metric conventions (`analysis.metrics`): acceptance_rate = accepted / drafted, acceptance_length =
accepted draft tokens per step (bonus EXCLUDED), tau = tokens per target call (bonus INCLUDED),
depth_d_acceptance = P(accepted >= d), rank_r_acceptance = Sequoia's acceptance vector. The end of
the generation enters two columns: `cut_steps`, steps whose tree the depth cap cut (they draft fewer
nodes: "drafted" counts the nodes verified, so rate = accepted / drafted still holds), and
`no_bonus_steps`, steps that accepted up to the continuation's end (EOS) and so added no bonus token:
tau = 1 + acceptance_length - no_bonus_steps / steps, exactly, on every row.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..core.generation import Step
from ..core.trees import Path, Tree
from . import spread
from .collection import Collection

# ---- replay: positions and per-node acceptance -------------------------------------------------


@dataclass(frozen=True)
class _Positions:
    """Every position of every prompt, concatenated (T in all)."""

    prompt: np.ndarray  # int [T], index into collection.prompts
    t: np.ndarray  # int [T], tokens generated before the step
    left: np.ndarray  # int [T], continuation tokens from t on
    cap: np.ndarray  # int [T], the real loop's depth limit max_new_tokens - t - 1
    offsets: np.ndarray  # int [prompts + 1], where each prompt's positions start

    def ranks(self, collection: Collection, depth: int) -> np.ndarray:
        """Int [T, depth]: the continuation rank path from each position; top_k (out) past its end."""
        out = np.full((len(self.t), depth), collection.config.top_k, dtype=np.int64)
        for i, p in enumerate(collection.prompts):
            lo, hi = self.offsets[i], self.offsets[i + 1]
            if p.head_ranks is not None:  # Medusa: depth d's rank depends on (t, d), not on t + d alone
                width = min(depth, p.head_ranks.shape[1])
                out[lo:hi, :width] = np.minimum(
                    p.head_ranks[: hi - lo, :width].astype(np.int64), collection.config.top_k
                )
                continue
            ranks = np.minimum(p.ranks[: hi - lo].astype(np.int64), collection.config.top_k)
            padded = np.concatenate([ranks, np.full(depth, collection.config.top_k)])
            for d in range(depth):
                out[lo:hi, d] = padded[d : d + hi - lo]
        return out


def _positions(collection: Collection, max_new_tokens: int | None) -> _Positions:
    cfg = collection.config
    max_new = cfg.max_new_tokens if max_new_tokens is None else int(max_new_tokens)
    if max_new > cfg.max_new_tokens and not all(p.stopped for p in collection.prompts):
        raise ValueError(f"the collection holds {cfg.max_new_tokens} tokens per prompt; cannot replay {max_new}")
    lengths = [min(len(p.tokens), max_new) for p in collection.prompts]
    t = np.concatenate([np.arange(n) for n in lengths]) if lengths else np.zeros(0, dtype=np.int64)
    prompt = np.repeat(np.arange(len(lengths)), lengths)
    left = np.array(lengths)[prompt] - t
    return _Positions(prompt, t, left, max_new - t - 1, np.concatenate([[0], np.cumsum(lengths)]))


@dataclass(frozen=True)
class _Nodes:
    """Trees per position (one tree broadcast, or one per position) and each node's acceptance
    probability there (0/1 when greedy). Arrays [T, N]; invalid slots have valid = False."""

    depth: np.ndarray
    rank: np.ndarray
    parent: np.ndarray  # -1 = the root
    valid: np.ndarray
    prob: np.ndarray  # float [T, N] (mean over draft samples in sampling mode)
    tokens: np.ndarray  # float [T]: tokens the step adds (greedy: cut at EOS; sampling: 1 + E[accepted])


def _static(tree: Tree, positions: _Positions, prob: np.ndarray, tokens: np.ndarray) -> _Nodes:
    t = len(positions.t)
    shape = (t, tree.num_nodes)
    return _Nodes(
        depth=np.broadcast_to(np.array(tree.depths, dtype=np.int64), shape),
        rank=np.broadcast_to(np.array(tree.ranks, dtype=np.int64), shape),
        parent=np.broadcast_to(np.array(tree.parents, dtype=np.int64), shape),
        valid=np.ones(shape, dtype=bool),
        prob=prob,
        tokens=tokens,
    )


def _greedy_static(collection: Collection, tree: Tree, positions: _Positions) -> _Nodes:
    """Walk each position's continuation rank path down `tree` (capped like the real loop)."""
    _check_greedy(collection)
    top_k = collection.config.top_k
    if tree.num_nodes and max(tree.ranks) >= top_k:
        raise ValueError(f"tree uses rank {max(tree.ranks)}; this collection stored ranks < {top_k} only")
    heads = (
        collection.prompts[0].head_ranks.shape[1]
        if collection.prompts and collection.prompts[0].head_ranks is not None
        else None
    )
    if heads is not None and tree.depth > heads:
        raise ValueError(
            f"a tree of depth {tree.depth} on a head collection of depth {heads} "
            f"(`analysis.head_collection`): its nodes below depth {heads} were never ranked; "
            f"cut the tree (tree.truncated({heads})) or collect deeper"
        )
    child = np.zeros((tree.num_nodes + 1, top_k + 1), dtype=np.int64)  # row -> node index + 1, 0 = none
    for i, (parent, rank) in enumerate(zip(tree.parents, tree.ranks)):
        child[parent + 1, rank] = i + 1
    ranks = positions.ranks(collection, max(tree.depth, 1))
    n = len(positions.t)
    row = np.zeros(n, dtype=np.int64)
    prob = np.zeros((n, tree.num_nodes))
    accepted = np.zeros(n, dtype=np.int64)
    for d in range(1, tree.depth + 1):
        nxt = child[row, ranks[:, d - 1]]
        alive = (nxt > 0) & (row > 0 if d > 1 else True) & (d <= positions.cap)
        prob[np.nonzero(alive)[0], nxt[alive] - 1] = 1.0
        accepted += alive
        row = np.where(alive, nxt, 0)
    tokens = np.minimum(accepted + 1, positions.left)  # EOS, the continuation's last token, ends a step
    return _static(tree, positions, prob, tokens.astype(float))


def _sampled_static(collection: Collection, tree: Tree, positions: _Positions) -> tuple[_Nodes, np.ndarray]:
    """Node acceptance probabilities of a gap-free subtree of the cover tree, averaged over draft
    samples; also the expected accepted length per (position, sample), float [T, R]."""
    cover = collection.config.cover
    if tree.has_rank_gaps:
        raise ValueError("sampling replays gap-free trees only (sibling ranks 0..k-1)")
    row_of = {p: i + 1 for i, p in enumerate(cover.paths)}
    missing = [p for p in tree.paths if p not in row_of]
    if missing:
        raise ValueError(f"tree nodes {missing[:4]} are not in the collected cover tree {collection.config.cover_tree}")
    alpha = np.concatenate(
        [p.alpha[: hi - lo] for p, lo, hi in zip(collection.prompts, positions.offsets[:-1], positions.offsets[1:])]
    )  # [T, R, N_c + 1, K]
    reject_before = np.cumprod(
        np.concatenate([np.ones(alpha.shape[:3] + (1,)), 1.0 - alpha[..., :-1]], axis=-1), axis=-1
    )
    reach = reject_before * alpha  # [T, R, rows, K]: child i of the row is the accepted one
    n, r = alpha.shape[:2]
    prob = np.zeros((n, r, tree.num_nodes))
    for i, (path, parent, rank) in enumerate(zip(tree.paths, tree.parents, tree.ranks)):
        parent_row = 0 if parent < 0 else row_of[tree.paths[parent]]
        above = 1.0 if parent < 0 else prob[:, :, parent]
        prob[:, :, i] = above * reach[:, :, parent_row, rank] * (len(path) <= positions.cap)[:, None]
    per_sample = prob.sum(-1)
    return _static(tree, positions, prob.mean(1), 1.0 + per_sample.mean(1)), per_sample


def _positions_array(collection: Collection, positions: _Positions, name: str) -> np.ndarray:
    """A per-position array of the prompts (a `PromptData` field), concatenated over `positions`."""
    spans = np.diff(positions.offsets)
    return np.concatenate([getattr(p, name)[:n] for p, n in zip(collection.prompts, spans)])


def _dynamic(collection: Collection, budget: int, positions: _Positions) -> _Nodes:
    """Greedy acceptance of the top-`budget` dynamic trees (super-trees needed)."""
    _check_greedy(collection)
    if not collection.has_super_trees:
        raise ValueError("this collection has no super-trees: collect with super_k > 0")
    if any(p.super_size is None for p in collection.prompts):
        raise ValueError("some prompts have no super-trees: replay dynamic trees on collection.super_tree_prompts()")
    size = collection.config.super_size
    if budget > size:
        raise ValueError(f"budget {budget} exceeds the collected super-tree size {size}")
    cat = lambda name: _positions_array(collection, positions, name)  # noqa: E731
    on_path = cat("super_on_path").astype(np.int64)  # [T, D]
    depths = np.arange(1, on_path.shape[1] + 1)
    inside = np.cumprod((on_path < budget) & (depths <= positions.cap[:, None]), axis=1).astype(bool)
    n = np.minimum(cat("super_size").astype(np.int64), budget)
    valid = np.arange(budget)[None, :] < n[:, None]
    prob = np.zeros(valid.shape)
    rows, cols = np.nonzero(inside)
    prob[rows, on_path[rows, cols]] = 1.0
    accepted = inside.sum(1)
    return _Nodes(
        depth=cat("super_depth")[:, :budget].astype(np.int64),
        rank=cat("super_rank")[:, :budget].astype(np.int64),
        parent=cat("super_parent")[:, :budget].astype(np.int64),
        valid=valid,
        prob=prob,
        tokens=np.minimum(accepted + 1, positions.left).astype(float),
    )


def sglang_pool(
    parent: np.ndarray, rank: np.ndarray, depth: np.ndarray, steps: int, topk: int
) -> tuple[np.ndarray, np.ndarray]:
    """The nodes SGLang's EAGLE drafter puts in its pool, as indices into one position's super-tree
    (nodes in score order, `super_*` arrays cut to its size), best first: the root's top-`topk`
    children, then for `steps` - 1 more levels every frontier node's top-`topk` children, of which
    the `topk` best by cumulative probability form the next frontier (SGLang's select_top_k_tokens
    and organize_draft_results: docs/engines.md). The
    first num_draft_tokens - 1 of the pool are verified. Also the frontier nodes whose children were
    drafted (levels 1 .. steps - 1). Nodes the super-tree lacks score below all it holds, so the pool's
    head is exact wherever the pool holds at least the nodes verified."""
    inside = (depth == 1) & (rank < topk)
    frontier = np.flatnonzero(inside)
    expanded = [frontier]
    for d in range(2, steps + 1):
        candidates = (depth == d) & (rank < topk) & np.isin(parent, frontier)
        inside |= candidates
        frontier = np.flatnonzero(candidates)[:topk]
        expanded.append(frontier)
    return np.flatnonzero(inside), np.concatenate(expanded[:-1]) if steps > 1 else np.zeros(0, dtype=np.int64)


def _sglang(collection: Collection, budget: int, positions: _Positions, steps: int, topk: int) -> _Nodes:
    """Greedy acceptance of SGLang's tree with --speculative-num-steps `steps`, --speculative-eagle-topk
    `topk` and --speculative-num-draft-tokens `budget` + 1 (`sglang_pool`), from the super-trees."""
    _check_greedy(collection)
    if not collection.has_super_trees:
        raise ValueError("this collection has no super-trees: collect with super_k > 0")
    config = collection.config
    if steps > config.super_depth or topk > config.super_k:
        raise ValueError(
            f"SGLang flags steps={steps}, topk={topk} need super-trees of depth >= {steps} and >= {topk} children "
            f"per node; this collection has depth {config.super_depth}, {config.super_k} children"
        )
    cat = lambda name: _positions_array(collection, positions, name)  # noqa: E731
    parent, rank, depth, size = (cat(f"super_{n}").astype(np.int64) for n in ("parent", "rank", "depth", "size"))
    on_path = cat("super_on_path").astype(np.int64)  # [T, D]
    count = len(positions.t)
    out = {name: np.zeros((count, budget), dtype=np.int64) for name in ("depth", "rank", "parent")}
    valid, prob = np.zeros((count, budget), dtype=bool), np.zeros((count, budget))
    accepted = np.zeros(count, dtype=np.int64)
    short = 0
    path_ranks = positions.ranks(collection, min(steps, on_path.shape[1]))  # the continuation's ranks from t
    for t in range(count):
        n = size[t]
        pool, expanded = sglang_pool(parent[t, :n], rank[t, :n], depth[t, :n], steps, topk)
        chosen = pool[:budget]
        where = {int(node): i for i, node in enumerate(chosen)}
        k = len(chosen)
        out["depth"][t, :k], out["rank"][t, :k] = depth[t, chosen], rank[t, chosen]
        out["parent"][t, :k] = [where.get(int(q), -1) for q in parent[t, chosen]]
        valid[t, :k] = True
        prev, fed = -1, set(expanded.tolist())  # the last accepted on-path node (-1: the root), the nodes fed
        for d in range(min(on_path.shape[1], positions.cap[t], steps)):
            node = int(on_path[t, d])
            if node not in where:
                # a pruned super-tree (fewer pool nodes held than verified) lacks a pool node that may be
                # verified: undecidable exactly when the on-path node is missing yet in the pool
                missing_in_pool = node >= n and path_ranks[t, d] < topk and (prev < 0 or prev in fed)
                short += k < budget and n == config.super_size and missing_in_pool
                break
            prob[t, where[node]] = 1.0
            accepted[t] += 1
            prev = node
    if short:
        raise ShortSuperTrees(
            f"SGLang flags steps={steps}, topk={topk}, {budget} draft tokens: at {short} positions the collected "
            f"super-trees ({config.super_size} nodes) hold fewer pool nodes than are verified and lack the "
            "continuation's node, which SGLang may verify; collect larger ones (super_size) or use a smaller budget"
        )
    return _Nodes(**out, valid=valid, prob=prob, tokens=np.minimum(accepted + 1, positions.left).astype(float))


def sglang_flags(super_k: int, super_depth: int, budgets: Iterable[int]) -> list[tuple[int, int, int]]:
    """(steps, topk, budget) SGLang accepts and a collection of these super-trees can replay: steps in
    1..super_depth, topk in 1, 2, 4, ... up to super_k, num_draft_tokens - 1 = budget within the pool
    (topk + (steps - 1) topk^2 nodes); topk 1 only with budget = steps (SGLang's server sets
    num_draft_tokens = steps + 1 when topk is 1)."""
    widths = [k for k in (1, 2, 4, 8, 16, 32) if k <= super_k]
    out = []
    for n in budgets:
        for steps in range(1, super_depth + 1):
            for k in widths:
                fits = n <= k + (steps - 1) * k * k and (k > 1 or n == steps) and steps <= n
                if fits:
                    out.append((steps, k, int(n)))
    return out


def trtllm_flags(super_k: int, super_depth: int, budgets: Iterable[int]) -> list[tuple[int, int, int]]:
    """(max_draft_len, dynamic_tree_max_topK, max_total_draft_tokens) TensorRT-LLM's dynamic tree accepts
    and these super-trees can replay: depth D in 1..super_depth, K in 2, 4, ... up to super_k (K = 1 runs
    its linear worker instead: a chain of D, with N = D), N = budget in [D, K x D] (its config's check,
    `llm_args.py`). Its tree is SGLang's rule (docs/engines.md), so `replay_sglang` replays it."""
    widths = [k for k in (1, 2, 4, 8, 16, 32) if k <= super_k]
    out = []
    for n in budgets:
        for depth in range(1, super_depth + 1):
            for k in widths:
                if (k > 1 and depth <= n <= k * depth) or (k == 1 and n == depth):
                    out.append((depth, k, int(n)))
    return out


def replay_sglang(
    collection: Collection,
    flags: Iterable[tuple[int, int, int]],
    mode: str = "all",
    max_new_tokens: int | None = None,
    per_prompt: bool = False,
    engine: str = "sglang",
) -> pd.DataFrame:
    """Metrics of SGLang's trees, one row per (steps, topk, budget) of `flags` (`sglang_flags`), shape
    "<engine>:<steps>x<topk>", on the prompts collected with super-trees (TensorRT-LLM's dynamic tree is
    the same rule: engine "tensorrt_llm", flags `trtllm_flags`). One level (steps 1) is the root's top
    n, the static wide:n, and topk 1 a chain of n: both replayed from the collected ranks. Other flags
    the super-trees are too small to replay exactly are left out, each said in the frame's
    attrs["skipped"]."""
    collection = collection.super_tree_prompts()
    positions = _positions(collection, max_new_tokens)
    rows, skipped = [], []
    for steps, topk, n in flags:
        label = {"shape": f"{engine}:{steps}x{topk}", "budget": n, "nodes": n, "depth": steps}
        try:
            if steps == 1 or topk == 1:  # the root's top n (wide:n), or a chain of n: static, from the ranks
                nodes = _nodes(collection, Tree.wide(n) if steps == 1 else Tree.chain(n), positions)
            else:
                nodes = _sglang(collection, n, positions, steps, topk)
            per = _per_position(nodes, positions.cap)
        except ShortSuperTrees as e:
            skipped.append(str(e))
            continue
        rows += _rows(collection, label | {"num_steps": steps, "topk": topk}, per, positions, mode, per_prompt)
    out = pd.DataFrame(rows)
    out.attrs["skipped"] = skipped
    return out


class ShortSuperTrees(ValueError):
    """The collected super-trees are too small to replay SGLang's tree of some flags exactly."""


def _oracle(collection: Collection, budget: int, positions: _Positions, k: int) -> _Nodes:
    """At each position, the accepted chain of the per-position oracle: the longest prefix of the
    continuation's rank path with every rank below k, capped at `budget` and at the loop's depth
    cap. Its "tree" is that chain."""
    _check_greedy(collection)
    if not 1 <= k <= collection.config.top_k:
        raise ValueError(
            f"the oracle's rank limit k must lie in 1..{collection.config.top_k} (the ranks collected), got {k}"
        )
    depth = max(budget, 1)
    ranks = positions.ranks(collection, depth)  # [T, depth]; top_k = out, and past the end
    depths = np.arange(1, depth + 1)
    inside = np.cumprod((ranks < k) & (depths <= positions.cap[:, None]), axis=1).astype(bool)
    shape = ranks.shape
    return _Nodes(
        depth=np.broadcast_to(depths, shape),
        rank=np.where(inside, ranks, 0),
        parent=np.broadcast_to(np.arange(-1, depth - 1), shape),
        valid=inside,
        prob=inside.astype(float),
        tokens=np.minimum(inside.sum(1) + 1, positions.left).astype(float),
    )


def _nodes(collection: Collection, tree: Tree | int, positions: _Positions) -> _Nodes:
    """The nodes of `tree` at every position: a static tree's (expected over the draft samples of a
    sampling collection), or for an int n the dynamic tree of budget n (greedy; super-trees needed)."""
    if not isinstance(tree, Tree):
        return _dynamic(collection, int(tree), positions)
    if collection.sampling:
        return _sampled_static(collection, tree, positions)[0]
    return _greedy_static(collection, tree, positions)


def _check_greedy(collection: Collection) -> None:
    if collection.config.cross_tokenizer:
        raise ValueError(
            "a cross-tokenizer collection holds no draft ranks of the target's tokens: its trees are "
            "re-drafted (analysis.redraft)"
        )
    if collection.sampling:
        raise ValueError("this is a sampling collection; greedy replay needs temperature 0")


# ---- replay: metrics ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _PerPosition:
    """Per-position sums that pool into the metrics (expected values in sampling mode)."""

    drafted: np.ndarray  # [T]
    accepted: np.ndarray  # [T]
    tokens: np.ndarray  # [T]
    tree_depth: np.ndarray  # [T], the truncated tree's depth
    depth_hits: np.ndarray  # [T, D]: P(accepted >= d)
    rank_hits: np.ndarray  # [T, K]: accepted nodes of rank r
    rank_visits: np.ndarray  # [T, K]: visited nodes (root or accepted) with a rank-r child
    cut: np.ndarray  # bool [T]: the end of the generation cut the tree (depth cap max_new_tokens - t - 1)
    no_bonus: np.ndarray  # bool [T]: the step added no bonus token (it accepted up to the continuation's end)


def _per_position(nodes: _Nodes, cap: np.ndarray) -> _PerPosition:
    n, width = nodes.valid.shape
    in_tree = nodes.valid & (nodes.depth <= cap[:, None])
    prob = np.where(in_tree, nodes.prob, 0.0)
    children = np.zeros((n, width + 1), dtype=np.int64)  # [T, root + nodes]
    rows = np.broadcast_to(np.arange(n)[:, None], (n, width))
    np.add.at(children, (rows[in_tree], nodes.parent[in_tree] + 1), 1)
    max_depth = int(nodes.depth[in_tree].max()) if in_tree.any() else 0
    max_rank = int(children.max()) if children.size else 0
    weight = np.concatenate([np.ones((n, 1)), prob], axis=1)  # the root is always visited
    depth_hits = (
        np.stack([(prob * (nodes.depth == d)).sum(1) for d in range(1, max_depth + 1)], axis=1)
        if max_depth
        else np.zeros((n, 0))
    )
    rank_hits = (
        np.stack([(prob * (nodes.rank == r)).sum(1) for r in range(max_rank)], axis=1) if max_rank else np.zeros((n, 0))
    )
    rank_visits = (
        np.stack([(weight * (children > r)).sum(1) for r in range(max_rank)], axis=1) if max_rank else np.zeros((n, 0))
    )
    accepted = prob.sum(1)
    return _PerPosition(
        drafted=in_tree.sum(1).astype(float),
        accepted=accepted,
        tokens=nodes.tokens,
        tree_depth=np.where(in_tree, nodes.depth, 0).max(1) if width else np.zeros(n, dtype=np.int64),
        depth_hits=depth_hits,
        rank_hits=rank_hits,
        rank_visits=rank_visits,
        cut=(nodes.valid & (nodes.depth > cap[:, None])).any(1),
        no_bonus=nodes.tokens < accepted + 1 - 1e-9,
    )


def _trajectory(per: _PerPosition, positions: _Positions) -> np.ndarray:
    """Bool [T]: the positions a real run visits (t = 0, then t += tokens added, per prompt)."""
    keep = np.zeros(len(positions.t), dtype=bool)
    tokens = np.rint(per.tokens).astype(np.int64)
    for lo, hi in zip(positions.offsets[:-1], positions.offsets[1:]):
        i = lo
        while i < hi:
            keep[i] = True
            i += max(int(tokens[i]), 1)
    return keep


def _pool(per: _PerPosition, keep: np.ndarray, sampling: bool) -> dict[str, float | int]:
    steps = int(keep.sum())
    drafted, accepted, tokens = per.drafted[keep].sum(), per.accepted[keep].sum(), per.tokens[keep].sum()
    row: dict[str, float | int] = {
        "steps": steps,
        "drafted": float(drafted),
        "accepted": float(accepted),
        "tokens": float(tokens),
        "acceptance_rate": accepted / drafted if drafted else float("nan"),
        "acceptance_length": accepted / steps if steps else float("nan"),
        "tau": tokens / steps if steps else float("nan"),
        "cut_steps": int(per.cut[keep].sum()),
        "no_bonus_steps": int(per.no_bonus[keep].sum()),
    }
    if sampling:  # normal approximation over positions (each the mean of its draft samples)
        se = float(np.std(per.tokens[keep], ddof=1) / np.sqrt(steps)) if steps > 1 else float("nan")
        row.update(
            {
                "tau_se": se,
                "tau_position_ci_low": row["tau"] - 1.96 * se,
                "tau_position_ci_high": row["tau"] + 1.96 * se,
            }
        )
    depth = int(per.tree_depth[keep].max()) if steps else 0
    for d in range(1, depth + 1):
        row[f"depth_{d}_acceptance"] = float(per.depth_hits[keep, d - 1].sum() / steps)
    visits = per.rank_visits[keep].sum(0)
    for r in range(len(visits)):
        if visits[r] > 0:
            row[f"rank_{r}_acceptance"] = float(per.rank_hits[keep, r].sum() / visits[r])
    return row


def _rows(
    collection: Collection, label: dict, per: _PerPosition, positions: _Positions, mode: str, per_prompt: bool
) -> list[dict]:
    if mode not in ("all", "trajectory"):
        raise ValueError(f"mode must be 'all' or 'trajectory', got {mode!r}")
    if mode == "trajectory" and collection.sampling:
        raise ValueError("sampling replay is over all positions (a sampled trajectory is random)")
    keep = _trajectory(per, positions) if mode == "trajectory" else np.ones(len(positions.t), dtype=bool)
    head = {**label, "mode": mode}
    if not per_prompt:
        row = {**head, "prompts": len(collection.prompts), **_pool(per, keep, collection.sampling)}
        return [{**row, **_intervals(per, keep, positions)}]
    out = []
    for i, p in enumerate(collection.prompts):
        mine = keep & (positions.prompt == i)
        out.append({**head, "prompt_id": p.prompt_id, "category": p.category, **_pool(per, mine, collection.sampling)})
    return out


def _intervals(per: _PerPosition, keep: np.ndarray, positions: _Positions) -> dict[str, float]:
    """tau, acceptance rate and acceptance length, with 95% bootstrap intervals over prompts (`analysis.spread`)."""
    sums = lambda v: np.bincount(positions.prompt[keep], weights=v[keep], minlength=len(positions.offsets) - 1)  # noqa: E731
    steps = np.bincount(positions.prompt[keep], minlength=len(positions.offsets) - 1).astype(float)
    return {
        **spread.interval_columns("tau", sums(per.tokens), steps),
        **spread.interval_columns("acceptance_rate", sums(per.accepted), sums(per.drafted)),
        **spread.interval_columns("acceptance_length", sums(per.accepted), steps),
    }


# ---- replay: public API ------------------------------------------------------------------------


def replay(
    collection: Collection,
    trees: Mapping[tuple[str, int], Tree],
    mode: str = "all",
    max_new_tokens: int | None = None,
    per_prompt: bool = False,
) -> pd.DataFrame:
    """Metrics of every (shape, budget) -> tree on the collection, one row each (or one per prompt).

    mode "all": every position; "trajectory": the positions a real run with that tree visits
    (greedy only). Greedy values are exact counts; sampling values are expectations given the
    collected draft samples, with tau_se and a 95% interval over positions (tau_position_ci_low,
    tau_position_ci_high). Pooled rows carry 95% intervals of tau and acceptance_rate across
    prompts (`analysis.spread`: bootstrap over prompts; NaN below 3 prompts).
    max_new_tokens: replay a shorter generation (default: the collected length).
    """
    positions = _positions(collection, max_new_tokens)
    rows = []
    for (shape, budget), tree in trees.items():
        label = {"shape": shape, "budget": int(budget), "nodes": tree.num_nodes, "depth": tree.depth}
        per = _per_position(_nodes(collection, tree, positions), positions.cap)
        rows += _rows(collection, label, per, positions, mode, per_prompt)
    return pd.DataFrame(rows)


def replay_dynamic(
    collection: Collection,
    budgets: Iterable[int],
    mode: str = "all",
    max_new_tokens: int | None = None,
    per_prompt: bool = False,
) -> pd.DataFrame:
    """Metrics of the dynamic (top-n by cumulative draft log-prob) trees, shape "dynamic", on the
    prompts collected with super-trees (column "prompts" says how many)."""
    collection = collection.super_tree_prompts()
    label = lambda n: {"shape": "dynamic", "budget": n, "nodes": n, "depth": collection.config.super_depth}  # noqa: E731
    return _per_budget(collection, budgets, _dynamic, label, mode, max_new_tokens, per_prompt)


def oracle(
    collection: Collection,
    budgets: Iterable[int],
    mode: str = "all",
    max_new_tokens: int | None = None,
    per_prompt: bool = False,
    k: int | None = None,
) -> pd.DataFrame:
    """The per-position oracle, shape "oracle" (module docstring), with its rank limit in column
    "top_k": at each position, the longest prefix of the continuation's rank path with ranks below k
    (default: every rank collected, the collection's top_k), capped at the budget. It bounds every
    tree of that budget whose nodes are among the draft's top-k children. Its "tree" is that
    accepted chain, so only acceptance_length and tau mean anything (acceptance rate 1 by
    construction)."""
    k = collection.config.top_k if k is None else int(k)
    label = lambda n: {"shape": "oracle", "budget": n, "nodes": n, "depth": n, "top_k": k}  # noqa: E731
    nodes = lambda c, n, positions: _oracle(c, n, positions, k)  # noqa: E731
    return _per_budget(collection, budgets, nodes, label, mode, max_new_tokens, per_prompt)


def _per_budget(
    collection: Collection,
    budgets: Iterable[int],
    nodes_of,
    label_of,
    mode: str,
    max_new_tokens: int | None,
    per_prompt: bool,
) -> pd.DataFrame:
    """Rows of trees that depend on the position (dynamic trees, the oracle), one budget each."""
    positions = _positions(collection, max_new_tokens)
    rows = []
    for n in budgets:
        per = _per_position(nodes_of(collection, int(n), positions), positions.cap)
        rows += _rows(collection, label_of(int(n)), per, positions, mode, per_prompt)
    return pd.DataFrame(rows)


def replay_steps(
    collection: Collection, tree: Tree | int, max_new_tokens: int | None = None
) -> dict[str, tuple[Step, ...]]:
    """Per prompt, the `Step`s a real greedy run with `tree` makes (times 0), from the collection.

    tree: a static tree, or an int n for the dynamic tree of budget n (super-trees needed; the
    prompts collected with them)."""
    _check_greedy(collection)
    if not isinstance(tree, Tree):
        collection = collection.super_tree_prompts()
    positions = _positions(collection, max_new_tokens)
    nodes = _nodes(collection, tree, positions)
    per = _per_position(nodes, positions.cap)
    keep = _trajectory(per, positions)
    out = {}
    for i, p in enumerate(collection.prompts):
        steps = []
        for j in np.nonzero(keep & (positions.prompt == i))[0]:
            in_tree = nodes.valid[j] & (nodes.depth[j] <= positions.cap[j])
            kids = np.bincount(nodes.parent[j][in_tree] + 1, minlength=nodes.valid.shape[1] + 1)
            path = sorted(np.nonzero(nodes.prob[j] > 0)[0], key=lambda v: nodes.depth[j, v])
            steps.append(
                Step(
                    position=int(positions.t[j]),
                    num_drafted=int(in_tree.sum()),
                    num_accepted=len(path),
                    num_tokens=int(per.tokens[j]),
                    draft_time=0.0,
                    verify_time=0.0,
                    tree_depth=int(per.tree_depth[j]),
                    accepted_ranks=tuple(int(nodes.rank[j, v]) for v in path),
                    child_counts=tuple(int(kids[v + 1]) for v in [-1] + path),
                )
            )
        out[p.prompt_id] = tuple(steps)
    return out


def position_table(collection: Collection, tree: Tree | int, max_new_tokens: int | None = None) -> pd.DataFrame:
    """One row per position: drafted, accepted (expected in sampling mode) and tokens added by a
    step of `tree` there (an int n: the dynamic tree of budget n), and whether a real greedy run
    visits it (on_trajectory). Dynamic trees: the prompts collected with super-trees."""
    if not isinstance(tree, Tree):
        collection = collection.super_tree_prompts()
    positions = _positions(collection, max_new_tokens)
    per = _per_position(_nodes(collection, tree, positions), positions.cap)
    return pd.DataFrame(
        {
            "prompt_id": [collection.prompts[i].prompt_id for i in positions.prompt],
            "category": [collection.prompts[i].category for i in positions.prompt],
            "position": positions.t,
            "drafted": per.drafted,
            "accepted": per.accepted,
            "tokens": per.tokens,
            "on_trajectory": _trajectory(per, positions) if not collection.sampling else False,
        }
    )


def sampled_accepted(collection: Collection, tree: Tree, max_new_tokens: int | None = None) -> np.ndarray:
    """Float [T, R]: expected accepted draft tokens given each collected draft sample, at every
    position (prompts concatenated): the per-sample values behind `replay`'s sampling means."""
    if not collection.sampling:
        raise ValueError("sampled_accepted needs a sampling collection")
    positions = _positions(collection, max_new_tokens)
    return _sampled_static(collection, tree, positions)[1]


def dynamic_tree(collection: Collection, prompt_id: str, position: int, budget: int) -> tuple[Tree, list[int]]:
    """The dynamic tree of `budget` nodes at one position and its draft tokens (canonical order)."""
    p = next(p for p in collection.prompts if p.prompt_id == prompt_id)
    n = min(int(p.super_size[position]), budget)
    paths: list[Path] = []
    for i in range(n):
        parent = int(p.super_parent[position, i])
        paths.append((paths[parent] if parent >= 0 else ()) + (int(p.super_rank[position, i]),))
    tree = Tree.from_paths(paths)
    token_of = {path: int(p.super_token[position, i]) for i, path in enumerate(paths)}
    return tree, [token_of[path] for path in tree.paths]


def sglang_tree(
    collection: Collection, prompt_id: str, position: int, steps: int, topk: int, budget: int
) -> tuple[Tree, list[int]]:
    """SGLang's tree at one position (`sglang_pool`'s first `budget` nodes of the super-tree) and its
    draft tokens (canonical order)."""
    p = next(p for p in collection.prompts if p.prompt_id == prompt_id)
    n = int(p.super_size[position])
    parent, rank, depth = (getattr(p, f"super_{x}")[position, :n].astype(np.int64) for x in ("parent", "rank", "depth"))
    path_of: dict[int, Path] = {}
    for i in range(n):  # a parent precedes its children in score order
        path_of[i] = (path_of[int(parent[i])] if parent[i] >= 0 else ()) + (int(rank[i]),)
    chosen = [int(i) for i in sglang_pool(parent, rank, depth, steps, topk)[0][:budget]]
    tree = Tree.from_paths([path_of[i] for i in chosen])
    token_of = {path_of[i]: int(p.super_token[position, i]) for i in chosen}
    return tree, [token_of[path] for path in tree.paths]


# ---- data-driven trees from a collection -------------------------------------------------------


def acceptance_vector(
    collection: Collection, k: int | None = None, max_new_tokens: int | None = None
) -> tuple[float, ...]:
    """Sequoia's acceptance vector measured on every position: a_r = share of positions whose next
    target token is the draft's rank-r token (greedy: a node whose path matches the continuation
    has its rank-r child accepted exactly then). k: entries (default the collection's top_k)."""
    _check_greedy(collection)
    positions = _positions(collection, max_new_tokens)
    ranks = positions.ranks(collection, 1)[:, 0]
    k = collection.config.top_k if k is None else k
    return tuple(float(np.mean(ranks == r)) for r in range(k))


def prefix_counts(collection: Collection, max_new_tokens: int | None = None) -> dict[Path, int]:
    """counts[v] = positions whose continuation rank path starts with v (within the real loop's
    depth cap and the continuation's end): the data of `tree_design.hindsight_trees`."""
    _check_greedy(collection)
    positions = _positions(collection, max_new_tokens)
    depth = int(max(positions.cap.max(initial=0), 1))
    ranks = positions.ranks(collection, depth)
    counts: dict[Path, int] = {}
    top_k = collection.config.top_k
    for row, cap in zip(ranks.tolist(), positions.cap.tolist()):
        path: Path = ()
        for d in range(min(cap, depth)):
            if row[d] >= top_k:
                break
            path = path + (row[d],)
            counts[path] = counts.get(path, 0) + 1
    return counts


def rank_accuracy_by_depth(
    collection: Collection, depth: int, k: int | None = None, max_new_tokens: int | None = None
) -> tuple[tuple[float, ...], ...]:
    """The per-depth acceptance vector: a[d - 1][r] = among the positions whose continuation rank
    path stays within the collected ranks for its first d - 1 tokens (and whose loop allows depth
    d), the share whose depth-d token is the draft's rank-r token there. What a Medusa-style tree
    search reads (`tree_design.medusa_tree`), measured along the continuation; depth 1's row is
    `acceptance_vector` over the positions that allow a draft token. k: ranks (default top_k)."""
    _check_greedy(collection)
    positions = _positions(collection, max_new_tokens)
    ranks = positions.ranks(collection, depth)  # [T, depth]
    top_k = collection.config.top_k
    k = top_k if k is None else k
    reached = np.ones(len(positions.t), dtype=bool)
    out = []
    for d in range(depth):
        alive = reached & (positions.cap >= d + 1)
        total = int(alive.sum())
        out.append(tuple(float((ranks[alive, d] == r).sum() / total) if total else 0.0 for r in range(k)))
        reached = alive & (ranks[:, d] < top_k)
    return tuple(out)
