"""Batched speculative generation: B prompts of different lengths, one target forward per step
verifying B x (N + 1) tokens, each row under its own tree mask and positions (`core.ragged`).

    speculative_generate_batch      draft -> verify -> accept -> commit for every row at once; rows
                                    accept different lengths (a per-row commit) and leave the batch
                                    when they reach EOS or their length
    autoregressive_generate_batch   the target alone on the same batch: one forward per token for
                                    every row (the baseline a batched speculative run must beat)
    BatchModelDrafter               a draft model drafting every row's tree together: one draft
                                    forward per depth for the whole batch, on its own ragged cache
                                    (a `Drafter`: its `draft` is a batch of one row)
    BatchResult                     per-row `GenerationResult`s (their steps carry the batch step's
                                    seconds) and the batch's own wall clock

One tree shape per step for every row. A model draft fills it for all rows; drafters of their own
(n-gram and other host-side drafters, one per row) may build smaller trees of their own, padded to
the largest for the verify block. Near a row's length its tree is cut per row (canonical order puts
a depth's nodes after every shallower one, so the cut tree is the first K nodes: the rest of the
block is padding for that row).

Exactness. A row's verify sees exactly its own committed tokens at its own positions, so under
greedy decoding each row's output equals that prompt's own batch-1 greedy output (up to float
rounding of kernels over another batch shape: `analysis.quality.compare_greedy` tells a tie from a
mismatch); acceptance runs per row with the single-row rules (greedy, lossless sampling with the
row's own generator, typical acceptance, LOSSY), so sampled rows follow the target's distribution.
Padding is never realigned: a row's tokens keep the slots their positions name (`core.ragged`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .acceptance import accept
from .drafting import Draft, Drafter, fill_levels
from .generation import GenerationResult, Step, StepOutcome
from .masks import attention_implementation, rooted_ancestor_mask
from .ragged import RaggedCache, block_forward, causal_block, commit, discard, select_rows
from .runtime import Clock, cut_at_eos, eos_ids, make_generator, peak_memory, reset_peak_memory
from .sampling import GREEDY, SamplingConfig, probabilities, sample, sample_without_replacement
from .streaming import kv_bytes
from .trees import Level, Tree


@dataclass(frozen=True)
class BatchResult:
    """A batch's rows, in prompt order, and its wall clock. Each row's steps carry the seconds of
    the batch step they were part of (a step drafts and verifies every active row at once)."""

    rows: tuple[GenerationResult, ...]
    total_time: float  # seconds, the whole call
    prefill_time: float  # seconds before the first step (the prompts' ragged prefill)

    @property
    def batch_size(self) -> int:
        return len(self.rows)

    @property
    def tokens(self) -> int:
        return sum(len(r.tokens) for r in self.rows)

    @property
    def tokens_per_s(self) -> float:
        """All rows' new tokens over the call's wall clock: the batch's throughput."""
        return self.tokens / self.total_time if self.total_time > 0 else float("nan")


def check_prompts(prompts: Sequence[torch.Tensor], max_new_tokens: int) -> list[list[int]]:
    """Each prompt as a host list of ids; ValueError for an empty batch, an empty prompt or a bad length."""
    if not prompts:
        raise ValueError("a batch needs at least one prompt")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    out = [torch.as_tensor(p).reshape(-1).tolist() for p in prompts]  # host: lists of ids
    if any(not p for p in out):
        raise ValueError("every prompt needs at least one token")
    return out


def draw_rows(probs: torch.Tensor, level: Level, generators: Sequence[torch.Generator]) -> torch.Tensor:
    """Sampling: each row's children drawn with that row's own generator (probs [B, P, V])."""
    return torch.stack([sample_without_replacement(probs[i], level.width, g) for i, g in enumerate(generators)])


def prefill_batch(model: torch.nn.Module, ragged: RaggedCache, sequences: Sequence[Sequence[int]]) -> None:
    """Append each row's tokens (any lengths, >= 0) as committed tokens, causally, in one forward."""
    if not max(map(len, sequences)):
        return
    block, columns = causal_block(ragged, [list(seq) for seq in sequences])
    block_forward(model, ragged, *block, logits_to_keep=1)
    commit(ragged, columns)


