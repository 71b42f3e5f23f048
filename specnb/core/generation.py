"""The generation loops: tree speculative decoding and its baseline, with the same instrumentation.

`speculative_generate` runs draft -> verify -> accept -> commit until `max_new_tokens` or EOS;
`autoregressive_generate` is the target's own decoding, one target call per token. Both return a
`GenerationResult` with one `Step` per target call that produced tokens. Batch size 1.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

import torch

from .acceptance import Acceptance, greedy_accept, speculative_accept
from .cache import new_cache
from .drafting import Draft, Drafter, ModelDrafter, as_drafter
from .masks import attention_implementation
from .sampling import SamplingConfig, probabilities, sample
from .trees import Tree
from .verification import commit, prefill, verify


@dataclass(frozen=True)
class Step:
    """One target call."""

    position: int  # tokens generated before this step
    num_drafted: int  # draft tokens in the verified tree
    num_accepted: int  # draft tokens accepted (the bonus token excluded)
    num_tokens: int  # tokens this step added (num_accepted + 1, fewer if EOS cut it short)
    draft_time: float  # seconds
    verify_time: float  # seconds (target forward pass)
    tree_depth: int = 0
    accepted_ranks: tuple[int, ...] = ()  # rank path of the accepted branch
    # children in the tree at the root and at each accepted node (len num_accepted + 1); with
    # accepted_ranks this gives the per-rank acceptance vector
    child_counts: tuple[int, ...] = ()


@dataclass(frozen=True)
class GenerationResult:
    tokens: torch.Tensor  # long [n], the new tokens
    steps: tuple[Step, ...]
    prompt_length: int
    prefill_time: float  # seconds of target work before the first step (0 for autoregressive)
    total_time: float  # wall clock of the whole call, seconds
    peak_memory_bytes: int | None  # CUDA peak allocation during the call; None on CPU
    method: str = "speculative"
    meta: dict = field(default_factory=dict, compare=False)


def speculative_generate(
    target: torch.nn.Module,
    drafter: Drafter | torch.nn.Module,
    input_ids: torch.Tensor,
    tree: Tree | None = None,
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = 0,
    eos_token_id: int | Sequence[int] | None = None,
) -> GenerationResult:
    """Tree speculative decoding; greedy output equals the target's greedy output token for token,
    sampled output follows the target's distribution.

    input_ids: long [1, T]. tree: default the drafter's `default_tree` if it has one (drafters that
    shape their own trees), else `Tree.chain(4)`. eos_token_id: default the target's
    generation config; pass () to never stop early.
    """
    drafter = as_drafter(drafter)
    if tree is None:
        tree = getattr(drafter, "default_tree", None) or Tree.chain(4)
    sampling = SamplingConfig(temperature, top_k, top_p)
    if not sampling.greedy and tree.has_rank_gaps and isinstance(drafter, ModelDrafter):
        raise ValueError("sampling needs a tree whose sibling ranks have no gaps (0..k-1)")
    attention_implementation(target)  # refuse a mask-less attention before any compute
    device = target.device
    seq = _check_input(input_ids, max_new_tokens).to(device)
    eos = _eos_ids(target, eos_token_id)
    generator = _generator(seed, device)
    drafter.reset()

    timer = _Timer(device)
    start = timer.now()
    cache = new_cache(target)
    if seq.shape[1] > 1:
        prefill(target, cache, seq[:, :-1])
    if hasattr(drafter, "bind_target_cache"):
        drafter.bind_target_cache(cache)
    prefill_time = timer.now() - start

    new: list[int] = []
    steps: list[Step] = []
    while len(new) < max_new_tokens:
        # a tree deeper than the tokens left would overshoot: depth <= left - 1 (+1 bonus)
        step_tree = tree.truncated(max_new_tokens - len(new) - 1)
        t0 = timer.now()
        draft = drafter.draft(seq, step_tree, sampling, generator)
        t1 = timer.now()
        step_tree = _drafted_tree(draft, step_tree)
        prefix_len = seq.shape[1] - 1
        logits = verify(target, cache, int(seq[0, -1]), step_tree, draft.tokens)  # [N+1, V]
        t2 = timer.now()
        if sampling.greedy:
            result = greedy_accept(step_tree, draft.tokens, logits.argmax(-1))
        else:
            p = probabilities(logits, sampling)
            q = None if draft.q is None else _match_vocab(draft.q, p)
            result = speculative_accept(step_tree, draft.tokens, p, q, generator)
        commit(cache, prefix_len, result.path)
        if hasattr(drafter, "observe"):
            drafter.observe(draft, result)

        added = draft.tokens[list(result.path)].tolist() + [result.next_token]
        added, stopped = _cut_at_eos(added, eos)
        steps.append(_step_record(len(new), step_tree, result, added, t1 - t0, t2 - t1))
        new.extend(added)
        seq = torch.cat([seq, torch.tensor([added], device=device)], dim=1)
        if stopped:
            break
    total = timer.now() - start
    return GenerationResult(
        tokens=torch.tensor(new, dtype=torch.long),
        steps=tuple(steps),
        prompt_length=int(input_ids.shape[-1]),
        prefill_time=prefill_time,
        total_time=total,
        peak_memory_bytes=timer.peak_memory(),
        method="speculative",
    )


def autoregressive_generate(
    target: torch.nn.Module,
    input_ids: torch.Tensor,
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = 0,
    eos_token_id: int | Sequence[int] | None = None,
) -> GenerationResult:
    """The target's own decoding: one forward pass per token (the first on the whole prompt)."""
    sampling = SamplingConfig(temperature, top_k, top_p)
    device = target.device
    seq = _check_input(input_ids, max_new_tokens).to(device)
    eos = _eos_ids(target, eos_token_id)
    generator = _generator(seed, device)

    timer = _Timer(device)
    start = timer.now()
    cache = new_cache(target)
    feed = seq
    new: list[int] = []
    steps: list[Step] = []
    while len(new) < max_new_tokens:
        t0 = timer.now()
        logits = prefill(target, cache, feed)[-1]
        token = int(logits.argmax()) if sampling.greedy else sample(probabilities(logits, sampling), generator)
        t1 = timer.now()
        steps.append(Step(len(new), 0, 0, 1, 0.0, t1 - t0, child_counts=(0,)))
        new.append(token)
        if token in eos:
            break
        feed = torch.tensor([[token]], device=device)
    total = timer.now() - start
    return GenerationResult(
        tokens=torch.tensor(new, dtype=torch.long),
        steps=tuple(steps),
        prompt_length=int(input_ids.shape[-1]),
        prefill_time=0.0,
        total_time=total,
        peak_memory_bytes=timer.peak_memory(),
        method="autoregressive",
    )


