"""The generation loops: tree speculative decoding and its baseline, with the same instrumentation.

`speculative_step` is one target call: draft -> verify -> accept -> commit. `speculative_generate`
is the loop around it (until `max_new_tokens` or EOS), with the bookkeeping kept out of the step:
the bounded-cache policy, the tree cut to the tokens left, the step records. `autoregressive_generate`
is the target's own decoding, one target call per token. Both loops return a `GenerationResult` with
one `Step` per target call that produced tokens. Batch size 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from .acceptance import Acceptance, accept
from .cache import cache_length, new_cache
from .drafting import Draft, Drafter, as_drafter
from .masks import attention_implementation
from .runtime import Clock, check_input, cut_at_eos, eos_ids, make_generator, peak_memory, reset_peak_memory
from .sampling import GREEDY, SamplingConfig, probabilities, sample
from .streaming import StreamingCache, kv_bytes
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
    target_kv_bytes: int = 0  # bytes of the target's KV cache after the step (`streaming.kv_bytes`)
    draft_kv_bytes: int = 0  # the draft's (`Drafter.kv_bytes`; 0 for drafters without a cache)
    # tokens the draft model drafted in its own vocabulary (cross-tokenizer drafts, transformers'
    # universal assisted generation); None: num_drafted (the draft shares the target's vocabulary)
    draft_tokens: int | None = None


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
    kv_bytes: int | None = None  # target + draft KV cache bytes at the end (None: not measured)
    kv_peak_bytes: int | None = None  # their largest sum, inside a step (the root and tree included)
    evictions: int = 0  # times the target's cache was cut (`StreamingCache`); the draft's in meta


@dataclass
class TargetCache:
    """The target's KV cache between steps. Invariant: it holds every token of the sequence but the
    root (the last token), except `pending`: the prompt before the first verification, which goes
    through the target inside that verification (`verification.verify`)."""

    cache: DynamicCache
    pending: torch.Tensor  # long [P]: tokens before the root that the cache does not hold yet
    position_offset: int = 0  # positions cut out of a bounded cache that keeps original positions
    evictions: int = 0  # times a bounded cache was cut

    def held(self) -> int:
        """Tokens before the root once `pending` is in: the prefix a verified tree sits on."""
        return cache_length(self.cache) + self.pending.numel()


def bound_target(state: TargetCache, policy: StreamingCache, target: torch.nn.Module, cut: bool) -> int:
    """Under a bounded-cache policy only: cut the cache before the root (a generated token, never
    inside a tree) when `cut`, and return the deepest tree that then fits (`depth_cap`)."""
    removed = policy.cut(target, state.cache) if cut else 0
    state.evictions += removed > 0
    state.position_offset += removed if policy.positions == "original" else 0
    return policy.depth_cap(state.held())


def open_target(target: torch.nn.Module, drafter: Drafter, prompt: torch.Tensor) -> TargetCache:
    """The target's cache for a generation, the prompt pending (it goes through the first
    verification), except for a drafter that shares the target's cache: it needs the prompt there
    before its first draft. prompt: long [1, T]."""
    state = TargetCache(new_cache(target), prompt[0, :-1].to(target.device))
    drafter.bind_target_cache(state.cache)  # before the prefill: a drafter may read its hidden states (Medusa)
    if drafter.shares_target_cache and state.pending.numel():
        prefill(target, state.cache, state.pending[None])
        state.pending = state.pending[:0]
    return state


@dataclass(frozen=True)
class StepOutcome:
    """What one speculative step did; the loop turns it into a `Step` record (`record`)."""

    tree: Tree  # the verified tree: the request, or the drafter's own shape
    acceptance: Acceptance
    draft_time: float  # seconds
    verify_time: float  # seconds (target forward)
    kv_bytes: int = 0  # target + draft KV bytes with the tree in the target's cache: the step's peak
    draft_tokens: int | None = None  # `Draft.draft_tokens`: tokens drafted in the draft's own vocabulary

    def record(self, position: int, added: list[int], target_kv_bytes: int = 0, draft_kv_bytes: int = 0) -> Step:
        """The step's record: `added`, the tokens it added (an EOS may cut them short); KV bytes after it."""
        path, tree = self.acceptance.path[: len(added)], self.tree  # an EOS inside the path cuts the rest
        return Step(
            position=position,
            num_drafted=tree.num_nodes,
            num_accepted=len(path),
            num_tokens=len(added),
            draft_time=self.draft_time,
            verify_time=self.verify_time,
            tree_depth=tree.depth,
            accepted_ranks=tuple(tree.ranks[i] for i in path),
            child_counts=tuple(len(tree.children[row]) for row in (0, *(i + 1 for i in path))),
            target_kv_bytes=target_kv_bytes,
            draft_kv_bytes=draft_kv_bytes,
            draft_tokens=self.draft_tokens,
        )


