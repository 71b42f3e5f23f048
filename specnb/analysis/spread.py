"""Spread across prompts: percentile-bootstrap 95% intervals for pooled ratios.

The tables pool each metric over prompts as a ratio of sums (tau = tokens / target calls,
acceptance rate = accepted / drafted; `analysis.metrics`). Prompts, not steps, are the unit that
varies between runs (steps of one prompt are not independent), so the interval resamples prompts
with replacement and recomputes the pooled ratio (Efron & Tibshirani 1993, percentile bootstrap).
With fewer than `MIN_PROMPTS` prompts there is no interval (NaN): a band from two prompts would
look like information and is not. The resampling is seeded, so a table is reproducible.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

LEVEL = 0.95  # two-sided coverage
RESAMPLES = 2000  # bootstrap replicates
MIN_PROMPTS = 3  # fewer prompts: no interval
SEED = 0


def ratio_interval(
    numerator: Sequence[float],
    denominator: Sequence[float],
    level: float = LEVEL,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> tuple[float, float]:
    """(low, high): the percentile-bootstrap interval of sum(numerator) / sum(denominator), one
    entry per prompt, resampling prompts. (nan, nan) below MIN_PROMPTS prompts."""
    num = np.asarray(numerator, dtype=float)  # [P]
    den = np.asarray(denominator, dtype=float)  # [P]
    if num.shape != den.shape or num.ndim != 1:
        raise ValueError(f"one numerator and one denominator per prompt, got shapes {num.shape} and {den.shape}")
    if len(num) < MIN_PROMPTS:
        return float("nan"), float("nan")
    picks = np.random.default_rng(seed).integers(0, len(num), size=(resamples, len(num)))  # [B, P]
    top, bottom = num[picks].sum(1), den[picks].sum(1)
    ratios = np.divide(top, bottom, out=np.full(resamples, np.nan), where=bottom > 0)
    ratios = ratios[~np.isnan(ratios)]
    if not len(ratios):
        return float("nan"), float("nan")
    tail = (1.0 - level) / 2.0 * 100.0
    low, high = np.percentile(ratios, [tail, 100.0 - tail])
    return float(low), float(high)


def interval_columns(
    metric: str, numerator: Sequence[float], denominator: Sequence[float], **kwargs
) -> dict[str, float]:
    """{metric_ci_low, metric_ci_high}: `ratio_interval` as table columns."""
    low, high = ratio_interval(numerator, denominator, **kwargs)
    return {f"{metric}_ci_low": low, f"{metric}_ci_high": high}
