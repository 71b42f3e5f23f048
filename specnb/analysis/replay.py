"""Collect once, replay many: the acceptance of every tree shape and budget from one pass of data.

Greedy decoding. The output of exact speculative decoding is the target's greedy continuation
c_0, c_1, ... whatever the tree. At a step that starts with t tokens generated, `greedy_accept`
walks down from the root taking the child whose token is c_t, then c_{t+1}, ...; the child of
rank r is the draft's r-th most likely token there. So the step accepts the longest prefix of the
*continuation rank path* (r_t, r_{t+1}, ...) that is a node path of the tree, where r_j is the rank
of c_j under the draft after c_{<j}. One teacher-forced draft forward over prompt + continuation
gives every r_j, and with it the acceptance of every rank-path tree at every position, without
running the target on any tree. The real loop's two caps are replayed too: the tree is truncated
to depth max_new_tokens - t - 1, and a step ends at EOS (ranks past the continuation's end count as
no match). "Run trajectory" positions are those a real run visits (t = 0, then t += tokens added);
"all positions" are every t.

Super-trees (optional, greedy): at each position the draft's top-K children of every node to depth
D, pruned to the global top-M nodes by cumulative draft log-probability. A dynamic tree of budget n
(EAGLE-2-style, Li et al. 2024) is *defined* here as the top-n nodes of that expansion in the
order (cumulative log q descending, then canonical (depth, path)); a child never precedes its
parent in that order, so every top-n is a tree and, for n <= M, the top-n of the pruned super-tree
equal those of the full expansion. A drafter that builds the same trees must break ties the same
way. Greedy replay of a dynamic tree accepts the leading on-path nodes (tokens c_t, c_{t+1}, ...)
that are among its n nodes; the per-position oracle accepts the longest on-path prefix inside the
super-tree, capped at n: what any tree of n nodes drawn from this draft's top-K could reach.

Growing a super-tree needs the draft's logits at its off-path nodes: the teacher-forced cache of
prompt + continuation already holds every on-path node, so off-path nodes are fed in batches over
several positions at once, each seeing the sequence up to its deepest on-path ancestor plus its
own fed ancestors (one forward per depth per chunk of positions).

Sampling. Lossless tree sampling (`acceptance.speculative_accept`) checks the children of a node
in draw order; child i (drawn i-th without replacement from q) is accepted, given children 0..i-1
were rejected, with probability alpha_i = min(1, p_i(x_i) / q_i(x_i)), where p_i, q_i are the
residuals after the earlier rejections. Given the draft's sample, node v of a gap-free subtree is
accepted with probability P(v) = P(parent) * prod_{j<i}(1 - alpha_j) * alpha_i at its parent, so
the expected accepted length of any gap-free subtree of the sampled tree is sum_v P(v). Collection
draws R samples of a cover tree per position along a sampled continuation, runs the target once
over all of them (a forest under the root, one tree-masked pass) and stores the alphas; replay
averages over samples and positions, with a normal-approximation confidence interval over
positions. EOS inside a step is not modelled in sampling mode.

Storage (`storage.Sweep` + `storage.write_arrays`): a folder with collection.json (the
parameters), prompts.jsonl (one line per finished prompt) and one .npz per prompt; an interrupted
collection resumes where it stopped, and a folder made with other parameters is refused.

Metric conventions (`metrics`): acceptance_rate = accepted / drafted, acceptance_length = accepted
draft tokens per step (bonus EXCLUDED), tau = tokens per target call (bonus INCLUDED),
depth_d_acceptance = P(accepted >= d), rank_r_acceptance = Sequoia's acceptance vector.
"""

from __future__ import annotations

import json
import re
import time
import zlib
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path as FilePath
from typing import Any, Iterable, Mapping

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm
from transformers import DynamicCache

from ..core.cache import crop, new_cache
from ..core.drafting import ModelDrafter
from ..core.generation import Step, _eos_ids, _match_vocab, speculative_generate
from ..core.masks import model_mask, prefix_tree_mask
from ..core.sampling import SamplingConfig, probabilities, sample_without_replacement
from ..io.storage import Sweep, read_arrays, write_arrays, write_json
from .tree_design import hindsight_trees, sequoia_trees
from ..core.trees import Path, Tree
from ..core.verification import prefill, verify

PARAMS_FILE = "collection.json"
UNITS_FILE = "prompts.jsonl"
UNIT_KEY = ("prompt_id",)


