"""Chi-square goodness of fit for the lossless-sampling tests."""

from __future__ import annotations

from collections import Counter

import numpy as np
from scipy import stats

ALPHA = 1e-3  # a correct rule fails with probability 0.1% per test (seeds are fixed, so never flaky)


def chi_square_pvalue(samples: list, expected: dict) -> float:
    """p-value of `samples` against the exact distribution `expected` (cell -> probability).

    Cells with expected count < 5 are pooled into one, as the chi-square approximation needs.
    """
    n = len(samples)
    counts = Counter(samples)
    assert set(counts) <= {c for c, pr in expected.items() if pr > 0}, "sampled an impossible cell"
    big = [c for c, pr in expected.items() if pr * n >= 5]
    small = [c for c, pr in expected.items() if pr * n < 5]
    observed = [counts.get(c, 0) for c in big]
    wanted = [expected[c] * n for c in big]
    if small:
        observed.append(sum(counts.get(c, 0) for c in small))
        wanted.append(sum(expected[c] for c in small) * n)
    wanted = np.array(wanted) * (n / sum(wanted))  # exact probabilities sum to 1 up to rounding
    return float(stats.chisquare(observed, wanted).pvalue)
