"""Self-distillation data: the target's own continuations of a prompt set and its hidden states,
the rows every learned drafter here trains on (Medusa-1 heads, `training.medusa`; EAGLE
heads, `training.eagle`).

    DistillConfig    the parameters that decide the data (a frozen dataclass: the data's cache key)
    DistillData      rows (positions) of the target's continuations, prompts concatenated: the last
                     hidden state of each row, Medusa's labels (head d at row t gets token t+1+d)
                     and soft rows, and what a sequence model of the rows needs (EAGLE, Li et al.
                     2024): each row's segment (one prompt + continuation), position and next token
    sequence_rows    the rows kept of one sequence, their labels and soft rows
    distill          the target's greedy (and sampled) continuations of a prompt set, batched, with
                     the last hidden state of every fed token captured by a hook on the final norm
                     during that same generation (`continuations`: a prompt's continuations decoded
                     as the branches of one sequence)
    continuation_view  the rows a `prompt_rows=False` distillation keeps, out of the one with them
    distill_cached   `distill`, kept on disk by (model, prompts, DistillConfig); Medusa's and EAGLE's
                     trainers on the same prompts and parameters share one distillation
    heldout_prompts  the prompts held out of training (evenly spaced through the list)
    training_split   a trainer's data: the distillation, its training rows and held-out rows, the
                     target frozen; `training_log` the log both trainers store beside their weights
    fast_bfloat16    whether bfloat16 matmuls are native on a device

Labels: head d at row t gets token t+1+d when it lies in the continuation (Medusa-1 masks
non-answer labels the same way), or anywhere in prompt + continuation with `prompt_rows`; `soft_row`:
the row whose LM-head distribution is that label's soft target (row t+d). A segment's rows are
consecutive positions t = first .. first + n - 1 of one sequence (the greedy continuation, or a
sampled one, of one prompt); row t's hidden state is the target's at seq[t] and its `token` is
seq[t + 1], so rows t and t + 1 of a segment are EAGLE's (feature, next token) -> next feature pair.
`distill_bfloat16` generates the data with a bfloat16 copy of a float32 target where bfloat16 is
native: the rows are then that copy's continuations and hidden states, close to the target's.
"""

from __future__ import annotations

import copy
import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import DynamicCache, StaticCache

from ..core.masks import use_attention
from ..core.sampling import sample_rows
from ..drafters.hidden_rows import final_norm
from ..io.embedded import cache_dir
from .grouped_attention import GROUPED_ATTENTION

DISTILL_FOLDER = "medusa-distill"  # under the cache; named for its first user, so data distilled before stay valid


@dataclass(frozen=True)
class DistillConfig:
    num_heads: int = (
        4  # label depth K: head d's label is the token d + 1 after its row (also decides the first row kept)
    )
    max_new_tokens: int = 128  # continuation tokens per prompt
    gen_batch: int = 16  # prompts generated together
    prompt_rows: bool = False  # also keep the prompt positions (labels: the prompt text)
    max_continued_prompt: int | None = None  # longer prompts give their prompt rows only (needs prompt_rows)
    samples: int = 1  # continuations sampled per prompt besides the greedy one
    sample_temperature: float = 0.7  # their temperature
    max_sampled_prompt: int | None = None  # longer prompts get the greedy continuation only
    distill_bfloat16: bool = False  # generate with a bfloat16 copy of a float32 target (`fast_bfloat16`)
    seed: int = 0  # seeds the sampled continuations

    def __post_init__(self) -> None:  # 0.7 and a numpy 0.7 are one config (and one cache key)
        object.__setattr__(self, "sample_temperature", float(self.sample_temperature))
        if self.max_continued_prompt is not None and not self.prompt_rows:
            raise ValueError(
                "max_continued_prompt leaves long prompts without a continuation: it needs prompt_rows=True"
            )

    def key(self) -> dict:
        """The data's cache key (its entries as first written, so data distilled before keep their keys)."""
        return {
            "num_heads": self.num_heads,
            "max_new_tokens": self.max_new_tokens,
            "gen_batch": self.gen_batch,
            "prompt_rows": self.prompt_rows,
            "max_continued_prompt": self.max_continued_prompt,
            "samples": self.samples,
            "sample_temperature": self.sample_temperature,
            "seed": self.seed,
            **({"distill_bfloat16": True} if self.distill_bfloat16 else {}),  # (keys of older data unchanged)
            **({"sampler": "sample_rows"} if self.samples else {}),  # (sampled data of older keys drew otherwise)
            **({"max_sampled_prompt": self.max_sampled_prompt} if self.max_sampled_prompt is not None else {}),
        }


