"""What one batched step costs a real model, against the batch size (`core.batch`'s own forwards).

    ragged_prefix   a ragged cache of B rows whose lengths spread from `prefix` down to half of it
                    (random tokens: timing does not depend on them)
    batch_curve     per batch size B, stored resumably (key `BATCH_CURVE_KEY`): role "target", one
                    verification of B x (n + 1) tokens (every row its root and an n-node tree under
                    its own mask; n = 0 is one decoding step of every row); role "draft", one
                    forward of B x w tokens (a level of width w for every row)
    batch_curve_table   the stored rows as a frame (milliseconds added)

`analysis.cost_model.batch_cost_table` turns them into expected tokens/s per tree and batch size.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import pandas as pd
import torch
from tqdm.auto import tqdm

from ..core.batch import prefill_batch
from ..core.masks import rooted_ancestor_mask
from ..core.ragged import RaggedCache, block_forward, discard
from ..core.trees import Tree
from ..io.storage import Sweep
from ..kernels.cpu_linear import linear_path
from .timing import environment_row, measure
from .verify_curve import CurveConfig

BATCH_CURVE_KEY = ("model", "role", "batch", "prefix", "nodes", "shape", "device", "dtype", "torch", "linear")


@torch.inference_mode()
def ragged_prefix(model: torch.nn.Module, batch: int, prefix: int, seed: int = 0) -> RaggedCache:
    """B rows of lengths spread evenly from `prefix` down to prefix // 2 (a ragged batch), prefilled."""
    g = torch.Generator().manual_seed(seed)
    lengths = [prefix - (prefix // 2) * b // max(batch - 1, 1) for b in range(batch)]
    ragged = RaggedCache.empty(model, batch)
    rows = [torch.randint(0, model.config.vocab_size, (n,), generator=g).tolist() for n in lengths]  # host: id lists
    prefill_batch(model, ragged, rows)
    return ragged


def batch_curve(
    store: Sweep,
    model: torch.nn.Module,
    model_name: str,
    role: str,
    prefix: int,
    batches: Sequence[int],
    nodes: Sequence[int],
    config: CurveConfig | None = None,
) -> None:
    """Every (B, n) point not yet in `store`: role "target": one verification of an n-node `shape`
    tree per row (n = 0: the roots alone); role "draft": one forward of n tokens per row (n = a
    level's width). The block is discarded after every call, so each one sees the same cache. The
    trees are `config.shape`'s (default: `CurveConfig(repeats=2)`)."""
    config = config or CurveConfig(repeats=2)
    shape = config.shape
    env = {**environment_row(model.device, model.dtype), "linear": linear_path(model)}
    for b in batches:
        todo = [n for n in nodes if _key(model_name, role, b, prefix, n, shape, env) not in store]
        if not todo:
            continue
        ragged = ragged_prefix(model, b, prefix)
        for n in tqdm(todo, desc=f"{model_name} {role} batch {b}", disable=not config.progress):
            ids, positions, visible, valid = _block(model, ragged, role, n, shape)
            timing = measure(
                lambda: block_forward(model, ragged, ids, positions, visible, valid),
                model.device,
                config.warmup,
                config.repeats,
                setup=lambda: discard(ragged),
            )
            discard(ragged)
            store.add(
                _key(model_name, role, b, prefix, n, shape, env),
                [{**timing.row(), "tokens": ids.numel(), "measured": time.strftime("%Y-%m-%d %H:%M:%S")}],
            )


def batch_curve_table(store: Sweep) -> pd.DataFrame:
    out = store.frame()
    if not out.empty:
        out["median_ms"] = out["median_s"] * 1e3
    return out


def _block(model: torch.nn.Module, ragged: RaggedCache, role: str, n: int, shape: str):
    """(ids, positions, visible, valid) of one verify (root + n-node tree) or one draft level (n tokens)."""
    b = ragged.rows
    g = torch.Generator().manual_seed(n)
    if role == "target":
        tree = Tree.preset(shape, n) if n else Tree.chain(0)
        width = n + 1
        visible = rooted_ancestor_mask(tree.ancestors)[None].expand(b, width, width)
        depth = torch.tensor((0,) + tree.depths)  # host
    else:
        width = max(n, 1)
        visible = torch.eye(width, dtype=torch.bool)[None].expand(b, width, width)  # host: siblings of one level
        depth = torch.ones(width, dtype=torch.long)  # host
    ids = torch.randint(0, model.config.vocab_size, (b, width), generator=g)  # host: moved by block_forward
    positions = torch.tensor(ragged.lengths)[:, None] + depth[None]  # host
    return ids, positions, visible, torch.ones(b, width, dtype=torch.bool)  # host


def _key(model: str, role: str, batch: int, prefix: int, nodes: int, shape: str, env: dict) -> dict:
    return {
        "model": model,
        "role": role,
        "batch": batch,
        "prefix": prefix,
        "nodes": nodes,
        "shape": shape,
        **{k: env[k] for k in ("device", "dtype", "torch", "linear")},
    }
