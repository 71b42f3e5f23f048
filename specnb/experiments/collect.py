"""Collect once: per prompt, what replay needs to answer every tree shape and budget.

Greedy (`CollectConfig.temperature` 0): the target's continuation c_0, c_1, ... from an exact
speculative run (`run_tree`), then one teacher-forced draft forward over prompt + continuation,
which gives the rank of every c_j under the draft after c_{<j} (`sampling.top_tokens`, the rule
every drafter ranks with) and its log q. Optionally, per position, the *super-tree*: the draft's
top-K children of every node to depth D, pruned to the global top-M nodes by cumulative draft
log-probability (`analysis.replay` explains what it answers). Growing it needs the draft's logits
at off-path nodes: the teacher-forced cache of prompt + continuation already holds every on-path
node, so only off-path nodes are fed: best first, so that only nodes of the final top-M are fed,
one per position per round over a chunk of positions at once, each seeing the sequence up to its
deepest on-path ancestor plus its own fed ancestors (one draft forward per round per chunk).

Sampling (`temperature` > 0): along a sampled continuation, R draft samples of the cover tree per
position (drafted as one forest, `ForestDrafter`), verified by the target in one
tree-masked pass, and per sample and node the alphas of `acceptance.sibling_alphas`: child i is
accepted, given children 0..i-1 were rejected, with probability alpha_i. `analysis.replay` turns
them into the expected acceptance of any gap-free subtree.

Cross-tokenizer (`CollectConfig.cross_tokenizer`): a draft of another tokenizer has no ranks of
the target's tokens, so only the continuation (in target tokens) and its run's steps are collected,
from an exact run of the given cross-tokenizer drafter; `analysis.redraft` answers the trees.

Everything lands in a collection folder (`analysis.collection`): resumable, one file per prompt.
The unit of work is one prompt (`collection.Unit`, named by a content hash) and `collect_unit` is
the plain function that does it; `collect_units` maps it over the units with an executor
(`experiments.executors`: in this process, or on Ray actors that each load the pair once, from its
names), retrying failed units and reporting them by name; `collect` is that loop in this process
with models already loaded. Either way the folder ends with the same files.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path as FilePath
from typing import Any

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm
from transformers import DynamicCache

from ..analysis.collection import CollectConfig, Collection, PromptData, Unit, open_folder, save_unit, units_of
from ..analysis.head_collection import empty_super_trees
from ..core.acceptance import sibling_alphas
from ..core.cache import crop, new_cache
from ..core.drafting import Drafter, ModelDrafter
from ..core.forward import forward
from ..core.generation import speculative_generate
from ..core.runtime import eos_ids
from ..core.sampling import SamplingConfig, match_vocab, probabilities, sample_without_replacement, top_tokens
from ..core.trees import Level, Tree
from ..core.verification import prefill, verify
from ..io.models import ModelPair
from ..io.storage import ResultFolder
from .continuations import Continuation, tie_table
from .executors import Executor, LocalExecutor, Outcome, Progress

Models = tuple[torch.nn.Module, torch.nn.Module, Drafter]  # (target, draft, the draft's drafter): what a worker keeps


def collect(
    folder: str | FilePath | ResultFolder,
    target: torch.nn.Module,
    draft: torch.nn.Module,
    prompts: Mapping[str, torch.Tensor],
    config: CollectConfig = CollectConfig(),
    categories: Mapping[str, str] | None = None,
    describe: Mapping[str, Any] | None = None,
    progress: bool = False,
) -> Collection:
    """Collect every prompt not yet in `folder`, in this process, and return the collection of `prompts`.

    prompts: prompt id -> input ids long [1, P]. describe: what made it (pair names, prompt
    source...; "super_prompts": see `collect_units`), stored with the config; resuming with another
    config or description raises. A prompt that fails raises its error (after the other prompts are
    collected). The continuation's run drafts with `ModelDrafter(draft)`; a cross-tokenizer
    collection needs its own drafter: `collect_units(folder, (target, draft, drafter), ...)`."""
    if config.cross_tokenizer:
        raise ValueError(
            "a cross-tokenizer collection needs its drafter: collect_units(folder, (target, draft, "
            "CrossTokenizerDrafter(...)), prompts, config)"
        )
    report = collect_units(
        folder, (target, draft), prompts, config, categories, describe, LocalExecutor(retries=0), progress
    )
    return report.check().collection


@dataclass(frozen=True)
class CollectReport:
    """What `collect_units` did: the collection of the units that are in the folder, and how the
    rest went (`outcome`: each written unit's result, the failures by unit name, the workers)."""

    collection: Collection  # the prompts asked for that are collected, in the order asked
    units: tuple[Unit, ...]  # every unit asked for
    present: int  # units already in the folder before this call
    outcome: Outcome
    # the target's continuations the units read (continuation "target"), by prompt id
    continuations: Mapping[str, Continuation] = field(default_factory=dict)

    def ties(self, dtype: torch.dtype) -> pd.DataFrame:
        """Per prompt, the continuation's tokens chosen by a margin below the tie margin of `dtype`
        (`continuations.tie_table`: where decoding that prompt alone may take the other token)."""
        return tie_table(self.continuations, dtype)

    def check(self) -> CollectReport:
        """Itself, if no unit failed; else the first failed unit's error is raised."""
        if self.outcome.failures:
            first = self.outcome.failures[0]
            raise first.exception or RuntimeError(f"collecting {first.unit} failed: {first.error}")
        return self

    @property
    def failed(self) -> list[str]:
        """Prompt ids of the units given up on."""
        by_name = {u.name: u.prompt_id for u in self.units}
        return [by_name[f.unit] for f in self.outcome.failures]

    def table(self) -> pd.DataFrame:
        """One row per unit: prompt_id, unit (file name), status ("present": there before; "written";
        "found": written meanwhile by another collection; "failed"), attempts, error, seconds."""
        failures = {f.unit: f for f in self.outcome.failures}
        rows = []
        for u in self.units:
            result, failure = self.outcome.results.get(u.name), failures.get(u.name)
            status = "failed" if failure else ("present" if result is None else result["status"])
            rows.append(
                {
                    "prompt_id": u.prompt_id,
                    "unit": u.name,
                    "status": status,
                    "attempts": self.outcome.attempts.get(u.name, 0) + (result is not None),
                    "error": failure.error if failure else "",
                    "seconds": None if result is None else result["seconds"],
                }
            )
        return pd.DataFrame(rows)


def collect_units(
    folder: str | FilePath | ResultFolder,
    models: ModelPair | tuple[torch.nn.Module, torch.nn.Module] | Models,
    prompts: Mapping[str, torch.Tensor],
    config: CollectConfig = CollectConfig(),
    categories: Mapping[str, str] | None = None,
    describe: Mapping[str, Any] | None = None,
    executor: Executor = LocalExecutor(),
    progress: bool | Callable[[Progress], None] = True,
    continuations: Mapping[str, Any] | None = None,
) -> CollectReport:
    """Collect every unit (prompt) not yet in `folder` with `executor`, which retries a failed unit
    up to its `retries` more times, then reports it (`CollectReport`) without stopping the others.

    models: a `ModelPair` (names: each worker loads it once, `load_models`) or loaded (target,
    draft) or (target, draft, drafter) for this process; a cross-tokenizer collection runs in this
    process, with its drafter. folder: a path, or for workers on other machines a shared folder or an
    fsspec URL they can all write. describe: what made the collection; if it names "draft_dtype",
    a worker whose draft loads in another dtype refuses to start; if it names "super_prompts" (prompt
    ids), only those get super-trees when config.super_k > 0 (they cost draft forwards; default
    every prompt), and resuming with another subset raises too. progress: a bar over units done /
    total with failures (True), or a callback taking each `Progress`. continuations: prompt id -> the
    target's own continuation (`experiments.continuations`), which config.continuation "target" reads
    instead of running the target: each unit carries its continuation to its worker."""
    describe = dict(describe or {})
    subset = describe.pop("super_prompts", None)
    if subset is not None and config.super_k:
        describe["super_prompts"] = sorted(str(p) for p in subset)
        unknown = sorted(set(describe["super_prompts"]) - {str(p) for p in prompts})
        if unknown:
            raise ValueError(f"super_prompts names prompts that are not collected: {unknown}")
    if config.cross_tokenizer and config.continuation == "run" and (isinstance(models, ModelPair) or len(models) != 3):
        raise ValueError(
            "a cross-tokenizer collection runs in this process with its drafter: "
            "models=(target, draft, CrossTokenizerDrafter(...)), executor local"
        )
    store = open_folder(folder, config, describe)
    units = units_of(prompts, config, describe, categories, continuations)
    todo = [u for u in units if not store.exists(u.name)]
    if isinstance(models, ModelPair):
        load: Callable[[], Models] = partial(load_models, models, (describe or {}).get("draft_dtype"))
    else:
        load = partial(_loaded, *models)
    with _ProgressBar(len(units), len(units) - len(todo), progress) as report:
        outcome = executor.map(load, partial(collect_unit, folder=store, config=config), todo, report)
    failed = {f.unit for f in outcome.failures}
    absent = [u.name for u in units if u.name not in failed and not store.exists(u.name)]
    if absent:
        raise FileNotFoundError(
            f"{len(absent)} units the workers wrote are not in {store} as this process sees it "
            f"(e.g. {absent[0]}): give them a folder this process shares (a shared file system, an fsspec URL)"
        )
    collection = Collection.load_units(store, [u.name for u in units if u.name not in failed])
    return CollectReport(collection, tuple(units), len(units) - len(todo), outcome, dict(continuations or {}))


def collect_unit(models: Models, unit: Unit, folder: ResultFolder, config: CollectConfig) -> dict[str, Any]:
    """One unit: collect the prompt and write its file, unless the file is there already (another
    worker or collection wrote it: units may run twice, the folder keeps one file). Returns
    {"status": "written" | "found", "seconds": ...}."""
    start = time.perf_counter()
    if folder.exists(unit.name):
        return {"status": "found", "seconds": 0.0}
    target, draft, drafter = models
    ids = torch.tensor([unit.prompt], dtype=torch.long)  # host: the generation loop moves it
    given = None if unit.continuation is None else Given(list(unit.continuation), unit.stopped, unit.seconds)
    save_unit(
        folder,
        unit.name,
        collect_prompt(target, draft, drafter, unit.prompt_id, unit.category, ids, config, unit.super_trees, given),
    )
    return {"status": "written", "seconds": time.perf_counter() - start}


def load_models(pair: ModelPair, draft_dtype: str | None = None) -> Models:
    """What a worker keeps: the pair loaded by name (on the worker's GPU, if it was given one).
    draft_dtype: the dtype the collection was described with; a worker whose draft loads in
    another (a float16 GPU worker for a float32 collection) refuses to start."""
    target, draft, _ = pair.load()
    dtype = str(draft.dtype).removeprefix("torch.")
    if draft_dtype is not None and dtype != draft_dtype:
        raise ValueError(f"this worker loads the draft in {dtype} ({draft.device}); the collection is {draft_dtype}")
    return target, draft, ModelDrafter(draft)


def _loaded(target: torch.nn.Module, draft: torch.nn.Module, drafter: Drafter | None = None) -> Models:
    return target, draft, drafter or ModelDrafter(draft)


class _ProgressBar:
    """A tqdm bar over units (done / total, failures) for `collect_units`, or the caller's callback."""

    def __init__(self, total: int, present: int, progress: bool | Callable[[Progress], None]) -> None:
        self.callback = progress if callable(progress) else None
        self.bar = tqdm(total=total, initial=present, desc="collect", unit="unit", disable=progress is not True)
        self.present = present

    def __enter__(self) -> _ProgressBar:
        return self

    def __call__(self, p: Progress) -> None:
        if self.callback is not None:
            self.callback(p)
        self.bar.n = self.present + p.done
        self.bar.set_postfix(
            failed=p.failed, retried=p.retried, workers=len(p.workers), lost=p.lost_workers, refresh=False
        )
        self.bar.refresh()

    def __exit__(self, *exc: Any) -> None:
        self.bar.close()


@dataclass(frozen=True)
class Given:
    """The target's own continuation of a prompt, decoded before (`experiments.continuations`)."""

    tokens: list[int]
    stopped: bool
    seconds: float  # what decoding it cost


def collect_prompt(
    target: torch.nn.Module,
    draft: torch.nn.Module,
    drafter: Drafter,
    prompt_id: str,
    category: str,
    input_ids: torch.Tensor,
    config: CollectConfig,
    super_trees: bool = True,
    given: Given | None = None,
) -> PromptData:
    """One prompt's data (the continuation; ranks and super-trees when config.super_k and
    `super_trees`, or sampled alphas). given: the target's continuation (config.continuation
    "target"); else a speculative run makes it and its steps are kept."""
    ids = input_ids.reshape(1, -1).long()
    times: dict[str, float] = {}
    if config.continuation == "target":
        if given is None:
            raise ValueError("this collection reads the target's continuation: give it (experiments.continuations)")
        tokens, stopped, times["continuation"] = list(given.tokens), given.stopped, given.seconds
        out: dict[str, Any] = {}
    else:
        tokens, stopped, out = _run_continuation(target, drafter, ids, prompt_id, config, times)
    out |= {"prompt": ids[0].numpy().astype(np.int64), "tokens": np.array(tokens, dtype=np.int64)}
    if config.cross_tokenizer:
        pass  # the continuation and its steps only
    elif config.sampling:
        start = time.perf_counter()
        out["alpha"] = _sampled_alphas(target, draft, ids, tokens, config, _seed(config.seed + 1, prompt_id))
        times["sampling"] = time.perf_counter() - start
    else:
        start = time.perf_counter()
        cache = new_cache(draft)
        ranks, logp = _ranks(draft, cache, ids, tokens, config.top_k)
        out.update(ranks)
        times["ranks"] = time.perf_counter() - start
        if config.super_k and super_trees:
            start = time.perf_counter()
            out.update(_super_trees(draft, cache, ids.shape[1], tokens, logp, config))
            times["super_tree"] = time.perf_counter() - start
    return PromptData(prompt_id=prompt_id, category=category, stopped=stopped, times=times, **out)


def _run_continuation(
    target: torch.nn.Module,
    drafter: Drafter,
    ids: torch.Tensor,
    prompt_id: str,
    config: CollectConfig,
    times: dict[str, float],
) -> tuple[list[int], bool, dict[str, np.ndarray]]:
    """The continuation from an exact speculative run of config.run: (tokens, stopped, {"run_steps"})."""
    start = time.perf_counter()
    run = speculative_generate(
        target,
        drafter,
        ids,
        tree=config.run,
        max_new_tokens=config.max_new_tokens,
        eos_token_id=config.eos_token_id,
        sampling=SamplingConfig(
            temperature=config.temperature,
            top_k=config.sample_top_k,
            top_p=config.sample_top_p,
            seed=_seed(config.seed, prompt_id),
        ),
    )
    times["continuation"] = time.perf_counter() - start
    tokens = run.tokens.tolist()
    steps = [(s.position, s.num_drafted, s.num_accepted, s.num_tokens) for s in run.steps]
    stopped = bool(tokens) and tokens[-1] in eos_ids(target, config.eos_token_id)
    return tokens, stopped, {"run_steps": np.array(steps, dtype=np.int32).reshape(-1, 4)}


def _ranks(
    draft: torch.nn.Module, cache: DynamicCache, ids: torch.Tensor, tokens: list[int], top_k: int
) -> tuple[dict[str, np.ndarray], torch.Tensor]:
    """The draft teacher-forced on prompt `ids` [1, T] + `tokens` (its cache filled): each token's
    rank among the draft's top_k (top_k: beyond), the logit margin to the nearest other rank, its
    log q; and the log q rows [L + 1, V] (row j predicting tokens[j])."""
    seq = torch.cat([ids, torch.tensor([tokens], dtype=torch.long)], dim=1)[0]  # host: moved by forward
    logits = forward(draft, cache, seq, logits_to_keep=len(tokens) + 1).float()
    logp = torch.log_softmax(logits, dim=-1)  # [L + 1, V]: row j predicts tokens[j]
    truth = torch.tensor(tokens, dtype=torch.long, device=logp.device)
    top = top_tokens(logits[: len(tokens)], top_k + 1)  # [L, top_k + 1]: the drafters' ranking
    hit = top[:, :top_k] == truth[:, None]
    rows = torch.arange(len(tokens), device=logits.device)
    gaps = (logits[: len(tokens)].gather(-1, top) - logits[rows, truth][:, None]).abs()
    out = {
        "ranks": torch.where(hit.any(-1), hit.int().argmax(-1), top_k).cpu().numpy().astype(np.int16),
        "rank_margin": gaps.masked_fill(top == truth[:, None], float("inf"))
        .min(-1)
        .values.cpu()
        .numpy()
        .astype(np.float32),
        "logq": logp[rows, truth].cpu().numpy().astype(np.float32),
    }
    return out, logp


@torch.inference_mode()
def _super_trees(
    draft: torch.nn.Module,
    cache: DynamicCache,
    prompt_len: int,
    tokens: list[int],
    logp: torch.Tensor,
    config: CollectConfig,
) -> dict[str, np.ndarray]:
    """Grow the super-tree at every position. cache: the draft's cache of prompt + continuation
    (restored after each chunk); logp: float [L + 1, V], teacher-forced log q, row j predicting
    tokens[j], i.e. the children of the on-path node at depth d of position t are in row t + d."""
    size, length = config.super_size, len(tokens)
    on_top = top_tokens(logp, config.super_k)  # [L + 1, k]
    on_children = (logp.gather(-1, on_top).tolist(), on_top.tolist())
    out = empty_super_trees(length, size, config.super_depth)
    for start in range(0, length, config.super_chunk):
        grown = _SuperChunk(range(start, min(length, start + config.super_chunk)), tokens)
        for t in grown.chunk:
            grown.add_children(t, -1, on_children[0][t], on_children[1][t])
        _grow_chunk(draft, cache, grown, prompt_len, on_children, config)
        crop(cache, prompt_len + length)
        for t in grown.chunk:
            kept = grown.kept(t, size)
            where = {old: new for new, old in enumerate(kept)}
            out["super_size"][t] = len(kept)
            for new, old in enumerate(kept):
                (neg_score, d, path), token, parent, on_depth, _ = grown.nodes[t][old]
                out["super_parent"][t, new] = where[parent] if parent >= 0 else -1
                out["super_rank"][t, new], out["super_depth"][t, new] = path[-1], d
                out["super_token"][t, new], out["super_score"][t, new] = token, -neg_score
                if on_depth == d:
                    out["super_on_path"][t, d - 1] = new
    return out


class _SuperChunk:
    """The super-trees of a chunk of positions as they grow. A node of position t: [sort key
    (-score, depth, path), token, parent index, on-path depth, fed column (-1: not fed)];
    `expanded[t]`: the indices of t's nodes whose children are known."""

    def __init__(self, chunk: range, tokens: list[int]) -> None:
        self.chunk, self.tokens = chunk, tokens
        self.nodes: dict[int, list[list]] = {t: [] for t in chunk}
        self.expanded: dict[int, set[int]] = {t: set() for t in chunk}

    def add_children(self, t: int, parent: int, values: list[float], indices: list[int]) -> None:
        nodes, length = self.nodes, len(self.tokens)
        base_score, base_depth, base_path = (
            (0.0, 0, ()) if parent < 0 else (-nodes[t][parent][0][0], nodes[t][parent][0][1], nodes[t][parent][0][2])
        )
        parent_on = parent < 0 or nodes[t][parent][3] == base_depth
        for r, (v, x) in enumerate(zip(values, indices)):
            d = base_depth + 1
            on = parent_on and t + d - 1 < length and x == self.tokens[t + d - 1]
            on_depth = d if on else (base_depth if parent_on else nodes[t][parent][3])
            nodes[t].append([(-(base_score + v), d, base_path + (r,)), x, parent, on_depth, -1])
        if parent >= 0:
            self.expanded[t].add(parent)

    def kept(self, t: int, size: int) -> list[int]:
        """The indices of position t's `size` best nodes, best first."""
        return sorted(range(len(self.nodes[t])), key=lambda i: self.nodes[t][i][0])[:size]

    def next_to_feed(self, t: int, size: int, depth: int, on_children: tuple[list, list]) -> int | None:
        """Position t's best node among its `size` best whose children are not known and can be kept
        (depth below `depth`), after expanding every on-path one met on the way from the teacher-forced
        rows (`on_children`); None when none is left: t's `size` best are final."""
        while True:
            node = next(
                (i for i in self.kept(t, size) if i not in self.expanded[t] and self.nodes[t][i][0][1] < depth), None
            )
            if node is None:
                return None
            d = self.nodes[t][node][0][1]
            if self.nodes[t][node][3] != d:
                return node
            self.add_children(t, node, on_children[0][t + d], on_children[1][t + d])


def _grow_chunk(
    draft: torch.nn.Module,
    cache: DynamicCache,
    grown: _SuperChunk,
    prompt_len: int,
    on_children: tuple[list, list],
    config: CollectConfig,
) -> None:
    """Best first, in rounds. A child never precedes its parent in the order, so a position's final
    `super_size` best are the nodes a best-first expansion takes: each round, every position of the
    chunk takes its best node among its current `super_size` best whose children are unknown (an
    on-path node's come from the teacher-forced rows, `on_children`: values and indices of each row's
    top super_k); the off-path ones, one per position, are fed to the draft in one forward, each
    seeing its sequence up to its deepest on-path ancestor and its fed ancestors. A position is done
    when its `super_size` best all have their children (or lie at super_depth): only nodes of the
    final tree are fed."""
    nodes, n_seq, fed = grown.nodes, prompt_len + len(grown.tokens), 0
    size, depth = config.super_size, config.super_depth
    active = list(grown.chunk)
    while active:
        feed = [(t, i) for t in active if (i := grown.next_to_feed(t, size, depth, on_children)) is not None]
        if not feed:
            return
        active = [t for t, _ in feed]
        q = len(feed)
        mask = torch.zeros(q, n_seq + fed + q, dtype=torch.bool)  # host: built here, moved by forward
        for row, (t, i) in enumerate(feed):
            node = nodes[t][i]
            node[4] = fed + row
            mask[row, : prompt_len + t + node[3]] = True  # the sequence up to the deepest on-path ancestor
            a = i
            while a >= 0 and nodes[t][a][4] >= 0:  # itself and its fed (off-path) ancestors
                mask[row, n_seq + nodes[t][a][4]] = True
                a = nodes[t][a][2]
        ids = torch.tensor([nodes[t][i][1] for t, i in feed])  # host: moved by forward
        positions = torch.tensor([prompt_len + t - 1 + nodes[t][i][0][1] for t, i in feed])  # host: moved by forward
        logq = torch.log_softmax(forward(draft, cache, ids, positions, mask).float(), dim=-1)
        fed += q
        top = top_tokens(logq, config.super_k)
        for (t, i), values, indices in zip(feed, logq.gather(-1, top).tolist(), top.tolist()):
            grown.add_children(t, i, values, indices)


@torch.inference_mode()
def _sampled_alphas(
    target: torch.nn.Module,
    draft: torch.nn.Module,
    ids: torch.Tensor,
    tokens: list[int],
    config: CollectConfig,
    seed: int,
) -> np.ndarray:
    """Float32 [L, R, N + 1, K]: per position, draft sample and cover-tree row, the acceptance
    probability of each child rank given the earlier ones were rejected (`sibling_alphas`).

    Samples are drafted `sample_chunk` at a time as copies of the cover tree side by side under the
    root (`_forest`, `ForestDrafter`), one draft forward per depth, and verified
    in one target pass."""
    cover = config.cover
    sampling = config.sampling_config
    generator = torch.Generator(device=draft.device).manual_seed(seed)
    width = max(len(c) for c in cover.children)
    drafter = ForestDrafter(draft)
    cache = new_cache(target)  # holds the sequence but its last token
    if ids.shape[1] > 1:
        prefill(target, cache, ids[:, :-1])
    seq = ids[0].tolist()
    out = np.zeros((len(tokens), config.samples, cover.num_nodes + 1, width), dtype=np.float32)
    chunks = [min(config.sample_chunk, config.samples - s0) for s0 in range(0, config.samples, config.sample_chunk)]
    forests = {n: _forest(cover, n) for n in set(chunks)}
    by_rank = _children_by_rank(cover, width)
    for t in range(len(tokens)):
        prefix_len = len(seq) - 1
        s0 = 0
        for copies in chunks:
            forest, index = forests[copies]
            drafter.copies = copies
            draft_out = drafter.draft(torch.tensor(seq), forest, sampling, generator)  # host: drafters read ids there
            logits = verify(target, cache, seq[-1], forest, draft_out.tokens)  # [1 + S N, V]
            crop(cache, prefix_len)
            p = probabilities(logits, sampling)
            q = match_vocab(draft_out.q, p)
            rows = torch.tensor([[0] + [i + 1 for i in index[s]] for s in range(copies)], device=p.device)  # [S, N + 1]
            child = torch.tensor(
                [[index[s][c] if c >= 0 else -1 for c in by_rank] for s in range(copies)],
                device=draft_out.tokens.device,
            )  # [S, (N + 1) K]: forest node per cover child
            child_tokens = torch.where(child >= 0, draft_out.tokens[child.clamp_min(0)], -1).to(p.device)
            flat = rows.reshape(-1)
            alpha, _ = sibling_alphas(p[flat].double(), q[flat].double(), child_tokens.reshape(-1, width))
            out[t, s0 : s0 + copies] = alpha.float().reshape(copies, cover.num_nodes + 1, width).cpu().numpy()
            s0 += copies
        prefill(target, cache, torch.tensor([seq[-1:]]))  # host: moved by forward | the root joins the cached sequence
        seq.append(tokens[t])
    return out


class ForestDrafter(ModelDrafter):
    """A model drafter whose tree is a forest of `copies` copies of one tree side by side under the
    root (`_forest`: copy s's depth-1 ranks are s * w .. s * w + w - 1), each copy an independent
    sample: the root's children are drawn without replacement within a copy, not across copies."""

    copies = 1

    def draw(self, probs: torch.Tensor, level: Level, generator: torch.Generator | None) -> torch.Tensor:
        if level.depth > 1 or self.copies == 1:
            return super().draw(probs, level, generator)
        return sample_without_replacement(probs.expand(self.copies, -1), level.width // self.copies, generator).reshape(
            1, -1
        )


def _children_by_rank(tree: Tree, width: int) -> list[int]:
    """Flat [(N + 1) * width]: the node index of row r's child of rank k at r * width + k, -1 if none."""
    out = [-1] * ((tree.num_nodes + 1) * width)
    for row, kids in enumerate(tree.children):
        for c in kids:
            out[row * width + tree.ranks[c]] = c
    return out


def _forest(tree: Tree, copies: int) -> tuple[Tree, list[list[int]]]:
    """`copies` copies of `tree` side by side under one root, and index[s][i] = the forest index of
    copy s's node i (copy s's depth-1 ranks are shifted by s * width; ranks here are only labels)."""
    width = len(tree.children[0])
    paths = [(s * width + p[0],) + p[1:] for s in range(copies) for p in tree.paths]
    forest = Tree.from_paths(paths)
    where = {p: i for i, p in enumerate(forest.paths)}
    index = [[where[(s * width + p[0],) + p[1:]] for p in tree.paths] for s in range(copies)]
    return forest, index


def _seed(seed: int, prompt_id: str) -> int:
    """A seed per prompt that does not depend on the order prompts are collected in."""
    return (seed * 1_000_003 + zlib.crc32(prompt_id.encode())) % (2**31)
