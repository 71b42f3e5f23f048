"""The generation loop: tree speculative decoding and its baseline, for one row or a batch, with the
same instrumentation.

`Loop.step` is one target call for B >= 1 rows: draft -> verify -> accept -> commit. `Loop.run` is
the loop around it (each row until its `max_new_tokens` or EOS), with the bookkeeping kept out of the
step: the bounded-cache policy, each row's tree cut to the tokens it has left, the step records, rows
leaving the batch. What a step measures is a `Meter` passed in: times (its clock syncs the device only
if asked) and KV bytes. The target's side of a step is a `Rows` state: one row on a `TargetCache` here
(`speculative_generate`, `autoregressive_generate`), a ragged batch in `core.batch`, a continuation
read back in `analysis.redraft`. The drafting side is `DrafterRows` (one `Drafter` per row) or a
model drafter drafting every row together (`drafting.ModelDrafter.draft_rows`). The target's own
decoding is the same loop with a drafter that drafts nothing (`NoDraft`, an empty tree): one target
call per token. A `Loop` holds what every step
shares (the step context); a `Request` what a generation is asked for. Every loop returns a
`GenerationResult` per row with one `Step` per target call that produced tokens.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
from transformers import DynamicCache

from .acceptance import Acceptance, accept
from .cache import cache_length, new_cache
from .drafting import Draft, Drafter, NoDraft, as_drafter
from .masks import attention_implementation
from .runtime import Clock, check_input, cut_at_eos, eos_ids, make_generator, peak_memory, reset_peak_memory
from .sampling import GREEDY, SamplingConfig
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
    # bytes of the target's KV cache after the step (a batch's: all its rows'; `streaming.kv_bytes`)
    target_kv_bytes: int = 0
    draft_kv_bytes: int = 0  # the draft's (`Drafter.kv_bytes`; 0 for drafters without a cache)
    # tokens the draft model drafted in its own vocabulary (cross-tokenizer drafts, transformers'
    # universal assisted generation); None: num_drafted (the draft shares the target's vocabulary)
    draft_tokens: int | None = None


@dataclass(frozen=True)
class GenerationResult:
    tokens: torch.Tensor  # long [n], the new tokens
    steps: tuple[Step, ...]
    prompt_length: int
    prefill_time: float  # seconds before the first step (the prompt itself goes through the first step's
    #                     forward, except for a drafter on the target's cache, or a batch's ragged prefill)
    total_time: float  # wall clock of the whole call, seconds
    peak_memory_bytes: int | None  # CUDA peak allocation during the call; None on CPU
    method: str = "speculative"
    meta: dict = field(default_factory=dict, compare=False)
    kv_bytes: int | None = None  # target + draft KV cache bytes at the end (None: not measured)
    kv_peak_bytes: int | None = None  # their largest sum, inside a step (the root and tree included)
    evictions: int = 0  # times the target's cache was cut (`StreamingCache`); the draft's in meta


class Rows(Protocol):
    """The target's side of a step for B rows: a `TargetCache` (one row) or `batch.RaggedTarget`."""

    def verify(
        self, target: torch.nn.Module, roots: list[int], trees: list[Tree], tokens: torch.Tensor
    ) -> torch.Tensor:
        """Float32 logits [B, N + 1, V] at each row's root and its tree's nodes (tokens long [B, N],
        row r's first `trees[r].num_nodes` its tree's); the cache then holds the roots and trees. A
        target known only by its greedy tokens gives those instead, long [B, N + 1] (greedy only)."""

    def commit(self, paths: list[tuple[int, ...]]) -> None:
        """Each row keeps its root and the accepted nodes `paths[r]` of the tree just verified."""

    def keep_rows(self, rows: list[int]) -> None:
        """Only these rows stay (the others have finished)."""

    def kv_bytes(self) -> int: ...


