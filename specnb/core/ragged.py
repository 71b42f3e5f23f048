"""Ragged batches on one KV cache: B sequences of different lengths in one stock model forward, none
attending to another row's tokens or to padding.

Layout: one `DynamicCache` of batch B, right-padded. Row b holds its committed tokens in columns
0 .. L_b - 1 (`RaggedCache.lengths`); the columns after them hold stale entries (padding, rejected
nodes) that no mask ever shows. Columns from `base` on are scratch: blocks appended since the last
commit (a tree being drafted level by level, a tree being verified).

    causal_block    `block_forward`'s inputs for a causal block of new tokens per row
    block_forward   append one block of M columns for every row (ids, position ids [B, M]) under a
                    per-row 4D mask: its committed columns and whatever scratch `visible` allows;
                    padding entries see only themselves and are never shown to a real token
    commit          per row, move chosen scratch columns to the end of its committed tokens, then
                    crop the cache to the longest row: the scratch is gone
    stack           several ragged caches' rows side by side in one
    truncate        a row keeps only its first tokens (the rest turn stale)
    discard         crop the scratch (a drafted tree whose nodes are not kept)
    select_rows     keep some rows only (finished rows leave the batch)

Exactness: a row's query sees exactly its own committed tokens at its own positions (the mask is
built from `lengths`, never from the cache's width), so its logits are those of the same tokens run
alone, up to float rounding from the different batch shape (`analysis.quality.compare_greedy`
reports a flipped near-tie as a tie). A row's tokens are never shifted relative to their positions,
only copied to the slot their next position already names.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache

from ..kernels.gqa_sdpa import GQA_SDPA, RowSpans
from ..kernels.topk_head import TopKHead
from .cache import crop, new_cache
from .forward import logits
from .masks import attention_implementation, model_mask


@dataclass
class RaggedCache:
    """A batch cache and each row's committed length; `base`: the width at the last commit."""

    cache: DynamicCache
    lengths: list[int]
    base: int = 0

    @classmethod
    def empty(cls, model: torch.nn.Module, rows: int) -> RaggedCache:
        return cls(new_cache(model), [0] * rows, 0)

    @property
    def rows(self) -> int:
        return len(self.lengths)

    @property
    def width(self) -> int:
        """Columns the cache holds (committed, stale and scratch)."""
        return self.cache.get_seq_length()


@torch.inference_mode()
def block_forward(
    model: torch.nn.Module,
    ragged: RaggedCache,
    ids: torch.Tensor,
    positions: torch.Tensor,
    visible: torch.Tensor,
    valid: torch.Tensor,
    logits_to_keep: int = 0,
    head: TopKHead | None = None,
    k: int = 0,
) -> torch.Tensor:
    """Logits [B, M', V] (model dtype; M' = M, or the last `logits_to_keep` columns) of one block.

    ids, positions: long [B, M]; each row's own position ids. visible: bool [B, M, S + M], which
    scratch columns (the S = width - base appended since the last commit, then this block) each
    block entry sees besides its row's committed tokens. valid: bool [B, M], False for padding
    entries (they see only themselves; nobody sees them). After the call the cache holds the block
    as scratch. head: a `topk_head.TopKHead` for the model's LM head (float32 logits whose top `k`
    per entry are exact, as `forward.forward` takes it); None: the model's own head."""
    device = model.device
    b, m = ids.shape
    width = ragged.width
    scratch = width - ragged.base
    if visible.shape != (b, m, scratch + m) or valid.shape != (b, m) or b != ragged.rows:
        raise ValueError(
            f"block of {b} rows x {m}: visible must be [{b}, {m}, {scratch + m}], valid [{b}, {m}]; "
            f"got {tuple(visible.shape)}, {tuple(valid.shape)} for a cache of {ragged.rows} rows"
        )
    lengths = torch.tensor(ragged.lengths, device=device)
    columns = torch.arange(ragged.base, device=device)
    committed = (columns[None, :] < lengths[:, None])[:, None, :].expand(b, m, ragged.base)  # [B, M, base]
    valid = valid.to(device)
    tail = visible.to(device).clone()  # [B, M, S + M]
    tail[:, :, scratch:] &= valid[:, None, :]  # a padding entry is never seen
    tail[:, :, :scratch] &= valid[:, :, None]  # and sees nothing but itself
    tail[:, :, scratch:] &= valid[:, :, None]
    tail[:, :, scratch:] |= torch.eye(m, dtype=torch.bool, device=device)[None]  # every entry sees itself
    mask = torch.cat([committed & valid[:, :, None], tail], dim=2)  # [B, M, width + M]
    spans = row_spans(model, ragged, mask[:, None])
    inputs = {
        "input_ids": ids.to(device),
        "position_ids": positions.to(device),
        "attention_mask": model_mask(mask[:, None], model, model.dtype),
        "cache": ragged.cache,
        "use_cache": True,
        **({} if spans is None else {"row_spans": spans}),
    }
    return logits(model, inputs, logits_to_keep, head, k)


