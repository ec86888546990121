"""The demo's statistics: bootstrap intervals, paired differences, sessions to converge.

* :func:`bootstrap_ci`: the 95 % percentile bootstrap interval of a mean over held-out problems
  (the evaluation's own noise: how much the score would move with another draw of problems).
* :func:`paired_diff_ci`: the interval of ``mean(after - before)`` over the same problems (is a
  gain, or a guard getting worse, beyond that noise?).
* :func:`seed_ci`: mean and 95 % t-interval over seeds (run-to-run noise).
* :func:`sessions_to_converge`: OpenClaw-RL's "sessions to converge" (updated paper): the number
  of training sessions until a preference holds in 3 sessions in a row, scored by the rules.
  Here a preference is one rubric check (or all of them, "overall"), judged on each session's
  *first* answer, sessions in the order they started; the count is the session that completes
  the first streak of 3. ``None``: it never held 3 times in a row.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
         9: 2.262, 10: 2.228}  # fmt: skip
"""Two-sided 95 % Student-t quantiles by degrees of freedom (1.96 beyond 10)."""


def bootstrap_ci(
    values: Sequence[float], *, resamples: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """95 % percentile bootstrap interval of the mean of ``values`` (``(nan, nan)`` if empty)."""
    if not values:
        return math.nan, math.nan
    rng = random.Random(seed)
    n = len(values)
    means = sorted(sum(rng.choice(values) for _ in range(n)) / n for _ in range(resamples))
    return means[int(0.025 * resamples)], means[min(resamples - 1, int(0.975 * resamples))]


def paired_diff_ci(
    before: Sequence[float], after: Sequence[float], *, resamples: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """``(mean difference, low, high)`` of ``after - before`` over paired items (95 %).

    Raises:
        ValueError: the sequences differ in length.
    """
    if len(before) != len(after):
        raise ValueError(f"paired values differ in length: {len(before)} vs {len(after)}")
    diffs = [a - b for b, a in zip(before, after, strict=True)]
    if not diffs:
        return math.nan, math.nan, math.nan
    low, high = bootstrap_ci(diffs, resamples=resamples, seed=seed)
    return sum(diffs) / len(diffs), low, high


def seed_ci(values: Sequence[float]) -> tuple[float, float, float]:
    """``(mean, low, high)``: the mean over seeds and its 95 % t-interval (one seed: no width)."""
    n = len(values)
    if n == 0:
        return math.nan, math.nan, math.nan
    mean = sum(values) / n
    if n == 1:
        return mean, mean, mean
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = T_975.get(n - 1, 1.96) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def sessions_to_converge(passes: Sequence[bool], *, streak: int = 3) -> int | None:
    """The 1-based session that completes the first run of ``streak`` consecutive passes.

    Args:
        passes: per training session, in order, whether the preference held on its first answer.
        streak: how many sessions in a row (OpenClaw-RL: 3).
    """
    run = 0
    for i, ok in enumerate(passes, 1):
        run = run + 1 if ok else 0
        if run >= streak:
            return i
    return None
