"""Timing tree attention and verification, and the cost model that picks a draft budget.

What it holds:
    Timing, measure            wall clock of a callable: warm-up, repeated runs, CUDA synchronised,
                               median and quartiles; measure_interleaved: several, round-robin
    environment_row            device, dtype, torch version and threads, put in every timed row
    HeadShape, HEAD_SHAPES     attention heads x head size of real targets (Llama-2-7B, Qwen2.5 1.5B,
                               SmolLM2-135M), or read from a model's config
    GridPoint, grid, run_grid  the attention grid (batch x prefix x draft tokens x tree shape, every
                               implementation of `specnb.attention`), stored in a resumable `Sweep`
    speedup_table              per grid point: per-sequence / tree time, tree / plain causal time
    verify_curve               wall time of one target verification (`verification.verify` on a
                               real cache) against the number of tree nodes, with a plain forward of
                               the same number of tokens beside it; also the draft's time per level
    expected_tau, cost_table   Sequoia's cost model (Chen et al. 2024): expected tokens per target
                               call under a per-rank acceptance vector (positional assumption), and
                               expected tokens/s = tau / (t_draft(tree) + t_verify(n)), where the
                               draft runs one forward per depth (depth x t_draft for a chain)
    StepCost, step_cost        that step-time model alone, for any tree and any tau (e.g. a tau
                               replayed from collected data, `tree_design.recommend_budget`)

No timing is asserted anywhere: tables are measurements of this machine, with the machine named.
"""

from __future__ import annotations

import itertools
import math
import os
import random
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from .attention import CAUSAL, IMPLEMENTATIONS, TreeBatch, Unsupported, prepare, random_inputs
from ..core.cache import crop, new_cache
from ..io.storage import Sweep
from ..core.trees import Tree
from ..core.verification import prefill, verify

GRID_KEY = ("batch", "prefix", "nodes", "shape")
CURVE_KEY = ("model", "role", "kind", "prefix", "nodes", "shape")


# ---- measuring --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Timing:
    """Seconds per call over `repeats` timed runs after `warmup` untimed ones."""

    median_s: float
    q25_s: float
    q75_s: float
    min_s: float
    max_s: float
    repeats: int
    warmup: int

    def row(self) -> dict[str, float | int]:
        return asdict(self)


def synchronize(device: torch.device | str) -> None:
    """Wait for queued work on `device` (CUDA runs asynchronously; CPU needs nothing)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(
    fn: Callable[[], Any],
    device: torch.device | str,
    warmup: int = 2,
    repeats: int = 7,
    setup: Callable[[], Any] | None = None,
) -> Timing:
    """Time `fn()`; `setup()` runs before every call, untimed (e.g. cropping a cache back)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    times = []
    for i in range(warmup + repeats):
        if setup is not None:
            setup()
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return _summary(times, repeats, warmup)


