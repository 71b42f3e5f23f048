"""Training Medusa-1 heads by self-distillation on a frozen target, and measuring them.

    TrainConfig      the recipe's parameters (a frozen dataclass: the cache key); its data
                     parameters are a `distillation.DistillConfig` (`distill_config`)
    (data)           the target's own continuations and hidden states, labelled for the heads (head
                     d at row t gets token t+1+d), come from `training.distillation`, which EAGLE's
                     trainer shares
    train_heads      AdamW, linear warmup then cosine (Medusa's lr 1e-3, warmup 10%), loss = sum
                     over heads of cross-entropy (lambda_k = 1 as in Medusa's code) against the hard
                     label or, with `soft_labels`, against the target's own distribution at that
                     position (the paper's self-distillation loss, section 2.3.2), a progress bar,
                     held-out top-k accuracy per head before and after
    train_or_load    the above for a named model and prompt set, cached under
                     `<cache>/medusa-heads/<key>/` in the published checkpoint layout
                     (`io.medusa_checkpoint`), the key a hash of (model, prompts, config)
    head_accuracy    top-k accuracy of each head (by depth) on rows with labels
    split_prompts, heldout_rank_accuracy, shape_trees   the benchmark's and
                     notebook 05's pieces (splits that span the categories, Medusa's rank table)
    collect_heads    a greedy `Collection` of every head's rank at every step of the target's
                     continuation (one plain forward per prompt), so `analysis.replay` answers
                     every Medusa tree shape and budget exactly (`analysis.head_collection`, whose
                     accuracy_by_depth and rank_accuracy read it)

Choices beyond Medusa-1's recipe (stated in every report): `share_lm_head` keeps W2 = the
target's LM head, frozen and shared (only the residual blocks train); `loss_vocab` sets the softmax's
support: "seen" = the tokens that occur as training labels (it never pushes down the others),
"sampled" = those plus `negatives` unseen tokens drawn uniformly per step, their logits raised by
log(unseen / negatives) (a sampled softmax: an unbiased estimate of the unseen part of the partition
function), "full" = the whole vocabulary, as Medusa. Drafting always uses the full vocabulary.
Data: `samples` adds continuations sampled at `sample_temperature` beside the greedy one;
`soft_labels` replaces each hard label by the target's distribution at that position (its argmax is
the hard label on the greedy continuation); `prompt_rows` also trains on the prompts' own positions
(labels: the prompt text, as Medusa-1's original ShareGPT training; its self-distillation keeps
answers only), and prompts longer than `max_continued_prompt` then give those rows only;
`max_sampled_prompt` samples after short prompts only. `distill_bfloat16` generates the data with a
bfloat16 copy of a float32 target where bfloat16 is native: the rows are within bfloat16 rounding
of the target's, not equal; drafting and every measurement use the target itself.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from ..analysis import head_collection
from ..analysis.collection import CollectConfig, Collection
from ..analysis.tree_design import medusa_tree, sequoia_trees
from ..core.trees import SPARSE_ACCEPTANCE, Tree
from ..drafters.hidden_rows import last_hidden
from ..drafters.medusa import MedusaDrafter, MedusaHeads, head_ranks
from ..io.embedded import cache_dir
from ..io.medusa_checkpoint import WEIGHTS, load_checkpoint, save_checkpoint
from ..io.prompts import interleave
from .distillation import (
    DistillConfig,
    DistillData,
    cache_key,
    fast_bfloat16,
    heldout_prompts,
    training_log,
    training_split,
)

RANKS = 64  # ranks per head in the held-out accuracy table and Medusa's tree search (Medusa's code: 10;
# a 64-node tree can reach rank 63)
SHOWN_K = (1, 3, 5, 10, 20, 64)  # the top-k columns shown in tables


@dataclass(frozen=True)
class TrainConfig:
    num_heads: int = 4  # K heads; head d predicts the token d + 1 after its row
    max_new_tokens: int = 128  # continuation tokens per training prompt
    gen_batch: int = 16  # prompts generated together
    heldout: float = 0.2  # share of the prompts held out (evenly spaced through the list)
    epochs: float = 2.0  # passes over the training rows
    batch_size: int = 256  # rows per optimizer step
    lr: float = 1e-3  # Medusa-1's learning rate
    warmup: float = 0.1  # share of the steps with a linear warmup, then cosine to 0
    share_lm_head: bool = True  # W2 = the target's LM head, frozen (else one trained copy per head)
    loss_vocab: str = "seen"  # "full": softmax over the vocabulary; "seen": over the training labels; "sampled":
    # those and `negatives` unseen tokens drawn at every step (a sampled softmax)
    negatives: int = 2048  # unseen tokens per step with loss_vocab="sampled"
    num_layers: int = 1  # residual blocks per head (Medusa's medusa_num_layers)
    soft_labels: bool = True  # targets: the target's distribution at the label's position (else the token)
    prompt_rows: bool = False  # also train on prompt positions (labels: the prompt text)
    samples: int = 1  # continuations sampled per prompt besides the greedy one
    sample_temperature: float = 0.7  # their temperature
    max_sampled_prompt: int | None = None  # longer prompts get the greedy continuation only
    max_continued_prompt: int | None = None  # longer prompts give their prompt rows only (needs prompt_rows)
    bfloat16: bool = True  # bfloat16 matmuls in training where the hardware has them (`fast_bfloat16`)
    distill_bfloat16: bool = False  # generate the data with a bfloat16 copy of a float32 target (`fast_bfloat16`)
    seed: int = 0

    def __post_init__(self) -> None:  # 3 and 3.0 are one config (and one cache key)
        for name in ("heldout", "epochs", "lr", "warmup", "sample_temperature"):
            object.__setattr__(self, name, float(getattr(self, name)))
        self.distill_config()  # refuses data parameters that do not fit together
        if self.loss_vocab not in ("full", "seen", "sampled"):
            raise ValueError(f"loss_vocab must be 'full', 'seen' or 'sampled', got {self.loss_vocab!r}")

    def distill_config(self) -> DistillConfig:
        """The parameters that decide the distilled data (not the training)."""
        return DistillConfig(
            num_heads=self.num_heads,
            max_new_tokens=self.max_new_tokens,
            gen_batch=self.gen_batch,
            prompt_rows=self.prompt_rows,
            max_continued_prompt=self.max_continued_prompt,
            samples=self.samples,
            sample_temperature=self.sample_temperature,
            max_sampled_prompt=self.max_sampled_prompt,
            distill_bfloat16=self.distill_bfloat16,
            seed=self.seed,
        )


def head_accuracy(
    heads: MedusaHeads, hidden: torch.Tensor, labels: torch.Tensor, ks: Sequence[int] = SHOWN_K, chunk: int = 256
) -> pd.DataFrame:
    """One row per (head, k): share of rows with a label whose label is in the head's top k
    (full vocabulary); head d = depth d of a Medusa tree."""
    hits = torch.zeros(heads.num_heads, len(ks))  # host: counts
    kmax = max(ks)
    with torch.no_grad():
        for lo in range(0, hidden.shape[0], chunk):
            logits = heads(hidden[lo : lo + chunk].to(heads[0][0].linear.weight))  # [K, B, V]
            top = logits.topk(kmax, dim=-1).indices.cpu()  # [K, B, kmax]
            lab = labels[lo : lo + chunk].T  # [K, B]
            for j, k in enumerate(ks):
                hits[:, j] += ((top[..., :k] == lab[..., None]).any(-1) & (lab >= 0)).sum(-1)
    counts = (labels >= 0).sum(0)
    return pd.DataFrame(
        [
            {
                "head": d + 1,
                "depth": d + 1,
                "k": k,
                "rows": int(counts[d]),
                "top_k_accuracy": float(hits[d, j] / max(int(counts[d]), 1)),
            }
            for d in range(heads.num_heads)
            for j, k in enumerate(ks)
        ]
    )


def train_heads(
    heads: MedusaHeads,
    data: DistillData,
    train: torch.Tensor,
    config: TrainConfig,
    progress: bool = True,
    lm_head: torch.Tensor | None = None,
) -> dict:
    """Train `heads` in place on rows `train` (indices into data); returns a log (losses, seconds).
    lm_head: the target's LM-head weight [V, H], the teacher of `config.soft_labels` (default: the
    heads' shared projection). The parameters stay float32; with `config.bfloat16` (and
    `fast_bfloat16`) the forward runs under bfloat16 autocast, the losses in float32."""
    gen = torch.Generator().manual_seed(config.seed)
    steps = max(1, math.ceil(config.epochs * len(train) / config.batch_size))
    opt, sched = _optimizer(heads.trainable(), config, steps)
    device = heads[0][0].linear.weight.device
    mixed = config.bfloat16 and fast_bfloat16(device)
    labels, targets, unseen = _loss_targets(
        heads, data.labels[train], config, lm_head, torch.bfloat16 if mixed else None
    )
    hidden = data.hidden[train]
    soft_row = data.soft_row[train]
    order = torch.cat([torch.randperm(len(train), generator=gen) for _ in range(math.ceil(config.epochs) + 1)])
    losses = []
    start = time.perf_counter()
    heads.train()
    bar = tqdm(range(steps), desc="train heads", disable=not progress)
    for s in bar:
        rows = order[s * config.batch_size : (s + 1) * config.batch_size]
        x = hidden[rows].to(device)  # [B, H]
        negatives = (
            None
            if unseen is None
            else unseen[torch.randperm(len(unseen), generator=gen)[: config.negatives].to(device)]
        )
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=mixed):
            loss = heads_loss(
                heads, x, labels[rows].to(device), soft_row[rows].to(device), data.hidden, targets, negatives
            )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
    heads.eval()
    return {
        "steps": steps,
        "train_rows": len(train),
        "seconds": time.perf_counter() - start,
        "bfloat16": mixed,
        "loss_first": losses[0],
        "loss_last": sum(losses[-10:]) / len(losses[-10:]),
    }


def _optimizer(
    params: list[torch.nn.Parameter], config: TrainConfig, steps: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW at `config.lr`, warmed up linearly over `config.warmup` of the steps, then a cosine decay."""
    opt = torch.optim.AdamW(params, lr=config.lr, weight_decay=0.0)
    warm = max(1, int(config.warmup * steps))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (s + 1) / warm if s < warm else 0.5 * (1 + math.cos(math.pi * (s - warm) / max(steps - warm, 1)))
    )
    return opt, sched