def speculative_step(
    target: torch.nn.Module,
    state: TargetCache,
    drafter: Drafter,
    seq: list[int],
    tree: Tree,
    sampling: SamplingConfig,
    generator: torch.Generator,
    clock: Clock | None = None,
) -> StepOutcome:
    """One target call: the drafter fills `tree` after `seq` (host ids; seq[-1] is the root), the
    target verifies root + nodes in one forward under the tree mask, the acceptance rule keeps a
    branch, and the target's cache keeps exactly the root and that branch. clock: times the draft and
    the verification (default: one that syncs the device at each reading)."""
    clock = clock or Clock(target.device)
    held = state.held()
    t0 = clock.now()
    draft = drafter.draft(torch.tensor(seq), tree, sampling, generator)  # host ids: drafters read them there
    tree = drafted_tree(draft, tree)
    t1 = clock.now()
    logits = verify(target, state.cache, seq[-1], tree, draft.tokens, state.pending, state.position_offset)  # [N+1, V]
    state.pending = state.pending[:0]
    t2 = clock.now()
    peak = kv_bytes(state.cache) + drafter.kv_bytes()
    result = accept(tree, draft.tokens, logits, sampling, draft.q, generator)
    commit(state.cache, held, result.path)
    drafter.observe(draft, result)
    return StepOutcome(tree, result, t1 - t0, t2 - t1, peak, draft.draft_tokens)


def speculative_generate(
    target: torch.nn.Module,
    drafter: Drafter | torch.nn.Module,
    input_ids: torch.Tensor,
    tree: Tree | None = None,
    max_new_tokens: int = 64,
    sampling: SamplingConfig = GREEDY,
    eos_token_id: int | Sequence[int] | None = None,
    cache_policy: StreamingCache | None = None,
    synced_times: bool = True,
) -> GenerationResult:
    """Tree speculative decoding; greedy output equals the target's greedy output token for token,
    sampled output follows the target's distribution (unless `sampling.typical` asks for the LOSSY rule).

    input_ids: long [1, T]. tree: default the drafter's `default_tree` (drafters that shape their
    own trees), else `Tree.chain(4)`. eos_token_id: default the target's generation config; pass ()
    to never stop early. The prompt goes through the target inside the first verification, except
    for a drafter that shares the target's cache, which needs it there before its first draft.
    cache_policy: a bounded cache for the target (`streaming.StreamingCache`), cut between steps,
    trees cut to fit: output then equals the streaming target's own (`autoregressive_generate` with
    the same policy). The draft's cache follows the drafter's own policy, if any. synced_times=False:
    the step's draft and verify times are read without waiting for the device (no syncs for timing:
    on a GPU they are then what the host saw, not the device's).
    """
    drafter = as_drafter(drafter)
    tree = tree or drafter.default_tree or Tree.chain(4)
    check_request(target, drafter, tree, sampling, cache_policy)
    prompt = check_input(input_ids, max_new_tokens)
    eos, generator = eos_ids(target, eos_token_id), make_generator(sampling.seed, target.device)
    drafter.reset()
    clock = Clock(target.device, sync=synced_times)
    reset_peak_memory(target.device)
    start = clock.now()
    state = open_target(target, drafter, prompt)
    prefill_time = clock.now() - start
    seq, new, steps, kv_peak = prompt[0].tolist(), [], [], 0
    while len(new) < max_new_tokens:
        depth = max_new_tokens - len(new) - 1  # no node past max_new_tokens (the bonus token is the +1)
        if cache_policy is not None:
            depth = min(depth, bound_target(state, cache_policy, target, cut=bool(new)))
        out = speculative_step(target, state, drafter, seq, tree.truncated(depth), sampling, generator, clock)
        kv_peak = max(kv_peak, out.kv_bytes)
        added, stopped = cut_at_eos([*out.acceptance.tokens, out.acceptance.next_token], eos)
        steps.append(out.record(len(new), added, kv_bytes(state.cache), drafter.kv_bytes()))
        new += added
        seq += added
        if stopped:
            break
    total = clock.now() - start
    drafter.release()
    return GenerationResult(
        tokens=torch.tensor(new, dtype=torch.long),  # host: results live on the CPU
        steps=tuple(steps),
        prompt_length=int(prompt.shape[-1]),
        prefill_time=prefill_time,
        total_time=total,
        peak_memory_bytes=peak_memory(target.device),
        method=sampling.method("speculative"),
        kv_bytes=kv_bytes(state.cache) + drafter.kv_bytes(),
        kv_peak_bytes=kv_peak,
        evictions=state.evictions,
        meta={"draft_evictions": drafter.evictions} if cache_policy is not None or drafter.evictions else {},
    )


