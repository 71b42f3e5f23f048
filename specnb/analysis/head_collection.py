"""Collections of learned drafters' ranks (Medusa heads, EAGLE heads), so that `analysis.replay`
answers every static tree shape and budget of such a drafter exactly, and the tables read from them.

    collect_heads      a greedy `Collection` for a drafter that reads the target's own hidden states:
                       per prompt the target's greedy continuation, made by an exact speculative run
                       with that drafter (its steps are kept to check the replay), then the drafter's
                       rank of the continuation's token at every depth of every step
                       (`PromptData.head_ranks`), computed by a function of the drafter's kind
                       (`drafters.medusa.head_ranks`: head d on the row before the root;
                       `training.eagle.eagle_ranks`: EAGLE's chain along the continuation)
    super_tree_arrays  a drafter's dynamic trees at every position (`drafters.dynamic.ScoredTree`s,
                       e.g. `EagleDynamicDrafter.super_trees`) as `PromptData`'s super-tree arrays, so
                       `replay.replay_dynamic` answers every budget up to the trees' size
    empty_super_trees  those arrays zeroed, for a collector that fills them itself (`experiments.collect`)
    accuracy_by_depth  top-k accuracy at each depth on a head collection's continuations
    rank_accuracy      acc[d][r] (Medusa's `heads_accuracy` table): the input of Medusa's tree
                       search and of per-depth Sequoia trees (`analysis.tree_design`)

Why a rank per (step, depth) replays a tree exactly (greedy). The output is the target's greedy
continuation c whatever the tree; a step starting with t tokens generated accepts the node at rank
path (r_1 .. r_d) iff c_t .. c_{t+d-1} sit at those ranks. A Medusa head d fills depth d from one
hidden row whatever the node's ancestors; an EAGLE head's depth-d distribution depends on the
node's ancestors, and along the accepted path those are c_t .. c_{t+d-2}: so R[t, d-1] = the rank of
c_{t+d-1} at depth d with the continuation as the path decides acceptance for every tree, as it does
for Medusa. A tree deeper than the collected depth cannot be replayed (`replay` refuses it).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from ..core.drafting import Drafter
from ..core.generation import speculative_generate
from ..core.trees import Tree
from ..drafters.dynamic import ScoredTree
from .collection import CollectConfig, Collection, PromptData

SHOWN_K = (1, 3, 5, 10, 20, 64)  # the top-k columns of accuracy_by_depth (those up to the collection's top_k)
RANKS = 64  # ranks per depth in rank_accuracy's acc[d][r] (Medusa's code: 10; a 64-node tree reaches rank 63)

# (sequence [P + L] long: prompt + continuation, P, top_k) -> int [L, D]: R[t, d-1] (module docstring),
# or (R, super-tree arrays: `super_tree_arrays`) for a drafter whose dynamic trees are re-drafted too
RankFunction = Callable[[torch.Tensor, int, int], torch.Tensor | tuple[torch.Tensor, dict]]


def collect_heads(
    target: torch.nn.Module,
    drafter: Drafter,
    ranks: RankFunction,
    prompts: Sequence[tuple[str, str, torch.Tensor]],
    config: CollectConfig,
    run_tree: Tree,
    describe: dict | None = None,
    progress: bool = True,
) -> Collection:
    """A greedy `Collection` (module docstring) of prompts (id, category, ids [T]): the
    continuation of each is made by `speculative_generate(target, drafter, ids, run_tree)`, then
    `ranks(prompt + continuation, P, config.top_k)` gives its `head_ranks`."""
    if config.sampling:
        raise ValueError("head collections are greedy (temperature 0)")
    out = []
    for prompt_id, category, ids in tqdm(prompts, desc="collect heads", disable=not progress):
        ids = ids.reshape(1, -1)
        if ids.shape[1] < 2:  # its first draft is empty (no row before the root): not a static tree
            raise ValueError(f"prompt {prompt_id!r} has one token; head replay needs prompts of >= 2 tokens")
        t0 = time.perf_counter()
        run = speculative_generate(
            target, drafter, ids, run_tree, config.max_new_tokens, eos_token_id=config.eos_token_id
        )
        t1 = time.perf_counter()
        seq = torch.cat([ids[0].cpu(), run.tokens])
        r = ranks(seq, ids.shape[1], config.top_k)
        r, super_trees = r if isinstance(r, tuple) else (r, {})
        out.append(
            PromptData(
                prompt_id=str(prompt_id),
                category=str(category),
                prompt=ids[0].cpu().numpy(),
                tokens=run.tokens.numpy(),
                stopped=bool(len(run.tokens) < config.max_new_tokens),
                times={"run": t1 - t0, "heads": time.perf_counter() - t1},
                run_steps=np.array(
                    [(s.position, s.num_drafted, s.num_accepted, s.num_tokens) for s in run.steps], dtype=np.int32
                ),
                head_ranks=r.numpy().astype(np.int16),
                **super_trees,
            )
        )
    describe = dict(describe or {}, run_tree_paths=[list(p) for p in run_tree.paths])
    return Collection(config, describe, tuple(out))


def super_tree_arrays(
    trees: Sequence[ScoredTree], continuation: Sequence[int], size: int, depth: int
) -> dict[str, np.ndarray]:
    """`PromptData`'s super_* arrays from the dynamic tree at every position t (trees[t], rooted
    before continuation[t]): nodes sorted by (cumulative log q descending, depth, path), the order
    that defines every smaller budget's tree (`drafters.dynamic`), at most `size` of them; each
    node's parent (index in that order, -1 the root), sibling rank, depth, token and score; and the
    index of the node on the continuation's path at each depth (`size` where there is none)."""
    out = empty_super_trees(len(trees), size, depth)
    for t, scored in enumerate(trees):
        paths, tokens, scores = scored.tree.paths, scored.tokens.tolist(), scored.scores.tolist()
        order = sorted(range(len(paths)), key=lambda i: (-scores[i], len(paths[i]), paths[i]))[:size]
        where = {paths[i]: new for new, i in enumerate(order)}
        out["super_size"][t] = len(order)
        on = {(): True}  # path -> its tokens are the continuation's
        for i in sorted(order, key=lambda i: len(paths[i])):
            path = paths[i]
            d = len(path)
            on[path] = on[path[:-1]] and t + d - 1 < len(continuation) and tokens[i] == continuation[t + d - 1]
            new = where[path]
            out["super_parent"][t, new] = where[path[:-1]] if d > 1 else -1
            out["super_rank"][t, new], out["super_depth"][t, new] = path[-1], d
            out["super_token"][t, new], out["super_score"][t, new] = tokens[i], scores[i]
            if on[path] and d <= depth:
                out["super_on_path"][t, d - 1] = new
    return out