@dataclass(frozen=True)
class LossTargets:
    """What `heads_loss` scores the heads' logits against, fixed for one training run."""

    vocab: torch.Tensor | None  # long [S]: the token ids the softmax runs over; None: the whole vocabulary
    teacher: torch.Tensor | None  # [V or S, H]: the LM head whose distribution is the soft target; None: one-hot
    shared: torch.Tensor | None = None  # [V or S, H]: the heads' common frozen projection, restricted to vocab
    shift: float = 0.0  # added to the negatives' logits: log(1 / their inclusion probability)


def _loss_targets(
    heads: MedusaHeads, labels: torch.Tensor, config: TrainConfig, lm_head: torch.Tensor | None, low: torch.dtype | None
) -> tuple[torch.Tensor, LossTargets, torch.Tensor | None]:
    """(labels [R, K] as indices into the loss vocabulary, its `LossTargets`, the unseen token ids
    negatives are drawn from, or None) for `config.loss_vocab`: "seen" (the labels' tokens), "sampled"
    (those and drawn negatives) or the full vocabulary. low: the autocast dtype, if any, that the
    teacher and the shared projection are cast to once, not every step."""
    device = heads[0][0].linear.weight.device
    unseen, shift, vocab = None, 0.0, None
    if config.loss_vocab in ("seen", "sampled"):
        vocab = torch.unique(labels[labels >= 0]).to(device)  # [S]
        remap = torch.full((heads.vocab_size,), -100, dtype=torch.long)  # host: labels live on the CPU
        remap[vocab.cpu()] = torch.arange(len(vocab))  # host
        labels = torch.where(labels >= 0, remap[labels.clamp_min(0)], -100)
        if config.loss_vocab == "sampled" and len(vocab) < heads.vocab_size:
            unseen = torch.nonzero(remap < 0)[:, 0].to(device)  # [U]
            shift = math.log(len(unseen) / min(config.negatives, len(unseen)))  # 1 / inclusion probability
    teacher = None
    if config.soft_labels:
        if lm_head is None and not heads.shares_lm_head:
            raise ValueError("soft_labels needs the target's LM head (lm_head=...) when the heads do not share it")
        teacher = (heads[0][-1].weight if lm_head is None else lm_head).detach().to(device)
        teacher = teacher if vocab is None else teacher[vocab]  # [V or S, H]
    teacher = teacher.to(low) if teacher is not None and low else teacher
    shared = None  # the frozen shared projection, gathered (and cast to the blocks' dtype) once, not every step
    if heads.shares_lm_head:
        shared = heads[0][-1].weight.detach()
        shared = (shared if vocab is None else shared[vocab]).to(low or heads[0][0].linear.weight.dtype)
    return labels, LossTargets(vocab, teacher, shared, shift), unseen