@dataclass(frozen=True)
class DistillData:
    """Rows (positions) of the target's own continuations, prompts concatenated (module docstring)."""

    hidden: torch.Tensor  # float [R, H]: the target's last hidden state at each row
    labels: torch.Tensor  # long [R, K]: head d's target token (index d - 1), -100 = none
    soft_row: torch.Tensor  # long [R, K]: the row whose LM-head output is that label's soft target, -1 = none
    prompt: torch.Tensor  # long [R]: the row's prompt index
    segment: (
        torch.Tensor
    )  # long [R]: the row's sequence (one prompt + one continuation); a segment's rows are consecutive
    position: (
        torch.Tensor
    )  # long [R]: the row's position t in its sequence (its hidden state is the target's at seq[t])
    token: torch.Tensor  # long [R]: seq[t + 1], the token after the row
    sequences: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]  # per prompt: (prompt ids, greedy continuation)
    sampled: tuple[tuple[int, tuple[int, ...]], ...] = ()  # (prompt index, sampled continuation)
    greedy: torch.Tensor | None = None  # bool [R]: the row belongs to a greedy continuation (or prompt); None = all

    def greedy_rows(self) -> torch.Tensor:
        """Bool [R]: rows of greedy continuations and prompts (not of sampled continuations): what
        greedy verification meets, so the held-out accuracy table is measured on them only."""
        return torch.ones(len(self.labels), dtype=torch.bool) if self.greedy is None else self.greedy  # host


def row_span(prompt_len: int, seq_len: int, num_heads: int, prompt_rows: bool) -> tuple[int, int]:
    """(first, n): the rows t = first .. first + n - 1 kept of a sequence of `seq_len` tokens (those
    with at least one label: up to len - 3, head 1's label being seq[t + 2]; from 0 with
    `prompt_rows`, else from the first row whose head K label lies in the continuation)."""
    last = seq_len - 3
    first = 0 if prompt_rows else max(prompt_len - 1 - num_heads, 0)
    return first, max(last - first + 1, 0)


def sequence_rows(
    prompt_len: int, seq: Sequence[int], num_heads: int, prompt_rows: bool
) -> tuple[int, torch.Tensor, torch.Tensor]:
    """(first, labels [n, K], soft [n, K]) for the rows t = first .. first + n - 1 of a sequence
    (prompt + continuation, `seq`; `row_span`): head d at row t gets seq[t + 1 + d] where it exists
    (and lies in the continuation unless `prompt_rows`); its soft target is row t + d (local index,
    -1 where that row is not kept)."""
    first, n = row_span(prompt_len, len(seq), num_heads, prompt_rows)
    last = first + n - 1
    labels = torch.full((n, num_heads), -100, dtype=torch.long)  # host: data rows live on the CPU
    soft = torch.full((n, num_heads), -1, dtype=torch.long)  # host
    ids = torch.tensor(list(seq), dtype=torch.long)  # host
    for d in range(1, num_heads + 1):
        t = torch.arange(first, first + n)  # host
        ok = t + 1 + d < len(seq)
        if not prompt_rows:
            ok &= t + 1 + d >= prompt_len
        labels[:, d - 1] = torch.where(ok, ids[(t + 1 + d).clamp(max=len(seq) - 1)], -100)
        soft[:, d - 1] = torch.where(ok & (t + d <= last), t + d - first, -1)
    return first, labels, soft