class RowDrafting(Protocol):
    """The drafting side of a step for B rows: `DrafterRows` or a `drafting.ModelDrafter` (its rows together)."""

    def draft_rows(
        self,
        sequences: list[list[int]],
        tree: Tree,
        sampling: SamplingConfig,
        generators: list[torch.Generator],
        depths: list[int] | None = None,
    ) -> list[Draft]:
        """Each row's draft of `tree`; given `depths`, as the row would draft alone with `tree` cut to
        depths[r] (the loop itself cuts each drafted tree to its row's depth afterwards)."""

    def observe_rows(self, drafts: list[Draft], results: list[Acceptance]) -> None: ...

    def keep_rows(self, rows: list[int]) -> None: ...

    def kv_bytes(self) -> int: ...


@dataclass
class TargetCache:
    """One row's target KV cache between steps. Invariant: it holds every token of the sequence but
    the root (the last token), except `pending`: the prompt before the first verification, which
    goes through the target inside that verification (`verification.verify`)."""

    cache: DynamicCache
    pending: torch.Tensor  # long [P]: tokens before the root that the cache does not hold yet
    position_offset: int = 0  # positions cut out of a bounded cache that keeps original positions
    evictions: int = 0  # times a bounded cache was cut
    prefix: int = 0  # tokens before the root of the tree being verified (set by `verify`)

    def held(self) -> int:
        """Tokens before the root once `pending` is in: the prefix a verified tree sits on."""
        return cache_length(self.cache) + self.pending.numel()

    def verify(
        self, target: torch.nn.Module, roots: list[int], trees: list[Tree], tokens: torch.Tensor
    ) -> torch.Tensor:
        (root,), (tree,) = roots, trees
        self.prefix = self.held()
        logits = verify(target, self.cache, root, tree, tokens[0, : tree.num_nodes], self.pending, self.position_offset)
        self.pending = self.pending[:0]
        return logits[None]

    def commit(self, paths: list[tuple[int, ...]]) -> None:
        (path,) = paths
        commit(self.cache, self.prefix, path)

    def keep_rows(self, rows: list[int]) -> None:
        """One row: it leaves only when the generation ends, and the cache ends with it."""

    def kv_bytes(self) -> int:
        return kv_bytes(self.cache)


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


class Meter:
    """What the loop measures, an observer passed in: its clock times each step's draft and verify,
    waiting for the device only with sync=True (`runtime.Clock`: sync=False, what the host saw, and
    no device sync for timing); with kv=True it reads the caches' bytes (tensor shapes: no sync) at
    each step's peak, the tree in the target's cache, and after each step. kv=False reads none: the
    step records say 0 and the result's KV fields None. timed=False reads no clock (times 0)."""

    def __init__(self, device: torch.device | str, sync: bool = True, kv: bool = True, timed: bool = True) -> None:
        self.clock, self.kv, self.kv_peak, self.timed = Clock(device, sync), kv, 0, timed

    def now(self) -> float:
        """The clock's time; 0.0 with timed=False (a re-draft: steps without wall clock)."""
        return self.clock.now() if self.timed else 0.0

    def reset(self) -> None:
        """A new generation: no peak seen yet."""
        self.kv_peak = 0

    def at_peak(self, state: Rows, drafters: RowDrafting) -> None:
        """The step's peak: the roots and trees in the target's cache, the drafts in the draft's."""
        if self.kv:
            self.kv_peak = max(self.kv_peak, state.kv_bytes() + drafters.kv_bytes())

    def kv_bytes(self, state: Rows, drafters: RowDrafting) -> tuple[int, int]:
        """(target, draft) KV bytes now; zeros with kv=False."""
        return (state.kv_bytes(), drafters.kv_bytes()) if self.kv else (0, 0)

    def total(self, state: Rows, drafters: RowDrafting) -> int | None:
        """Target + draft KV bytes now; None with kv=False."""
        return sum(self.kv_bytes(state, drafters)) if self.kv else None

    def peak(self) -> int | None:
        return self.kv_peak if self.kv else None