@dataclass(frozen=True)
class CollectConfig:
    """What a collection measures; stored beside it and checked when it resumes."""

    max_new_tokens: int = 64  # target tokens per prompt (fewer if EOS ends the continuation)
    top_k: int = 16  # greedy: ranks >= top_k are stored as "out"; replayed trees use ranks < top_k
    run_tree: str = "chain:4"  # shape:budget of the exact speculative run that makes the continuation
    eos_token_id: tuple[int, ...] | None = None  # None: the target's generation config; () = never stop
    super_k: int = 0  # super-tree children per node; 0 = no super-trees (they cost draft forwards)
    super_depth: int = 6  # D, super-tree depth
    super_size: int = 64  # M, nodes kept per position (global top-M by cumulative draft log-prob)
    super_chunk: int = 8  # positions whose off-path nodes share one draft forward per depth
    temperature: float = 0.0  # > 0: sampling mode (continuation sampled, alphas collected)
    sample_top_k: int = 0  # sampling transforms shared by p and q (`SamplingConfig`)
    sample_top_p: float = 1.0
    samples: int = 0  # R draft samples of the cover tree per position (sampling mode)
    cover_tree: str = "kary2:6"  # sampling: drawn R times per position; any gap-free subtree replays
    sample_chunk: int = 16  # samples verified in one target pass
    seed: int = 0

    def __post_init__(self) -> None:
        if self.eos_token_id is not None:
            object.__setattr__(self, "eos_token_id", tuple(int(e) for e in self.eos_token_id))
        if self.sampling and self.samples < 1:
            raise ValueError("sampling mode (temperature > 0) needs samples >= 1 draft samples per position")
        if self.super_k and self.sampling:
            raise ValueError("super-trees are collected in greedy mode only")
        if self.sampling and _tree(self.cover_tree).has_rank_gaps:
            raise ValueError(f"cover tree {self.cover_tree} has rank gaps; sampling needs ranks 0..k-1")

    @property
    def sampling(self) -> bool:
        return self.temperature > 0.0

    @property
    def sampling_config(self) -> SamplingConfig:
        return SamplingConfig(self.temperature, self.sample_top_k, self.sample_top_p)