def row_layout(
    sequences: Sequence[tuple[Sequence[int], Sequence[int]]],
    sampled: Sequence[tuple[int, Sequence[int]]],
    num_heads: int,
    prompt_rows: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(segment, position, token), long [R] each, for the rows `distill` keeps, in its order: per
    prompt its greedy continuation (with prompt rows if `prompt_rows`), then its sampled ones in
    the order of `sampled` (their rows start in the continuation)."""
    segment, position, token = [], [], []
    for j, (prompt, new) in enumerate(sequences):
        for cont, rows_of_prompt in [(new, prompt_rows)] + [(b, False) for i, b in sampled if i == j]:
            seq = torch.tensor(list(prompt) + list(cont), dtype=torch.long)  # host
            first, n = row_span(len(prompt), len(seq), num_heads, rows_of_prompt)
            t = torch.arange(first, first + n)  # host
            segment.append(torch.full((n,), len(segment), dtype=torch.long))  # host
            position.append(t)
            token.append(seq[t + 1])
    return torch.cat(segment), torch.cat(position), torch.cat(token)


@torch.no_grad()  # not inference_mode: the captured rows are training inputs
def distill(
    target: torch.nn.Module,
    prompts: Sequence[torch.Tensor],
    config: DistillConfig,
    eos_token_id: int | None = None,
    progress: bool = True,
) -> DistillData:
    """The target's greedy continuations of `prompts` (long [T] each), generated `config.gen_batch`
    at a time (left padding), and the hidden state of every fed token captured on the way (module
    docstring); `config.samples` more continuations of each prompt sampled at
    `config.sample_temperature` (seeded from `config.seed`; their rows belong to the same prompt;
    prompts longer than `config.max_sampled_prompt` get none: after a long prompt each token costs
    most). Prompts longer than `config.max_continued_prompt` are not continued: one plain forward
    gives their prompt rows (`config.prompt_rows` must be on). `config.distill_bfloat16`: a float32
    target generates as a bfloat16 copy where that is native (`fast_bfloat16`; otherwise as it is):
    the rows are then that copy's continuations and hidden states, close to the target's, not equal."""
    if config.distill_bfloat16 and target.dtype == torch.float32 and fast_bfloat16(target.device):
        target = copy.deepcopy(target).to(torch.bfloat16)
    eos = target.generation_config.eos_token_id if eos_token_id is None else eos_token_id
    eos = eos[0] if isinstance(eos, (list, tuple)) else eos
    pad = target.config.pad_token_id if target.config.pad_token_id is not None else (eos if eos is not None else 0)
    limit = config.max_continued_prompt
    long = [j for j in range(len(prompts)) if limit is not None and prompts[j].numel() > limit]
    order = sorted(set(range(len(prompts))) - set(long), key=lambda i: prompts[i].numel())  # similar lengths pad less
    rows = _Rows(len(prompts), config.num_heads)
    captured: list[torch.Tensor] = []
    hook = final_norm(target).register_forward_hook(lambda m, a, out: captured.append(out.float().cpu()))
    try:
        for lo in tqdm(range(0, len(order), config.gen_batch), desc="distill", disable=not progress or not order):
            members = order[lo : lo + config.gen_batch]
            group = [prompts[j].reshape(-1) for j in members]
            batch = _prompt_batch(group, config, pad, eos, target.device)
            generator = torch.Generator(target.device).manual_seed(config.seed * 1_000_003 + lo)
            out, hidden = continuations(
                target, batch, config.max_new_tokens, config.sample_temperature, generator, captured
            )
            rows.keep_batch(members, group, batch, out, hidden, config.prompt_rows)
        for j in tqdm(long, desc="prompt rows", disable=not progress or not long):
            captured.clear()
            target.model(input_ids=prompts[j].reshape(1, -1).to(target.device))
            rows.keep(j, prompts[j].reshape(-1).cpu(), [], captured[0][0], True)
            rows.sequences[j] = (tuple(prompts[j].reshape(-1).tolist()), ())
    finally:
        hook.remove()
    return rows.data(config.prompt_rows)


@dataclass(frozen=True)
class PromptBatch:
    """Prompts generated together (`continuations`): left-padded, and the rows that continue them."""

    ids: torch.Tensor  # long [B, W]: the prompts, left-padded with `pad`
    mask: torch.Tensor  # long [B, W]: 1 on prompt tokens, 0 on padding
    source: tuple[int, ...]  # row r continues prompt source[r]
    greedy: int  # the first `greedy` rows continue greedily, the others are sampled
    pad: int  # fed to a row after it ends
    eos: int | None  # the token that ends a row; None: rows run to max_new_tokens


def _prompt_batch(
    group: list[torch.Tensor], config: DistillConfig, pad: int, eos: int | None, device: torch.device
) -> PromptBatch:
    """The prompts of `group` left-padded, one greedy row each, then `config.samples` sampled rows of
    each prompt no longer than `config.max_sampled_prompt`."""
    width = max(len(p) for p in group)
    ids = torch.full((len(group), width), pad, dtype=torch.long, device=device)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(group):
        ids[i, width - len(p) :] = p.to(device)
        mask[i, width - len(p) :] = 1
    limit = config.max_sampled_prompt
    sampled_too = [i for i, p in enumerate(group) if limit is None or len(p) <= limit]
    source = tuple(range(len(group))) + tuple(i for i in sampled_too for _ in range(config.samples))
    return PromptBatch(ids, mask, source, len(group), pad, eos)


class _Rows:
    """The rows `distill` keeps, per prompt: its greedy continuation's (or its prompt's) first, then
    its sampled continuations', and the sequences they come from."""

    def __init__(self, num_prompts: int, num_heads: int) -> None:
        self.num_heads = num_heads
        self.parts: dict[int, list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]] = {
            j: [] for j in range(num_prompts)
        }
        self.sequences: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = {}
        self.sampled: list[tuple[int, tuple[int, ...]]] = []

    def keep(self, j: int, p: torch.Tensor, new: list[int], hidden: torch.Tensor, rows_of_prompt: bool) -> None:
        """hidden: [>= len(seq) - 1, H], the rows of seq[:-1] from its start."""
        first, labels, soft = sequence_rows(len(p), p.tolist() + new, self.num_heads, rows_of_prompt)
        self.parts[j].append((hidden[first : first + len(labels)], labels, soft))

    def keep_batch(
        self,
        members: list[int],
        group: list[torch.Tensor],
        batch: PromptBatch,
        out: torch.Tensor,
        hidden: torch.Tensor,
        prompt_rows: bool,
    ) -> None:
        """The rows of one batch (`group`: prompts `members`, as `batch` holds them padded) from
        `continuations`' out and hidden, each continuation cut at its eos."""
        width = batch.ids.shape[1]
        for b, i in enumerate(batch.source):  # rows 0 .. greedy - 1: the greedy continuations, first
            p = group[i]
            new = out[b].tolist()
            if batch.eos is not None and batch.eos in new:
                new = new[: new.index(batch.eos) + 1]
            greedy_row = b < batch.greedy
            self.keep(members[i], p.cpu(), new, hidden[b, width - len(p) :], prompt_rows and greedy_row)
            if greedy_row:
                self.sequences[members[i]] = (tuple(p.tolist()), tuple(new))
            else:
                self.sampled.append((members[i], tuple(new)))

    def data(self, prompt_rows: bool) -> DistillData:
        """Every prompt's rows concatenated, prompt by prompt, soft rows made global."""
        hidden_rows, label_rows, soft_rows, prompt_of, greedy = [], [], [], [], []
        offset = 0
        for j in range(len(self.parts)):
            for k, (hidden, labels, soft) in enumerate(self.parts[j]):  # k = 0: the greedy continuation (or prompt)
                hidden_rows.append(hidden)
                label_rows.append(labels)
                soft_rows.append(torch.where(soft >= 0, soft + offset, -1))
                prompt_of.append(torch.full((len(labels),), j, dtype=torch.long))  # host
                greedy.append(torch.full((len(labels),), k == 0, dtype=torch.bool))  # host
                offset += len(labels)
        ordered = tuple(self.sequences[i] for i in range(len(self.parts)))
        segment, position, token = row_layout(ordered, self.sampled, self.num_heads, prompt_rows)
        return DistillData(
            torch.cat(hidden_rows),
            torch.cat(label_rows),
            torch.cat(soft_rows),
            torch.cat(prompt_of),
            segment,
            position,
            token,
            ordered,
            tuple(self.sampled),
            torch.cat(greedy),
        )


