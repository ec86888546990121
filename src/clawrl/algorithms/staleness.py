"""Off-policy staleness filter for asynchronous training."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class StalenessResult:
    """Which samples to keep, which were dropped, and metrics (``stale/*``)."""

    kept: tuple[int, ...]
    """Indices (into the input) of samples to train on, in input order."""
    dropped: tuple[int, ...]
    """Indices of samples dropped as too stale, in input order."""
    metrics: dict[str, float]
    """``stale/dropped``, ``stale/kept``, ``stale/max_lag`` (over all inputs; 0 when empty)."""

    @property
    def num_dropped(self) -> int:
        """How many samples were dropped."""
        return len(self.dropped)


def drop_stale(
    policy_versions: Sequence[int], trainer_version: int, *, max_lag: int = 4
) -> StalenessResult:
    """Keep samples whose policy version lags the trainer's by at most ``max_lag``.

    ``keep_i  ⇔  trainer_version - policy_versions[i] <= K`` (K = ``max_lag``, default 4). Bounded
    staleness as in asynchronous RL systems (e.g. AReaL, Fu et al. 2025, arXiv:2505.24298; slime
    and prime-rl's ``max_off_policy_steps``). Dropping is reported, never silent.

    Args:
        policy_versions: version of the policy that sampled each sample (``[B]`` ints).
        trainer_version: the trainer's current policy version.
        max_lag: K >= 0; 0 keeps only samples of the current version.

    Raises:
        ValueError: ``max_lag < 0`` or a sample claims a version newer than the trainer's.
    """
    if max_lag < 0:
        raise ValueError(f"max_lag must be >= 0, got {max_lag}")
    lags = [trainer_version - int(version) for version in policy_versions]
    if any(lag < 0 for lag in lags):
        raise ValueError(
            f"policy version newer than the trainer's ({trainer_version}): {list(policy_versions)}"
        )
    kept = tuple(i for i, lag in enumerate(lags) if lag <= max_lag)
    dropped = tuple(i for i, lag in enumerate(lags) if lag > max_lag)
    metrics = {
        "stale/dropped": float(len(dropped)),
        "stale/kept": float(len(kept)),
        "stale/max_lag": float(max(lags, default=0)),
    }
    return StalenessResult(kept=kept, dropped=dropped, metrics=metrics)