@dataclass(frozen=True)
class PromptData:
    """One prompt's collected arrays (L = continuation length)."""

    prompt_id: str
    category: str
    prompt: np.ndarray  # int64 [P] prompt ids
    tokens: np.ndarray  # int64 [L] the target's continuation
    stopped: bool  # the continuation ended at EOS (else at max_new_tokens)
    times: dict[str, float]  # seconds per collection stage
    ranks: np.ndarray | None = None  # int16 [L]: rank of tokens[j] under the draft; >= top_k: out
    logq: np.ndarray | None = None  # float32 [L]: draft log-probability of tokens[j]
    # super-trees, nodes sorted by (cumulative log q desc, depth, path); -1 / padding past `size`
    super_size: np.ndarray | None = None  # int16 [L]: nodes kept at each position (<= M)
    super_parent: np.ndarray | None = None  # int16 [L, M]: parent's index in the sorted order, -1 root
    super_rank: np.ndarray | None = None  # int16 [L, M]: sibling rank (the draft's r-th child)
    super_depth: np.ndarray | None = None  # int16 [L, M]
    super_token: np.ndarray | None = None  # int64 [L, M]
    super_score: np.ndarray | None = None  # float32 [L, M]: cumulative draft log-probability
    super_on_path: np.ndarray | None = None  # int16 [L, D]: sorted index of the on-path node at depth d, M if absent
    alpha: np.ndarray | None = None  # float32 [L, R, N + 1, K]: sampling, per cover row and child rank

    def arrays(self) -> dict[str, np.ndarray]:
        """The collected arrays by field name (what is stored in the prompt's .npz)."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return {k: v for k, v in values.items() if isinstance(v, np.ndarray)}


@dataclass(frozen=True)
class Collection:
    """Collected prompts with the parameters that made them; `Collection.load(folder)`."""

    config: CollectConfig
    describe: dict[str, Any]
    prompts: tuple[PromptData, ...]
    folder: FilePath | None = field(default=None, compare=False)

    @classmethod
    def load(cls, folder: str | FilePath, prompt_ids: Iterable[str] | None = None) -> Collection:
        folder = FilePath(folder)
        params = json.loads((folder / PARAMS_FILE).read_text())
        config = _config_from_json(params["config"])
        units = Sweep(folder / UNITS_FILE, UNIT_KEY)
        table = units.meta_frame()
        stored = [] if table.empty else table["prompt_id"].astype(str).tolist()
        wanted = stored if prompt_ids is None else [str(p) for p in prompt_ids]
        missing = [p for p in wanted if p not in stored]
        if missing:
            raise KeyError(f"prompts not collected in {folder}: {missing}")
        prompts = []
        for pid in wanted:
            meta = units.meta({"prompt_id": pid})
            arrays = read_arrays(folder / meta["file"])
            prompts.append(PromptData(
                prompt_id=pid, category=str(meta["category"]), stopped=bool(meta["stopped"]),
                times={k[:-2]: float(v) for k, v in meta.items() if k.endswith("_s")}, **arrays,
            ))
        return cls(config, params.get("describe", {}), tuple(prompts), folder)

    @property
    def sampling(self) -> bool:
        return self.config.sampling

    @property
    def has_super_trees(self) -> bool:
        return bool(self.prompts) and self.prompts[0].super_size is not None

    def times(self) -> dict[str, float]:
        """Seconds per collection stage, summed over prompts."""
        out: dict[str, float] = {}
        for p in self.prompts:
            for k, v in p.times.items():
                out[k] = out.get(k, 0.0) + v
        return out


# ---- collection -------------------------------------------------------------------------------


def collect(
    folder: str | FilePath,
    target: torch.nn.Module,
    draft: torch.nn.Module,
    prompts: Mapping[str, torch.Tensor],
    config: CollectConfig = CollectConfig(),
    categories: Mapping[str, str] | None = None,
    describe: Mapping[str, Any] | None = None,
    progress: bool = False,
) -> Collection:
    """Collect every prompt not yet in `folder` and return the collection of `prompts`.

    prompts: prompt id -> input ids long [1, P]. describe: what made it (pair names, prompt
    source...), stored with the config; resuming with another config or description raises.
    """
    folder = FilePath(folder)
    params = {"config": _config_to_json(config), "describe": dict(describe or {})}
    existing = folder / PARAMS_FILE
    if existing.exists():
        stored = json.loads(existing.read_text())
        if stored != json.loads(json.dumps(params)):
            raise ValueError(
                f"{folder} holds a collection made with other parameters:\n  stored: {stored}\n  asked:  {params}"
            )
    else:
        write_json(existing, params)
    units = Sweep(folder / UNITS_FILE, UNIT_KEY)
    drafter = ModelDrafter(draft)
    todo = [pid for pid in prompts if {"prompt_id": str(pid)} not in units]
    for pid in tqdm(todo, desc="collect", disable=not progress):
        category = (categories or {}).get(pid, "")
        data = _collect_prompt(target, draft, drafter, str(pid), category, prompts[pid], config)
        name = _file_name(str(pid))
        write_arrays(folder / name, data.arrays())  # the arrays first: a unit line means a whole file
        units.add(
            {"prompt_id": str(pid)}, [],
            meta={"category": category, "file": name, "prompt_length": int(len(data.prompt)),
                  "length": int(len(data.tokens)), "stopped": data.stopped,
                  **{f"{k}_s": v for k, v in data.times.items()}},
        )
    return Collection.load(folder, [str(p) for p in prompts])


def _collect_prompt(
    target: torch.nn.Module,
    draft: torch.nn.Module,
    drafter: ModelDrafter,
    prompt_id: str,
    category: str,
    input_ids: torch.Tensor,
    config: CollectConfig,
) -> PromptData:
    ids = input_ids.reshape(1, -1).long()
    eos = config.eos_token_id
    times: dict[str, float] = {}
    start = time.perf_counter()
    run = speculative_generate(
        target, drafter, ids, tree=_tree(config.run_tree), max_new_tokens=config.max_new_tokens,
        temperature=config.temperature, top_k=config.sample_top_k, top_p=config.sample_top_p,
        seed=_seed(config.seed, prompt_id), eos_token_id=eos,
    )
    times["continuation"] = time.perf_counter() - start
    tokens = run.tokens.tolist()
    stopped = bool(tokens) and tokens[-1] in _eos_ids(target, eos)
    out: dict[str, Any] = {"prompt": ids[0].numpy().astype(np.int64), "tokens": np.array(tokens, dtype=np.int64)}
    if config.sampling:
        start = time.perf_counter()
        out["alpha"] = _sampled_alphas(target, draft, ids, tokens, config, _seed(config.seed + 1, prompt_id))
        times["sampling"] = time.perf_counter() - start
    else:
        start = time.perf_counter()
        cache = new_cache(draft)
        seq = torch.cat([ids, torch.tensor([tokens], dtype=torch.long)], dim=1).to(draft.device)
        with torch.inference_mode():
            logits = draft(input_ids=seq, past_key_values=cache, use_cache=True, logits_to_keep=len(tokens) + 1).logits[0]
        logp = torch.log_softmax(logits.float(), dim=-1)  # [L + 1, V]: row j predicts tokens[j]
        truth = torch.tensor(tokens, dtype=torch.long, device=logp.device)
        top = torch.topk(logits[: len(tokens)].float(), config.top_k, dim=-1).indices  # [L, top_k]
        hit = top == truth[:, None]
        out["ranks"] = torch.where(hit.any(-1), hit.int().argmax(-1), config.top_k).cpu().numpy().astype(np.int16)
        out["logq"] = logp[torch.arange(len(tokens)), truth].cpu().numpy().astype(np.float32)
        times["ranks"] = time.perf_counter() - start
        if config.super_k:
            start = time.perf_counter()
            out.update(_super_trees(draft, cache, ids.shape[1], tokens, logp, config))
            times["super_tree"] = time.perf_counter() - start
    return PromptData(prompt_id=prompt_id, category=category, stopped=stopped, times=times, **out)


@torch.inference_mode()
def _super_trees(
    draft: torch.nn.Module, cache: DynamicCache, prompt_len: int, tokens: list[int], logp: torch.Tensor, config: CollectConfig
) -> dict[str, np.ndarray]:
    """Grow the super-tree at every position. cache: the draft's cache of prompt + continuation
    (restored after each chunk); logp: float [L + 1, V], teacher-forced log q, row j predicting
    tokens[j], i.e. the children of the on-path node at depth d of position t are in row t + d."""
    k, depth, size = config.super_k, config.super_depth, config.super_size
    n_seq, length, device = prompt_len + len(tokens), len(tokens), draft.device
    on_top = torch.topk(logp, k, dim=-1)  # [L + 1, k]
    on_values, on_indices = on_top.values.tolist(), on_top.indices.tolist()
    cols = {name: np.zeros((length, size), dtype=dt) for name, dt in
            [("parent", np.int16), ("rank", np.int16), ("depth", np.int16), ("token", np.int64), ("score", np.float32)]}
    sizes = np.zeros(length, dtype=np.int16)
    on_path = np.full((length, depth), size, dtype=np.int16)
    for start in range(0, length, config.super_chunk):
        chunk = range(start, min(length, start + config.super_chunk))
        # node: [sort key (-score, depth, path), token, parent index, on-path depth, fed column]
        nodes: dict[int, list[list]] = {t: [] for t in chunk}

        def add_children(t: int, parent: int, values: list[float], indices: list[int]) -> None:
            base_score, base_depth, base_path = (0.0, 0, ()) if parent < 0 else (
                -nodes[t][parent][0][0], nodes[t][parent][0][1], nodes[t][parent][0][2])
            parent_on = parent < 0 or nodes[t][parent][3] == base_depth
            for r, (v, x) in enumerate(zip(values, indices)):
                d = base_depth + 1
                on = parent_on and t + d - 1 < length and x == tokens[t + d - 1]
                on_depth = d if on else (base_depth if parent_on else nodes[t][parent][3])
                nodes[t].append([(-(base_score + v), d, base_path + (r,)), x, parent, on_depth, -1])

        for t in chunk:
            add_children(t, -1, on_values[t], on_indices[t])
        fed = 0
        for d in range(1, depth):
            expand: list[tuple[int, int]] = []
            for t in chunk:
                kept = sorted(range(len(nodes[t])), key=lambda i: nodes[t][i][0])[:size]
                expand += [(t, i) for i in kept if nodes[t][i][0][1] == d]
            feed = [(t, i) for t, i in expand if nodes[t][i][3] != d]  # off-path: no teacher-forced row
            for t, i in expand:
                if nodes[t][i][3] == d:
                    add_children(t, i, on_values[t + d], on_indices[t + d])
            if not feed:
                continue
            q = len(feed)
            mask = torch.zeros(q, n_seq + fed + q, dtype=torch.bool)
            for row, (t, i) in enumerate(feed):
                node = nodes[t][i]
                node[4] = fed + row
                mask[row, : prompt_len + t + node[3]] = True  # the sequence up to the deepest on-path ancestor
                a = i
                while a >= 0 and nodes[t][a][4] >= 0:  # itself and its fed (off-path) ancestors
                    mask[row, n_seq + nodes[t][a][4]] = True
                    a = nodes[t][a][2]
            ids = torch.tensor([[nodes[t][i][1] for t, i in feed]], device=device)
            positions = torch.tensor([[prompt_len + t - 1 + d for t, _ in feed]], device=device)
            logits = draft(
                input_ids=ids, position_ids=positions, attention_mask=model_mask(mask[None, None].to(device), draft, draft.dtype),
                past_key_values=cache, use_cache=True,
            ).logits[0]
            fed += q
            top = torch.topk(torch.log_softmax(logits.float(), dim=-1), k, dim=-1)
            for (t, i), values, indices in zip(feed, top.values.tolist(), top.indices.tolist()):
                add_children(t, i, values, indices)
        crop(cache, n_seq)
        for t in chunk:
            kept = sorted(range(len(nodes[t])), key=lambda i: nodes[t][i][0])[:size]
            where = {old: new for new, old in enumerate(kept)}
            sizes[t] = len(kept)
            for new, old in enumerate(kept):
                (neg_score, d, path), token, parent, on_depth, _ = nodes[t][old]
                cols["parent"][t, new] = where[parent] if parent >= 0 else -1
                cols["rank"][t, new], cols["depth"][t, new] = path[-1], d
                cols["token"][t, new], cols["score"][t, new] = token, -neg_score
                if on_depth == d:
                    on_path[t, d - 1] = new
    return {"super_size": sizes, **{f"super_{k}": v for k, v in cols.items()}, "super_on_path": on_path}


@torch.inference_mode()
def _sampled_alphas(
    target: torch.nn.Module,
    draft: torch.nn.Module,
    ids: torch.Tensor,
    tokens: list[int],
    config: CollectConfig,
    seed: int,
) -> np.ndarray:
    """Float32 [L, R, N + 1, K]: per position, draft sample and cover-tree row, the acceptance
    probability of each child rank given the earlier ones were rejected (`node_alphas`).

    Samples are drafted `sample_chunk` at a time as copies of the cover tree side by side under the
    root (`_forest`), one draft forward per depth, and verified in one target pass."""
    cover = _tree(config.cover_tree)
    sampling = config.sampling_config
    generator = torch.Generator(device=draft.device).manual_seed(seed)
    width = max(len(c) for c in cover.children)
    caches = {}
    for name, model in (("target", target), ("draft", draft)):  # both hold the sequence but its last token
        caches[name] = new_cache(model)
        if ids.shape[1] > 1:
            prefill(model, caches[name], ids[:, :-1].to(model.device))
    seq = ids.to(target.device)
    out = np.zeros((len(tokens), config.samples, cover.num_nodes + 1, width), dtype=np.float32)
    forests = {n: _forest(cover, n) for n in {min(config.sample_chunk, config.samples - s0)
                                              for s0 in range(0, config.samples, config.sample_chunk)}}
    for t in range(len(tokens)):
        prefix_len = seq.shape[1] - 1
        for s0 in range(0, config.samples, config.sample_chunk):
            copies = min(config.sample_chunk, config.samples - s0)
            forest, index = forests[copies]
            draft_tokens, q = _draft_copies(draft, caches["draft"], seq, forest, copies, sampling, generator)
            logits = verify(target, caches["target"], int(seq[0, -1]), forest, draft_tokens)  # [1 + S N, V]
            crop(caches["target"], prefix_len)
            p = probabilities(logits, sampling)
            q = _match_vocab(q, p)
            rows = torch.tensor([[0] + [i + 1 for i in index[s]] for s in range(copies)])  # [S, N + 1]
            child = torch.tensor([[index[s][c] if c >= 0 else -1 for c in _children_by_rank(cover, width)]
                                  for s in range(copies)])  # [S, (N + 1) * K], forest node per cover child
            child_tokens = torch.where(child >= 0, draft_tokens[child.clamp_min(0)], -1)
            alpha = node_alphas(p[rows.reshape(-1)], q[rows.reshape(-1)], child_tokens.reshape(-1, width))
            out[t, s0 : s0 + copies] = alpha.reshape(copies, cover.num_nodes + 1, width).cpu().numpy()
        for name, model in (("target", target), ("draft", draft)):  # the root joins the cached sequence
            crop(caches[name], prefix_len)
            prefill(model, caches[name], seq[:, -1:].to(model.device))
        seq = torch.cat([seq, torch.tensor([[tokens[t]]], device=seq.device)], dim=1)
    return out


def _children_by_rank(tree: Tree, width: int) -> list[int]:
    """Flat [(N + 1) * width]: the node index of row r's child of rank k at r * width + k, -1 if none."""
    out = [-1] * ((tree.num_nodes + 1) * width)
    for row, kids in enumerate(tree.children):
        for c in kids:
            out[row * width + tree.ranks[c]] = c
    return out