RUN_COST = 512  # a run of rows in a split read (`row_spans`) costs about what reading this many keys does
SPLIT_SAVING = 0.3  # a split read pays when it skips at least this share of the committed keys


def row_spans(model: torch.nn.Module, ragged: RaggedCache, mask: torch.Tensor) -> RowSpans | None:
    """Where a batch's rows differ much in length, runs of consecutive rows, each reading its committed
    keys only up to its longest row (`kernels.gqa_sdpa.split_sdpa`; mask: bool [B, 1, M, L] "may
    attend"): the runs that read the fewest keys, RUN_COST per run added (`cheapest_runs`); None where
    a plain read is as good (not GQA_SDPA on a CPU, or less than SPLIT_SAVING of the keys saved). Rows
    in length order (`experiments.redraft_study.redrafts` sorts its prompts) make few runs."""
    if not ragged.base or model.device.type != "cpu" or attention_implementation(model) != GQA_SDPA:
        return None
    runs, read = cheapest_runs(ragged.lengths, RUN_COST)
    if len(runs) < 2 or read > (1 - SPLIT_SAVING) * ragged.rows * ragged.base:
        return None
    return RowSpans.of([(a, b, max(w, 1)) for a, b, w in runs], ragged.base, mask, model.dtype)


def cheapest_runs(lengths: list[int], cost: int) -> tuple[list[tuple[int, int, int]], int]:
    """The split of rows 0..B-1 into runs of consecutive rows (start, stop, longest length) that
    minimises the keys read, sum of rows x longest length, plus `cost` per run; and that sum."""
    n = len(lengths)
    best, cut = [0] + [0] * n, [0] * (n + 1)
    for j in range(1, n + 1):
        longest, best[j] = 0, -1
        for i in range(j - 1, -1, -1):
            longest = max(longest, lengths[i])
            read = best[i] + (j - i) * longest + cost
            if best[j] < 0 or read < best[j]:
                best[j], cut[j] = read, i
    runs, j = [], n
    while j:
        runs.append((cut[j], j, max(lengths[cut[j] : j])))
        j = cut[j]
    return runs[::-1], best[n]


def causal_block(ragged: RaggedCache, rows: list[list[int]]) -> tuple[tuple[torch.Tensor, ...], list[list[int]]]:
    """((ids, positions, visible, valid), columns): `block_forward`'s inputs for a block appending each
    row's `rows[b]` tokens (any counts) causally at its own next positions, and each row's columns
    in the block (for `commit`). Rows are aligned right, padding first, so every row's last token
    is the block's last column: `logits_to_keep=1` gives each row's next-token logits."""
    b, width = len(rows), max(map(len, rows))
    ids = torch.zeros(b, width, dtype=torch.long)  # host: moved by block_forward
    valid = torch.zeros(b, width, dtype=torch.bool)  # host
    positions = torch.zeros(b, width, dtype=torch.long)  # host
    columns = []
    for i, toks in enumerate(rows):
        start = width - len(toks)
        ids[i, start:] = torch.tensor(toks, dtype=torch.long)  # host
        valid[i, start:] = True
        positions[i, start:] = ragged.lengths[i] + torch.arange(len(toks))  # host: each row's own positions
        columns.append(list(range(start, width)))
    causal = torch.ones(width, width, dtype=torch.bool).tril()[None].expand(b, width, width)  # host
    return (ids, positions, causal, valid), columns


