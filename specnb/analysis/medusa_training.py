"""Training Medusa-1 heads by self-distillation on a frozen target, and measuring them.

    TrainConfig      the recipe's parameters (a frozen dataclass: the cache key)
    distill          the target's own greedy continuations of a prompt set, batched, with the last
                     hidden state of every fed token captured during that same generation (a hook
                     on the final norm: no second pass); labels: head d at row t gets token t+1+d
                     when it lies in the continuation (Medusa-1 masks non-answer labels the same way)
    train_heads      AdamW, linear warmup then cosine (Medusa's lr 1e-3, warmup 10%), loss = sum
                     over heads of cross-entropy (lambda_k = 1 as in Medusa's code), a progress bar,
                     held-out top-k accuracy per head before and after
    train_or_load    the above for a named model and prompt set, cached under
                     `<cache>/medusa-heads/<key>/` in the published checkpoint layout
                     (`io.medusa_checkpoint`), the key a hash of (model, prompts, config)
    head_accuracy    top-k accuracy of each head (by depth) on rows with labels
    split_prompts, heldout_rank_accuracy, shape_trees   the benchmark's and notebook 05's pieces
    collect_heads    a greedy `Collection` of every head's rank at every step of the target's
                     continuation (one plain forward per prompt), so `analysis.replay` answers
                     every Medusa tree shape and budget exactly; accuracy_by_depth and
                     rank_accuracy (Medusa's acc[d][r], the input of its tree search) read it

CPU choices (stated in every report): `share_lm_head` keeps W2 = the target's LM head, frozen and
shared (only the residual blocks train, 332k parameters per SmolLM2 head); `loss_vocab="seen"`
computes the softmax over the tokens that occur as training labels only (a sampled-softmax-like
shortcut, ~10x cheaper for SmolLM2's 49k vocabulary; it does not push down tokens never seen as
labels), `"full"` over the whole vocabulary as Medusa does. Drafting always uses the full vocabulary.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from ..core.generation import speculative_generate
from ..core.trees import SPARSE_ACCEPTANCE, Tree
from ..drafters.medusa import MedusaDrafter, MedusaHeads, final_norm, head_ranks, last_hidden
from ..io.embedded import cache_dir
from ..io.medusa_checkpoint import WEIGHTS, load_checkpoint, save_checkpoint
from .collection import CollectConfig, Collection, PromptData
from .tree_design import medusa_tree, sequoia_trees


RANKS = 10  # ranks per head in accuracy tables and Medusa's tree search (Medusa's TOPK)


@dataclass(frozen=True)
class TrainConfig:
    num_heads: int = 4  # K heads; head d predicts the token d + 1 after its row
    max_new_tokens: int = 128  # continuation tokens per training prompt
    gen_batch: int = 16  # prompts generated together
    heldout: float = 0.2  # share of the prompts held out (the last ones)
    epochs: float = 2.0  # passes over the training rows
    batch_size: int = 256  # rows per optimizer step
    lr: float = 1e-3  # Medusa-1's learning rate
    warmup: float = 0.1  # share of the steps with a linear warmup, then cosine to 0
    share_lm_head: bool = True  # W2 = the target's LM head, frozen (else one trained copy per head)
    loss_vocab: str = "seen"  # "full": softmax over the vocabulary; "seen": over the training labels
    seed: int = 0

    def __post_init__(self) -> None:  # 3 and 3.0 are one config (and one cache key)
        for name in ("heldout", "epochs", "lr", "warmup"):
            object.__setattr__(self, name, float(getattr(self, name)))


@dataclass(frozen=True)
class DistillData:
    """Rows (positions) of the target's own continuations, prompts concatenated."""

    hidden: torch.Tensor  # float [R, H]: the target's last hidden state at each row
    labels: torch.Tensor  # long [R, K]: head d's target token (index d - 1), -100 = none
    prompt: torch.Tensor  # long [R]: the row's prompt index
    sequences: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]  # per prompt: (prompt ids, continuation)


