"""The unbiased Pass@k estimator (Chen et al. 2021) against exact combinatorics."""

from __future__ import annotations

import itertools
from math import comb

import pytest

from clawrl.harness.passk import mean_pass_at_k, pass_at_k


@pytest.mark.parametrize(("n", "c", "k"), [(5, 2, 1), (5, 2, 2), (10, 3, 4), (4, 0, 2), (4, 4, 1)])
def test_matches_closed_form(n, c, k):
    assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k))


def test_hand_computed_values():
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)  # 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert pass_at_k(3, 2, 2) == 1.0  # n - c < k: every k-subset holds a pass
    assert pass_at_k(4, 0, 4) == 0.0


def test_equals_the_subset_average():
    outcomes = [1, 0, 0, 1, 0, 1]
    k = 3
    subsets = list(itertools.combinations(outcomes, k))
    brute = sum(any(s) for s in subsets) / len(subsets)
    assert pass_at_k(len(outcomes), sum(outcomes), k) == pytest.approx(brute)


def test_mean_and_bounds():
    assert mean_pass_at_k([(4, 1), (4, 0)], 1) == pytest.approx(0.125)
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)
