"""core/sampling.py: `top_tokens`' order (value descending, ties by the lower index) against a
reference sort, on rows built to hit its fast path and its fallback (ties at the k-th score,
-0.0 beside 0.0, NaN, k past the row's end)."""

import math

import pytest
import torch

from specnb.core.sampling import top_tokens


def reference(row: list[float], k: int) -> list[int]:
    """Python's sort: float value descending (NaN above everything, -0.0 below 0.0, as their bits
    order), then the lower index."""

    def key(i: int) -> tuple:
        v = row[i]
        if math.isnan(v):
            return (0, 0.0, i)
        return (1, -v, 0 if math.copysign(1.0, v) > 0 else 1, i)

    return sorted(range(len(row)), key=key)[:k]


@pytest.mark.parametrize("k", [1, 3, 10, 40])
def test_top_tokens_orders_as_the_reference_sort(k):
    g = torch.Generator().manual_seed(k)
    rows = [
        torch.randn(40, generator=g),  # no ties: the fast path
        torch.randint(0, 4, (40,), generator=g).float(),  # many ties, at the k-th score too
        torch.tensor([0.0, -0.0] * 20),  # -0.0 and 0.0 compare equal as floats, not as keys
        torch.tensor([1.0, float("nan")] + [0.5] * 38),
        torch.full((40,), 2.0),
    ]  # every score tied
    scores = torch.stack(rows)
    got = top_tokens(scores, k)
    assert got.shape == (len(rows), min(k, 40))
    for row, g_row in zip(rows, got):
        assert g_row.tolist() == reference(row.tolist(), k), row


def test_top_tokens_takes_batched_shapes_and_half_precision():
    x = torch.randn(2, 3, 50).half()  # half has many ties among 50 values
    got = top_tokens(x, 5)
    assert got.shape == (2, 3, 5)
    for i in range(2):
        for j in range(3):
            assert got[i, j].tolist() == reference(x[i, j].float().tolist(), 5)
    assert top_tokens(x, 0).shape == (2, 3, 0)
    assert top_tokens(torch.zeros(0, 7), 3).shape == (0, 3)
