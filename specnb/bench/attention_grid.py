"""The tree-attention grid: every implementation of `bench.attention` timed across batch size,
prefix length, draft tokens and tree shape.

    HeadShape, head_shape      attention heads x head size of a real model, read from its config
                               (any embedded model, hub id or folder; no weights), or given
    GridPoint, grid, run_grid  the grid (batch x prefix x draft tokens x tree shape; a custom tree,
                               `io.tree_spec`, at its own node count), stored in a resumable
                               `Sweep`, one row per (point, implementation); visited in a shuffled
                               order, each point warmed up until its calls settle
    grid_table, speedup_table  per grid point: per-sequence / tree time, tree / plain causal time
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch
from tqdm.auto import tqdm

from ..core.trees import Tree
from ..io.embedded import ModelNotInstalledError
from ..io.models import load_config
from ..io.sources import ModelSourceError
from ..io.storage import Sweep
from .attention import CAUSAL, IMPLEMENTATIONS, TreeBatch, Unsupported, prepare, random_inputs
from .timing import environment_row, measure_interleaved

GRID_KEY = ("batch", "prefix", "nodes", "shape")


@dataclass(frozen=True)
class HeadShape:
    """Attention heads of a target model: query heads, key/value heads, head size (and its layers,
    None where not given)."""

    name: str
    heads: int
    kv_heads: int
    head_dim: int
    layers: int | None = None

    def __post_init__(self) -> None:
        sizes = (self.heads, self.kv_heads, self.head_dim, self.layers or 1)
        if not all(isinstance(v, int) and v > 0 for v in sizes) or self.heads % self.kv_heads:
            raise ValueError(
                f"head shape {self.name!r}: heads, kv_heads, head_dim (and layers) must be positive integers, "
                f"heads a multiple of kv_heads; got {self.heads}, {self.kv_heads}, {self.head_dim}, {self.layers}"
            )

    @classmethod
    def from_config(cls, config: Any, name: str | None = None) -> HeadShape:
        """From a transformers config (its text model's, for a composite one): num_attention_heads,
        num_key_value_heads (default: as many as heads), head_dim (default: hidden_size / heads),
        num_hidden_layers."""
        config = config.get_text_config() if hasattr(config, "get_text_config") else config
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        kv = getattr(config, "num_key_value_heads", None) or heads
        layers = getattr(config, "num_hidden_layers", None)
        return cls(name or getattr(config, "name_or_path", "") or config.model_type, heads, kv, head_dim, layers)


EXPLICIT_SHAPE = '{"heads": 24, "kv_heads": 8, "head_dim": 128}'  # the form of a shape given by hand


def head_shape(model: str | Mapping[str, Any]) -> HeadShape:
    """The head shape of `model`, read from its config alone (`io.models.load_config`: an embedded
    model, a hub id (committed, cached, or its config.json fetched), a folder or a config.json; never
    weights), or given by hand as a mapping like `EXPLICIT_SHAPE` (kv_heads defaults to heads; an
    optional "layers" and "name"). ValueError says what was wrong and what to do."""
    if isinstance(model, Mapping):
        unknown = set(model) - {"name", "heads", "kv_heads", "head_dim", "layers"}
        if unknown or not {"heads", "head_dim"} <= set(model):
            raise ValueError(f"a head shape given by hand looks like {EXPLICIT_SHAPE} (optionally layers), not {model}")
        heads = model["heads"]
        return HeadShape(
            model.get("name", "given"), heads, model.get("kv_heads", heads), model["head_dim"], model.get("layers")
        )
    try:
        return HeadShape.from_config(load_config(model), model)
    except (ModelSourceError, ModelNotInstalledError, OSError) as e:
        raise ValueError(
            f"no head shape for {model!r}, its config cannot be read: {e}\nName a model whose config can be read "
            f"(a hub id needs the hub once: only its config.json is fetched, then cached), or give the shape by hand "
            f"from its config.json (num_attention_heads, num_key_value_heads, head_dim or hidden_size / heads), "
            f"e.g. {EXPLICIT_SHAPE}"
        ) from e


@dataclass(frozen=True)
class GridPoint:
    """One attention problem: `batch` sequences, the longest with `prefix` cached positions, each
    with a tree of `nodes` draft tokens of the named shape (`Tree.preset`, or `custom`: a custom
    tree named `shape`, of `nodes` nodes)."""

    batch: int
    prefix: int
    nodes: int
    shape: str
    custom: Tree | None = field(default=None, compare=False, repr=False)

    def key(self) -> dict[str, int | str]:
        return {"batch": self.batch, "prefix": self.prefix, "nodes": self.nodes, "shape": self.shape}

    def tree(self) -> Tree:
        return self.custom if self.custom is not None else Tree.preset(self.shape, self.nodes)

    def tree_batch(self, ragged: bool) -> TreeBatch:
        """ragged: prefix lengths spread from `prefix` down to about prefix / 2 (batch > 1)."""
        tree = self.tree()
        return (
            TreeBatch.spread(self.prefix, tree, self.batch)
            if ragged
            else TreeBatch.uniform(self.prefix, tree, self.batch)
        )


def grid(
    batches: Iterable[int],
    prefixes: Iterable[int],
    nodes: Iterable[int],
    shapes: Iterable[str],
    custom: Mapping[str, Tree] | None = None,
) -> list[GridPoint]:
    """Every combination, cheapest first (so an interrupted run has the small points); each custom
    tree (name -> `Tree`) at every batch and prefix, at its own node count."""
    batches, prefixes = list(batches), list(prefixes)
    points = [GridPoint(b, p, n, s) for s, b, p, n in itertools.product(shapes, batches, prefixes, nodes)]
    points += [
        GridPoint(b, p, t.num_nodes, name, t) for name, t in (custom or {}).items() for b in batches for p in prefixes
    ]
    return sorted(points, key=lambda g: (g.batch * (g.prefix + g.nodes) * g.nodes, g.shape))


@dataclass(frozen=True)
class GridConfig:
    """How `run_grid` times each point, built where notebook 03 reads its parameters."""

    impls: tuple[str, ...] = IMPLEMENTATIONS + (CAUSAL,)  # the implementations timed (`bench.attention`)
    dtype: torch.dtype = torch.float32  # of the random queries, keys and values
    device: torch.device | str = "cpu"
    warmup: int = 2  # untimed calls of each implementation per point, at least
    repeats: int = 7  # timed calls, interleaved between implementations
    ragged: bool = True  # prefix lengths spread from `prefix` down to about prefix / 2 (batch > 1)
    progress: bool = True  # a progress bar over the points
    settle: float | None = 0.1  # more untimed calls until each one's last is within 10% of its fastest
    order: int | None = 0  # the points visited shuffled by this seed (None: cheapest first)

    def __post_init__(self) -> None:  # a notebook's list, kept as a tuple
        object.__setattr__(self, "impls", tuple(self.impls))


def run_grid(store: Sweep, points: Sequence[GridPoint], heads: HeadShape, config: GridConfig = GridConfig()) -> None:
    """Time every implementation at every point not yet in `store` (key `GRID_KEY`); one row per
    (point, implementation). Each point is warmed up on its own (`config.settle`) and the points are
    visited in a shuffled order (`config.order`), so that no point's time depends on which one ran
    before it (a new batch x prefix after another, a first call of a shape). An implementation that
    cannot run is stored as skipped, with why, and is not tried again in this call (a failed compile
    can take as long as a working one)."""
    env = environment_row(config.device, config.dtype)
    unsupported: dict[str, str] = {}
    todo = visiting_order([p for p in points if p.key() not in store], config.order)
    for i, point in enumerate(tqdm(todo, desc="attention grid", disable=not config.progress)):
        batch = point.tree_batch(config.ragged)
        rows = _time_point(batch, heads, config, i, unsupported)
        tree = batch.trees[0]
        store.add(
            point.key(),
            [{"impl": impl, **env, **row} for impl, row in rows.items()],
            meta={
                "leaves": len(tree.leaves),
                "depth": tree.depth,
                "prefix_lens": "/".join(map(str, batch.prefix_lens)),
                "ragged": config.ragged,
            },
        )


def visiting_order(points: Sequence[GridPoint], order: int | None) -> list[GridPoint]:
    """`points` shuffled by the seed `order` (the same seed, the same order: a resumed run keeps it);
    None keeps them as given (`grid`: cheapest first)."""
    todo = list(points)
    if order is not None:
        random.Random(order).shuffle(todo)
    return todo


def _time_point(
    batch: TreeBatch, heads: HeadShape, config: GridConfig, seed: int, unsupported: dict[str, str]
) -> dict[str, dict]:
    """Every implementation on random inputs of one point (seeded by `seed`): its row of times, or
    skipped (an implementation in `unsupported`, or one that raises `Unsupported`: added there) or out
    of memory, with why."""
    x = random_inputs(batch, heads.heads, heads.head_dim, heads.kv_heads, config.dtype, config.device, seed=seed)
    shape = {"heads": heads.heads, "kv_heads": heads.kv_heads, "head_dim": heads.head_dim}
    rows = {impl: {**shape, "status": "ok", "note": ""} for impl in config.impls}
    runs: dict[str, Callable[[], Any]] = {}
    for impl in config.impls:
        if impl in unsupported:
            rows[impl].update(status="skipped", note=unsupported[impl])
            continue
        try:
            runs[impl] = prepare(x, impl).run
        except Unsupported as e:
            unsupported[impl] = str(e)
            rows[impl].update(status="skipped", note=str(e))
    try:
        timings = measure_interleaved(runs, config.device, config.warmup, config.repeats, settle=config.settle)
        for impl, t in timings.items():
            rows[impl].update(t.row())
    except torch.OutOfMemoryError as e:
        for impl in runs:
            rows[impl].update(status="out of memory", note=str(e)[:200])
    runs.clear()
    del x
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return rows


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
    wide = ok.pivot_table(
        index=list(GRID_KEY) + ["leaves", "depth", "device", "dtype", "torch"], columns="impl", values="median_s"
    ).reset_index()
    if {"per_sequence", "sdpa"} <= set(wide.columns):
        wide["per_sequence_over_tree"] = wide["per_sequence"] / wide["sdpa"]
    if {"sdpa", CAUSAL} <= set(wide.columns):
        wide["mask_overhead"] = wide["sdpa"] / wide[CAUSAL]
    wide.columns.name = None
    return wide
