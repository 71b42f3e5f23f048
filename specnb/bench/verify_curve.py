"""What verification costs a real model: one `verify` of n tree nodes on a real cache, against n.

    prefilled_cache        a cache of a given length (random tokens: timing does not depend on them)
    point_calls, timed     the calls of one point (a verification of root + tree, a plain forward of
                           as many tokens) and their round-robin timing on one cache
    verify_and_forward     both for one point
    StepPoints             the points one tree's step needs, timed a round at a time between runs
    verify_curve           both against the number of nodes (the target), or a plain forward per
                           level width (the draft), stored resumably; `curve_table` reads it back
    curve_shape            where the verify curve steps and where it slopes, from its measured points

`analysis.cost_model` turns the curves into expected tokens/s per tree.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from ..core.cache import crop, new_cache
from ..core.trees import Tree
from ..core.verification import prefill, verify
from ..io.storage import Sweep
from ..kernels.cpu_linear import linear_path
from .timing import Timing, environment_row, measure_interleaved

# the machine is part of the key, so one store can hold (and share between notebooks) curves of several
CURVE_KEY = ("model", "role", "kind", "prefix", "nodes", "shape", "device", "dtype", "torch", "linear")
KINDS = {"target": ("verify", "plain"), "draft": ("plain",)}  # what each role measures


@torch.inference_mode()
def prefilled_cache(model: torch.nn.Module, prefix_len: int, seed: int = 0):
    """A cache holding `prefix_len` random tokens of `model` (timing does not depend on content)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (1, prefix_len), generator=g).to(model.device)
    cache = new_cache(model)
    prefill(model, cache, ids)
    return cache


def point_calls(
    model: torch.nn.Module, cache, tree: Tree | None, tokens: int | None = None, seed: int = 0
) -> dict[str, Callable[[], Any]]:
    """The calls one curve point times on `cache`: "verify": one `verification.verify` of root +
    `tree` (if a tree is given); "plain": one plain forward of `tokens` new tokens with the model's
    own causal mask (default: as many tokens as verify feeds, root + nodes). Each leaves its tokens
    in the cache: `timed` crops it back before every call."""
    g = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    fns: dict[str, Callable[[], Any]] = {}
    if tree is not None:
        draft = torch.randint(0, vocab, (tree.num_nodes,), generator=g)  # host: verify moves it
        root = int(torch.randint(0, vocab, (1,), generator=g))  # host: a Python int
        fns["verify"] = lambda: verify(model, cache, root, tree, draft)
    n_plain = tokens if tokens is not None else (tree.num_nodes + 1 if tree is not None else 1)
    ids = torch.randint(0, vocab, (1, n_plain), generator=g).to(model.device)

    @torch.inference_mode()
    def plain() -> None:
        model(input_ids=ids, cache=cache, use_cache=True)

    fns["plain"] = plain
    return fns


def timed(model: torch.nn.Module, cache, fns: dict, warmup: int = 1, repeats: int = 3) -> dict:
    """`fns` (calls on `cache`, any keys) timed round-robin (`timing.measure_interleaved`), the cache
    cropped back to its length before every call and at the end."""
    prefix_len = cache.get_seq_length()
    reset = lambda: crop(cache, prefix_len)  # noqa: E731
    out = measure_interleaved(fns, model.device, warmup, repeats, setups={name: reset for name in fns})
    reset()
    return out


def verify_and_forward(
    model: torch.nn.Module,
    cache,
    tree: Tree | None,
    tokens: int | None = None,
    warmup: int = 1,
    repeats: int = 3,
    seed: int = 0,
) -> dict[str, Timing]:
    """One point's calls (`point_calls`: "verify" of root + `tree`, "plain" forward) timed
    round-robin on `cache` (cropped back to its length before every run)."""
    return timed(model, cache, point_calls(model, cache, tree, tokens, seed), warmup, repeats)


@dataclass(frozen=True)
class CurveConfig:
    """How a cost curve is measured (`verify_curve`, `bench.batch_curve.batch_curve`)."""

    shape: str = "sparse"  # the `Tree.preset` of every n-node tree verified
    warmup: int = 1  # untimed calls per point
    repeats: int = 3  # timed calls per point
    progress: bool = True  # a progress bar over the points


