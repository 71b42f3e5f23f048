"""Training EAGLE-1 heads (Li et al. 2024) by self-distillation on a frozen target, and measuring them.

    EagleConfig      the recipe's parameters (a frozen dataclass: the cache key); its data
                     parameters are a `distillation.DistillConfig`, the data path Medusa's trainer uses
    windows          the data's segments (one prompt + one continuation each) cut into training windows
    eagle_loss       EAGLE's loss on one batch of windows: smooth-L1 regression of the head's output
                     to the target's next feature (weight 1) plus 0.1 x the cross-entropy of the
                     frozen LM head on that output against the target's own distribution at the next
                     position (EAGLE's v_w = 1.0, p_w = 0.1), with EAGLE's uniform noise on the input
                     features (U(-noise/2, noise/2); EAGLE's train code: std 0.2 scaled by 512 / length);
                     `ce_rows` (a CPU choice, off by default) estimates the cross-entropy's mean on a
                     uniform sample of the rows
    train_head       AdamW (betas 0.9 / 0.95 and gradient clipping at 0.5, as EAGLE), linear warmup then
                     cosine, a progress bar; bfloat16 autocast where native (`fast_bfloat16`)
    train_or_load    the above for a named model and prompt set, cached under
                     `<cache>/eagle-heads/<key>/` (key: a hash of model, prompts and config; the head in
                     EAGLE's published layout, `io.eagle_checkpoint`), so a second call loads the head
                     and trains nothing
    chain_ranks      per row, the rank of the continuation's token at each depth of a chain drafted
                     along the target's own continuation from the head's predicted features, exactly
                     as a chain draft (or a tree's on-path nodes) does
    head_accuracy    per-depth top-k accuracy on held-out rows, from those ranks
    collect_eagle    a greedy `Collection` of the head's rank at every depth of every step of the
                     target's continuation (`eagle_ranks`, and EAGLE-2's trees re-drafted), so
                     `analysis.replay` answers every EAGLE tree shape and budget exactly
                     (`analysis.head_collection`)

Segments, rows and positions: `distillation.DistillData` (row t = the target's feature of seq[t],
its `token` seq[t + 1]); the head's row t is (f_t + noise, seq[t + 1]) at position t, and its output is
regressed to f_{t+1}, the next row of the same segment (the last row of a segment has no target).
`data.prompt_rows=True` (the default here) keeps every row from the sequence's start, so the head's
layer attends over the prompt too, as it does when drafting; with False a segment starts K rows
before the continuation.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import pandas as pd
import torch
from tqdm.auto import tqdm

from ..analysis.collection import CollectConfig, Collection
from ..analysis.head_collection import collect_heads, super_tree_arrays
from ..core.cache import new_cache
from ..core.masks import causal_visible
from ..core.sampling import top_tokens
from ..drafters.eagle import EagleDrafter, EagleDynamicDrafter, EagleHead
from ..drafters.hidden_rows import last_hidden
from ..io.embedded import cache_dir
from .distillation import (
    DistillConfig,
    DistillData,
    cache_key,
    fast_bfloat16,
    heldout_prompts,
    training_log,
    training_split,
)

SHOWN_K = (1, 3, 5, 10)  # the top-k columns shown in tables
RANKS = 16  # ranks per depth in train_or_load's held-out accuracy table (acc[d][r] for Sequoia's tree)
RECIPE = 2  # in the heads' cache key: raised when the recipe or the saved layout change, so cached heads are retrained


@dataclass(frozen=True)
class EagleConfig:
    data: DistillConfig = field(default_factory=lambda: DistillConfig(prompt_rows=True))  # the distilled rows
    heldout: float = 0.2  # share of the prompts held out (evenly spaced through the list)
    epochs: float = 4.0  # passes over the training windows
    batch_rows: int = 1024  # rows (positions) per optimizer step, padding included
    max_len: int = 1024  # rows per window (a longer segment is cut: later windows lose the earlier context)
    lr: float = 5e-4  # AdamW (EAGLE: 3e-5 on 68k conversations; here far fewer rows)
    warmup: float = 0.05  # share of the steps with a linear warmup, then cosine to 0
    grad_clip: float = 0.5  # EAGLE's
    v_weight: float = 1.0  # EAGLE's weight of the feature regression (smooth L1)
    p_weight: float = 0.1  # EAGLE's weight of the cross-entropy through the frozen LM head
    noise: float = 0.2  # width of the uniform noise added to the input features (EAGLE's std 0.2)
    ce_rows: int = 0  # rows per step whose cross-entropy is computed, drawn uniformly among those with a
    # target (0 = all, as EAGLE): an unbiased estimate that skips most of the LM head's cost
    bfloat16: bool = True  # bfloat16 autocast in training where native (`fast_bfloat16`)
    seed: int = 0

    def __post_init__(self) -> None:  # 3 and 3.0 are one config (and one cache key)
        for name in ("heldout", "epochs", "lr", "warmup", "grad_clip", "v_weight", "p_weight", "noise"):
            object.__setattr__(self, name, float(getattr(self, name)))


@dataclass(frozen=True)
class Window:
    """Consecutive rows of one segment: rows[i] is the data row of the window's i-th position."""

    rows: torch.Tensor  # long [n]: data rows
    targets: torch.Tensor  # long [n]: the next row of the segment (the regression target), -1 = none