def empty_super_trees(length: int, size: int, depth: int) -> dict[str, np.ndarray]:
    """`PromptData`'s super_* arrays for `length` positions of at most `size` nodes and `depth`
    levels, to be filled: zeros, and super_on_path `size` (no node on the path at that depth)."""
    out = {"super_size": np.zeros(length, dtype=np.int16)}
    for name, dtype in [
        ("parent", np.int16),
        ("rank", np.int16),
        ("depth", np.int16),
        ("token", np.int64),
        ("score", np.float32),
    ]:
        out[f"super_{name}"] = np.zeros((length, size), dtype=dtype)
    out["super_on_path"] = np.full((length, depth), size, dtype=np.int16)
    return out


def _depth_ranks(collection: Collection, d: int) -> np.ndarray:
    """Ranks at depth d + 1 of every step whose depth-(d+1) token lies in the continuation: a head
    collection's R[t, d]; a draft model's rank of c_{t+d} after the continuation's own c_{<t+d}
    (its depth-(d+1) node on the accepted path), `PromptData.ranks` shifted."""
    if collection.prompts[0].head_ranks is None:
        return np.concatenate([p.ranks[d : len(p.tokens)] for p in collection.prompts])
    return np.concatenate([p.head_ranks[: max(len(p.tokens) - d, 0), d] for p in collection.prompts])


def accuracy_by_depth(collection: Collection, ks: Sequence[int] = SHOWN_K, depth: int | None = None) -> pd.DataFrame:
    """Top-k accuracy at each depth on a collection's continuations: share of steps (every position
    t with a token at t + d) whose depth-d token is in the drafter's top k there along the accepted
    path (k up to the collection's top_k). A head collection gives its collected depths; a draft
    model's collection (whose depth-d rank is its rank of the continuation's next token, the path
    being the continuation itself) gives `depth` of them. The `head` column repeats the depth
    (Medusa's head d drafts depth d)."""
    ks = [k for k in ks if k <= collection.config.top_k]
    heads = collection.prompts[0].head_ranks
    depths = heads.shape[1] if heads is not None else depth
    if depths is None:
        raise ValueError("a draft model's collection has no depth of its own: pass depth=")
    rows = []
    for d in range(depths):
        ranks = _depth_ranks(collection, d)
        for k in ks:
            rows.append(
                {
                    "head": d + 1,
                    "depth": d + 1,
                    "k": k,
                    "positions": len(ranks),
                    "top_k_accuracy": float(np.mean(ranks < k)) if len(ranks) else float("nan"),
                }
            )
    return pd.DataFrame(rows)


def rank_accuracy(collection: Collection, ranks: int = RANKS) -> list[list[float]]:
    """acc[d][r]: share of positions whose depth-(d+1) token is the drafter's rank-r token there
    (Medusa's `heads_accuracy` table, the input of its tree search and of per-depth Sequoia); r below
    min(ranks, the collection's top_k)."""
    ranks = min(ranks, collection.config.top_k)
    out = []
    for d in range(collection.prompts[0].head_ranks.shape[1]):
        r = _depth_ranks(collection, d)
        out.append([float(np.mean(r == k)) for k in range(ranks)])
    return out
