"""Batched speculative generation: B prompts of different lengths, one target forward per step
verifying B x (N + 1) tokens, each row under its own tree mask and positions (`core.ragged`). The
loop and the step are batch 1's (`generation.Loop`); this module gives them a ragged target.

    speculative_generate_batch      draft -> verify -> accept -> commit for every row at once; rows
                                    accept different lengths (a per-row commit) and leave the batch
                                    when they reach EOS or their length
    autoregressive_generate_batch   the target alone on the same batch: one forward per token for
                                    every row (the baseline a batched speculative run must beat; with
                                    each greedy token's top-2 margin, `MarginRows`)
    RaggedTarget                    the target's side of a batch step: verify, commit, rows leaving
    BatchResult                     per-row `GenerationResult`s (their steps carry the batch step's
                                    seconds) and the batch's own wall clock

One tree shape per step for every row. A draft model fills it for all rows at once
(`drafting.ModelDrafter.draft_rows`: one draft forward per depth for the whole batch, on the draft's
own ragged cache); drafters of their own
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

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .drafting import Drafter, ModelDrafter, NoDraft, check_batched
from .generation import DrafterRows, GenerationResult, Loop, Meter, Request, RowDrafting
from .masks import attention_implementation, rooted_ancestor_mask
from .ragged import RaggedCache, block_forward, causal_block, commit, select_rows, stack
from .runtime import eos_ids, make_generator, peak_memory, reset_peak_memory
from .sampling import GREEDY, SamplingConfig
from .streaming import kv_bytes
from .trees import Tree


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


def prefill_batch(model: torch.nn.Module, ragged: RaggedCache, sequences: Sequence[Sequence[int]]) -> None:
    """Append each row's tokens (any lengths, >= 0) as committed tokens, causally. One forward pads every
    row to the longest; into an empty cache, rows of very different lengths (the padded block at least
    `PADDING` times their tokens) are prefilled in groups of similar length instead, each its own
    forward, and the groups' caches are put side by side in row order (`ragged.stack`)."""
    rows = [list(seq) for seq in sequences]
    longest = max(map(len, rows))
    if not longest:
        return
    if ragged.width or len(rows) * longest <= PADDING * sum(map(len, rows)):
        block, columns = causal_block(ragged, rows)
        block_forward(model, ragged, *block, logits_to_keep=1)
        commit(ragged, columns)
        return
    order = sorted(range(len(rows)), key=lambda b: len(rows[b]))
    groups, start = [], 0
    while start < len(order):  # the next group: rows while the group's padded block stays within PADDING
        end = start + 1
        while end < len(order) and (end + 1 - start) * len(rows[order[end]]) <= PADDING * sum(
            len(rows[b]) for b in order[start : end + 1]
        ):
            end += 1
        groups.append(order[start:end])
        start = end
    parts = []
    for group in groups:
        part = RaggedCache.empty(model, len(group))
        prefill_batch(model, part, [rows[b] for b in group])
        parts.append(part)
    placed = stack(model, parts)
    where = [b for group in groups for b in group]  # row of `placed` -> row of the batch
    select_rows(placed, [where.index(b) for b in range(len(rows))])
    ragged.cache, ragged.lengths, ragged.base = placed.cache, placed.lengths, placed.base


# Prefill groups: the padded block at most this many times the rows' own tokens. A prefill is bound by
# the linear layers' arithmetic on a CPU, so padding costs what it holds: 26 Spec-Bench prompts of
# 39-741 tokens (4,459 in all) on Qwen2.5-Coder-1.5B took 38.6-39.8 s at 1.05 against 46.7-49.0 s at 1.5.
PADDING = 1.05