def heads_loss(
    heads: MedusaHeads,
    x: torch.Tensor,
    labels: torch.Tensor,
    soft_row: torch.Tensor,
    hidden: torch.Tensor,
    targets: LossTargets,
    negatives: torch.Tensor | None = None,
) -> torch.Tensor:
    """Sum over heads of the cross-entropy of head d's logits on rows x [B, H] (over `targets.vocab`,
    or the whole vocabulary when None) against labels[:, d] (-100 = none; index into vocab) or, with
    a `targets.teacher` ([V or S, H]), against the teacher's distribution on hidden[soft_row[:, d]]
    (one-hot on the label where soft_row is -1). targets.shared: the heads' common frozen projection
    already restricted to vocab ([V or S, H]), used instead of gathering each head's. negatives:
    token ids outside vocab whose logits, raised by `targets.shift`, join the softmax with no target
    mass (a sampled softmax's estimate of the unseen tokens' share of the partition function)."""
    vocab, teacher, shared = targets.vocab, targets.teacher, targets.shared
    device = x.device
    loss = torch.zeros((), device=device)
    for d, head in enumerate(heads):
        z = x
        for block in head[:-1]:
            z = block(z)
        w = shared if shared is not None else head[-1].weight if vocab is None else head[-1].weight[vocab]
        logits = (z @ w.T).float()  # [B, V or S]
        if negatives is not None:
            logits = torch.cat([logits, (z @ head[-1].weight[negatives].to(z.dtype).T).float() + targets.shift], -1)
        want = labels[:, d]
        if teacher is None:
            loss = loss + torch.nn.functional.cross_entropy(logits, want, ignore_index=-100)
            continue
        valid = want >= 0
        if not bool(valid.any()):
            continue
        src = soft_row[:, d]
        with torch.no_grad():  # the target's distribution at the label's position; one-hot where no row
            target_p = torch.nn.functional.one_hot(want.clamp_min(0), logits.shape[-1]).float()  # negatives: 0
            has = src >= 0
            if bool(has.any()):
                p = torch.softmax((hidden[src[has].cpu()].to(device, teacher.dtype) @ teacher.T).float(), -1)
                target_p[has, : p.shape[-1]] = p
        loss = loss + torch.nn.functional.cross_entropy(logits[valid], target_p[valid])
    return loss


