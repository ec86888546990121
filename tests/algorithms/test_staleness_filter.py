"""Staleness filter: drop samples whose policy version lags by more than K."""

from __future__ import annotations

import pytest

from clawrl.algorithms import drop_stale


def test_drops_samples_lagging_by_more_than_k_and_reports_them() -> None:
    result = drop_stale([10, 6, 5, 9, 2], trainer_version=10)  # lags 0, 4, 5, 1, 8; K = 4
    assert result.kept == (0, 1, 3)
    assert result.dropped == (2, 4)
    assert result.num_dropped == 2
    assert result.metrics == {"stale/dropped": 2.0, "stale/kept": 3.0, "stale/max_lag": 8.0}


def test_custom_k_and_edge_cases() -> None:
    assert drop_stale([3, 2, 3], trainer_version=3, max_lag=0).kept == (0, 2)
    assert drop_stale([1, 1], trainer_version=2, max_lag=1).num_dropped == 0
    empty = drop_stale([], trainer_version=7)
    assert empty.kept == () and empty.num_dropped == 0 and empty.metrics["stale/max_lag"] == 0.0


def test_rejects_future_versions_and_negative_k() -> None:
    with pytest.raises(ValueError, match="newer"):
        drop_stale([4, 6], trainer_version=5)
    with pytest.raises(ValueError, match="max_lag"):
        drop_stale([1], trainer_version=1, max_lag=-1)