@torch.inference_mode()
def commit(ragged: RaggedCache, keep: list[list[int]]) -> None:
    """Row b keeps scratch columns base + keep[b][j] (ascending) as its next len(keep[b]) tokens;
    then the scratch is dropped (the cache is cropped to the longest row)."""
    if len(keep) != ragged.rows:
        raise ValueError(f"one list of columns per row: got {len(keep)} for {ragged.rows} rows")
    rows = [b for b, cols in enumerate(keep) for _ in cols]
    src = [ragged.base + c for cols in keep for c in cols]
    dst = [ragged.lengths[b] + j for b, cols in enumerate(keep) for j in range(len(cols))]
    if rows and src != dst:
        for layer in ragged.cache.layers:
            if not layer.is_initialized:
                continue
            device = layer.keys.device
            r, s, d = (torch.tensor(v, dtype=torch.long, device=device) for v in (rows, src, dst))
            layer.keys[r, :, d] = layer.keys[r, :, s]  # the right side is gathered first: overlaps are safe
            layer.values[r, :, d] = layer.values[r, :, s]
    ragged.lengths = [n + len(cols) for n, cols in zip(ragged.lengths, keep)]
    ragged.base = max(ragged.lengths, default=0)
    crop(ragged.cache, ragged.base)


@torch.inference_mode()
def stack(model: torch.nn.Module, parts: list[RaggedCache]) -> RaggedCache:
    """One ragged cache holding the rows of `parts` in order (each part's scratch empty): every part's
    keys and values padded with stale columns to the widest, then put side by side on the batch."""
    if any(p.width != p.base for p in parts):
        raise ValueError("stack caches between steps only (a scratch is not empty)")
    out = RaggedCache.empty(model, sum(p.rows for p in parts))
    out.lengths = [n for p in parts for n in p.lengths]
    out.base = max(out.lengths, default=0)
    held = [p for p in parts if p.cache.layers and p.cache.layers[0].is_initialized]
    for i in range(len(held[0].cache.layers) if held else 0):
        like = held[0].cache.layers[i].keys  # [B, heads, width, dim]
        keys, values = [], []
        for p in parts:
            layer = p.cache.layers[i]
            if not layer.is_initialized:  # a part of empty rows: stale columns only
                empty = like.new_zeros(p.rows, like.shape[1], out.base, like.shape[3])
                keys.append(empty)
                values.append(empty)
                continue
            pad = out.base - layer.keys.shape[-2]
            keys.append(torch.nn.functional.pad(layer.keys, (0, 0, 0, pad)))
            values.append(torch.nn.functional.pad(layer.values, (0, 0, 0, pad)))
        out.cache.update(torch.cat(keys), torch.cat(values), i)
    return out


def truncate(ragged: RaggedCache, row: int, length: int) -> None:
    """Row `row` keeps its first `length` committed tokens; the rest become stale columns that no mask
    shows (a row whose text was re-encoded from an earlier point: `drafters.cross_tokenizer`)."""
    if not 0 <= length <= ragged.lengths[row]:
        raise ValueError(f"row {row} holds {ragged.lengths[row]} tokens; cannot keep {length}")
    ragged.lengths[row] = length


def discard(ragged: RaggedCache) -> None:
    """Drop the scratch columns (nodes drafted and not kept)."""
    crop(ragged.cache, ragged.base)


@torch.inference_mode()
def select_rows(ragged: RaggedCache, rows: list[int]) -> None:
    """Keep only `rows` (in this order), committed state and all; the scratch must be empty."""
    if ragged.width != ragged.base:
        raise ValueError("select rows between steps only (the scratch is not empty)")
    for layer in ragged.cache.layers:
        if not layer.is_initialized:
            continue
        index = torch.tensor(rows, dtype=torch.long, device=layer.keys.device)
        layer.keys = layer.keys.index_select(0, index)
        layer.values = layer.values.index_select(0, index)
    ragged.lengths = [ragged.lengths[b] for b in rows]
    ragged.base = max(ragged.lengths, default=0)
    crop(ragged.cache, ragged.base)
