"""Long generations under bounded caches (notebook 04): generated length x cache policy x method.

A unit is one generation: (prompt, window, method), where window is None for the full cache and
otherwise a `core.streaming.StreamingCache` of `sink` + `window` positions (slack = the deepest tree
of the methods, so trees are never cut short before the limit), and method is "autoregressive"
(the target alone: under a policy, the streaming model's own decoding, the reference its
speculative runs must equal) or a method spec (`drafters.methods`). The target's cache takes the
policy; a draft model's own cache takes it too when `draft_policy` is on. Stored resumably in a
`Sweep`, one row per step (tokens generated, KV bytes of target and draft after the step, times,
drafted and accepted), and a summary per unit with:

    tokens_per_s, tpot_s      wall clock
    kv_bytes, kv_peak_bytes   the caches' bytes at the end and their largest sum inside a step
    evictions                 times the target's cache was cut
    tau, acceptance_rate      tau = tokens per target call, bonus INCLUDED; accepted / drafted
    perplexity                of the output under the full-cache target (one forward, no cache)
    first_difference          first index where the output differs from the full-cache target's
                              greedy output (None: never, within the length)
    streaming_greedy          "exact" / "tie" / "mismatch" against the target alone under the same
                              policy (`analysis.quality`): what speculative decoding must preserve
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd
import torch
from tqdm.auto import tqdm

from ..analysis.metrics import step_row
from ..analysis.quality import compare_greedy, logit_gap, score
from ..core.generation import GenerationResult, autoregressive_generate, speculative_generate
from ..core.streaming import StreamingCache
from ..drafters.methods import build_drafter, parse_method
from ..io.models import prompt_ids
from ..io.prompts import Prompt
from ..io.storage import Sweep
from .sweeps import unit_row

TARGET_ALONE = "autoregressive"
UNIT_KEY = ("prompt_id", "window", "method")
FULL = 0  # the window of the full cache in tables (no policy)


def policies(windows: Sequence[int], sink: int, slack: int, positions: str) -> dict[int, StreamingCache | None]:
    """{window: policy}: 0 = the full cache (no policy), others StreamingLLM's sinks + window."""
    return {int(w): None if not w else StreamingCache(sink, int(w), slack, positions) for w in windows}


@dataclass(frozen=True)
class LongConfig:
    """What `run_long` generates, built where notebook 04 reads its parameters."""

    methods: tuple[str, ...]  # TARGET_ALONE and method specs (`drafters.methods`)
    windows: tuple[int, ...]  # cache windows; 0 (FULL) is the full cache, the others StreamingLLM's sinks + window
    sink: int  # attention sinks kept at the start of the cache
    positions: str  # "cache" (positions inside the cache, keys re-rotated) or "original" (`core.streaming`)
    max_new_tokens: int  # tokens generated per unit
    draft_policy: bool = True  # a draft model's own cache takes the same policy
    progress: bool = True  # a progress bar over the units
    stop_at_eos: bool = False  # False: every unit runs max_new_tokens whatever the model's EOS; True: it stops there

    def __post_init__(self) -> None:  # a notebook's lists, kept as tuples
        object.__setattr__(self, "methods", tuple(self.methods))
        object.__setattr__(self, "windows", tuple(self.windows))


def run_long(
    store: Sweep,
    target: torch.nn.Module,
    draft: torch.nn.Module | None,
    tokenizer,
    prompts: Sequence[Prompt],
    config: LongConfig,
) -> None:
    """Every (prompt, window, method) unit not yet in `store`; per prompt, the full cache's target
    alone first (the reference of first_difference), and per window the target alone before the
    methods (their streaming reference). config.stop_at_eos False: every generation runs its
    `max_new_tokens` whatever the model's EOS (a base model may emit it long before a window
    fills, and then nothing is evicted); True: each stops at EOS."""
    eos = None if config.stop_at_eos else ()  # None: the model's own EOS; (): none
    methods = config.methods
    trees = {m: parse_method(m) for m in methods if m != TARGET_ALONE}
    slack = max([t.tree.depth for t in trees.values()] + [1])
    by_window = policies([FULL] + [w for w in config.windows if w], config.sink, slack, config.positions)
    order = [TARGET_ALONE] + [m for m in methods if m != TARGET_ALONE]
    todo = [(p, w, m) for p in prompts for w in by_window for m in order]
    todo = [u for u in todo if {"prompt_id": u[0].id, "window": u[1], "method": u[2]} not in store]
    gap: list[float] = []  # the target's decode-vs-verify logit gap (`quality.logit_gap`), measured once
    for prompt, window, method in tqdm(todo, desc="long generations", disable=not config.progress):
        ids = prompt_ids(tokenizer, prompt.text)
        policy = by_window[window]
        if method == TARGET_ALONE:
            result = autoregressive_generate(
                target, ids, max_new_tokens=config.max_new_tokens, cache_policy=policy, eos_token_id=eos
            )
        else:
            spec = trees[method]
            drafter = build_drafter(spec, target, draft, cache_policy=policy if config.draft_policy else None)
            result = speculative_generate(
                target,
                drafter,
                ids,
                tree=spec.tree,
                max_new_tokens=config.max_new_tokens,
                cache_policy=policy,
                eos_token_id=eos,
            )
        full_reference = _tokens(store, prompt.id, FULL)
        streaming_reference = result.tokens.tolist() if method == TARGET_ALONE else _tokens(store, prompt.id, window)
        quality = score(target, ids, result.tokens)
        if not gap:
            gap.append(logit_gap(target, ids, result.tokens[:8].tolist() or [0]))
        store.add(
            {"prompt_id": prompt.id, "window": window, "method": method},
            [step_row(s) for s in result.steps],
            meta=_summary(result, prompt, policy, quality, full_reference, streaming_reference, target.dtype, gap[0]),
        )