@torch.no_grad()
def continuations(
    model: torch.nn.Module,
    batch: PromptBatch,
    max_new_tokens: int,
    temperature: float,
    generator: torch.Generator,
    captured: list[torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Continue the left-padded prompts of `batch` (ids [B, W]): row r continues prompt
    batch.source[r], greedily for the first `batch.greedy` rows, sampled at `temperature`
    (`sample_rows`, `generator`, drawn in row order) for the others. Each prompt is prefilled once;
    its continuations then grow as the branches of one sequence (branch c at cache slot
    W + step * C + c, C = the most rows of one prompt; a tree mask lets each branch see the prompt
    and itself), so every step reads a prompt's keys once for all its continuations, not once per
    continuation, in a cache allocated once (`training.grouped_attention`). A row that ends
    (batch.eos) is fed `batch.pad` after it. `captured` collects the final norm's outputs (a hook set
    by the caller). Returns (tokens [R, max_new_tokens], hidden [R, W + steps - 1, H] float32 on the
    CPU: the last hidden state of every fed token)."""
    device, (prompts, width), source = batch.ids.device, batch.ids.shape, batch.source
    branch = [source[:r].count(i) for r, i in enumerate(source)]  # row r is branch branch[r] of prompt source[r]
    width_c = max(branch) + 1
    host_prompt, host_branch = torch.tensor(list(source)), torch.tensor(branch)  # host: index the captured rows
    row_prompt, row_branch = host_prompt.to(device), host_branch.to(device)
    positions = (batch.mask.cumsum(-1) - 1).clamp_min(0)  # left padding: each prompt starts at position 0
    length = width + width_c * max_new_tokens
    logits, prompt_hidden, cache = _prefill(model, batch, positions, length, captured)
    logits = logits[row_prompt]  # [R, V]
    visible = torch.zeros(prompts, 1, width_c, length, dtype=torch.bool, device=device)
    visible[:, 0, :, :width] = batch.mask.bool()[:, None]
    lanes = torch.arange(width_c, device=device)
    position = positions[:, -1:].expand(prompts, width_c)  # [B, C]: a prompt's branches stand at one position
    feed = torch.full((prompts, width_c), batch.pad, dtype=torch.long, device=device)  # branches without a row: pad
    done = torch.zeros(len(source), dtype=torch.bool, device=device)
    tokens, steps = [], []
    with use_attention(model, GROUPED_ATTENTION):
        for step in range(max_new_tokens):
            token = _next_tokens(logits, batch, done, temperature, generator)
            tokens.append(token)
            if batch.eos is not None:
                done |= token == batch.eos
            if step == max_new_tokens - 1 or bool(done.all()):
                break
            slot = width + step * width_c
            feed[row_prompt, row_branch] = token
            visible[:, 0, lanes, slot + lanes] = True
            position = position + 1
            captured.clear()
            logits = model(
                input_ids=feed,
                attention_mask=visible[..., : slot + width_c],
                position_ids=position,
                cache=cache,
                use_cache=True,
                cache_position=slot + lanes,
            ).logits
            logits = logits[row_prompt, row_branch]  # [R, V]
            steps.append(captured[0][host_prompt, host_branch][:, None])  # [R, 1, H]
    return torch.stack(tokens, 1), torch.cat([prompt_hidden[host_prompt], *steps], 1)


def _next_tokens(
    logits: torch.Tensor, batch: PromptBatch, done: torch.Tensor, temperature: float, generator: torch.Generator
) -> torch.Tensor:
    """Each row's next token [R] from its logits [R, V]: the argmax for the first `batch.greedy` rows,
    sampled for the others (in row order); `batch.pad` for a row that has ended (`done` [R])."""
    token = logits.argmax(-1)
    if len(batch.source) > batch.greedy:
        token[batch.greedy :] = sample_rows(logits[batch.greedy :], temperature, generator)
    return token.masked_fill(done, batch.pad)


def _prefill(
    model: torch.nn.Module, batch: PromptBatch, positions: torch.Tensor, length: int, captured: list[torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor, StaticCache]:
    """The prompts prefilled once: (last logits [B, V], hidden [B, W, H] from `captured`, a static cache
    of `length` slots holding the prompts' keys and values)."""
    width = batch.ids.shape[1]
    prefill = DynamicCache(config=model.config)
    captured.clear()
    out = model(
        input_ids=batch.ids,
        attention_mask=batch.mask,
        position_ids=positions,
        cache=prefill,
        use_cache=True,
        logits_to_keep=1,
    )
    cache = StaticCache(config=model.config, max_cache_len=length)  # a growing cache would copy itself every step
    for i, layer in enumerate(prefill.layers):
        cache.update(layer.keys, layer.values, i, {"cache_position": torch.arange(width, device=batch.ids.device)})
    return out.logits[:, -1], captured[0], cache


def fast_bfloat16(device: torch.device) -> bool:
    """bfloat16 matmuls run natively here: a GPU of compute capability >= 8, or a CPU with
    AVX512-BF16 / AMX (oneDNN says so); elsewhere (a T4 among them) they are emulated and slower."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported(including_emulation=False)  # a T4 (sm75) emulates: False
    return (
        device.type == "cpu" and torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    )


def continuation_view(data: DistillData, num_heads: int) -> DistillData:
    """The DistillData `distill` returns with `prompt_rows=False`, out of `data` distilled with
    `prompt_rows=True` and otherwise the same parameters: the generation and the captured hidden
    states do not depend on `prompt_rows`, which only starts a greedy segment's rows at row 0
    instead of the first whose head-K label is generated, and keeps prompt-text labels. Per
    segment (in `row_layout`'s order) the rows from that first one are kept and their labels and
    soft rows rebuilt (`sequence_rows`)."""
    conts = [
        (j, cont)
        for j, (_, new) in enumerate(data.sequences)
        for cont in [new] + [b for i, b in data.sampled if i == j]
    ]
    counts = torch.bincount(data.segment, minlength=len(conts)).tolist()
    keep, labels, soft = [], [], []
    start = offset = 0
    for s, (j, cont) in enumerate(conts):
        prompt = data.sequences[j][0]
        first, lab, sft = sequence_rows(len(prompt), list(prompt) + list(cont), num_heads, False)
        rows = torch.arange(start, start + counts[s])  # host
        kept = rows[data.position[rows] >= first]
        if len(kept) != len(lab):
            raise ValueError(
                f"segment {s}: {len(kept)} rows from position {first}, {len(lab)} expected: not data of this num_heads"
            )
        keep.append(kept)
        labels.append(lab)
        soft.append(torch.where(sft >= 0, sft + offset, -1))
        start += counts[s]
        offset += len(lab)
    idx = torch.cat(keep)
    segment, position, token = row_layout(data.sequences, data.sampled, num_heads, False)
    return DistillData(
        data.hidden[idx],
        torch.cat(labels),
        torch.cat(soft),
        data.prompt[idx],
        segment,
        position,
        token,
        data.sequences,
        data.sampled,
        data.greedy_rows()[idx],
    )


def cache_key(model_name: str, prompts: Sequence[torch.Tensor], *parts: Any) -> str:
    """The name of what is cached for (model, prompts, parts): the first 16 hex digits of the SHA-256 of
    their JSON (the prompts as token ids), for distilled data and for each trainer's heads."""
    data = [model_name, [p.reshape(-1).tolist() for p in prompts], *parts]
    return hashlib.sha256(json.dumps(data).encode()).hexdigest()[:16]


def distill_cached(
    target: torch.nn.Module,
    model_name: str,
    prompts: Sequence[torch.Tensor],
    config: DistillConfig,
    progress: bool = True,
) -> DistillData:
    """`distill`, kept under `<cache>/medusa-distill/<key>.pt` (key: model, prompts and
    `DistillConfig.key`), so every trainer and every training recipe on the same data reuses it.
    Data without prompt rows is distilled (or found) with them and viewed (`continuation_view`):
    one generation serves Medusa's heads and EAGLE's head (a file of the data without prompt rows,
    written before, is still read)."""
    path = cache_dir() / DISTILL_FOLDER / f"{cache_key(model_name, prompts, config.key())}.pt"
    d = torch.load(path, weights_only=True) if path.exists() else {}
    if "greedy" not in d and not config.prompt_rows:
        wide = distill_cached(target, model_name, prompts, replace(config, prompt_rows=True), progress)
        return continuation_view(wide, config.num_heads)
    if "greedy" in d:  # (files written before the greedy mask are distilled again)
        sequences = tuple((tuple(a), tuple(b)) for a, b in d["sequences"])
        sampled = tuple((int(j), tuple(b)) for j, b in d["sampled"])
        segment, position, token = row_layout(sequences, sampled, config.num_heads, config.prompt_rows)
        return DistillData(
            d["hidden"],
            d["labels"],
            d["soft_row"],
            d["prompt"],
            segment,
            position,
            token,
            sequences,
            sampled,
            d["greedy"],
        )
    data = distill(target, prompts, config, progress=progress)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(
        {
            "hidden": data.hidden,
            "labels": data.labels,
            "soft_row": data.soft_row,
            "prompt": data.prompt,
            "greedy": data.greedy_rows(),
            "sequences": [list(map(list, s)) for s in data.sequences],
            "sampled": [[j, list(b)] for j, b in data.sampled],
        },
        tmp,
    )
    tmp.replace(path)
    return data


def heldout_prompts(n: int, share: float) -> tuple[int, ...]:
    """Indices of the held-out prompts among n: `share` of them, evenly spaced (so every part of an
    ordered list, e.g. every category, is in both splits)."""
    if share <= 0 or n == 0:
        return ()
    k = min(n, max(1, int(round(share * n))))
    return tuple(sorted({int(i) for i in np.linspace(0, n - 1, k).round()}))


def training_split(
    target: torch.nn.Module,
    model_name: str,
    prompts: Sequence[torch.Tensor],
    config: DistillConfig,
    held: Sequence[int],
    progress: bool = True,
) -> tuple[DistillData, torch.Tensor, torch.Tensor, float]:
    """(data, training rows, held-out rows, seconds to distill) for a head trained on the frozen
    `target` (its parameters stop taking gradients): `distill_cached`, split by prompt; the held-out
    rows are the held-out prompts' greedy rows, the accuracy greedy verification meets."""
    start = time.perf_counter()
    data = distill_cached(target, model_name, prompts, config, progress)
    seconds = time.perf_counter() - start
    is_held = torch.isin(data.prompt, torch.tensor(held, dtype=torch.long))  # host
    for p in target.parameters():
        p.requires_grad_(False)
    return data, torch.nonzero(~is_held)[:, 0], torch.nonzero(is_held & data.greedy_rows())[:, 0], seconds


def training_log(
    log: dict[str, Any], seconds: float, data: DistillData, held_rows: torch.Tensor, config: Any, model_name: str
) -> dict[str, Any]:
    """A trainer's `log` with what made it: distillation seconds, rows, held-out rows, its config, the model."""
    return {
        **log,
        "distill_seconds": seconds,
        "rows": int(data.hidden.shape[0]),
        "heldout_rows": len(held_rows),
        "config": asdict(config),
        "model": model_name,
        "cached": False,
    }
