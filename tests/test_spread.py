"""Bootstrap intervals across prompts (`analysis.spread`): the pooled ratio lies inside, no interval
below three prompts, identical prompts give a zero-width interval, and the stated 95% coverage
holds on simulated prompts with a known pooled ratio."""

from __future__ import annotations

import math

import numpy as np
import pytest

from specnb.analysis.spread import MIN_PROMPTS, interval_columns, ratio_interval


def test_interval_contains_the_pooled_ratio_and_is_reproducible():
    tokens, steps = [30, 22, 20, 27, 41], [10, 12, 8, 9, 14]
    low, high = ratio_interval(tokens, steps)
    assert low < sum(tokens) / sum(steps) < high
    assert (low, high) == ratio_interval(tokens, steps)  # seeded
    assert ratio_interval(tokens, steps, seed=1) != (low, high)
    cols = interval_columns("tau", tokens, steps)
    assert cols == {"tau_ci_low": low, "tau_ci_high": high}


def test_too_few_prompts_give_no_interval_and_equal_prompts_a_point():
    assert all(math.isnan(v) for v in ratio_interval([3] * (MIN_PROMPTS - 1), [1] * (MIN_PROMPTS - 1)))
    assert ratio_interval([6, 6, 6, 6], [2, 2, 2, 2]) == (3.0, 3.0)
    with pytest.raises(ValueError, match="one numerator"):
        ratio_interval([1, 2, 3], [1, 2])


def test_coverage_is_near_the_stated_level():
    """300 simulated runs of 40 prompts (steps ~ Poisson, tokens per step ~ 1 + Binomial) around a
    known pooled tau: the 95% interval covers it in 89-99% of runs (the percentile bootstrap
    undercovers slightly at this size; a broken interval covers ~0% or ~100%)."""
    rng = np.random.default_rng(7)
    p_accept, depth = 0.6, 4
    truth = 1 + depth * p_accept  # tokens per step in expectation
    covered = 0
    for run in range(300):
        steps = rng.poisson(12, size=40) + 1
        tokens = np.array([(1 + rng.binomial(depth, p_accept, size=n)).sum() for n in steps])
        low, high = ratio_interval(tokens, steps, resamples=500, seed=run)
        covered += low <= truth <= high
    assert 0.89 <= covered / 300 <= 0.99, covered


def test_speed_ratio_interval_is_paired_and_the_verdict_needs_it_to_exclude_one():
    """Two methods on the same prompts: prompt lengths differ a lot (times 1 s to 9 s), one method
    is 5% faster on every prompt. Paired resampling sees the 5% (the interval excludes 1: "faster");
    an unpaired view of such spread prompts could not. A 1% edge that flips on some prompts is
    "within the spread"; below three prompts there is no verdict."""
    from specnb.analysis.spread import speed_ratio_interval, verdict

    tokens = [24, 24, 24, 24, 24, 24]
    slow = [1.0, 9.0, 3.0, 5.0, 2.0, 7.0]
    fast = [t / 1.05 for t in slow]
    low, high = speed_ratio_interval(tokens, fast, tokens, slow)
    assert low == pytest.approx(1.05) and high == pytest.approx(1.05) and verdict(low, high) == "faster"
    assert verdict(*speed_ratio_interval(tokens, slow, tokens, fast)) == "slower"
    mixed = [t * f for t, f in zip(slow, [0.95, 1.04, 0.97, 1.02, 0.96, 1.03])]
    low, high = speed_ratio_interval(tokens, mixed, tokens, slow)
    assert low < 1 < high and verdict(low, high) == "within the spread"
    assert verdict(*speed_ratio_interval(tokens[:2], fast[:2], tokens[:2], slow[:2])) == "too few prompts"
    with pytest.raises(ValueError, match="one entry per prompt"):
        speed_ratio_interval([1, 2, 3], [1, 2, 3], [1, 2], [1, 2])


def test_a_paired_difference_sees_a_constant_edge_that_spread_prompts_hide():
    """Two trees on the same six prompts whose tau spans 1.5 to 4.5 (easy and hard prompts), one 0.1
    ahead on every prompt: the paired interval is that 0.1 exactly (each resample moves both alike),
    where the two unpaired intervals overlap almost wholly. Equal trees: 0, a tie."""
    from specnb.analysis.spread import paired_difference, tie

    steps = np.array([40.0, 30.0, 50.0, 25.0, 35.0, 45.0])
    tau = np.array([1.5, 4.5, 2.0, 3.0, 2.5, 3.5])
    diff, low, high = paired_difference((tau + 0.1) * steps, steps, tau * steps, steps)
    assert diff == pytest.approx(0.1) and low == pytest.approx(0.1) and high == pytest.approx(0.1)
    assert not tie(low, high)
    a, b = ratio_interval((tau + 0.1) * steps, steps), ratio_interval(tau * steps, steps)
    assert a[0] < b[1]  # unpaired, the two intervals overlap
    assert paired_difference(tau * steps, steps, tau * steps, steps) == (0.0, 0.0, 0.0)
    assert tie(0.0, 0.0) and tie(-0.1, 0.2) and tie(float("nan"), float("nan"))
    diff, low, high = paired_difference(tau[:2] * steps[:2], steps[:2], tau[:2] * steps[:2], steps[:2])
    assert diff == 0.0 and math.isnan(low) and math.isnan(high)  # below three prompts: no interval


def test_the_paired_interval_of_a_mean_difference_has_the_normal_width():
    """Per-prompt differences d ~ N(0.2, 0.5) on 400 prompts, one target call each: the pooled
    difference is the mean of d, and its 95% interval is about mean +- 1.96 sd / sqrt(400)."""
    from specnb.analysis.spread import paired_difference

    rng = np.random.default_rng(3)
    d = rng.normal(0.2, 0.5, size=400)
    ones = np.ones(400)
    diff, low, high = paired_difference(3.0 + d, ones, np.full(400, 3.0), ones)
    half = 1.96 * d.std(ddof=1) / np.sqrt(400)
    assert diff == pytest.approx(d.mean())
    assert low == pytest.approx(d.mean() - half, abs=0.2 * half) and high == pytest.approx(
        d.mean() + half, abs=0.2 * half
    )