def long_table(units: pd.DataFrame) -> pd.DataFrame:
    """window x method, pooled over prompts, with KV bytes against the full cache's."""
    out = (
        units.groupby(["window", "method"], sort=False)
        .agg(
            prompts=("prompt_id", "nunique"),
            tokens=("num_tokens", "sum"),
            steps=("num_steps", "sum"),
            drafted=("num_drafted", "sum"),
            accepted=("num_accepted", "sum"),
            time_s=("total_time", "sum"),
            tpot_s=("tpot_s", "mean"),
            kv_bytes=("kv_bytes", "mean"),
            kv_peak_bytes=("kv_peak_bytes", "mean"),
            evictions=("evictions", "mean"),
            perplexity=("perplexity", "mean"),
            first_difference=("first_difference", "min"),
            streaming_exact=("streaming_greedy", lambda v: int((v == "exact").sum())),
            streaming_ties=("streaming_greedy", lambda v: int((v == "tie").sum())),
        )
        .reset_index()
    )
    out["tau"] = out["tokens"] / out["steps"]
    out["acceptance_rate"] = out["accepted"] / out["drafted"].where(out["drafted"] > 0)
    out["tokens_per_s"] = out["tokens"] / out["time_s"]
    full = out[out["window"] == FULL].set_index("method")
    out["kv_over_full"] = out["kv_bytes"] / out["method"].map(full["kv_bytes"])
    out["speed_over_full"] = out["tokens_per_s"] / out["method"].map(full["tokens_per_s"])
    return out


def position_frame(steps: pd.DataFrame, every: int = 16) -> pd.DataFrame:
    """Steps binned by tokens generated (bins of `every`): KV MB after the step, seconds per token
    and tau in each bin, per (window, method); for the figures against position."""
    data = steps.assign(
        kv_mb=(steps["target_kv_bytes"] + steps["draft_kv_bytes"]) / 1e6,
        seconds=steps["draft_time"] + steps["verify_time"],
        bin=(steps["position"] // every) * every,
    )
    out = (
        data.groupby(["window", "method", "bin"], sort=False)
        .agg(
            kv_mb=("kv_mb", "max"),
            seconds=("seconds", "sum"),
            tokens=("num_tokens", "sum"),
            steps=("num_tokens", "size"),
        )
        .reset_index()
        .rename(columns={"bin": "position"})
    )
    out["tpot_s"] = out["seconds"] / out["tokens"]
    out["tau"] = out["tokens"] / out["steps"]
    return out


def _tokens(store: Sweep, prompt_id: str, window: int) -> list[int] | None:
    meta = store.meta({"prompt_id": prompt_id, "window": window, "method": TARGET_ALONE})
    return None if meta is None else [int(t) for t in str(meta["tokens"]).split()]


def _summary(
    result: GenerationResult,
    prompt: Prompt,
    policy: StreamingCache | None,
    quality,
    full_reference,
    streaming_reference,
    dtype: torch.dtype,
    gap: float = 0.0,
) -> dict:
    """A sweep's unit row (`sweeps.unit_row`, greedy against the full-cache target) and the policy's:
    its name, the KV bytes at the end and at the peak, the evictions, greedy against the streaming target."""
    streaming = compare_greedy(result.tokens.tolist(), streaming_reference, quality.margins, dtype, gap)
    return unit_row(result, prompt, full_reference, None, quality, dtype, gap) | {
        "policy": "full cache" if policy is None else policy.describe(),
        "kv_bytes": result.kv_bytes,
        "kv_peak_bytes": result.kv_peak_bytes,
        "evictions": result.evictions,
        "streaming_greedy": streaming.verdict,
    }