class DrafterRows:
    """B rows drafted by one `Drafter` each (host-side drafters, and any drafter at batch size 1)."""

    def __init__(self, drafters: Sequence[Drafter]) -> None:
        self.drafters = list(drafters)

    def draft_rows(
        self,
        sequences: list[list[int]],
        tree: Tree,
        sampling: SamplingConfig,
        generators: list[torch.Generator],
        depths: list[int] | None = None,
    ) -> list[Draft]:
        """Each row's draft of `tree` (or, given `depths`, of `tree` cut to the row's depth: what it
        drafts alone near its end)."""
        ids = [torch.tensor(seq) for seq in sequences]  # host ids: drafters read them there
        trees = [tree] * len(ids) if depths is None else [tree.truncated(d) for d in depths]
        return [d.draft(x, t, sampling, g) for d, x, t, g in zip(self.drafters, ids, trees, generators)]

    def observe_rows(self, drafts: list[Draft], results: list[Acceptance]) -> None:
        for drafter, draft, result in zip(self.drafters, drafts, results):
            drafter.observe(draft, result)

    def keep_rows(self, rows: list[int]) -> None:
        self.drafters = [self.drafters[r] for r in rows]

    def kv_bytes(self) -> int:
        return sum(d.kv_bytes() for d in self.drafters)


@dataclass(frozen=True)
class StepOutcome:
    """What one speculative step did for one row; the loop turns it into a `Step` record (`record`)."""

    tree: Tree  # the verified tree: the request, or the drafter's own shape
    acceptance: Acceptance
    draft_time: float  # seconds
    verify_time: float  # seconds (target forward)
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


@dataclass(frozen=True)
class Request:
    """What a generation is asked for: the tree (each step's request, cut to the tokens a row has
    left), the tokens to generate, the sampling settings, the EOS ids (None: the target's generation
    config; (): never stop early), a bounded-cache policy for the target (one row), and what the steps
    measure (`Meter`; None: a new one that waits for the device)."""

    tree: Tree
    max_new_tokens: int
    sampling: SamplingConfig = GREEDY
    eos_token_id: int | Sequence[int] | None = None
    cache_policy: StreamingCache | None = None
    meter: Meter | None = None