# ---- helpers --------------------------------------------------------------------------------


def _check_input(input_ids: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
    if input_ids.dim() != 2 or input_ids.shape[0] != 1 or input_ids.shape[1] == 0:
        raise ValueError(f"input_ids must be [1, T] with T >= 1 (batch size 1), got {tuple(input_ids.shape)}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    return input_ids.long()


def _eos_ids(target: torch.nn.Module, eos_token_id: int | Sequence[int] | None) -> frozenset[int]:
    if eos_token_id is None:
        config = getattr(target, "generation_config", None)
        eos_token_id = getattr(config, "eos_token_id", None)
        if eos_token_id is None:
            return frozenset()
    if isinstance(eos_token_id, int):
        return frozenset([eos_token_id])
    return frozenset(int(e) for e in eos_token_id)


def _cut_at_eos(tokens: list[int], eos: frozenset[int]) -> tuple[list[int], bool]:
    for i, token in enumerate(tokens):
        if token in eos:
            return tokens[: i + 1], True
    return tokens, False


def _generator(seed: int | None, device: torch.device) -> torch.Generator:
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator


def _drafted_tree(draft: Draft, requested: Tree) -> Tree:
    """The tree to verify: the drafter's own if it built one, checked against the request."""
    tree = requested if draft.tree is None else draft.tree
    if tree.num_nodes != draft.tokens.numel():
        raise ValueError(f"the drafter returned {draft.tokens.numel()} tokens for a tree of {tree.num_nodes} nodes")
    if tree.depth > requested.depth:
        raise ValueError(f"the drafter built a tree of depth {tree.depth}, deeper than the {requested.depth} allowed")
    return tree


def _match_vocab(q: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Draft probabilities over the target's vocabulary size (models may pad embeddings
    differently; a token outside a model's vocabulary has probability 0 there)."""
    q = q.to(p.device)
    if q.shape[-1] == p.shape[-1]:
        return q
    if q.shape[-1] > p.shape[-1]:
        return q[..., : p.shape[-1]]  # p is 0 there; such a draw is always rejected
    return torch.nn.functional.pad(q, (0, p.shape[-1] - q.shape[-1]))


def _step_record(
    position: int, tree: Tree, result: Acceptance, added: list[int], draft_time: float, verify_time: float
) -> Step:
    path = result.path[: len(added)]  # an EOS inside the path cuts the rest of it
    rows = (0,) + tuple(i + 1 for i in path)
    return Step(
        position=position,
        num_drafted=tree.num_nodes,
        num_accepted=len(path),
        num_tokens=len(added),
        draft_time=draft_time,
        verify_time=verify_time,
        tree_depth=tree.depth,
        accepted_ranks=tuple(tree.ranks[i] for i in path),
        child_counts=tuple(len(tree.children[r]) for r in rows),
    )


class _Timer:
    """Wall clock that waits for queued CUDA work, and the CUDA peak memory of the call."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = torch.device(device).type == "cuda"
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(device)
        self.device = device

    def now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def peak_memory(self) -> int | None:
        return int(torch.cuda.max_memory_allocated(self.device)) if self.cuda else None