def check_request(
    target: torch.nn.Module, drafter: Drafter, tree: Tree, sampling: SamplingConfig, cache_policy: StreamingCache | None
) -> None:
    """Refuse, before any compute, a request that cannot run: a drafter on the target's cache under
    a cache policy, a tree the drafter cannot draft, a target without a mask-taking attention."""
    if cache_policy is not None and drafter.shares_target_cache:
        raise ValueError(
            "a drafter that shares the target's cache cannot run with a cache policy (its layers "
            "would be cut under it); give the target the policy and use a separate draft model"
        )
    drafter.check_request(tree, sampling)
    attention_implementation(target)


def autoregressive_generate(
    target: torch.nn.Module,
    input_ids: torch.Tensor,
    max_new_tokens: int = 64,
    sampling: SamplingConfig = GREEDY,
    eos_token_id: int | Sequence[int] | None = None,
    cache_policy: StreamingCache | None = None,
) -> GenerationResult:
    """The target's own decoding: one forward pass per token (the first on the whole prompt).
    cache_policy: a bounded cache (`streaming.StreamingCache`), cut before a generated token is
    fed when it holds the policy's limit: the streaming model's own decoding."""
    device = target.device
    seq = check_input(input_ids, max_new_tokens).to(device)
    eos, generator = eos_ids(target, eos_token_id), make_generator(sampling.seed, device)
    clock = Clock(device)
    reset_peak_memory(device)
    start = clock.now()
    cache = new_cache(target)
    feed, new, steps, evicted, evictions, kv_peak = seq, [], [], 0, 0, 0
    while len(new) < max_new_tokens:
        t0 = clock.now()
        positions = None
        if cache_policy is not None and new:  # a generated token: the cut comes before it is fed
            cut = cache_policy.cut(target, cache)
            evicted, evictions = evicted + cut, evictions + (cut > 0)
            if cache_policy.positions == "original":
                positions = torch.tensor([seq.shape[1] + len(new) - 1], device=device)  # its true index
        logits = prefill(target, cache, feed, positions)[-1]
        token = int(logits.argmax()) if sampling.greedy else sample(probabilities(logits, sampling), generator)
        t1 = clock.now()
        kv_peak = max(kv_peak, kv_bytes(cache))
        steps.append(Step(len(new), 0, 0, 1, 0.0, t1 - t0, child_counts=(0,), target_kv_bytes=kv_bytes(cache)))
        new.append(token)
        if token in eos:
            break
        feed = torch.tensor([[token]], device=device)
    total = clock.now() - start
    return GenerationResult(
        tokens=torch.tensor(new, dtype=torch.long),  # host: results live on the CPU
        steps=tuple(steps),
        prompt_length=int(input_ids.shape[-1]),
        prefill_time=0.0,
        total_time=total,
        peak_memory_bytes=peak_memory(device),
        method="autoregressive",
        kv_bytes=kv_bytes(cache),
        kv_peak_bytes=kv_peak,
        evictions=evictions,
    )


def drafted_tree(draft: Draft, requested: Tree) -> Tree:
    """The tree to verify: the drafter's own if it built one, checked against the request."""
    tree = requested if draft.tree is None else draft.tree
    if tree.num_nodes != draft.tokens.numel():
        raise ValueError(f"the drafter returned {draft.tokens.numel()} tokens for a tree of {tree.num_nodes} nodes")
    if tree.depth > requested.depth:
        raise ValueError(f"the drafter built a tree of depth {tree.depth}, deeper than the {requested.depth} allowed")
    return tree
