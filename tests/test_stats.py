"""One statistics module: the demo's and harness mode's intervals over seeds are the same."""

import math

import pytest

from clawrl.harness.passk import across_runs
from clawrl.stats import seed_ci, t_975, t_interval

# Student's t 97.5 % quantiles from published tables (NIST/SEMATECH e-Handbook, 1.3.6.7.2)
_REFERENCE = {1: 12.706, 5: 2.571, 10: 2.228, 11: 2.201, 20: 2.086, 30: 2.042, 40: 2.021,
              60: 2.000, 100: 1.984}  # fmt: skip


def test_t_quantiles_match_published_values():
    for df, t in _REFERENCE.items():
        assert t_975(df) == pytest.approx(t, abs=3e-3), df


def test_t_quantile_known_values_and_bad_input():
    assert t_975(2) == 4.303
    assert t_975(15) == 2.131  # the demo's old table fell back to 1.96 past 10 df
    assert t_975(29) == 2.045
    with pytest.raises(ValueError):
        t_975(0)


@pytest.mark.parametrize("n", [2, 3, 5, 12, 20, 31, 40])
def test_demo_and_harness_give_one_interval_over_seeds(n):
    values = [0.1 * ((7 * i) % 11) for i in range(n)]
    assert seed_ci(values) == across_runs(values) == t_interval(values)
    mean, _, high = t_interval(values)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    assert high - mean == pytest.approx(t_975(n - 1) * sd / math.sqrt(n))


def test_one_seed():
    assert seed_ci([0.4]) == (0.4, 0.4, 0.4)
    mean, low, high = across_runs([0.4])
    assert mean == 0.4 and math.isnan(low) and math.isnan(high)
    with pytest.raises(ValueError):
        across_runs([])