@dataclass(frozen=True)
class TrainedHeads:
    heads: MedusaHeads
    accuracy: pd.DataFrame  # head_accuracy on the held-out prompts, split "before" (init) and "after"
    log: dict  # training log and the data sizes; "cached": loaded from the cache
    heldout_prompts: tuple[int, ...]  # indices (into the prompt list) not trained on
    folder: Path


RECIPE = 4  # in the heads' cache key: raised when the recipe or its data change, so cached heads are retrained


def train_or_load(
    target: torch.nn.Module,
    model_name: str,
    prompts: Sequence[torch.Tensor],
    config: TrainConfig,
    folder: str | Path | None = None,
    progress: bool = True,
) -> TrainedHeads:
    """Heads for `target` trained on `prompts` (a `heldout` share held out, `heldout_prompts`), or
    loaded from a previous run with the same (model, prompts, config). folder: default
    `<cache>/medusa-heads/<key>` (outside the repository)."""
    folder = (
        Path(folder)
        if folder is not None
        else cache_dir() / "medusa-heads" / cache_key(model_name, prompts, asdict(config), RECIPE)
    )
    held = heldout_prompts(len(prompts), config.heldout)
    if (folder / WEIGHTS).exists():
        _, saved = load_checkpoint(folder)
        heads = MedusaHeads.load(folder, target)
        train = saved["specnb_training"]
        return TrainedHeads(heads, pd.DataFrame(train["accuracy"]), {**train["log"], "cached": True}, held, folder)
    torch.manual_seed(config.seed)
    data, train_rows, held_rows, distill_s = training_split(  # the backbone frozen (Medusa-1)
        target, model_name, prompts, config.distill_config(), held, progress
    )
    heads = MedusaHeads.from_target(target, config.num_heads, config.num_layers, share_lm_head=config.share_lm_head)
    ks = tuple(range(1, RANKS + 1))
    before = head_accuracy(heads, data.hidden[held_rows], data.labels[held_rows], ks).assign(split="before")
    log = train_heads(heads, data, train_rows, config, progress, lm_head=target.get_output_embeddings().weight)
    after = head_accuracy(heads, data.hidden[held_rows], data.labels[held_rows], ks).assign(split="after")
    accuracy = pd.concat([before, after], ignore_index=True)
    log = training_log(log, distill_s, data, held_rows, config, model_name)
    save_checkpoint(
        folder,
        heads.published_state_dict(),
        model_name,
        extra={"specnb_training": {"log": log, "accuracy": accuracy.to_dict("records")}},
    )
    return TrainedHeads(heads, accuracy, log, held, folder)


