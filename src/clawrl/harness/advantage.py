"""Credit for harness rollouts: one advantage per rollout, carried by all its trainable turns.

The rule (DeepSeekMath GRPO, Shao et al. 2024, arXiv:2402.03300, §4.1.2, at rollout level):

* a group is the rollouts of one task by one harness in one step; only rollouts whose verifier
  gave a reward count (verifier and harness errors are dropped with their reason);
* ``A_i = (r_i - mean_g r) / (std_g r + eps)`` with the Bessel-corrected std (``grpo``), or
  ``A_i = r_i - mean_g r`` (``ppo``: a group-mean baseline, no std, as Dr. GRPO, Liu et al.
  2025, arXiv:2503.20783); ``r`` is the verifier's reward in [0, 1];
* a group with fewer than two rewarded rollouts, or whose rewards are all equal, carries no
  signal: it is skipped and counted (``group/skipped_zero_variance``, ``group/skipped_too_small``);
* every trainable turn of rollout ``i`` carries ``A_i`` on each of its sampled tokens; a prefix
  shared by several calls of the rollout (retries, subagents, compaction branches) is trained
  once, in the row :func:`clawrl.trajectory.training_rows` assigns it (every sampled token has
  loss mask 1 in exactly one row), so branches carry the rollout's advantage too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class GroupAdvantages:
    """Advantages of the trained groups and counts of the skipped ones.

    Attributes:
        advantages: rollout id -> A_i, for rollouts in groups with signal.
        skipped_zero_variance: groups whose rewards were all equal.
        skipped_too_small: groups with fewer than two rewarded rollouts.
        group_means: group key -> mean reward (every group with a reward).
    """

    advantages: dict[str, float] = field(default_factory=dict)
    skipped_zero_variance: int = 0
    skipped_too_small: int = 0
    group_means: dict[str, float] = field(default_factory=dict)


def normalized(rewards: Sequence[float], *, normalize_std: bool, eps: float = 1e-4) -> list[float]:
    """``(r - mean) / (std + eps)`` (Bessel std) or ``r - mean``; all zeros when std is 0."""
    n = len(rewards)
    if n == 0:
        return []
    mean = sum(rewards) / n
    centered = [r - mean for r in rewards]
    std = math.sqrt(sum(c * c for c in centered) / max(1, n - 1))
    if std == 0:
        return [0.0] * n
    return [c / (std + eps) for c in centered] if normalize_std else centered


def group_advantages(
    rewards: Sequence[tuple[str, str, float]], *, normalize_std: bool = True, eps: float = 1e-4
) -> GroupAdvantages:
    """Group ``(rollout_id, group_key, reward)`` triples and compute each rollout's advantage.

    Args:
        rewards: one triple per rewarded rollout.
        normalize_std: ``grpo`` (True) or ``ppo``-style centring only (False).
        eps: added to the std.
    """
    groups: dict[str, list[tuple[str, float]]] = {}
    for rollout_id, key, reward in rewards:
        groups.setdefault(key, []).append((rollout_id, reward))
    out = GroupAdvantages()
    zero = small = 0
    for key, members in groups.items():
        values = [r for _, r in members]
        out.group_means[key] = sum(values) / len(values)
        if len(members) < 2:
            small += 1
            continue
        if max(values) == min(values):
            zero += 1
            continue
        for (rid, _), a in zip(
            members, normalized(values, normalize_std=normalize_std, eps=eps), strict=True
        ):
            out.advantages[rid] = a
    return GroupAdvantages(out.advantages, zero, small, out.group_means)