@dataclass(frozen=True)
class Loop:
    """What every step of one generation shares: the target and its side of the step (`Rows`), the
    drafting side (`RowDrafting`), the request, each row's generator and stop tokens (by prompt), and
    the meter. `step` is one target call, `run` the loop around it. target: None where the target's
    side needs no model (`analysis.redraft`: a continuation read back), the host then its device."""

    target: torch.nn.Module | None
    state: Rows
    drafters: RowDrafting
    request: Request
    generators: list[torch.Generator | None]
    eos: list[frozenset[int]]
    meter: Meter

    @property
    def device(self) -> torch.device:
        return self.target.device if self.target is not None else torch.device("cpu")

    def step(
        self, sequences: list[list[int]], depths: list[int], generators: list[torch.Generator]
    ) -> list[StepOutcome]:
        """One target call for B rows: the drafters fill the requested tree after each row's sequence
        (host ids; its last token the root), each row's tree is cut to its depth in `depths`, the
        target verifies every row's root + nodes in one forward under the tree masks, the acceptance
        rule keeps a branch per row (with the row's generator), and the target's cache keeps exactly
        the roots and those branches."""
        sampling, meter = self.request.sampling, self.meter
        t0 = meter.now()
        request = self.request.tree.truncated(max(depths))
        drafts = self.drafters.draft_rows(sequences, request, sampling, generators, depths)  # each as if alone
        trees = [drafted_tree(d, request).truncated(depth) for d, depth in zip(drafts, depths)]
        tokens = padded_tokens(drafts, trees, self.device)  # long [B, N]
        t1 = meter.now()
        logits = self.state.verify(self.target, [seq[-1] for seq in sequences], trees, tokens)  # [B, N + 1, V]
        # (a target known by its greedy tokens alone gives them, long [B, N + 1]: `acceptance.accept`)
        t2 = meter.now()
        meter.at_peak(self.state, self.drafters)
        results = [
            accept(t, tokens[r, : t.num_nodes], logits[r, : t.num_nodes + 1], sampling, q_rows(d, t), g)
            for r, (t, d, g) in enumerate(zip(trees, drafts, generators))
        ]
        self.state.commit([result.path for result in results])
        self.drafters.observe_rows(drafts, results)
        return [StepOutcome(t, res, t1 - t0, t2 - t1, d.draft_tokens) for t, res, d in zip(trees, results, drafts)]

    def run(
        self,
        sequences: list[list[int]],
        ends: Sequence[int] | None = None,
        after: Callable[[int, int, list[int], Step], None] | None = None,
    ) -> tuple[list[list[int]], list[list[Step]]]:
        """Steps until every row has its `max_new_tokens` (or its end, `ends[i]`, where sooner) or an
        EOS, a finished row leaving the batch. Returns each row's new tokens and steps (their times and
        KV bytes read by the meter). sequences: each row's prompt (host ids), the target's cache holding
        all but its last token (or with the rest pending). A cache policy: one row on a `TargetCache`,
        cut before each step. after(i, r, sequence, step): called after each row's step (prompt i, row r
        of the batch, its sequence so far, the step's record), before a finished row leaves."""
        limit, policy = self.request.max_new_tokens, self.request.cache_policy
        ends = [min(limit, e) for e in ends] if ends is not None else [limit] * len(sequences)
        active = [i for i in range(len(sequences)) if ends[i] > 0]  # prompt indices still in the batch, in row order
        if len(active) < len(sequences):
            self.state.keep_rows(active)
            self.drafters.keep_rows(active)
        new: list[list[int]] = [[] for _ in sequences]
        steps: list[list[Step]] = [[] for _ in sequences]
        while active:
            depths = [limit - len(new[i]) - 1 for i in active]  # no node past max_new_tokens (+1: the bonus)
            if policy is not None:
                depths = [min(depths[0], bound_target(self.state, policy, self.target, cut=bool(new[0])))]
            rows = [sequences[i] + new[i] for i in active]
            outcomes = self.step(rows, depths, [self.generators[i] for i in active])
            finished = []
            kv = self.meter.kv_bytes(self.state, self.drafters)
            for r, (i, out) in enumerate(zip(active, outcomes)):
                added, stopped = cut_at_eos([*out.acceptance.tokens, out.acceptance.next_token], self.eos[i])
                steps[i].append(out.record(len(new[i]), added, *kv))
                new[i] += added
                if after is not None:
                    after(i, r, sequences[i] + new[i], steps[i][-1])
                if stopped or len(new[i]) >= ends[i]:
                    finished.append(r)
            if finished:
                stay = [r for r in range(len(active)) if r not in finished]
                self.state.keep_rows(stay)
                self.drafters.keep_rows(stay)
                active = [active[r] for r in stay]
        return new, steps


def speculative_generate(
    target: torch.nn.Module,
    drafter: Drafter | torch.nn.Module,
    input_ids: torch.Tensor,
    tree: Tree | None = None,
    max_new_tokens: int = 64,
    sampling: SamplingConfig = GREEDY,
    eos_token_id: int | Sequence[int] | None = None,
    cache_policy: StreamingCache | None = None,
    meter: Meter | None = None,
) -> GenerationResult:
    """Tree speculative decoding; greedy output equals the target's greedy output token for token,
    sampled output follows the target's distribution (unless `sampling.typical` asks for the LOSSY rule).

    input_ids: long [1, T]. tree: default the drafter's `default_tree` (drafters that shape their
    own trees), else `Tree.chain(4)`. eos_token_id: default the target's generation config; pass ()
    to never stop early. The prompt goes through the target inside the first verification, except
    for a drafter that shares the target's cache, which needs it there before its first draft.
    cache_policy: a bounded cache for the target (`streaming.StreamingCache`), cut between steps,
    trees cut to fit: output then equals the streaming target's own (`autoregressive_generate` with
    the same policy). The draft's cache follows the drafter's own policy, if any. meter: what the
    steps measure (`Meter`; default: times that wait for the device, and KV bytes);
    `Meter(device, sync=False)` reads the times without waiting (no device syncs for timing: on a
    GPU they are then what the host saw, not the device's).
    """
    drafter = as_drafter(drafter)
    tree = tree or drafter.default_tree or Tree.chain(4)
    check_request(target, drafter, tree, sampling, cache_policy)
    prompt = check_input(input_ids, max_new_tokens)
    request = Request(tree, max_new_tokens, sampling, eos_token_id, cache_policy, meter)
    return generate_one(target, drafter, prompt, request, sampling.method("speculative"))