@dataclass
class RaggedTarget:
    """The target's side of a batch step (`generation.Rows`): a ragged cache of the active rows."""

    ragged: RaggedCache

    def verify(
        self, target: torch.nn.Module, roots: list[int], trees: list[Tree], tokens: torch.Tensor
    ) -> torch.Tensor:
        """Logits [B, N + 1, V] of every row's root and nodes (row r's tree: `trees[r]`, its first
        nodes of `tokens[r]`; the block is as wide as the largest tree, the rest padding)."""
        b, n = len(roots), tokens.shape[1]
        ids = torch.cat([torch.tensor(roots, device=tokens.device)[:, None], tokens], dim=1)  # [B, N + 1]
        visible = torch.zeros(b, n + 1, n + 1, dtype=torch.bool)  # host: moved by block_forward
        valid = torch.zeros(b, n + 1, dtype=torch.bool)  # host
        positions = torch.zeros(b, n + 1, dtype=torch.long)  # host
        for r, t in enumerate(trees):
            k = t.num_nodes
            visible[r, : k + 1, : k + 1] = rooted_ancestor_mask(t.ancestors)
            valid[r, : k + 1] = True
            positions[r, : k + 1] = self.ragged.lengths[r] + torch.tensor((0,) + t.depths)  # host
        return block_forward(target, self.ragged, ids, positions, visible, valid).float()

    def commit(self, paths: list[tuple[int, ...]]) -> None:
        commit(self.ragged, [[0] + [1 + j for j in path] for path in paths])

    def keep_rows(self, rows: list[int]) -> None:
        select_rows(self.ragged, rows)

    def kv_bytes(self) -> int:
        return kv_bytes(self.ragged.cache)


class MarginRows:
    """A `generation.Rows` over another (`inner`) that keeps, for every row the batch started with,
    the top-1 minus top-2 logit at each root it verified: how near a tie each greedy token of the
    target's own decoding was. Where that margin is below the dtype's tie margin, the same row decoded
    alone may take the other token (`analysis.quality.compare_greedy` calls such a difference a tie)."""

    def __init__(self, inner: RaggedTarget, rows: int) -> None:
        self.inner, self.active = inner, list(range(rows))
        self.margins: list[list[float]] = [[] for _ in range(rows)]

    def verify(
        self, target: torch.nn.Module, roots: list[int], trees: list[Tree], tokens: torch.Tensor
    ) -> torch.Tensor:
        logits = self.inner.verify(target, roots, trees, tokens)  # [B, N + 1, V]
        top = logits[:, 0].topk(2, dim=-1).values  # [B, 2]
        for row, margin in zip(self.active, (top[:, 0] - top[:, 1]).tolist()):
            self.margins[row].append(margin)
        return logits

    def commit(self, paths: list[tuple[int, ...]]) -> None:
        self.inner.commit(paths)

    def keep_rows(self, rows: list[int]) -> None:
        self.inner.keep_rows(rows)
        self.active = [self.active[r] for r in rows]

    def kv_bytes(self) -> int:
        return self.inner.kv_bytes()


@torch.inference_mode()
def speculative_generate_batch(
    target: torch.nn.Module,
    drafter: torch.nn.Module | ModelDrafter | Sequence[Drafter],
    prompts: Sequence[torch.Tensor],
    tree: Tree | None = None,
    max_new_tokens: int = 64,
    sampling: SamplingConfig = GREEDY,
    eos_token_id: int | Sequence[int] | None = None,
) -> BatchResult:
    """Speculative decoding of B prompts at once (module docstring). drafter: a draft model (or its
    `ModelDrafter`, `ModelDrafter.draft_rows`): every row's tree drafted in one forward per depth; or
    one `Drafter` per prompt (host-side drafters draft per row). prompts: B long tensors [T_b] (or [1, T_b]). tree:
    default `Tree.chain(4)`. Row b samples with its own generator, seeded `sampling.seed` + b."""
    tree = tree or Tree.chain(4)
    sequences = check_prompts(prompts, max_new_tokens)
    drafters = batch_drafter(drafter, len(sequences), tree, sampling)
    everyone = list(drafters.drafters) if isinstance(drafters, DrafterRows) else [drafters]
    request = Request(tree, max_new_tokens, sampling, eos_token_id)
    result = generate_batch(target, drafters, sequences, request, sampling.method("speculative_batch"))
    for d in everyone:
        d.release()
    return result


