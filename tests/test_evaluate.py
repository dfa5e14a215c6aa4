"""Avg@K and the unbiased Pass@K estimator."""

import itertools
from math import comb

import pytest

from entropy_rft.evaluate import avg_at_k, filter_by_pass_rate, pass_at_k, pass_rate_histogram


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_pass_at_k_equals_enumeration(n):
    """Pass@k equals the fraction of all k-subsets of the n samples that contain a correct one."""
    for c in range(n + 1):
        samples = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            subsets = list(itertools.combinations(samples, k))
            brute = sum(any(s) for s in subsets) / len(subsets)
            assert pass_at_k(n, c, k) == pytest.approx(brute, abs=1e-12)
            assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k), abs=1e-12)


def test_pass_at_k_rejects_bad_counts():
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 2)
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)


def test_avg_at_k_and_histogram():
    correct = [[True, False, False, False], [True] * 4, [False] * 4]
    assert avg_at_k(correct) == pytest.approx((0.25 + 1 + 0) / 3)
    assert pass_rate_histogram([0.0, 0.25, 1.0, 0.5, 0.99], bins=4) == [1, 0, 1, 1, 1, 1]


def test_filter_by_pass_rate_paper_bounds():
    """The paper drops problems solved in >= 15/16 or <= 1/16 of 16 samples."""
    rates = [0 / 16, 1 / 16, 2 / 16, 14 / 16, 15 / 16, 1.0]
    kept = filter_by_pass_rate(list(range(6)), rates)
    assert [p for p, _ in kept] == [2, 3]