def verify_curve(
    store: Sweep,
    model: torch.nn.Module,
    model_name: str,
    prefix_len: int,
    nodes: Sequence[int],
    role: str = "target",
    config: CurveConfig | None = None,
) -> None:
    """For each n in `nodes` not yet in `store` (key `CURVE_KEY`), on a cache of `prefix_len`
    tokens: role "target": one verification of an n-node tree (kind "verify"; n = 0 is the root
    alone, one decoding step) and, interleaved with it, one plain forward of the same n + 1 tokens
    (kind "plain"); role "draft": one plain forward of n tokens, the draft's cost per tree level
    of width n. The trees are `config.shape`'s (default: `CurveConfig()`). Every missing point is
    timed in the same rounds (each round calls every point once, in a shuffled order), so that a
    change of the machine's speed during the curve moves all points alike, not its shape; the
    points are stored when the rounds are done."""
    config = config or CurveConfig()
    shape, warmup, repeats = config.shape, config.warmup, config.repeats
    env = {**environment_row(model.device, model.dtype), "linear": linear_path(model)}
    kinds = KINDS[role]
    key = lambda kind, n: curve_key(model_name, role, kind, prefix_len, n, shape, env)  # noqa: E731
    todo = missing_points(store, model_name, role, prefix_len, nodes, shape, env)
    if not todo:
        return
    cache = prefilled_cache(model, prefix_len)
    fns = {}
    for n in todo:  # every point in one round-robin: a drift of the machine lands on all of them alike
        tree = Tree.preset(shape, n)
        calls = point_calls(model, cache, None, max(n, 1)) if role == "draft" else point_calls(model, cache, tree)
        fns.update({(kind, n): calls[kind] for kind in kinds})
    desc = f"{model_name} {role}: {len(todo)} points x {warmup + repeats} rounds"
    with tqdm(total=1, desc=desc, disable=not config.progress) as bar:
        timings = timed(model, cache, fns, warmup, repeats)
        bar.update()
    for n in todo:
        tree = Tree.preset(shape, n)
        tokens = max(n, 1) if role == "draft" else n + 1
        for kind in kinds:
            store.add(
                key(kind, n),
                [
                    {
                        **timings[(kind, n)].row(),
                        "tokens": tokens,
                        "depth": tree.depth,
                        "leaves": len(tree.leaves),
                        "measured": time.strftime("%Y-%m-%d %H:%M:%S"),
                    }
                ],
            )


def curve_key(model: str, role: str, kind: str, prefix: int, nodes: int, shape: str, env: dict) -> dict:
    """The store key of one curve point (`CURVE_KEY`); env: `timing.environment_row` of the model
    and its "linear" path (`kernels.cpu_linear.linear_path`)."""
    return {
        "model": model,
        "role": role,
        "kind": kind,
        "prefix": prefix,
        "nodes": nodes,
        "shape": shape,
        **{k: env[k] for k in ("device", "dtype", "torch", "linear")},
    }


def missing_points(
    store: Sweep,
    model_name: str,
    role: str,
    prefix_len: int,
    nodes: Sequence[int],
    shape: str = "sparse",
    env: dict | None = None,
) -> list[int]:
    """The n of `nodes` whose points `verify_curve` would still measure on this machine (env)."""
    return [
        n
        for n in nodes
        if any(curve_key(model_name, role, k, prefix_len, n, shape, env) not in store for k in KINDS[role])
    ]


def curve_table(
    store: Sweep,
    models: Sequence[str] | None = None,
    prefix: int | None = None,
    device: str | None = None,
    linear: str | None = None,
) -> pd.DataFrame:
    """The stored rows (milliseconds added), optionally only these models, prefix, device and linear
    path (rows with no recorded path match no path)."""
    out = store.frame()
    if not out.empty and linear is not None:
        out = out[out["linear"] == linear] if "linear" in out else out.iloc[0:0]
    if not out.empty and models is not None:
        out = out[out["model"].isin(list(models))]
    if not out.empty and prefix is not None:
        out = out[out["prefix"] == prefix]
    if not out.empty and device is not None:
        out = out[out["device"] == device]
    if not out.empty:
        out["median_ms"] = out["median_s"] * 1e3
    return out