@torch.inference_mode()
def _draft_copies(
    model: torch.nn.Module,
    cache: DynamicCache,
    seq: torch.Tensor,
    forest: Tree,
    copies: int,
    sampling: SamplingConfig,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draft `copies` independent samples of a tree at once: tokens long [N_f] and q float
    [N_f + 1, V] of `forest` (its copies side by side). Draws as `ModelDrafter.draft` makes them
    (children of every node without replacement from q there, one draft forward per depth under the
    tree mask), except that the root's children are drawn once per copy. cache: the draft's cache
    of seq[:, :-1]; it is cropped back to that on return."""
    prefix_len = seq.shape[1]
    device = model.device
    root = model(input_ids=seq[:, -1:].to(device), past_key_values=cache, use_cache=True).logits[0, -1].float()
    out = torch.zeros(forest.num_nodes, dtype=torch.long, device=device)
    q = torch.zeros(forest.num_nodes + 1, root.shape[-1], dtype=torch.float32, device=device)
    ancestors = forest.ancestor_mask(device)
    parents = torch.tensor(forest.parents, device=device)
    ranks = torch.tensor(forest.ranks, device=device)
    level_logits, level_rows = root[None], torch.zeros(1, dtype=torch.long, device=device)
    for depth in range(1, forest.depth + 1):
        nodes = forest.level(depth)
        probs = probabilities(level_logits, sampling)
        q[level_rows] = probs
        if depth == 1:  # copy s's root children are forest ranks s * width .. s * width + width - 1
            out[nodes.start : nodes.stop] = sample_without_replacement(
                probs.expand(copies, -1), len(nodes) // copies, generator).reshape(-1)
        else:
            local = torch.searchsorted(level_rows, parents[nodes.start : nodes.stop] + 1)
            k = int(ranks[nodes.start : nodes.stop].max()) + 1
            out[nodes.start : nodes.stop] = sample_without_replacement(probs, k, generator)[local, ranks[nodes.start : nodes.stop]]
        if depth == forest.depth:
            break
        mask = prefix_tree_mask(ancestors[nodes.start : nodes.stop, : nodes.stop], prefix_len)
        positions = torch.full((1, len(nodes)), prefix_len - 1 + depth, dtype=torch.long, device=device)
        level_logits = model(
            input_ids=out[None, nodes.start : nodes.stop], position_ids=positions,
            attention_mask=model_mask(mask, model, model.dtype), past_key_values=cache, use_cache=True,
        ).logits[0].float()
        level_rows = torch.arange(nodes.start + 1, nodes.stop + 1, device=device)
    crop(cache, prefix_len - 1)
    return out, q


def node_alphas(p: torch.Tensor, q: torch.Tensor, children: torch.Tensor) -> torch.Tensor:
    """Float [B, K]: alpha[b, i] = probability that row b's child i (the i-th draw without
    replacement from q) is accepted given children 0..i-1 were rejected, by the residual updates
    of `acceptance.speculative_accept` (SpecInfer / Sequoia multi-round rejection): alpha_i =
    min(1, p_i(x) / q_i(x)); on rejection p <- norm(max(p_i - q_i, 0)), q <- norm(q_i without x).
    A draw outside q's support is skipped (alpha 0, residuals unchanged); once q has no mass left
    the later children are never checked (alpha 0).

    p, q: float [B, V] at each row; children: long [B, K] child tokens by rank, -1 = no child.
    """
    p, q = p.double().clone(), q.double().clone()
    alpha = torch.zeros(children.shape, dtype=torch.float64, device=p.device)
    live = torch.ones(children.shape[0], dtype=torch.bool, device=p.device)
    rows = torch.arange(children.shape[0], device=p.device)
    for i in range(children.shape[1]):
        x = children[:, i].clamp_min(0)
        qx, px = q[rows, x], p[rows, x]
        checked = live & (children[:, i] >= 0) & (qx > 0)
        alpha[:, i] = torch.where(checked, torch.clamp(px / qx.clamp_min(1e-300), max=1.0), 0.0)
        residual = (p - q).clamp_min(0.0)
        mass = residual.sum(-1, keepdim=True)
        p = torch.where(checked[:, None] & (mass > 0), residual / mass.clamp_min(1e-300), p)
        q_rest = q.clone()
        q_rest[rows, x] = 0.0
        q_mass = q_rest.sum(-1, keepdim=True)
        live = live & ~(checked & (q_mass[:, 0] <= 0))
        q = torch.where(checked[:, None] & (q_mass > 0), q_rest / q_mass.clamp_min(1e-300), q)
    return alpha.float()


def _forest(tree: Tree, copies: int) -> tuple[Tree, list[list[int]]]:
    """`copies` copies of `tree` side by side under one root, and index[s][i] = the forest index of
    copy s's node i (copy s's depth-1 ranks are shifted by s * width; ranks here are only labels)."""
    width = len(tree.children[0])
    paths = [(s * width + p[0],) + p[1:] for s in range(copies) for p in tree.paths]
    forest = Tree.from_paths(paths)
    where = {p: i for i, p in enumerate(forest.paths)}
    index = [[where[(s * width + p[0],) + p[1:]] for p in tree.paths] for s in range(copies)]
    return forest, index


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
        valid=np.ones(shape, dtype=bool), prob=prob, tokens=tokens,
    )


def _greedy_static(collection: Collection, tree: Tree, positions: _Positions) -> _Nodes:
    """Walk each position's continuation rank path down `tree` (capped like the real loop)."""
    _check_greedy(collection)
    top_k = collection.config.top_k
    if tree.num_nodes and max(tree.ranks) >= top_k:
        raise ValueError(f"tree uses rank {max(tree.ranks)}; this collection stored ranks < {top_k} only")
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
    cover = _tree(collection.config.cover_tree)
    if tree.has_rank_gaps:
        raise ValueError("sampling replays gap-free trees only (sibling ranks 0..k-1)")
    row_of = {p: i + 1 for i, p in enumerate(cover.paths)}
    missing = [p for p in tree.paths if p not in row_of]
    if missing:
        raise ValueError(f"tree nodes {missing[:4]} are not in the collected cover tree {collection.config.cover_tree}")
    alpha = np.concatenate([p.alpha[: hi - lo] for p, lo, hi in
                            zip(collection.prompts, positions.offsets[:-1], positions.offsets[1:])])  # [T, R, N_c + 1, K]
    reject_before = np.cumprod(np.concatenate([np.ones(alpha.shape[:3] + (1,)), 1.0 - alpha[..., :-1]], axis=-1), axis=-1)
    reach = reject_before * alpha  # [T, R, rows, K]: child i of the row is the accepted one
    n, r = alpha.shape[:2]
    prob = np.zeros((n, r, tree.num_nodes))
    for i, (path, parent, rank) in enumerate(zip(tree.paths, tree.parents, tree.ranks)):
        parent_row = 0 if parent < 0 else row_of[tree.paths[parent]]
        above = 1.0 if parent < 0 else prob[:, :, parent]
        prob[:, :, i] = above * reach[:, :, parent_row, rank] * (len(path) <= positions.cap)[:, None]
    per_sample = prob.sum(-1)
    return _static(tree, positions, prob.mean(1), 1.0 + per_sample.mean(1)), per_sample