def autoregressive_generate(
    target: torch.nn.Module,
    input_ids: torch.Tensor,
    max_new_tokens: int = 64,
    sampling: SamplingConfig = GREEDY,
    eos_token_id: int | Sequence[int] | None = None,
    cache_policy: StreamingCache | None = None,
) -> GenerationResult:
    """The target's own decoding: one forward pass per token (the first on the whole prompt), the
    loop of `speculative_generate` with a drafter that drafts nothing. Sampled tokens come from the
    target's distribution (an acceptance rule, lossy or not, has nothing to check). cache_policy: a
    bounded cache (`streaming.StreamingCache`), cut before a generated token is fed when it holds
    the policy's limit: the streaming model's own decoding."""
    prompt = check_input(input_ids, max_new_tokens)
    sampling = dataclasses.replace(sampling, typical=None)
    request = Request(NoDraft.empty, max_new_tokens, sampling, eos_token_id, cache_policy)
    return generate_one(target, NoDraft(), prompt, request, "autoregressive")


def generate_one(
    target: torch.nn.Module, drafter: Drafter, prompt: torch.Tensor, request: Request, method: str
) -> GenerationResult:
    """One row through the loop (`Loop.run`), its target on a `TargetCache` (prompt: long [1, T])."""
    drafter.reset()
    meter = request.meter or Meter(target.device)
    meter.reset()
    reset_peak_memory(target.device)
    start = meter.now()
    state = open_target(target, drafter, prompt)
    prefill_time = meter.now() - start
    sequences = [prompt[0].tolist()]
    rows = DrafterRows([drafter])
    generator = make_generator(request.sampling.seed, target.device)
    loop = Loop(target, state, rows, request, [generator], [eos_ids(target, request.eos_token_id)], meter)
    (new,), (steps,) = loop.run(sequences)
    total = meter.now() - start
    drafter.release()
    return GenerationResult(
        tokens=torch.tensor(new, dtype=torch.long),  # host: results live on the CPU
        steps=tuple(steps),
        prompt_length=int(prompt.shape[-1]),
        prefill_time=prefill_time,
        total_time=total,
        peak_memory_bytes=peak_memory(target.device),
        method=method,
        kv_bytes=meter.total(state, rows),
        kv_peak_bytes=meter.peak(),
        evictions=state.evictions,
        meta={"draft_evictions": drafter.evictions} if request.cache_policy is not None or drafter.evictions else {},
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


def drafted_tree(draft: Draft, requested: Tree) -> Tree:
    """The tree to verify: the drafter's own if it built one, checked against the request."""
    tree = requested if draft.tree is None else draft.tree
    if tree.num_nodes != draft.tokens.numel():
        raise ValueError(f"the drafter returned {draft.tokens.numel()} tokens for a tree of {tree.num_nodes} nodes")
    if tree.depth > requested.depth:
        raise ValueError(f"the drafter built a tree of depth {tree.depth}, deeper than the {requested.depth} allowed")
    return tree


def padded_tokens(drafts: list[Draft], trees: list[Tree], device: torch.device) -> torch.Tensor:
    """The rows' draft tokens, long [B, N] on `device`, N the largest tree (a row's tree is a prefix
    of its draft in canonical order; the rest of its row is padding)."""
    tokens = torch.zeros(len(drafts), max(t.num_nodes for t in trees), dtype=torch.long, device=device)
    for r, (d, t) in enumerate(zip(drafts, trees)):
        tokens[r, : t.num_nodes] = d.tokens[: t.num_nodes].to(device)
    return tokens


def q_rows(draft: Draft, tree: Tree) -> torch.Tensor | None:
    """The draft's probabilities at the root and the nodes of `tree` (its draft cut to a prefix)."""
    return None if draft.q is None else draft.q[: tree.num_nodes + 1]
