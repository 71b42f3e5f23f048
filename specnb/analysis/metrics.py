"""Metrics from generation results, each named for its convention (README.md, "Metric conventions").

- acceptance_rate   = accepted draft tokens / drafted tokens (the course brief, vLLM)
- acceptance_length = accepted draft tokens per verification step, bonus token EXCLUDED
                      (the course brief; gpt-fast's "mean accepted")
- tau               = tokens added per target call, bonus token INCLUDED (Spec-Bench "mean
                      accepted tokens", vLLM "mean acceptance length"); plain decoding = 1.00.
                      Equals 1 + acceptance_length except where EOS cut a step short.
- draft_tokens_per_accepted = tokens the draft model drafted, in its own vocabulary, per accepted
                      draft token (target tokens): the draft's cost per accepted token. With a
                      shared vocabulary it is 1 / acceptance_rate; across tokenizers the drafted
                      count is in draft tokens, the accepted one in target tokens (the verified tree)
- depth_acceptance[d-1] = steps that accepted at least d draft tokens / steps
- rank_acceptance[r]    = how often the rank-r child of an accepted node (or the root) is the one
                      accepted, among visits to nodes that have a rank-r child: Sequoia's
                      acceptance vector
- ttft_s = time to first token (prefill + first step), tpot_s = (total - ttft) / (tokens - 1),
  tokens_per_s = tokens / total wall time, peak_memory_bytes where the device reports it (CUDA).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass

import pandas as pd

from ..core.generation import GenerationResult, Step


@dataclass(frozen=True)
class Summary:
    num_runs: int
    num_steps: int
    num_tokens: int
    num_drafted: int  # nodes of the verified trees (target tokens)
    num_accepted: int
    num_draft_tokens: int  # tokens the drafter drafted in its own vocabulary (= num_drafted when shared)
    acceptance_rate: float  # accepted / drafted (nan when nothing was drafted)
    acceptance_length: float  # accepted draft tokens per step, bonus excluded
    tau: float  # tokens per target call, bonus included
    draft_tokens_per_accepted: float  # num_draft_tokens / num_accepted (nan when nothing was accepted)
    depth_acceptance: tuple[float, ...]
    rank_acceptance: tuple[float, ...]
    ttft_s: float  # mean over runs
    tpot_s: float  # mean over runs with more than one token
    tokens_per_s: float  # all tokens / all wall time
    draft_time_s: float  # total
    verify_time_s: float  # total
    peak_memory_bytes: int | None

    def row(self) -> dict:
        """A flat dict for a tidy table (tuples become columns depth_1.., rank_0..)."""
        out = {k: v for k, v in asdict(self).items() if k not in ("depth_acceptance", "rank_acceptance")}
        out.update({f"depth_{d + 1}_acceptance": v for d, v in enumerate(self.depth_acceptance)})
        out.update({f"rank_{r}_acceptance": v for r, v in enumerate(self.rank_acceptance)})
        return out


def summarize(results: GenerationResult | Iterable[GenerationResult]) -> Summary:
    """Pool one or several runs (e.g. one per prompt) into one summary."""
    runs = [results] if isinstance(results, GenerationResult) else list(results)
    if not runs:
        raise ValueError("summarize needs at least one GenerationResult")
    steps = [s for r in runs for s in r.steps]
    n_steps = len(steps)
    drafted = sum(s.num_drafted for s in steps)
    accepted = sum(s.num_accepted for s in steps)
    draft_tokens = sum(s.num_drafted if s.draft_tokens is None else s.draft_tokens for s in steps)
    tokens = sum(s.num_tokens for s in steps)
    max_depth = max((s.tree_depth for s in steps), default=0)
    depth = tuple(sum(s.num_accepted >= d for s in steps) / n_steps for d in range(1, max_depth + 1))
    ttfts = [_ttft(r) for r in runs if r.steps]
    tpots = [(r.total_time - _ttft(r)) / (len(r.tokens) - 1) for r in runs if len(r.tokens) > 1]
    peaks = [r.peak_memory_bytes for r in runs if r.peak_memory_bytes is not None]
    total_time = sum(r.total_time for r in runs)
    return Summary(
        num_runs=len(runs),
        num_steps=n_steps,
        num_tokens=tokens,
        num_drafted=drafted,
        num_accepted=accepted,
        num_draft_tokens=draft_tokens,
        acceptance_rate=accepted / drafted if drafted else float("nan"),
        acceptance_length=accepted / n_steps if n_steps else float("nan"),
        tau=tokens / n_steps if n_steps else float("nan"),
        draft_tokens_per_accepted=draft_tokens / accepted if accepted else float("nan"),
        depth_acceptance=depth,
        rank_acceptance=rank_acceptance(steps),
        ttft_s=sum(ttfts) / len(ttfts) if ttfts else float("nan"),
        tpot_s=sum(tpots) / len(tpots) if tpots else float("nan"),
        tokens_per_s=tokens / total_time if total_time > 0 else float("nan"),
        draft_time_s=sum(s.draft_time for s in steps),
        verify_time_s=sum(s.verify_time for s in steps),
        peak_memory_bytes=max(peaks) if peaks else None,
    )


def rank_acceptance(steps: Iterable) -> tuple[float, ...]:
    """Sequoia's acceptance vector: P(the rank-r child is accepted | its parent was accepted and
    has a rank-r child), pooled over every visited node of every step."""
    hits: dict[int, int] = {}
    visits: dict[int, int] = {}
    for s in steps:
        for depth, count in enumerate(s.child_counts):
            for r in range(count):
                visits[r] = visits.get(r, 0) + 1
            if depth < len(s.accepted_ranks):
                r = s.accepted_ranks[depth]
                hits[r] = hits.get(r, 0) + 1
    return tuple(hits.get(r, 0) / visits[r] for r in range(max(visits, default=-1) + 1))


def steps_table(results: Mapping[str, GenerationResult] | Iterable[GenerationResult]) -> pd.DataFrame:
    """Tidy table, one row per step; `run` labels the result (its key, or its index)."""
    items = results.items() if isinstance(results, Mapping) else enumerate(results)
    rows = [{"run": label, "method": r.method, **step_row(s)} for label, r in items for s in r.steps]
    return pd.DataFrame(rows)


def step_row(step: Step) -> dict:
    """One step as a flat row; rank paths and child counts as "0/1/0" strings."""
    row = asdict(step)
    row["accepted_ranks"] = "/".join(map(str, step.accepted_ranks))
    row["child_counts"] = "/".join(map(str, step.child_counts))
    return row


def summary_table(groups: Mapping[str, GenerationResult | Iterable[GenerationResult]]) -> pd.DataFrame:
    """One row per group (e.g. per tree shape), pooled with `summarize`."""
    return pd.DataFrame([{"group": k, **summarize(v).row()} for k, v in groups.items()])


def _ttft(r: GenerationResult) -> float:
    first = r.steps[0]
    return r.prefill_time + first.draft_time + first.verify_time