def collect_heads(
    target: torch.nn.Module,
    heads: MedusaHeads,
    prompts: Sequence[tuple[str, str, torch.Tensor]],
    config: CollectConfig,
    describe: dict | None = None,
    progress: bool = True,
    tree: Tree | None = None,
) -> Collection:
    """`head_collection.collect_heads` for Medusa heads: per prompt (id, category, ids [T]) the
    target's greedy continuation by an exact run with the heads (`config.run_tree`, a preset spec
    such as "sparse:16", cut at the heads' depth, or `tree`), then one plain forward over prompt +
    continuation whose hidden rows give every head's rank at every step (`drafters.medusa.head_ranks`)."""

    def ranks(seq: torch.Tensor, p: int, top_k: int) -> torch.Tensor:
        hidden = last_hidden(target, seq[:-1])  # [P + L - 1, H]
        tokens = seq[p:]
        return head_ranks(
            heads, hidden[p - 2 : p - 2 + len(tokens)], tokens, top_k
        )  # step t reads seq[p + t - 2]'s row

    run_tree = tree if tree is not None else config.run.truncated(heads.num_heads)
    return head_collection.collect_heads(
        target,
        MedusaDrafter(target, heads),
        ranks,
        prompts,
        config,
        run_tree,
        dict(describe or {}, drafter="medusa", heads=heads.num_heads),
        progress,
    )


def split_prompts(
    prompts: Sequence[tuple[str, str, torch.Tensor]], every: int = 4, group: Callable[[str], str] | None = None
) -> tuple[list, list]:
    """(train, test): prompts (id, category, ids), every `every`-th one of each category (by id)
    held out for testing; both lists take the categories in turn, so any first n of either spans
    them. group: take groups of categories in turn instead (e.g. `io.prompts.spec_bench_task`,
    Spec-Bench's six tasks), the categories of a group in turn within it."""
    by_category: dict[str, list] = {}
    for p in sorted(prompts, key=lambda p: (len(str(p[0])), str(p[0]))):
        by_category.setdefault(str(p[1]), []).append(p)
    groups: dict[str, list[list]] = {}
    for category, ps in sorted(by_category.items()):
        groups.setdefault(group(category) if group else category, []).append(ps)

    def part(held: bool) -> list:
        return interleave(
            [
                interleave([[p for i, p in enumerate(ps) if (i % every == 0) == held] for ps in members])
                for _, members in sorted(groups.items())
            ]
        )

    return part(False), part(True)


def heldout_rank_accuracy(accuracy: pd.DataFrame, floor: float = 1e-4) -> list[list[float]]:
    """acc[d][r] (Medusa's table) from `train_or_load`'s held-out top-k accuracies after training:
    top-(r+1) minus top-r, floored at `floor` (so every rank keeps a value for the tree search)."""
    after = accuracy[accuracy["split"] == "after"].pivot(index="head", columns="k", values="top_k_accuracy")
    top = after.to_numpy()  # [K, RANKS], k = 1..RANKS
    per_rank = np.diff(np.concatenate([np.zeros((top.shape[0], 1)), top], axis=1), axis=1)
    return [[max(float(a), floor) for a in row] for row in per_rank]


def shape_trees(budget: int, depth: int, accuracy: Sequence[Sequence[float]]) -> dict[tuple[str, int], Tree]:
    """Trees of at most `budget` nodes and depth <= `depth` (the heads) to fill from Medusa heads:
    preset shapes (k-ary and beams capped at that depth, wide, sparse best-first with a depth cap),
    Sequoia's tree from the per-depth accuracy, and Medusa's own search (`tree_design.medusa_tree`)."""
    out: dict[tuple[str, int], Tree] = {}
    for k in (2, 3, 4, 8):
        out[(f"kary{k}", budget)] = Tree.kary(k, min(budget, sum(k**d for d in range(1, depth + 1))))
    out[("wide", budget)] = Tree.wide(budget)
    beams = max(1, -(-budget // depth))
    out[(f"beams{beams}", budget)] = Tree.beams(beams, budget)
    out[("sparse", budget)] = Tree.best_first(budget, SPARSE_ACCEPTANCE, max_depth=depth)
    seq = sequoia_trees(accuracy, budget, max_depth=depth)
    out[("sequoia_per_depth", budget)] = seq[max(seq)]
    out[("medusa", budget)] = medusa_tree(accuracy, budget)
    return out
