"""clawrl's statistics, one module for every report (the demo's tables, harness evaluation, the
dashboard): bootstrap intervals, paired differences, Student-t intervals over seeds, sessions to
converge. Pure Python, no torch.

* :func:`bootstrap_ci`: the 95 % percentile bootstrap interval of a mean over held-out problems
  (the evaluation's own noise: how much the score would move with another draw of problems).
* :func:`paired_diff_ci`: the interval of ``mean(after - before)`` over the same problems (is a
  gain, or a guard getting worse, beyond that noise?).
* :func:`t_interval` / :func:`seed_ci`: mean and 95 % Student-t interval over seeds (run-to-run
  noise), :func:`t_975` the quantile.
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

RESAMPLES = 2000
"""Bootstrap resamples behind every percentile interval."""

_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
         2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
         2.060, 2.056, 2.052, 2.048, 2.045, 2.042)  # fmt: skip
"""Student's t 97.5 % quantile for 1..30 degrees of freedom."""


def t_975(df: int) -> float:
    """Student's t 97.5 % quantile (two-sided 95 %) for ``df`` degrees of freedom: the table for
    1..30, past 30 ``1.96 + 2.4 / df`` (within 0.003 of the exact value).

    Raises:
        ValueError: ``df < 1``.
    """
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    return _T975[df - 1] if df <= len(_T975) else 1.96 + 2.4 / df


def percentile_interval(sorted_means: Sequence[float]) -> tuple[float, float]:
    """The 2.5 % and 97.5 % percentiles of sorted bootstrap means (``(nan, nan)`` if empty)."""
    if not sorted_means:
        return math.nan, math.nan
    n = len(sorted_means)
    return sorted_means[int(0.025 * n)], sorted_means[min(n - 1, int(0.975 * n))]


def bootstrap_ci(
    values: Sequence[float], *, resamples: int = RESAMPLES, seed: int = 0
) -> tuple[float, float]:
    """95 % percentile bootstrap interval of the mean of ``values`` (``(nan, nan)`` if empty)."""
    if not values:
        return math.nan, math.nan
    rng = random.Random(seed)
    n = len(values)
    return percentile_interval(
        sorted(sum(rng.choice(values) for _ in range(n)) / n for _ in range(resamples))
    )


def paired_diff_ci(
    before: Sequence[float], after: Sequence[float], *, resamples: int = RESAMPLES, seed: int = 0
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


def t_interval(values: Sequence[float]) -> tuple[float, float, float]:
    """``(mean, low, high)``: the mean of independent runs (training seeds) and its 95 % Student-t
    interval, ``mean +- t_975(n - 1) * sd / sqrt(n)`` (:func:`t_975`); ``nan`` bounds for one
    value, all ``nan`` for none."""
    n = len(values)
    if n == 0:
        return math.nan, math.nan, math.nan
    mean = sum(values) / n
    if n == 1:
        return mean, math.nan, math.nan
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = t_975(n - 1) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def seed_ci(values: Sequence[float]) -> tuple[float, float, float]:
    """:func:`t_interval` over seeds, except that one seed gives a zero-width interval at its
    value (the demo's tables print it as such, marked one seed)."""
    mean, low, high = t_interval(values)
    if len(values) == 1:
        return mean, mean, mean
    return mean, low, high


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