def measure_interleaved(
    fns: Mapping[str, Callable[[], Any]],
    device: torch.device | str,
    warmup: int = 2,
    repeats: int = 7,
    setups: Mapping[str, Callable[[], Any]] | None = None,
) -> dict[str, Timing]:
    """Time several callables round-robin (each round runs every one once), so that a drift in the
    machine's speed (other load, clocks) falls on all of them alike and their ratios stay fair. The
    order within a round is shuffled (seeded), so that the effect of what ran just before a call
    (e.g. the caches it left) lands on every callable alike.
    setups[name]() runs, untimed, before each call of fns[name]."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    setups = setups or {}
    times: dict[str, list[float]] = {name: [] for name in fns}
    order = list(fns)
    rng = random.Random(0)
    for i in range(warmup + repeats):
        rng.shuffle(order)
        for name in order:
            fn = fns[name]
            if name in setups:
                setups[name]()
            synchronize(device)
            start = time.perf_counter()
            fn()
            synchronize(device)
            if i >= warmup:
                times[name].append(time.perf_counter() - start)
    return {name: _summary(t, repeats, warmup) for name, t in times.items()}


def _summary(times: list[float], repeats: int, warmup: int) -> Timing:
    q25, _, q75 = statistics.quantiles(times, n=4, method="inclusive") if len(times) > 1 else times * 3
    return Timing(statistics.median(times), q25, q75, min(times), max(times), repeats, warmup)


def device_name(device: torch.device | str) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{device.type} ({torch.get_num_threads()} threads, {os.cpu_count()} cores)"


def environment_row(device: torch.device | str, dtype: torch.dtype) -> dict[str, str]:
    """What every timed row carries so that tables from different machines can be told apart."""
    return {"device": device_name(device), "dtype": str(dtype).removeprefix("torch."), "torch": torch.__version__}


# ---- the attention grid -----------------------------------------------------------------------


@dataclass(frozen=True)
class HeadShape:
    """Attention heads of a target model: query heads, key/value heads, head size."""

    name: str
    heads: int
    kv_heads: int
    head_dim: int

    @classmethod
    def from_config(cls, config: Any, name: str | None = None) -> HeadShape:
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        kv = getattr(config, "num_key_value_heads", None) or heads
        return cls(name or getattr(config, "name_or_path", "") or config.model_type, heads, kv, head_dim)


# from the models' config.json files (hidden size / heads = head size)
HEAD_SHAPES: dict[str, HeadShape] = {
    s.name: s
    for s in (
        HeadShape("llama-2-7b", 32, 32, 128),
        HeadShape("qwen2.5-coder-1.5b", 12, 2, 128),
        HeadShape("qwen2.5-coder-0.5b", 14, 2, 64),
        HeadShape("smollm2-135m", 9, 3, 64),
    )
}


def head_shape(name: str) -> HeadShape:
    if name not in HEAD_SHAPES:
        raise ValueError(f"unknown head shape {name!r}; known: {sorted(HEAD_SHAPES)}")
    return HEAD_SHAPES[name]


@dataclass(frozen=True)
class GridPoint:
    """One attention problem: `batch` sequences, the longest with `prefix` cached positions, each
    with a tree of `nodes` draft tokens of the named shape (`Tree.preset`)."""

    batch: int
    prefix: int
    nodes: int
    shape: str

    def key(self) -> dict[str, int | str]:
        return asdict(self)

    def tree(self) -> Tree:
        return Tree.preset(self.shape, self.nodes)

    def tree_batch(self, ragged: bool) -> TreeBatch:
        """ragged: prefix lengths spread from `prefix` down to about prefix / 2 (batch > 1)."""
        tree = self.tree()
        return TreeBatch.spread(self.prefix, tree, self.batch) if ragged else TreeBatch.uniform(self.prefix, tree, self.batch)


def grid(batches: Iterable[int], prefixes: Iterable[int], nodes: Iterable[int], shapes: Iterable[str]) -> list[GridPoint]:
    """Every combination, cheapest first (so an interrupted run has the small points)."""
    points = [GridPoint(b, p, n, s) for s, b, p, n in itertools.product(shapes, batches, prefixes, nodes)]
    return sorted(points, key=lambda g: (g.batch * (g.prefix + g.nodes) * g.nodes, g.shape))


def run_grid(
    store: Sweep,
    points: Sequence[GridPoint],
    heads: HeadShape,
    impls: Sequence[str] = IMPLEMENTATIONS + (CAUSAL,),
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    warmup: int = 2,
    repeats: int = 7,
    ragged: bool = True,
    progress: bool = True,
) -> None:
    """Time every implementation at every point not yet in `store` (key `GRID_KEY`); one row per
    (point, implementation). An implementation that cannot run is stored as skipped, with why,
    and is not tried again in this call (a failed compile can take as long as a working one)."""
    env = environment_row(device, dtype)
    unsupported: dict[str, str] = {}
    todo = [p for p in points if p.key() not in store]
    for i, point in enumerate(tqdm(todo, desc="attention grid", disable=not progress)):
        batch = point.tree_batch(ragged)
        x = random_inputs(batch, heads.heads, heads.head_dim, heads.kv_heads, dtype, device, seed=i)
        rows = {impl: {"impl": impl, **env, "heads": heads.heads, "kv_heads": heads.kv_heads,
                       "head_dim": heads.head_dim, "status": "ok", "note": ""} for impl in impls}
        runs: dict[str, Callable[[], Any]] = {}
        for impl in impls:
            if impl in unsupported:
                rows[impl].update(status="skipped", note=unsupported[impl])
                continue
            try:
                runs[impl] = prepare(x, impl).run
            except Unsupported as e:
                unsupported[impl] = str(e)
                rows[impl].update(status="skipped", note=str(e))
        try:
            for impl, t in measure_interleaved(runs, device, warmup, repeats).items():
                rows[impl].update(t.row())
        except torch.OutOfMemoryError as e:
            for impl in runs:
                rows[impl].update(status="out of memory", note=str(e)[:200])
        runs.clear()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        tree = batch.trees[0]
        store.add(point.key(), list(rows.values()), meta={"leaves": len(tree.leaves), "depth": tree.depth,
                                                        "prefix_lens": "/".join(map(str, batch.prefix_lens)), "ragged": ragged})
        del x


def grid_table(store: Sweep) -> pd.DataFrame:
    """One row per (point, implementation) with the point's tree facts; milliseconds added."""
    rows = store.frame()
    if rows.empty:
        return rows
    meta = store.meta_frame()
    out = rows.merge(meta, on=list(GRID_KEY), how="left")
    for col in ("median_s", "q25_s", "q75_s"):
        if col in out:
            out[col.replace("_s", "_ms")] = out[col] * 1e3
    return out