def windows(data: DistillData, rows: torch.Tensor, max_len: int) -> list[Window]:
    """The segments that `rows` (indices into data, whole segments) cover, cut into windows of at
    most `max_len` rows, in data order."""
    out = []
    keep = torch.zeros(len(data.segment), dtype=torch.bool)  # host: data rows live on the CPU
    keep[rows] = True
    for s in torch.unique(data.segment[keep]).tolist():
        idx = torch.nonzero((data.segment == s) & keep)[:, 0]
        nxt = torch.cat([idx[1:], torch.tensor([-1])])  # host
        for lo in range(0, len(idx), max_len):
            out.append(Window(idx[lo : lo + max_len], nxt[lo : lo + max_len]))
    return out


def batches(ws: Sequence[Window], batch_rows: int, generator: torch.Generator) -> list[list[Window]]:
    """Windows grouped by length (little padding) into batches of at most `batch_rows` padded rows
    (one window at least), in random order."""
    order = sorted(range(len(ws)), key=lambda i: len(ws[i].rows))
    out, cur = [], []
    for i in order:
        if cur and (len(cur) + 1) * len(ws[i].rows) > batch_rows:
            out.append(cur)
            cur = []
        cur.append(ws[i])
    if cur:
        out.append(cur)
    return [out[i] for i in torch.randperm(len(out), generator=generator).tolist()]


def batch_tensors(data: DistillData, batch: Sequence[Window]) -> dict[str, torch.Tensor]:
    """Padded tensors of a batch of windows (host): features [B, T, H], tokens and positions [B, T],
    target features [B, T, H] and valid [B, T] (rows with a target)."""
    width = max(len(w.rows) for w in batch)
    b, h = len(batch), data.hidden.shape[1]
    feats = torch.zeros(b, width, h, dtype=data.hidden.dtype)  # host
    target = torch.zeros(b, width, h, dtype=data.hidden.dtype)  # host
    tokens = torch.zeros(b, width, dtype=torch.long)  # host
    positions = torch.zeros(b, width, dtype=torch.long)  # host
    valid = torch.zeros(b, width, dtype=torch.bool)  # host
    for i, w in enumerate(batch):
        n = len(w.rows)
        feats[i, :n] = data.hidden[w.rows]
        tokens[i, :n] = data.token[w.rows]
        positions[i, :n] = data.position[w.rows]
        valid[i, :n] = w.targets >= 0
        target[i, :n] = data.hidden[w.targets.clamp_min(0)]
    return {"features": feats, "tokens": tokens, "positions": positions, "target": target, "valid": valid}