@torch.no_grad()  # not inference_mode: the captured rows are training inputs
def distill(target: torch.nn.Module, prompts: Sequence[torch.Tensor], num_heads: int, max_new_tokens: int,
            batch: int = 16, eos_token_id: int | None = None, progress: bool = True) -> DistillData:
    """The target's greedy continuations of `prompts` (long [T] each), generated `batch` at a time
    (left padding), and the hidden state of every fed token captured on the way (module docstring)."""
    eos = target.generation_config.eos_token_id if eos_token_id is None else eos_token_id
    eos = eos[0] if isinstance(eos, (list, tuple)) else eos
    pad = target.config.pad_token_id if target.config.pad_token_id is not None else (eos if eos is not None else 0)
    captured: list[torch.Tensor] = []
    hook = final_norm(target).register_forward_hook(lambda m, a, out: captured.append(out.float().cpu()))
    hidden_rows, label_rows, prompt_rows = [], [], []
    sequences: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = {}
    order = sorted(range(len(prompts)), key=lambda i: prompts[i].numel())  # similar lengths pad less
    try:
        for lo in tqdm(range(0, len(prompts), batch), desc="distill", disable=not progress):
            members = order[lo : lo + batch]
            group = [prompts[j].reshape(-1) for j in members]
            width = max(len(p) for p in group)
            ids = torch.full((len(group), width), pad, dtype=torch.long, device=target.device)
            mask = torch.zeros_like(ids)
            for i, p in enumerate(group):
                ids[i, width - len(p):] = p.to(target.device)
                mask[i, width - len(p):] = 1
            captured.clear()
            out = target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                                  pad_token_id=pad, eos_token_id=eos)
            hidden = torch.cat(captured, dim=1)  # [B, width + new - 1, H]: every fed token
            for i, p in enumerate(group):
                new = out[i, width:].tolist()
                if eos is not None and eos in new:
                    new = new[: new.index(eos) + 1]
                seq = p.tolist() + new
                rows = hidden[i, width - len(p) : width - len(p) + len(seq) - 1]  # rows of seq[:-1]
                labels = torch.full((len(rows), num_heads), -100, dtype=torch.long)  # host: data rows live on the CPU
                for d in range(1, num_heads + 1):
                    for t in range(max(len(p) - 1 - d, 0), len(seq) - 1 - d):
                        labels[t, d - 1] = seq[t + 1 + d]
                keep = (labels >= 0).any(-1)
                hidden_rows.append(rows[keep])
                label_rows.append(labels[keep])
                prompt_rows.append(torch.full((int(keep.sum()),), members[i], dtype=torch.long))  # host
                sequences[members[i]] = (tuple(p.tolist()), tuple(new))
    finally:
        hook.remove()
    return DistillData(torch.cat(hidden_rows), torch.cat(label_rows), torch.cat(prompt_rows),
                       tuple(sequences[i] for i in range(len(prompts))))


def head_accuracy(heads: MedusaHeads, hidden: torch.Tensor, labels: torch.Tensor, ks: Sequence[int] = (1, 3, 5, 10),
                  chunk: int = 256) -> pd.DataFrame:
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
    return pd.DataFrame([{"head": d + 1, "depth": d + 1, "k": k, "rows": int(counts[d]),
                          "top_k_accuracy": float(hits[d, j] / max(int(counts[d]), 1))}
                         for d in range(heads.num_heads) for j, k in enumerate(ks)])