class BatchModelDrafter(Drafter):
    """A draft model drafting one tree shape for every row at once (greedy: each node the rank-r
    token of its parent's draft distribution; sampling: draws without replacement, q returned, as
    `drafting.ModelDrafter`). Its cache is ragged like the target's: each step first feeds every
    row's tokens it lacks (the accepted ones and the next root), then one forward per depth feeds
    the batch's nodes of that depth; the nodes are discarded afterwards.

    A `Drafter`: `draft_batch` drafts the rows of `speculative_generate_batch`, and `draft` one
    sequence, a batch of one, so `speculative_generate` takes it as it takes any drafter."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.reset()

    def reset(self) -> None:
        self.ragged: RaggedCache | None = None
        self.committed: list[list[int]] = []

    def check_request(self, tree: Tree, sampling: SamplingConfig) -> None:
        if not sampling.greedy and tree.has_rank_gaps:
            raise ValueError("sampling needs a tree whose sibling ranks have no gaps (0..k-1)")

    @torch.inference_mode()
    def draft(
        self, tokens: torch.Tensor, tree: Tree, sampling: SamplingConfig, generator: torch.Generator | None = None
    ) -> Draft:
        """One sequence (long [1, T] or [T], its last token the root): the batch of one row."""
        seq = tokens.reshape(-1).tolist()
        if self.ragged is None:  # a new generation (`reset`): its prompt but the root into the cache
            self.start([seq])
        out, q = self.draft_batch([seq], tree, sampling, [generator])
        return Draft(out[0], None if q is None else q[0])

    def start(self, sequences: Sequence[Sequence[int]]) -> None:
        """A new batch: the prompts but their last token go into the draft's cache."""
        self.ragged = RaggedCache.empty(self.model, len(sequences))
        prefill_batch(self.model, self.ragged, [seq[:-1] for seq in sequences])
        self.committed = [list(seq[:-1]) for seq in sequences]

    def select_rows(self, rows: list[int]) -> None:
        select_rows(self.ragged, rows)
        self.committed = [self.committed[b] for b in rows]

    def kv_bytes(self) -> int:
        return kv_bytes(None if self.ragged is None else self.ragged.cache)

    @torch.inference_mode()
    def draft_batch(
        self,
        sequences: Sequence[Sequence[int]],
        tree: Tree,
        sampling: SamplingConfig,
        generators: Sequence[torch.Generator],
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(tokens long [B, N], q float32 [B, N + 1, V] or None when greedy) for the rows'
        sequences (each ending with its root)."""
        self.check_request(tree, sampling)
        logits = self._advance(sequences)  # [B, V]
        b = len(sequences)
        roots = torch.tensor(self.ragged.lengths) - 1  # host: each root's position
        fed_nodes: list[int] = []  # nodes fed so far, in scratch-column order

        def feed(level: Level, ids: torch.Tensor) -> torch.Tensor:
            """The batch's nodes of `level` that have children (ids long [B, F]), each under its ancestors."""
            fed = list(level.fed)
            visible = tree.ancestors[fed][:, fed_nodes + fed][None].expand(b, -1, -1)  # [B, F, S + F]
            valid = torch.ones(b, len(fed), dtype=torch.bool)  # host
            positions = (roots + level.depth)[:, None].expand(b, len(fed))
            fed_nodes.extend(fed)
            return block_forward(self.model, self.ragged, ids, positions, visible, valid)

        draft = fill_levels(tree, logits[:, None], sampling, generators, feed, draw=draw_rows)
        discard(self.ragged)
        return draft.tokens, draft.q

    def _advance(self, sequences: Sequence[Sequence[int]]) -> torch.Tensor:
        """Feed each row what its cache lacks (at least its root); float32 logits [B, V] at each
        root."""
        new = []
        for b, seq in enumerate(sequences):
            held = self.committed[b]
            if seq[: len(held)] != held or len(seq) <= len(held):
                raise ValueError("a row's sequence must extend what its draft cache holds")
            new.append(list(seq[len(held) :]))
        block, columns = causal_block(self.ragged, new)
        root_logits = block_forward(self.model, self.ragged, *block, logits_to_keep=1)[
            :, -1
        ].float()  # [B, V]: each root
        commit(self.ragged, columns)
        self.committed = [list(seq) for seq in sequences]
        return root_logits


@torch.inference_mode()
def speculative_generate_batch(
    target: torch.nn.Module,
    drafter: torch.nn.Module | BatchModelDrafter | Sequence[Drafter],
    prompts: Sequence[torch.Tensor],
    tree: Tree | None = None,
    max_new_tokens: int = 64,
    sampling: SamplingConfig = GREEDY,
    eos_token_id: int | Sequence[int] | None = None,
) -> BatchResult:
    """Speculative decoding of B prompts at once (module docstring). drafter: a draft model (or its
    `BatchModelDrafter`): every row's tree drafted in one forward per depth; or one `Drafter` per
    prompt (host-side drafters draft per row). prompts: B long tensors [T_b] (or [1, T_b]). tree:
    default `Tree.chain(4)`. Row b samples with its own generator, seeded `sampling.seed` + b."""
    attention_implementation(target)
    tree = tree or Tree.chain(4)
    sequences = check_prompts(prompts, max_new_tokens)
    drafter = batch_drafter(drafter, len(sequences), tree, sampling)
    eos, generators = eos_ids(target, eos_token_id), row_generators(sampling.seed, len(sequences), target.device)
    clock = Clock(target.device)
    reset_peak_memory(target.device)
    start = clock.now()
    ragged = RaggedCache.empty(target, len(sequences))
    prefill_batch(target, ragged, [seq[:-1] for seq in sequences])  # the cache holds all but each root
    if isinstance(drafter, BatchModelDrafter):
        drafter.start(sequences)
    prefill_time = clock.now() - start

    active = list(range(len(sequences)))  # prompt indices of the rows still in the batch, in row order
    new: list[list[int]] = [[] for _ in sequences]
    steps: list[list[Step]] = [[] for _ in sequences]
    while active:
        rows_seq = [sequences[i] + new[i] for i in active]
        t0 = clock.now()
        trees, tokens, qs, drafts = draft_rows(drafter, active, rows_seq, tree, sampling, generators)  # tokens [B, N]
        t1 = clock.now()
        # each row's tree, cut so that no node lies beyond its length (canonical order: a prefix)
        cut = [t.truncated(max_new_tokens - len(new[i]) - 1) for i, t in zip(active, trees)]
        logits = _verify_rows(target, ragged, [seq[-1] for seq in rows_seq], cut, tokens).float()  # [B, N + 1, V]
        t2 = clock.now()
        keep, finished = [], []
        for r, i in enumerate(active):
            k = cut[r].num_nodes
            q = None if qs[r] is None else qs[r][: k + 1]
            result = accept(cut[r], tokens[r, :k], logits[r, : k + 1], sampling, q, generators[i])
            added, stopped = cut_at_eos([*result.tokens, result.next_token], eos)
            keep.append([0] + [1 + j for j in result.path])
            if drafts:
                drafter[i].observe(drafts[r], result)
            steps[i].append(StepOutcome(cut[r], result, t1 - t0, t2 - t1).record(len(new[i]), added))
            new[i].extend(added)
            if stopped or len(new[i]) >= max_new_tokens:
                finished.append(r)
        commit(ragged, keep)
        active = drop_rows(ragged, drafter, active, finished)
    total = clock.now() - start
    if not isinstance(drafter, BatchModelDrafter):
        for d in drafter:
            d.release()
    return batch_result(target, sequences, new, steps, sampling.method("speculative_batch"), prefill_time, total)


def batch_drafter(
    drafter: torch.nn.Module | BatchModelDrafter | Sequence[Drafter], rows: int, tree: Tree, sampling: SamplingConfig
) -> BatchModelDrafter | list[Drafter]:
    """A draft model as a `BatchModelDrafter`, or one checked and reset `Drafter` per row."""
    if isinstance(drafter, BatchModelDrafter):
        return drafter
    if isinstance(drafter, torch.nn.Module):
        return BatchModelDrafter(drafter)
    drafter = list(drafter)
    if len(drafter) != rows:
        raise ValueError(f"one drafter per prompt: got {len(drafter)} for {rows} prompts")
    for d in drafter:
        d.check_request(tree, sampling)
        d.reset()
    return drafter


def draft_rows(
    drafter: BatchModelDrafter | list[Drafter],
    active: list[int],
    rows_seq: list[list[int]],
    tree: Tree,
    sampling: SamplingConfig,
    generators: list[torch.Generator],
) -> tuple[list[Tree], torch.Tensor, list[torch.Tensor | None], list[Draft]]:
    """Every active row's tree, its tokens (long [B, N], padded to the largest tree), its draft
    probabilities ([N + 1, V] per row, None for deterministic proposals) and, for per-row drafters,
    their `Draft`s (the model drafter returns none)."""
    if isinstance(drafter, BatchModelDrafter):
        tokens, q = drafter.draft_batch(rows_seq, tree, sampling, [generators[i] for i in active])
        return [tree] * len(active), tokens, [None if q is None else q[r] for r in range(len(active))], []
    drafts = [
        drafter[i].draft(torch.tensor(seq), tree, sampling, generators[i])  # host ids: drafters read them there
        for i, seq in zip(active, rows_seq)
    ]
    trees = [d.tree or tree for d in drafts]
    device = generators[0].device
    tokens = torch.zeros(len(active), max(t.num_nodes for t in trees), dtype=torch.long, device=device)
    for r, d in enumerate(drafts):
        tokens[r, : d.tokens.numel()] = d.tokens.to(device)
    return trees, tokens, [d.q for d in drafts], drafts


def drop_rows(
    ragged: RaggedCache, drafter: BatchModelDrafter | list[Drafter] | None, active: list[int], finished: list[int]
) -> list[int]:
    """The rows still active once the `finished` ones (row indices) leave the cache and the draft's."""
    if not finished:
        return active
    stay = [r for r in range(len(active)) if r not in finished]
    select_rows(ragged, stay)
    if isinstance(drafter, BatchModelDrafter):
        drafter.select_rows(stay)
    return [active[r] for r in stay]


def row_generators(seed: int | None, rows: int, device: torch.device) -> list[torch.Generator]:
    """Row b's generator, seeded seed + b (None: every row from entropy)."""
    return [make_generator(None if seed is None else seed + b, device) for b in range(rows)]


def batch_result(
    target: torch.nn.Module,
    sequences: list[list[int]],
    new: list[list[int]],
    steps: list[list[Step]],
    method: str,
    prefill_time: float,
    total: float,
) -> BatchResult:
    """Each row's `GenerationResult`, in prompt order, with the batch's times."""
    rows = tuple(
        GenerationResult(
            tokens=torch.tensor(new[i], dtype=torch.long),  # host: results live on the CPU
            steps=tuple(steps[i]),
            prompt_length=len(sequences[i]),
            prefill_time=prefill_time,
            total_time=total,
            peak_memory_bytes=peak_memory(target.device),
            method=method,
            meta={"batch_size": len(sequences)},
        )
        for i in range(len(sequences))
    )
    return BatchResult(rows, total, prefill_time)


def _verify_rows(
    target: torch.nn.Module, ragged: RaggedCache, roots: list[int], trees: list[Tree], tokens: torch.Tensor
) -> torch.Tensor:
    """Logits [B, N + 1, V] of every row's root and nodes (row r's tree: `trees[r]`, its first
    nodes of `tokens[r]`; the block is as wide as the largest tree, the rest padding)."""
    b = len(roots)
    n = max(t.num_nodes for t in trees)
    ids = torch.cat([torch.tensor(roots, device=tokens.device)[:, None], tokens[:, :n]], dim=1)  # [B, N + 1]
    visible = torch.zeros(b, n + 1, n + 1, dtype=torch.bool)  # host: moved by block_forward
    valid = torch.zeros(b, n + 1, dtype=torch.bool)  # host
    positions = torch.zeros(b, n + 1, dtype=torch.long)  # host
    for r, t in enumerate(trees):
        k = t.num_nodes
        visible[r, : k + 1, : k + 1] = rooted_ancestor_mask(t.ancestors)
        valid[r, : k + 1] = True
        positions[r, : k + 1] = ragged.lengths[r] + torch.tensor((0,) + t.depths)  # host
    return block_forward(target, ragged, ids, positions, visible, valid)


@torch.inference_mode()
def autoregressive_generate_batch(
    target: torch.nn.Module,
    prompts: Sequence[torch.Tensor],
    max_new_tokens: int = 64,
    sampling: SamplingConfig = GREEDY,
    eos_token_id: int | Sequence[int] | None = None,
) -> BatchResult:
    """The target alone on a batch: each step one forward of one token per active row (the first
    after the prompts' ragged prefill). Row b samples with its own generator seeded `sampling.seed` + b."""
    attention_implementation(target)
    sequences = check_prompts(prompts, max_new_tokens)
    device = target.device
    eos, generators = eos_ids(target, eos_token_id), row_generators(sampling.seed, len(sequences), device)
    one = Tree.chain(0)
    clock = Clock(device)
    reset_peak_memory(device)
    start = clock.now()
    ragged = RaggedCache.empty(target, len(sequences))
    prefill_batch(target, ragged, [seq[:-1] for seq in sequences])
    prefill_time = clock.now() - start
    active = list(range(len(sequences)))
    new: list[list[int]] = [[] for _ in sequences]
    steps: list[list[Step]] = [[] for _ in sequences]
    while active:
        t0 = clock.now()
        roots = [(sequences[i] + new[i])[-1] for i in active]
        empty = torch.zeros(len(active), 0, dtype=torch.long, device=device)
        logits = _verify_rows(target, ragged, roots, [one] * len(active), empty)[:, 0].float()  # [B, V]
        t1 = clock.now()
        finished = []
        for r, i in enumerate(active):
            row = logits[r]  # [V]
            token = int(row.argmax()) if sampling.greedy else sample(probabilities(row, sampling), generators[i])
            steps[i].append(Step(len(new[i]), 0, 0, 1, 0.0, t1 - t0, child_counts=(0,)))
            new[i].append(token)
            if token in eos or len(new[i]) >= max_new_tokens:
                finished.append(r)
        commit(ragged, [[0]] * len(active))
        active = drop_rows(ragged, None, active, finished)
    total = clock.now() - start
    return batch_result(target, sequences, new, steps, "autoregressive_batch", prefill_time, total)