def eagle_loss(
    head: EagleHead,
    features: torch.Tensor,
    tokens: torch.Tensor,
    positions: torch.Tensor,
    target: torch.Tensor,
    valid: torch.Tensor,
    config: EagleConfig,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """EAGLE's loss on a batch (module docstring): features, target [B, T, H]; tokens, positions,
    valid [B, T]. Padding sits at the end of each window, so the causal mask alone keeps real rows
    from it. Returns (loss, its two parts as floats)."""
    device = head.fc.weight.device
    features, target, valid = features.to(device), target.to(device).float(), valid.to(device)
    if config.noise > 0:
        u = torch.rand(features.shape, generator=generator, device=generator.device if generator else None)
        features = features + (u.to(device, features.dtype) - 0.5) * config.noise
    b, t = tokens.shape
    visible = causal_visible(t, 0, device).expand(b, t, t)
    g = head(features, tokens, positions, visible).float()  # [B, T, H]
    count = valid.sum().clamp_min(1)
    v = torch.nn.functional.smooth_l1_loss(g, target, reduction="none").mean(-1)  # [B, T]
    vloss = (v * valid).sum() / count
    g, target = g[valid], target[valid]  # [R, H]: the CE only where there is a next position
    if 0 < config.ce_rows < len(g):  # an unbiased estimate of the mean over all R rows
        pick = torch.randperm(len(g), generator=generator)[: config.ce_rows].to(device)
        g, target = g[pick], target[pick]
    with torch.no_grad():
        p = torch.softmax(head.project(target), -1)  # the target's own distribution there
    logp = torch.log_softmax(head.project(g), -1)
    ploss = -(p * logp).sum(-1).sum() / max(len(g), 1)
    loss = config.v_weight * vloss + config.p_weight * ploss
    return loss, {"vloss": float(vloss.detach()), "ploss": float(ploss.detach())}


def train_head(
    head: EagleHead, data: DistillData, train: torch.Tensor, config: EagleConfig, progress: bool = True
) -> dict:
    """Train `head` in place on the segments of rows `train` (indices into data); returns a log."""
    gen = torch.Generator().manual_seed(config.seed)
    ws = windows(data, train, config.max_len)
    per_epoch = len(batches(ws, config.batch_rows, gen))
    steps = max(1, math.ceil(config.epochs * per_epoch))
    warm = max(1, int(config.warmup * steps))
    opt = torch.optim.AdamW(head.trainable(), lr=config.lr, betas=(0.9, 0.95), weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (s + 1) / warm if s < warm else 0.5 * (1 + math.cos(math.pi * (s - warm) / max(steps - warm, 1)))
    )
    device = head.fc.weight.device
    mixed = config.bfloat16 and fast_bfloat16(device)
    plan: list[list[Window]] = []
    losses, parts = [], []
    start = time.perf_counter()
    head.train()
    bar = tqdm(range(steps), desc="train eagle head", disable=not progress)
    for _ in bar:
        if not plan:
            plan = batches(ws, config.batch_rows, gen)
        x = batch_tensors(data, plan.pop())
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=mixed):
            loss, part = eagle_loss(
                head, x["features"], x["tokens"], x["positions"], x["target"], x["valid"], config, gen
            )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.trainable(), config.grad_clip)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        parts.append(part)
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
    head.eval()
    last = min(10, len(losses))
    return {
        "steps": steps,
        "windows": len(ws),
        "train_rows": len(train),
        "seconds": time.perf_counter() - start,
        "bfloat16": mixed,
        "loss_first": losses[0],
        "loss_last": sum(losses[-last:]) / last,
        "vloss_last": sum(p["vloss"] for p in parts[-last:]) / last,
        "ploss_last": sum(p["ploss"] for p in parts[-last:]) / last,
    }


@torch.no_grad()
def depth_top_tokens(
    head: EagleHead,
    features: torch.Tensor,
    tokens: torch.Tensor,
    positions: torch.Tensor,
    depth: int,
    k: int,
    roots: torch.Tensor | None = None,
) -> torch.Tensor:
    """Long [depth, m, k]: the head's top-k tokens at depth d (index d - 1) of a chain drafted from
    each root row along one segment: features [n, H] (the target's), tokens and positions long [n],
    roots long [m] (default: every row). Depth 1 at row i reads the target's rows 0..i (it predicts
    tokens[i + 1]); depth d > 1 feeds row (g_{d-1}[i], tokens[i + d - 1]) at position positions[i] +
    d - 1, which sees the target's rows 0..i and the chain's own rows of root i (a chain draft's
    mask), and predicts tokens[i + d]. The target's rows are fed once into the head's cache, then one
    forward per depth of the m chain rows, as `EagleDrafter` does."""
    device = head.fc.weight.device
    n = features.shape[0]
    roots = torch.arange(n, device=device) if roots is None else roots.to(device)
    m = len(roots)
    tokens, positions = tokens.to(device), positions.to(device)
    cache = new_cache(head)
    base = causal_visible(n, 0, device)  # [n, n]
    g = head(features.to(device)[None], tokens[None], positions[None], base[None], cache)[0][roots]  # [m, H]
    out = [top_tokens(head.project(g), k)]
    eye = torch.eye(m, dtype=torch.bool, device=device)
    for d in range(2, depth + 1):
        idx = roots + d - 1
        fed = torch.where(idx < n, tokens[idx.clamp(max=n - 1)], 0)  # tokens[i + d - 1] (0 past the end: unused)
        visible = torch.cat([base[roots]] + [eye] * (d - 1), dim=1)  # [m, n + (d - 1) m]: rows 0..i, its chain, itself
        g = head(g[None], fed[None], (positions[roots] + d - 1)[None], visible[None], cache)[0]  # [m, H]
        out.append(top_tokens(head.project(g), k))
    return torch.stack(out)