@torch.inference_mode()
def autoregressive_generate_batch(
    target: torch.nn.Module,
    prompts: Sequence[torch.Tensor],
    max_new_tokens: int = 64,
    sampling: SamplingConfig = GREEDY,
    eos_token_id: int | Sequence[int] | None = None,
    margins: bool = False,
) -> BatchResult:
    """The target alone on a batch: each step one forward of one token per active row (the first
    after the prompts' ragged prefill), the loop of `speculative_generate_batch` with drafters that
    draft nothing. Row b samples with its own generator seeded `sampling.seed` + b. margins: each
    row's result carries meta["margins"], the top-1 minus top-2 logit at each of its tokens
    (`MarginRows`: where a greedy token was a near tie)."""
    sequences = check_prompts(prompts, max_new_tokens)
    drafters = DrafterRows([NoDraft() for _ in sequences])
    sampling = dataclasses.replace(sampling, typical=None)
    request = Request(NoDraft.empty, max_new_tokens, sampling, eos_token_id)
    return generate_batch(target, drafters, sequences, request, "autoregressive_batch", margins)


def generate_batch(
    target: torch.nn.Module,
    drafters: RowDrafting,
    sequences: list[list[int]],
    request: Request,
    method: str,
    margins: bool = False,
) -> BatchResult:
    """The rows through the loop (`Loop.run`), the target on a `RaggedTarget` after the prompts' ragged
    prefill (all but each root); each row's `GenerationResult` in prompt order, with the batch's times
    (and with `margins`, its roots' top-1 minus top-2 logits in meta["margins"], `MarginRows`)."""
    attention_implementation(target)
    generators = row_generators(request.sampling.seed, len(sequences), target.device)
    meter = request.meter or Meter(target.device)
    reset_peak_memory(target.device)
    start = meter.now()
    ragged = RaggedTarget(RaggedCache.empty(target, len(sequences)))
    prefill_batch(target, ragged.ragged, [seq[:-1] for seq in sequences])
    prefill_time = meter.now() - start
    state = MarginRows(ragged, len(sequences)) if margins else ragged
    eos = [eos_ids(target, request.eos_token_id)] * len(sequences)
    loop = Loop(target, state, drafters, request, generators, eos, meter)
    new, steps = loop.run(sequences)
    total = meter.now() - start
    rows = tuple(
        GenerationResult(
            tokens=torch.tensor(new[i], dtype=torch.long),  # host: results live on the CPU
            steps=tuple(steps[i]),
            prompt_length=len(sequences[i]),
            prefill_time=prefill_time,
            total_time=total,
            peak_memory_bytes=peak_memory(target.device),
            method=method,
            meta={"batch_size": len(sequences)} | ({"margins": state.margins[i]} if margins else {}),
            kv_peak_bytes=meter.peak(),  # the batch's: target + draft caches of all its rows, inside a step
        )
        for i in range(len(sequences))
    )
    return BatchResult(rows, total, prefill_time)


def batch_drafter(
    drafter: torch.nn.Module | ModelDrafter | Sequence[Drafter], rows: int, tree: Tree, sampling: SamplingConfig
) -> ModelDrafter | DrafterRows:
    """A draft model as a checked and reset `ModelDrafter` drafting the rows together (`draft_rows`),
    or one checked and reset `Drafter` per row."""
    if isinstance(drafter, torch.nn.Module):
        drafter = ModelDrafter(drafter)
    if isinstance(drafter, ModelDrafter):
        drafter.check_rows()
        drafter.check_request(tree, sampling)
        drafter.reset()
        return drafter
    drafter = list(drafter)
    if len(drafter) != rows:
        raise ValueError(f"one drafter per prompt: got {len(drafter)} for {rows} prompts")
    for d in drafter:
        check_batched(d)
        d.check_request(tree, sampling)
        d.reset()
    return DrafterRows(drafter)


def row_generators(seed: int | None, rows: int, device: torch.device) -> list[torch.Generator]:
    """Row b's generator, seeded seed + b (None: every row from entropy)."""
    return [make_generator(None if seed is None else seed + b, device) for b in range(rows)]