def train_heads(heads: MedusaHeads, data: DistillData, train: torch.Tensor, config: TrainConfig,
                progress: bool = True) -> dict:
    """Train `heads` in place on rows `train` (indices into data); returns a log (losses, seconds)."""
    gen = torch.Generator().manual_seed(config.seed)
    params = heads.trainable()
    opt = torch.optim.AdamW(params, lr=config.lr, weight_decay=0.0)
    steps = max(1, math.ceil(config.epochs * len(train) / config.batch_size))
    warm = max(1, int(config.warmup * steps))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (s + 1) / warm if s < warm else 0.5 * (1 + math.cos(math.pi * (s - warm) / max(steps - warm, 1))))
    labels = data.labels[train]
    if config.loss_vocab == "seen":
        vocab = torch.unique(labels[labels >= 0])  # [S]
        remap = torch.full((heads.vocab_size,), -100, dtype=torch.long)  # host: labels live on the CPU
        remap[vocab] = torch.arange(len(vocab))  # host
        labels = torch.where(labels >= 0, remap[labels.clamp_min(0)], -100)
    elif config.loss_vocab == "full":
        vocab = None
    else:
        raise ValueError(f"loss_vocab must be 'full' or 'seen', got {config.loss_vocab!r}")
    device = heads[0][0].linear.weight.device
    hidden = data.hidden[train]
    order = torch.cat([torch.randperm(len(train), generator=gen) for _ in range(math.ceil(config.epochs) + 1)])
    losses = []
    start = time.perf_counter()
    heads.train()
    bar = tqdm(range(steps), desc="train heads", disable=not progress)
    for s in bar:
        rows = order[s * config.batch_size : (s + 1) * config.batch_size]
        x = hidden[rows].to(device)  # [B, H]
        loss = torch.zeros((), device=device)
        for d, head in enumerate(heads):
            z = x
            for block in head[:-1]:
                z = block(z)
            w = head[-1].weight if vocab is None else head[-1].weight[vocab.to(device)]
            logits = z @ w.T  # [B, V or S]
            loss = loss + torch.nn.functional.cross_entropy(logits.float(), labels[rows, d].to(device), ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
    heads.eval()
    return {"steps": steps, "train_rows": len(train), "seconds": time.perf_counter() - start,
            "loss_first": losses[0], "loss_last": sum(losses[-10:]) / len(losses[-10:])}


@dataclass(frozen=True)
class TrainedHeads:
    heads: MedusaHeads
    accuracy: pd.DataFrame  # head_accuracy on the held-out prompts, split "before" (init) and "after"
    log: dict  # training log and the data sizes; "cached": loaded from the cache
    heldout_prompts: tuple[int, ...]  # indices (into the prompt list) not trained on
    folder: Path


def cache_key(model_name: str, prompts: Sequence[torch.Tensor], config: TrainConfig) -> str:
    h = hashlib.sha256(json.dumps([model_name, [p.reshape(-1).tolist() for p in prompts], asdict(config)]).encode())
    return h.hexdigest()[:16]


def distill_cached(target: torch.nn.Module, model_name: str, prompts: Sequence[torch.Tensor], config: TrainConfig,
                   progress: bool = True) -> DistillData:
    """`distill`, kept under `<cache>/medusa-distill/<key>.pt` (key: model, prompts and the
    generation parameters), so heads trained with other training parameters reuse the data."""
    gen = {"num_heads": config.num_heads, "max_new_tokens": config.max_new_tokens, "gen_batch": config.gen_batch}
    key = hashlib.sha256(json.dumps([model_name, [p.reshape(-1).tolist() for p in prompts], gen]).encode()).hexdigest()[:16]
    path = cache_dir() / "medusa-distill" / f"{key}.pt"
    if path.exists():
        d = torch.load(path, weights_only=True)
        return DistillData(d["hidden"], d["labels"], d["prompt"], tuple((tuple(a), tuple(b)) for a, b in d["sequences"]))
    data = distill(target, prompts, config.num_heads, config.max_new_tokens, config.gen_batch, progress=progress)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save({"hidden": data.hidden, "labels": data.labels, "prompt": data.prompt,
                "sequences": [list(map(list, s)) for s in data.sequences]}, tmp)
    tmp.replace(path)
    return data


def train_or_load(target: torch.nn.Module, model_name: str, prompts: Sequence[torch.Tensor], config: TrainConfig,
                  folder: str | Path | None = None, progress: bool = True) -> TrainedHeads:
    """Heads for `target` trained on `prompts` (the last `heldout` share held out), or loaded from
    a previous run with the same (model, prompts, config). folder: default
    `<cache>/medusa-heads/<key>` (kept out of git: 4 SmolLM2 heads are ~458 MB in float32)."""
    folder = Path(folder) if folder is not None else cache_dir() / "medusa-heads" / cache_key(model_name, prompts, config)
    n_held = max(1, int(round(config.heldout * len(prompts)))) if config.heldout > 0 else 0
    held = tuple(range(len(prompts) - n_held, len(prompts)))
    if (folder / WEIGHTS).exists():
        _, saved = load_checkpoint(folder)
        heads = MedusaHeads.load(folder, target)
        train = saved["specnb_training"]
        return TrainedHeads(heads, pd.DataFrame(train["accuracy"]), {**train["log"], "cached": True}, held, folder)
    torch.manual_seed(config.seed)
    t0 = time.perf_counter()
    data = distill_cached(target, model_name, prompts, config, progress)
    distill_s = time.perf_counter() - t0
    is_held = torch.isin(data.prompt, torch.tensor(held, dtype=torch.long))  # host
    train_rows, held_rows = torch.nonzero(~is_held)[:, 0], torch.nonzero(is_held)[:, 0]
    for p in target.parameters():  # the backbone is frozen (Medusa-1)
        p.requires_grad_(False)
    heads = MedusaHeads.from_target(target, config.num_heads, share_lm_head=config.share_lm_head)
    ks = tuple(range(1, RANKS + 1))
    before = head_accuracy(heads, data.hidden[held_rows], data.labels[held_rows], ks).assign(split="before")
    log = train_heads(heads, data, train_rows, config, progress)
    after = head_accuracy(heads, data.hidden[held_rows], data.labels[held_rows], ks).assign(split="after")
    accuracy = pd.concat([before, after], ignore_index=True)
    log = {**log, "distill_seconds": distill_s, "rows": int(data.hidden.shape[0]), "heldout_rows": len(held_rows),
           "config": asdict(config), "model": model_name, "cached": False}
    save_checkpoint(folder, heads.published_state_dict(), model_name,
                    extra={"specnb_training": {"log": log, "accuracy": accuracy.to_dict("records")}})
    return TrainedHeads(heads, accuracy, log, held, folder)


def collect_heads(target: torch.nn.Module, heads: MedusaHeads, prompts: Sequence[tuple[str, str, torch.Tensor]],
                  config: CollectConfig, describe: dict | None = None, progress: bool = True,
                  tree: Tree | None = None) -> Collection:
    """A greedy `Collection` for Medusa heads: per prompt (id, category, ids [T]) the target's
    greedy continuation, made by an exact speculative run with the heads (`config.run_tree`, a
    preset spec such as "sparse:16", or `tree`; its steps are kept to check the replay), then one plain
    forward over prompt + continuation whose hidden rows give every head's rank at every step
    (`PromptData.head_ranks`). Every shape and budget of Medusa trees then replays exactly."""
    if config.sampling:
        raise ValueError("Medusa head collections are greedy (temperature 0)")
    drafter = MedusaDrafter(target, heads)
    eos = config.eos_token_id
    out = []
    for prompt_id, category, ids in tqdm(prompts, desc="collect heads", disable=not progress):
        ids = ids.reshape(1, -1)
        if ids.shape[1] < 2:  # its first draft is empty (no row before the root): not a static tree
            raise ValueError(f"prompt {prompt_id!r} has one token; Medusa replay needs prompts of >= 2 tokens")
        t0 = time.perf_counter()
        run_tree = tree if tree is not None else config.run.truncated(heads.num_heads)
        run = speculative_generate(target, drafter, ids, run_tree, config.max_new_tokens,
                                   eos_token_id=eos)
        t1 = time.perf_counter()
        tokens = run.tokens
        seq = torch.cat([ids[0].cpu(), tokens])
        hidden = last_hidden(target, seq[:-1])  # [P + L - 1, H]
        p = ids.shape[1]
        rows = hidden[p - 2 : p - 2 + len(tokens)]  # step t reads the row of seq[p + t - 2]
        ranks = head_ranks(heads, rows, tokens, config.top_k)
        stopped = bool(len(tokens) < config.max_new_tokens)
        out.append(PromptData(
            prompt_id=str(prompt_id), category=str(category), prompt=ids[0].cpu().numpy(), tokens=tokens.numpy(),
            stopped=stopped, times={"run": t1 - t0, "heads": time.perf_counter() - t1},
            run_steps=np.array([(s.position, s.num_drafted, s.num_accepted, s.num_tokens) for s in run.steps], dtype=np.int32),
            head_ranks=ranks.numpy().astype(np.int16)))
    describe = dict(describe or {}, drafter="medusa", heads=heads.num_heads)
    if tree is not None:
        describe["run_tree_paths"] = [list(p) for p in tree.paths]
    return Collection(config, describe, tuple(out))


def accuracy_by_depth(collection: Collection, ks: Sequence[int] = (1, 3, 5, 10)) -> pd.DataFrame:
    """Top-k accuracy of each head (depth) on a head collection's continuations: share of steps
    (every position t with a token at t + d) whose depth-d token is in head d's top k."""
    rows = []
    for d in range(collection.prompts[0].head_ranks.shape[1]):
        ranks = np.concatenate([p.head_ranks[: max(len(p.tokens) - d, 0), d] for p in collection.prompts])
        for k in ks:
            rows.append({"head": d + 1, "depth": d + 1, "k": k, "positions": len(ranks),
                         "top_k_accuracy": float(np.mean(ranks < k)) if len(ranks) else float("nan")})
    return pd.DataFrame(rows)


def rank_accuracy(collection: Collection, ranks: int = 10) -> list[list[float]]:
    """acc[d][r]: share of positions whose depth-(d+1) token is head d+1's rank-r token (Medusa's
    `heads_accuracy` table, the input of its tree search and of per-depth Sequoia)."""
    out = []
    for d in range(collection.prompts[0].head_ranks.shape[1]):
        r = np.concatenate([p.head_ranks[: max(len(p.tokens) - d, 0), d] for p in collection.prompts])
        out.append([float(np.mean(r == k)) for k in range(ranks)])
    return out


def split_prompts(prompts: Sequence[tuple[str, str, torch.Tensor]], every: int = 4) -> tuple[list, list]:
    """(train, test): prompts (id, category, ids) sorted by id, every `every`-th one held out for
    testing (so every category is in both)."""
    ordered = sorted(prompts, key=lambda p: (len(str(p[0])), str(p[0])))
    return ([p for i, p in enumerate(ordered) if i % every], [p for i, p in enumerate(ordered) if not i % every])


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