def curve_shape(curve: pd.DataFrame, model: str | None = None, kind: str = "verify") -> dict[str, float]:
    """The shape of a target's verify curve, computed from its measured points (`curve_table` rows
    of role "target"): decode_ms (one token: the root alone), then, from 1 token to the first
    measured tree (first_tokens), step_ms (the jump) and step_per_token_ms (the jump per added
    token); beyond it, slope_ms (least squares, ms per further token, NaN with fewer than 2 points)
    and its span (first_tokens..last_tokens), with last_ms. step_share: the part of the cost of the
    largest tree above one decode that the first jump accounts for (near 1: a step between one row
    and a few, then flat; near first/last tokens: linear throughout)."""
    rows = curve[(curve["role"] == "target") & (curve["kind"] == kind)]
    if model is not None:
        rows = rows[rows["model"] == model]
    if rows["model"].nunique() > 1:
        raise ValueError(f"the curve holds several targets {sorted(rows['model'].unique())}: name one (model=...)")
    points = rows.groupby("tokens")["median_ms"].median().sort_index()
    if 1 not in points.index or len(points) < 2:
        raise ValueError("the curve needs the 1-token point (nodes 0) and at least one tree")
    decode, rest = float(points.loc[1]), points[points.index > 1]
    first_tokens, first_ms = int(rest.index[0]), float(rest.iloc[0])
    last_tokens, last_ms = int(rest.index[-1]), float(rest.iloc[-1])
    slope = float(np.polyfit(rest.index.to_numpy(float), rest.to_numpy(float), 1)[0]) if len(rest) > 1 else float("nan")
    return {
        "decode_ms": decode,
        "first_tokens": first_tokens,
        "first_ms": first_ms,
        "step_ms": first_ms - decode,
        "step_per_token_ms": (first_ms - decode) / (first_tokens - 1),
        "slope_ms": slope,
        "last_tokens": last_tokens,
        "last_ms": last_ms,
        "step_share": (first_ms - decode) / (last_ms - decode) if last_ms != decode else float("nan"),
    }


class StepPoints:
    """The points of the cost model one tree's step needs, timed a round at a time between other work
    (`experiments.sweeps.measure_choice` times one round before each prompt it runs and stores it with
    the prompt's runs): the target's verification of the tree and of the root alone (nodes 0, one
    decode), and the draft's plain forward at each width the tree feeds (`Tree.draft_widths`), each on
    a cache of `prefix` tokens. `table(rounds)` gives rounds as `curve_table` rows (median and
    quartiles over them), so a prediction can be priced on the machine as it was while a measurement ran."""

    def __init__(
        self, target: torch.nn.Module, draft: torch.nn.Module, tree: Tree, prefix: int, names: tuple[str, str]
    ) -> None:
        self.models, self.names, self.prefix, self.tree = (target, draft), names, prefix, tree
        # prefilled, and the calls made, on the first round: a resumed run may need none
        self.caches: tuple | None = None
        self.calls: tuple[dict, dict] = ({}, {})

    def round(self) -> list[dict[str, Any]]:
        """One timed call of every point (round-robin within each model): rows of role, kind, nodes, seconds."""
        if self.caches is None:
            (target, draft), tree = self.models, self.tree
            self.caches = tuple(prefilled_cache(m, self.prefix) for m in self.models)
            self.calls = (
                {
                    ("verify", 0): point_calls(target, self.caches[0], Tree.preset("sparse", 0))["verify"],
                    ("verify", tree.num_nodes): point_calls(target, self.caches[0], tree)["verify"],
                },
                {
                    ("plain", w): point_calls(draft, self.caches[1], None, w)["plain"]
                    for w in sorted(set(tree.draft_widths))
                },
            )
        rows = []
        for role, model, cache, fns in zip(("target", "draft"), self.models, self.caches, self.calls):
            for (kind, n), timing in timed(model, cache, fns, warmup=0, repeats=1).items():
                rows.append({"role": role, "kind": kind, "nodes": n, "seconds": timing.median_s})
        return rows

    def table(self, rounds: Iterable[dict[str, Any]]) -> pd.DataFrame:
        """Rows of rounds (`round`'s) as `curve_table` rows: model, role, kind, nodes, tokens, prefix and
        the timing columns over the rounds (`timing.Timing`)."""
        rows = pd.DataFrame(list(rounds))
        if rows.empty:
            return pd.DataFrame()
        out = []
        for (role, kind, n), times in rows.groupby(["role", "kind", "nodes"])["seconds"]:
            out.append(
                {
                    "model": self.names[role == "draft"],
                    "role": role,
                    "kind": kind,
                    "prefix": self.prefix,
                    "nodes": int(n),
                    "tokens": int(n) + 1 if role == "target" else int(n),
                    **Timing.of(times.tolist()).row(),
                }
            )
        out = pd.DataFrame(out)
        out["median_ms"] = out["median_s"] * 1e3
        return out