def rank_in(top: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """Long [m]: the index of want[i] in the row top[i] (top: [m, k] tokens, best first), k where
    it is absent."""
    hit = top == want[:, None]
    return torch.where(hit.any(-1), hit.int().argmax(-1), top.shape[-1])


def eagle_ranks(
    target: torch.nn.Module, head: EagleHead, depth: int, dynamic: EagleDynamicDrafter | None = None
) -> Callable[[torch.Tensor, int, int], torch.Tensor | tuple]:
    """A `head_collection.RankFunction` for an EAGLE head: for a sequence (prompt of P tokens +
    continuation c), the target's rows from one plain forward, then the head's chain along c from the
    row before each step's root (`depth_top_tokens`): R[t, d-1] = the rank of c[t + d - 1] at depth d
    of the step that starts with t tokens generated (top_k where it is not in the top_k or past c's
    end), `depth` depths. With `dynamic`, also the drafter's top-n tree at every step position
    (`EagleDynamicDrafter.super_trees`) as super-tree arrays (`head_collection.super_tree_arrays`)."""

    def ranks(seq: torch.Tensor, p: int, top_k: int) -> torch.Tensor | tuple:
        hidden = last_hidden(target, seq[:-1])  # [P + L - 1, H]: row i's token is seq[i + 1]
        steps = len(seq) - p
        roots = torch.arange(p - 2, p - 2 + steps)  # host: step t reads the head's row of seq[p + t - 2]
        positions = torch.arange(len(seq) - 1)  # host: moved by depth_top_tokens
        top = depth_top_tokens(head, hidden, seq[1:], positions, depth, top_k, roots).cpu()  # [D, L, k]
        out = torch.full((steps, depth), top_k, dtype=torch.long)  # host: ranks are numpy-bound
        for d in range(1, depth + 1):
            idx = torch.arange(steps) + p + d - 1  # host: seq index of c[t + d - 1]
            want = torch.where(idx < len(seq), seq[idx.clamp(max=len(seq) - 1)], -1)
            out[:, d - 1] = rank_in(top[d - 1], want)
        if dynamic is None:
            return out
        trees = dynamic.super_trees(hidden, seq, p - 1)  # roots seq[p - 1 + t], t = 0 .. L - 1
        return out, super_tree_arrays(trees, seq[p:].tolist(), dynamic.n, dynamic.max_depth)

    return ranks


def collect_eagle(
    target: torch.nn.Module,
    head: EagleHead,
    prompts: Sequence[tuple[str, str, torch.Tensor]],
    config: CollectConfig,
    depth: int = 6,
    describe: dict | None = None,
    progress: bool = True,
) -> Collection:
    """`head_collection.collect_heads` for an EAGLE head: per prompt (id, category, ids [T]) the
    target's greedy continuation by an exact run with `EagleDrafter` (`config.run_tree`), then the
    head's rank at every depth <= `depth` of every step (`eagle_ranks`): every static tree of depth
    <= `depth` then replays exactly. config.super_k > 0: also EAGLE-2's tree of `config.super_size`
    nodes, `super_k` children per node (`EagleDynamicDrafter`, depth `depth`: the config's
    super_depth is set to it) re-drafted at every step position, so `replay.replay_dynamic`
    answers every budget <= super_size."""
    drafter = None
    if config.super_k:
        config = replace(config, super_depth=depth)
        drafter = EagleDynamicDrafter(target, head, n=config.super_size, top_k=config.super_k, max_depth=depth)
    return collect_heads(
        target,
        EagleDrafter(target, head),
        eagle_ranks(target, head, depth, drafter),
        prompts,
        config,
        config.run,
        dict(describe or {}, drafter="eagle", depth=depth),
        progress,
    )


def chain_ranks(head: EagleHead, data: DistillData, rows: torch.Tensor, depth: int, k: int) -> torch.Tensor:
    """Long [N, depth], one row per entry of `rows` (indices into data; segment by segment in data
    order, row order within each): the rank of the continuation's token at depth d (index d - 1)
    among the head's top k at depth d of a chain drafted from that row along the target's own
    continuation (`depth_top_tokens`): 0 = its top-1, k = not in its top k, -1 = no such token
    (past the segment's end, or prompt text rather than a generated token). A row whose depth-1
    token is generated is a root a greedy generation meets (the last prompt token or a generated
    one), and its ranks are the continuation rank path that replay of a static tree reads there
    (`tree_design.accepted_lengths`)."""
    out = []
    prompt_len = torch.tensor([len(p) for p, _ in data.sequences], dtype=torch.long)  # host
    keep = torch.zeros(len(data.segment), dtype=torch.bool)  # host
    keep[rows] = True
    for s in torch.unique(data.segment[keep]).tolist():
        idx = torch.nonzero(data.segment == s)[:, 0]  # the whole segment is the context
        top = depth_top_tokens(head, data.hidden[idx], data.token[idx], data.position[idx], depth, k).cpu()
        n = len(idx)
        plen = int(prompt_len[data.prompt[idx[0]]])
        i = torch.nonzero(keep[idx])[:, 0]  # host: the segment's rows asked for
        ranks = torch.full((len(i), depth), -1, dtype=torch.long)  # host
        for d in range(1, depth + 1):
            ok = (i + d < n) & (data.position[idx[i]] + 1 + d >= plen)  # the depth-d token tokens[i + d] is generated
            j = i[ok]
            ranks[ok, d - 1] = rank_in(top[d - 1, j], data.token[idx[j + d]])
        out.append(ranks)
    return torch.cat(out) if out else torch.zeros(0, depth, dtype=torch.long)  # host, like the ranks above


def head_accuracy(
    head: EagleHead, data: DistillData, rows: torch.Tensor, depth: int = 5, ks: Sequence[int] = SHOWN_K
) -> pd.DataFrame:
    """One row per (depth, k): share of `rows` (indices into data) whose depth-d token, the
    continuation's token d positions after the root, is in the head's top k at depth d of a chain
    drafted along the target's own continuation (`chain_ranks`); only tokens of the
    continuation count (not prompt text) and rows whose depth-d token lies in the segment. The
    `head` column repeats the depth, so Medusa's readers of such tables take it as they are
    (`training.medusa.heldout_rank_accuracy`: acc[d][r] for Sequoia's and Medusa's tree searches)."""
    ranks = chain_ranks(head, data, rows, depth, max(ks))
    counts = (ranks >= 0).sum(0)  # [depth]
    return pd.DataFrame(
        [
            {
                "head": d + 1,
                "depth": d + 1,
                "k": k,
                "rows": int(counts[d]),
                "top_k_accuracy": float(((ranks[:, d] >= 0) & (ranks[:, d] < k)).sum() / max(int(counts[d]), 1)),
            }
            for d in range(depth)
            for k in ks
        ]
    )


@dataclass(frozen=True)
class TrainedEagle:
    head: EagleHead
    accuracy: pd.DataFrame  # head_accuracy on the held-out prompts' greedy rows, split "before" (init) and "after"
    log: dict  # training log and the data sizes; "cached": loaded from the cache
    heldout_prompts: tuple[int, ...]  # indices (into the prompt list) not trained on
    folder: Path


LOG = "training.json"  # beside the weights: the training log and the accuracy table


def train_or_load(
    target: torch.nn.Module,
    model_name: str,
    prompts: Sequence[torch.Tensor],
    config: EagleConfig,
    folder: str | Path | None = None,
    progress: bool = True,
    depth: int = 5,
) -> TrainedEagle:
    """An EAGLE head for `target` trained on `prompts` (the `heldout` share held out, its top-k
    accuracy measured to `depth`, k = 1 .. RANKS), or loaded from a previous run with the same (model, prompts, config).
    folder: default `<cache>/eagle-heads/<key>`."""
    folder = (
        Path(folder)
        if folder is not None
        else cache_dir() / "eagle-heads" / cache_key(model_name, prompts, asdict(config), RECIPE)
    )
    held = heldout_prompts(len(prompts), config.heldout)
    if (folder / LOG).exists():
        saved = json.loads((folder / LOG).read_text())
        head = EagleHead.load(folder, target, torch.float32)  # as trained (from_target's float32)
        return TrainedEagle(head, pd.DataFrame(saved["accuracy"]), {**saved["log"], "cached": True}, held, folder)
    data, train_rows, held_rows, distill_s = training_split(target, model_name, prompts, config.data, held, progress)
    head = EagleHead.from_target(target, seed=config.seed)
    ks = tuple(range(1, RANKS + 1))
    before = (
        head_accuracy(head, data, held_rows, depth, ks).assign(split="before") if len(held_rows) else pd.DataFrame()
    )
    log = train_head(head, data, train_rows, config, progress)
    after = head_accuracy(head, data, held_rows, depth, ks).assign(split="after") if len(held_rows) else pd.DataFrame()
    accuracy = pd.concat([before, after], ignore_index=True)
    log = training_log(log, distill_s, data, held_rows, config, model_name)
    head.save(folder, model_name)
    (folder / LOG).write_text(json.dumps({"log": log, "accuracy": accuracy.to_dict("records")}, indent=1))
    return TrainedEagle(head, accuracy, log, held, folder)