def _dynamic(collection: Collection, budget: int, positions: _Positions, oracle: bool = False) -> _Nodes:
    """Greedy acceptance of the top-`budget` dynamic trees (or, oracle=True, of the on-path chain
    inside the super-tree, capped at `budget`: the per-position oracle)."""
    _check_greedy(collection)
    if not collection.has_super_trees:
        raise ValueError("this collection has no super-trees: collect with super_k > 0")
    size = collection.config.super_size
    if budget > size:
        raise ValueError(f"budget {budget} exceeds the collected super-tree size {size}")
    sl = [slice(lo, hi) for lo, hi in zip(positions.offsets[:-1], positions.offsets[1:])]
    cat = lambda name: np.concatenate([getattr(p, name)[: s.stop - s.start] for p, s in zip(collection.prompts, sl)])  # noqa: E731
    on_path = cat("super_on_path").astype(np.int64)  # [T, D]
    cap = positions.cap
    depths = np.arange(1, on_path.shape[1] + 1)
    inside = np.cumprod((on_path < (size if oracle else budget)) & (depths <= cap[:, None]), axis=1).astype(bool)
    if oracle:  # the per-position "tree" is the accepted chain itself
        inside &= depths <= budget
        rows = np.arange(len(cap))[:, None]
        rank = np.where(on_path < size, cat("super_rank").astype(np.int64)[rows, np.minimum(on_path, size - 1)], 0)
        parent = np.broadcast_to(np.arange(-1, on_path.shape[1] - 1), on_path.shape)
        tokens = np.minimum(inside.sum(1) + 1, positions.left).astype(float)
        return _Nodes(np.broadcast_to(depths, on_path.shape), rank, parent, inside, inside.astype(float), tokens)
    n = np.minimum(cat("super_size").astype(np.int64), budget)
    valid = np.arange(budget)[None, :] < n[:, None]
    prob = np.zeros(valid.shape)
    rows, cols = np.nonzero(inside)
    prob[rows, on_path[rows, cols]] = 1.0
    accepted = inside.sum(1)
    return _Nodes(
        depth=cat("super_depth")[:, :budget].astype(np.int64), rank=cat("super_rank")[:, :budget].astype(np.int64),
        parent=cat("super_parent")[:, :budget].astype(np.int64), valid=valid, prob=prob,
        tokens=np.minimum(accepted + 1, positions.left).astype(float),
    )