def speedup_table(table: pd.DataFrame) -> pd.DataFrame:
    """One row per grid point: per_sequence_over_tree = t(per_sequence) / t(sdpa) (how much one
    tree call saves), mask_overhead = t(sdpa) / t(causal), and each implementation's median."""
    ok = table[table["status"] == "ok"]
    wide = ok.pivot_table(index=list(GRID_KEY) + ["leaves", "depth", "device", "dtype", "torch"],
                          columns="impl", values="median_s").reset_index()
    if {"per_sequence", "sdpa"} <= set(wide.columns):
        wide["per_sequence_over_tree"] = wide["per_sequence"] / wide["sdpa"]
    if {"sdpa", CAUSAL} <= set(wide.columns):
        wide["mask_overhead"] = wide["sdpa"] / wide[CAUSAL]
    wide.columns.name = None
    return wide


# ---- a real model: verification cost against tree size ----------------------------------------


@torch.inference_mode()
def prefilled_cache(model: torch.nn.Module, prefix_len: int, seed: int = 0):
    """A cache holding `prefix_len` random tokens of `model` (timing does not depend on content)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (1, prefix_len), generator=g).to(model.device)
    cache = new_cache(model)
    prefill(model, cache, ids)
    return cache


def verify_and_forward(
    model: torch.nn.Module,
    cache,
    tree: Tree | None,
    tokens: int | None = None,
    warmup: int = 1,
    repeats: int = 3,
    seed: int = 0,
) -> dict[str, Timing]:
    """Timed round-robin on `cache` (cropped back to its length before every run):
    "verify": one `verification.verify` of root + `tree` (if a tree is given);
    "plain": one plain forward of `tokens` new tokens with the model's own causal mask (default:
    as many tokens as verify feeds, root + nodes)."""
    prefix_len = cache.get_seq_length()
    g = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    fns: dict[str, Callable[[], Any]] = {}
    if tree is not None:
        draft = torch.randint(0, vocab, (tree.num_nodes,), generator=g)
        root = int(torch.randint(0, vocab, (1,), generator=g))
        fns["verify"] = lambda: verify(model, cache, root, tree, draft)
    n_plain = tokens if tokens is not None else (tree.num_nodes + 1 if tree is not None else 1)
    ids = torch.randint(0, vocab, (1, n_plain), generator=g).to(model.device)

    @torch.inference_mode()
    def plain() -> None:
        model(input_ids=ids, past_key_values=cache, use_cache=True)

    fns["plain"] = plain
    reset = lambda: crop(cache, prefix_len)  # noqa: E731
    out = measure_interleaved(fns, model.device, warmup, repeats, setups={name: reset for name in fns})
    reset()
    return out


def verify_curve(
    store: Sweep,
    model: torch.nn.Module,
    model_name: str,
    prefix_len: int,
    nodes: Sequence[int],
    shape: str = "sparse",
    role: str = "target",
    warmup: int = 1,
    repeats: int = 3,
    progress: bool = True,
) -> None:
    """For each n in `nodes` not yet in `store` (key `CURVE_KEY`), on a cache of `prefix_len`
    tokens: role "target": one verification of an n-node tree (kind "verify"; n = 0 is the root
    alone, one decoding step) and, interleaved with it, one plain forward of the same n + 1 tokens
    (kind "plain"); role "draft": one plain forward of n tokens, the draft's cost per tree level
    of width n."""
    env = environment_row(model.device, model.dtype)
    kinds = ["plain"] if role == "draft" else ["verify", "plain"]

    def key(kind: str, n: int) -> dict:
        return {"model": model_name, "role": role, "kind": kind, "prefix": prefix_len, "nodes": n, "shape": shape}

    todo = [n for n in nodes if any(key(k, n) not in store for k in kinds)]
    if not todo:
        return
    cache = prefilled_cache(model, prefix_len)
    for n in tqdm(todo, desc=f"{model_name} {role}", disable=not progress):
        tree = Tree.preset(shape, n)
        if role == "draft":
            timings = verify_and_forward(model, cache, None, max(n, 1), warmup, repeats)
        else:
            timings = verify_and_forward(model, cache, tree, None, warmup, repeats)
        tokens = max(n, 1) if role == "draft" else n + 1
        for kind in kinds:
            store.add(key(kind, n), [{**env, **timings[kind].row(), "tokens": tokens,
                                      "depth": tree.depth, "leaves": len(tree.leaves)}])


def curve_table(store: Sweep) -> pd.DataFrame:
    out = store.frame()
    if not out.empty:
        out["median_ms"] = out["median_s"] * 1e3
    return out


# ---- the cost model ---------------------------------------------------------------------------


def expected_tau(tree: Tree, acceptance: Sequence[float]) -> float:
    """Expected tokens per target call, bonus included, if the rank-r child of an accepted node is
    accepted with probability acceptance[r] (Sequoia's positional assumption): 1 + the sum over
    nodes of the product of acceptance[rank] along the node's path. Ranks beyond the vector: 0."""
    value: list[float] = []
    for i, (parent, rank) in enumerate(zip(tree.parents, tree.ranks)):
        a = acceptance[rank] if rank < len(acceptance) else 0.0
        value.append(a * (value[parent] if parent >= 0 else 1.0))
    return 1.0 + sum(value)


def draft_seconds(tree: Tree, draft_width_s: Callable[[int], float]) -> float:
    """Draft time of one step: the root's forward plus one forward per level fed (levels 1..depth-1;
    the deepest level is only sampled), each costing `draft_width_s(width)`."""
    widths = [1] + [len(tree.level(d)) for d in range(1, tree.depth)]
    return float(sum(draft_width_s(w) for w in widths))


def draft_widths(shapes: Sequence[str], nodes: Sequence[int]) -> list[int]:
    """Powers of two from 1 up to the widest level of any tree in the cost model: the draft forward
    widths to time (`cost_table` interpolates between them)."""
    widest = max([1] + [len(t.level(d)) for s in shapes for n in nodes if n > 0
                        for t in [Tree.preset(s, n)] for d in range(1, t.depth + 1)])
    return [2**i for i in range(math.ceil(math.log2(widest)) + 1)]


@dataclass(frozen=True)
class StepCost:
    """Seconds of one speculative step on the measured device, read from the curves.

    t_verify(n): the target's "verify" rows at n nodes (trees of any shape with n nodes: the
    attention is dense, so the shape hardly changes the time), linearly interpolated between
    measured n; the draft's time per level of width w is interpolated from its plain-forward rows.
    """

    verify_s: pd.Series  # median seconds of one verification, indexed by nodes (0 = plain decoding)
    draft_width_s: pd.Series  # median seconds of one draft forward, indexed by its width in tokens
    target: str
    draft: str

    def t_verify(self, n: int) -> float:
        if n in self.verify_s.index:
            return float(self.verify_s.loc[n])
        return float(np.interp(n, self.verify_s.index.to_numpy(), self.verify_s.to_numpy()))

    def t_draft(self, tree: Tree) -> float:
        widths = self.draft_width_s
        return draft_seconds(tree, lambda w: float(np.interp(w, widths.index.to_numpy(), widths.to_numpy())))

    def row(self, tree: Tree, tau: float) -> dict[str, float | int | str]:
        """Expected speed of `tree` at `tau` tokens per target call (bonus included)."""
        base = self.t_verify(0)
        t_draft = self.t_draft(tree)
        t_verify = self.t_verify(tree.num_nodes)
        t_step = t_draft + t_verify
        return {
            "target": self.target, "draft": self.draft, "nodes": tree.num_nodes, "depth": tree.depth,
            "leaves": len(tree.leaves), "expected_tau": tau, "t_draft_s": t_draft,
            "t_draft_chain_s": tree.depth * self.t_draft(Tree.chain(1)), "t_verify_s": t_verify,
            "t_step_s": t_step, "tokens_per_s": tau / t_step, "baseline_tokens_per_s": 1.0 / base,
            "speedup": tau / t_step * base,
        }


def step_cost(curve: pd.DataFrame, target: str, draft: str) -> StepCost:
    """The step-time model of `target` verifying and `draft` drafting, from `verify_curve` rows."""
    v = curve[(curve["model"] == target) & (curve["role"] == "target") & (curve["kind"] == "verify")]
    d = curve[(curve["model"] == draft) & (curve["role"] == "draft")]
    if v.empty or d.empty or 0 not in set(v["nodes"]):
        raise ValueError("cost_table needs the target's verify curve including n = 0 and the draft's forward curve")
    t_verify = v.groupby("nodes")["median_s"].median().sort_index()
    widths = d.groupby("tokens")["median_s"].median().sort_index()
    return StepCost(t_verify, widths, target, draft)


def cost_table(
    curve: pd.DataFrame,
    shapes: Sequence[str],
    acceptance: Sequence[float],
    target: str,
    draft: str,
) -> pd.DataFrame:
    """Expected tokens/s per (tree shape, nodes) from the measured curves (see `StepCost`), with
    tau from the acceptance vector (`expected_tau`), at every measured n > 0. speedup = tokens/s
    over the target's own decoding, 1 / t_verify(0)."""
    cost = step_cost(curve, target, draft)
    rows = []
    for shape in shapes:
        for n in sorted(int(n) for n in cost.verify_s.index if n > 0):
            tree = Tree.preset(shape, n)
            rows.append({"shape": shape, **cost.row(tree, expected_tau(tree, acceptance))})
    return pd.DataFrame(rows)[_COST_COLUMNS]


_COST_COLUMNS = ["target", "draft", "shape", "nodes", "depth", "leaves", "expected_tau", "t_draft_s",
                 "t_draft_chain_s", "t_verify_s", "t_step_s", "tokens_per_s", "baseline_tokens_per_s", "speedup"]


def recommendation(cost: pd.DataFrame) -> str:
    """The budget the cost model picks on this device, in one markdown paragraph."""
    best = cost.loc[cost["tokens_per_s"].idxmax()]
    per_shape = cost.loc[cost.groupby("shape")["tokens_per_s"].idxmax()]
    others = ", ".join(f"{r.shape} {int(r.nodes)} ({r.speedup:.2f}x)" for r in per_shape.itertuples())
    verdict = "pays off" if best["speedup"] > 1 else "does not pay off: the target alone is faster"
    return (
        f"Best on this device: **{best['shape']} with {int(best['nodes'])} draft tokens**, expected tau "
        f"{best['expected_tau']:.2f} (bonus included), {best['tokens_per_s']:.2f} tokens/s = "
        f"{best['speedup']:.2f}x the target alone; speculation {verdict}. Best budget per shape: {others}."
    )
