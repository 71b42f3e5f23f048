"""Spread across prompts: percentile-bootstrap 95% intervals for pooled ratios.

The tables pool each metric over prompts as a ratio of sums (tau = tokens / target calls,
acceptance rate = accepted / drafted; `analysis.metrics`). Prompts, not steps, are the unit that
varies between runs (steps of one prompt are not independent), so the interval resamples prompts
with replacement and recomputes the pooled ratio (Efron & Tibshirani 1993, percentile bootstrap).
With fewer than `MIN_PROMPTS` prompts there is no interval (NaN): a band from two prompts would
look like information and is not. The resampling is seeded, so a table is reproducible.

Comparisons of two methods on the same prompts resample prompts paired: a difference of pooled
ratios (`paired_difference`, e.g. two trees' tau: a tie where its interval holds 0) or a speed ratio
(`speed_ratio_interval`: both ran in the same process, interleaved), so the interval excludes what
the two share; `verdict` names a winner only where the interval excludes 1, in the words of a speed
comparison (`SPEED`) or the caller's (`heldout.PAYS`: a tree to deploy).
"""

from __future__ import annotations

from collections.abc import Sequence

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
    draws: int | None = None,
) -> tuple[float, float]:
    """(low, high): the percentile-bootstrap interval of sum(numerator) / sum(denominator), one
    entry per prompt, resampling prompts. (nan, nan) below MIN_PROMPTS prompts. draws: prompts per
    resample (default: as many as given); fewer gives the interval of a measurement on that many
    prompts drawn from these, wider than the interval of their mean."""
    num = np.asarray(numerator, dtype=float)  # [P]
    den = np.asarray(denominator, dtype=float)  # [P]
    if num.shape != den.shape or num.ndim != 1:
        raise ValueError(f"one numerator and one denominator per prompt, got shapes {num.shape} and {den.shape}")
    if len(num) < MIN_PROMPTS:
        return float("nan"), float("nan")
    picks = np.random.default_rng(seed).integers(0, len(num), size=(resamples, draws or len(num)))  # [B, draws]
    return _percentiles(_divide(num[picks].sum(1), den[picks].sum(1)), level)


def speed_ratio_interval(
    tokens_a: Sequence[float],
    seconds_a: Sequence[float],
    tokens_b: Sequence[float],
    seconds_b: Sequence[float],
    level: float = LEVEL,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> tuple[float, float]:
    """(low, high): the percentile-bootstrap interval of one method's pooled tokens/s over
    another's, (sum tokens_a / sum seconds_a) / (sum tokens_b / sum seconds_b), one entry of each
    per prompt, the same prompts: resampled together (paired), so what both share (a slow prompt)
    cancels. (nan, nan) below MIN_PROMPTS prompts."""
    arrays = [np.asarray(x, dtype=float) for x in (tokens_a, seconds_a, tokens_b, seconds_b)]  # [P] each
    if len({a.shape for a in arrays}) != 1 or arrays[0].ndim != 1:
        raise ValueError(f"one entry per prompt for each of the four, got shapes {[a.shape for a in arrays]}")
    if len(arrays[0]) < MIN_PROMPTS:
        return float("nan"), float("nan")
    picks = np.random.default_rng(seed).integers(0, len(arrays[0]), size=(resamples, len(arrays[0])))  # [B, P]
    ta, sa, tb, sb = (a[picks].sum(1) for a in arrays)
    return _percentiles(_divide(_divide(ta, sa), _divide(tb, sb)), level)


def paired_difference(
    numerator_a: Sequence[float],
    denominator_a: Sequence[float],
    numerator_b: Sequence[float],
    denominator_b: Sequence[float],
    level: float = LEVEL,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> tuple[float, float, float]:
    """(difference, low, high): sum(num_a) / sum(den_a) - sum(num_b) / sum(den_b), two methods
    measured on the same prompts (one entry of each per prompt, in the same order), with its
    percentile-bootstrap interval resampling prompts together (paired): what both share (a prompt
    every tree accepts much of) cancels, so the interval is of the difference, not of two spreads.
    An interval that holds 0 is a tie. (difference, nan, nan) below MIN_PROMPTS prompts."""
    arrays = [np.asarray(x, dtype=float) for x in (numerator_a, denominator_a, numerator_b, denominator_b)]  # [P]
    if len({a.shape for a in arrays}) != 1 or arrays[0].ndim != 1:
        raise ValueError(f"one entry per prompt for each of the four, got shapes {[a.shape for a in arrays]}")
    na, da, nb, db = arrays
    whole = _divide(np.array([na.sum(), nb.sum()]), np.array([da.sum(), db.sum()]))  # [2]: a's and b's pooled ratio
    whole = float(whole[0] - whole[1])
    if len(na) < MIN_PROMPTS:
        return whole, float("nan"), float("nan")
    picks = np.random.default_rng(seed).integers(0, len(na), size=(resamples, len(na)))  # [B, P]
    diffs = _divide(na[picks].sum(1), da[picks].sum(1)) - _divide(nb[picks].sum(1), db[picks].sum(1))
    low, high = _percentiles(diffs, level)
    return whole, low, high


def tie(low: float, high: float) -> bool:
    """A difference whose interval holds 0 (or that has none): the two cannot be told apart."""
    return not (low == low and high == high) or low <= 0.0 <= high


SPEED = ("faster", "slower", "within the spread", "too few prompts")  # above 1, below 1, holding 1, none


def verdict(low: float, high: float, words: tuple[str, str, str, str] = SPEED) -> str:
    """What an interval of a ratio says, in `words`: it lies above 1 ("faster"), below 1 ("slower"),
    holds 1 ("within the spread"), or there is none ("too few prompts")."""
    above, below, holds, none = words
    if not (low == low and high == high):
        return none
    return above if low > 1 else below if high < 1 else holds


def _divide(top: np.ndarray, bottom: np.ndarray) -> np.ndarray:
    return np.divide(top, bottom, out=np.full(top.shape, np.nan), where=bottom > 0)


def _percentiles(values: np.ndarray, level: float) -> tuple[float, float]:
    values = values[~np.isnan(values)]
    if not len(values):
        return float("nan"), float("nan")
    tail = (1.0 - level) / 2.0 * 100.0
    low, high = np.percentile(values, [tail, 100.0 - tail])
    return float(low), float(high)


def interval_columns(
    metric: str, numerator: Sequence[float], denominator: Sequence[float], **kwargs
) -> dict[str, float]:
    """{metric_ci_low, metric_ci_high}: `ratio_interval` as table columns."""
    low, high = ratio_interval(numerator, denominator, **kwargs)
    return {f"{metric}_ci_low": low, f"{metric}_ci_high": high}