def _check_greedy(collection: Collection) -> None:
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
    depth_hits = np.stack([(prob * (nodes.depth == d)).sum(1) for d in range(1, max_depth + 1)], axis=1) \
        if max_depth else np.zeros((n, 0))
    rank_hits = np.stack([(prob * (nodes.rank == r)).sum(1) for r in range(max_rank)], axis=1) \
        if max_rank else np.zeros((n, 0))
    rank_visits = np.stack([(weight * (children > r)).sum(1) for r in range(max_rank)], axis=1) \
        if max_rank else np.zeros((n, 0))
    return _PerPosition(
        drafted=in_tree.sum(1).astype(float), accepted=prob.sum(1), tokens=nodes.tokens,
        tree_depth=np.where(in_tree, nodes.depth, 0).max(1) if width else np.zeros(n, dtype=np.int64),
        depth_hits=depth_hits, rank_hits=rank_hits, rank_visits=rank_visits,
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
        "steps": steps, "drafted": float(drafted), "accepted": float(accepted), "tokens": float(tokens),
        "acceptance_rate": accepted / drafted if drafted else float("nan"),
        "acceptance_length": accepted / steps if steps else float("nan"),
        "tau": tokens / steps if steps else float("nan"),
    }
    if sampling:  # normal approximation over positions (each the mean of its draft samples)
        se = float(np.std(per.tokens[keep], ddof=1) / np.sqrt(steps)) if steps > 1 else float("nan")
        row.update({"tau_se": se, "tau_ci_low": row["tau"] - 1.96 * se, "tau_ci_high": row["tau"] + 1.96 * se})
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
        return [{**head, "prompts": len(collection.prompts), **_pool(per, keep, collection.sampling)}]
    out = []
    for i, p in enumerate(collection.prompts):
        mine = keep & (positions.prompt == i)
        out.append({**head, "prompt_id": p.prompt_id, "category": p.category, **_pool(per, mine, collection.sampling)})
    return out


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
    collected draft samples, with tau_se and a 95% interval (tau_ci_low, tau_ci_high).
    max_new_tokens: replay a shorter generation (default: the collected length).
    """
    positions = _positions(collection, max_new_tokens)
    rows = []
    for (shape, budget), tree in trees.items():
        if collection.sampling:
            nodes, _ = _sampled_static(collection, tree, positions)
        else:
            nodes = _greedy_static(collection, tree, positions)
        label = {"shape": shape, "budget": int(budget), "nodes": tree.num_nodes, "depth": tree.depth}
        rows += _rows(collection, label, _per_position(nodes, positions.cap), positions, mode, per_prompt)
    return pd.DataFrame(rows)


def replay_dynamic(
    collection: Collection,
    budgets: Iterable[int],
    mode: str = "all",
    max_new_tokens: int | None = None,
    per_prompt: bool = False,
) -> pd.DataFrame:
    """Metrics of the dynamic (top-n by cumulative draft log-prob) trees, shape "dynamic"."""
    return _per_budget(collection, budgets, False, mode, max_new_tokens, per_prompt)


def oracle(
    collection: Collection,
    budgets: Iterable[int],
    mode: str = "all",
    max_new_tokens: int | None = None,
    per_prompt: bool = False,
) -> pd.DataFrame:
    """The per-position oracle, shape "oracle": at each position, the longest prefix of the target's
    continuation inside the super-tree, capped at the budget. Its "tree" is that accepted chain, so
    only acceptance_length and tau mean anything (its acceptance rate is 1 by construction)."""
    return _per_budget(collection, budgets, True, mode, max_new_tokens, per_prompt)


def _per_budget(collection: Collection, budgets: Iterable[int], is_oracle: bool, mode: str,
                max_new_tokens: int | None, per_prompt: bool) -> pd.DataFrame:
    positions = _positions(collection, max_new_tokens)
    rows = []
    for n in budgets:
        per = _per_position(_dynamic(collection, int(n), positions, oracle=is_oracle), positions.cap)
        label = {"shape": "oracle" if is_oracle else "dynamic", "budget": int(n), "nodes": int(n),
                 "depth": collection.config.super_depth}
        rows += _rows(collection, label, per, positions, mode, per_prompt)
    return pd.DataFrame(rows)


def replay_steps(
    collection: Collection, tree: Tree | int, max_new_tokens: int | None = None
) -> dict[str, tuple[Step, ...]]:
    """Per prompt, the `Step`s a real greedy run with `tree` makes (times 0), from the collection.

    tree: a static tree, or an int n for the dynamic tree of budget n (super-trees needed)."""
    positions = _positions(collection, max_new_tokens)
    if isinstance(tree, Tree):
        nodes = _greedy_static(collection, tree, positions)
    else:
        nodes = _dynamic(collection, int(tree), positions)
    per = _per_position(nodes, positions.cap)
    keep = _trajectory(per, positions)
    out = {}
    for i, p in enumerate(collection.prompts):
        steps = []
        for j in np.nonzero(keep & (positions.prompt == i))[0]:
            in_tree = nodes.valid[j] & (nodes.depth[j] <= positions.cap[j])
            kids = np.bincount(nodes.parent[j][in_tree] + 1, minlength=nodes.valid.shape[1] + 1)
            path = sorted(np.nonzero(nodes.prob[j] > 0)[0], key=lambda v: nodes.depth[j, v])
            steps.append(Step(
                position=int(positions.t[j]), num_drafted=int(in_tree.sum()), num_accepted=len(path),
                num_tokens=int(per.tokens[j]), draft_time=0.0, verify_time=0.0, tree_depth=int(per.tree_depth[j]),
                accepted_ranks=tuple(int(nodes.rank[j, v]) for v in path),
                child_counts=tuple(int(kids[v + 1]) for v in [-1] + path),
            ))
        out[p.prompt_id] = tuple(steps)
    return out


def position_table(collection: Collection, tree: Tree | int, max_new_tokens: int | None = None) -> pd.DataFrame:
    """One row per position: drafted, accepted (expected in sampling mode) and tokens added by a
    step of `tree` there (an int n: the dynamic tree of budget n), and whether a real greedy run
    visits it (on_trajectory)."""
    positions = _positions(collection, max_new_tokens)
    if collection.sampling:
        nodes = _sampled_static(collection, tree, positions)[0]
    elif isinstance(tree, Tree):
        nodes = _greedy_static(collection, tree, positions)
    else:
        nodes = _dynamic(collection, int(tree), positions)
    per = _per_position(nodes, positions.cap)
    return pd.DataFrame({
        "prompt_id": [collection.prompts[i].prompt_id for i in positions.prompt],
        "category": [collection.prompts[i].category for i in positions.prompt],
        "position": positions.t, "drafted": per.drafted, "accepted": per.accepted, "tokens": per.tokens,
        "on_trajectory": _trajectory(per, positions) if not collection.sampling else False,
    })


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


# ---- data-driven trees from a collection -------------------------------------------------------


def acceptance_vector(collection: Collection, k: int | None = None, max_new_tokens: int | None = None) -> tuple[float, ...]:
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


def ceiling(collection: Collection, budgets: Iterable[int], max_new_tokens: int | None = None) -> dict[int, Tree]:
    """The hindsight-best static tree per budget on this collection (all positions)."""
    return hindsight_trees(prefix_counts(collection, max_new_tokens), budgets)


def sequoia(
    collection: Collection, budgets: Iterable[int], max_depth: int | None = None, max_new_tokens: int | None = None
) -> dict[int, Tree]:
    """Sequoia's DP trees per budget for this collection's measured acceptance vector."""
    budgets = list(budgets)
    trees = sequoia_trees(acceptance_vector(collection, max_new_tokens=max_new_tokens), max(budgets), max_depth)
    return {n: trees[n] for n in budgets}


# ---- helpers -----------------------------------------------------------------------------------


def _tree(spec: str) -> Tree:
    shape, _, budget = spec.partition(":")
    if not budget.isdigit():
        raise ValueError(f"tree {spec!r} must be shape:budget, e.g. chain:4")
    return Tree.preset(shape, int(budget))


def _seed(seed: int, prompt_id: str) -> int:
    """A seed per prompt that does not depend on the order prompts are collected in."""
    return (seed * 1_000_003 + zlib.crc32(prompt_id.encode())) % (2**31)


def _file_name(prompt_id: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", prompt_id)[:40]
    return f"{safe}-{zlib.crc32(prompt_id.encode()):08x}.npz"


def _config_to_json(config: CollectConfig) -> dict:
    out = asdict(config)
    out["eos_token_id"] = None if config.eos_token_id is None else list(config.eos_token_id)
    return out


def _config_from_json(d: Mapping[str, Any]) -> CollectConfig:
    d = dict(d)
    if d.get("eos_token_id") is not None:
        d["eos_token_id"] = tuple(d["eos_token_id"])
    return CollectConfig(**d)
