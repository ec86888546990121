"""Harness evaluation statistics: per-task pass counts, Pass@1 with a bootstrap interval over
tasks, per-family Pass@1, and the paired gain of one evaluation over another.

The unit of resampling is the task, not the rollout: the k rollouts of one task are correlated
(same instruction, same files), so the interval says how much Pass@1 would move with another draw
of tasks like these. A task's Pass@1 is ``c / n`` (the unbiased estimator of Chen et al. 2021 at
k = 1); the mean over tasks is the reported Pass@1.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from clawrl.demo.stats import bootstrap_ci, paired_diff_ci
from clawrl.store import RolloutResult

_VARIANT = re.compile(r"^(.*?)-\d+$")


def task_family(task_id: str) -> str:
    """The family of a task id: the id without a trailing ``-N`` (``copy-file-3`` ->
    ``copy-file``); an id without one is its own family."""
    match = _VARIANT.match(task_id)
    return match.group(1) if match else task_id


@dataclass(frozen=True)
class TaskCount:
    """One task's rollouts in an evaluation: ``n`` with a reward, ``c`` of them passing."""

    task_id: str
    n: int
    c: int

    @property
    def pass_at_1(self) -> float:
        """``c / n``."""
        return self.c / self.n


def task_counts(
    results: Iterable[RolloutResult], *, harness: str, pass_threshold: float = 1.0
) -> list[TaskCount]:
    """Per task (in first-seen order), the rollouts of ``harness`` with a reward and those whose
    reward is at least ``pass_threshold``; rollouts without a reward (verifier or harness errors)
    are left out, and a task without any rewarded rollout is left out."""
    seen: dict[str, list[float]] = {}
    for r in results:
        if r.harness != harness:
            continue
        rewards = seen.setdefault(r.task_id, [])
        if r.reward is not None:
            rewards.append(r.reward)
    return [TaskCount(t, len(v), sum(x >= pass_threshold for x in v)) for t, v in seen.items() if v]


def pass_at_1_ci(counts: Sequence[TaskCount], *, seed: int = 0) -> tuple[float, float, float]:
    """``(Pass@1, low, high)``: the mean of each task's ``c / n`` and its 95 % percentile
    bootstrap interval over tasks (2,000 resamples); ``nan`` for no tasks."""
    values = [t.pass_at_1 for t in counts]
    if not values:
        return math.nan, math.nan, math.nan
    low, high = bootstrap_ci(values, seed=seed)
    return sum(values) / len(values), low, high


def family_pass_at_1(counts: Sequence[TaskCount]) -> dict[str, tuple[float, int]]:
    """Family (:func:`task_family`) -> (Pass@1 over its tasks, number of tasks), sorted."""
    out: dict[str, list[float]] = {}
    for t in counts:
        out.setdefault(task_family(t.task_id), []).append(t.pass_at_1)
    return {f: (sum(v) / len(v), len(v)) for f, v in sorted(out.items())}


def paired_gain(
    before: Sequence[TaskCount], after: Sequence[TaskCount], *, seed: int = 0
) -> tuple[float, float, float, int]:
    """``(gain, low, high, tasks)``: mean over the tasks both evaluations scored of
    ``after.c/n - before.c/n``, with its 95 % paired bootstrap interval over those tasks.

    An interval that excludes 0 is a gain beyond the noise of drawing these tasks (and these
    k rollouts of each); ``nan`` when no task is shared.
    """
    b = {t.task_id: t.pass_at_1 for t in before}
    a = {t.task_id: t.pass_at_1 for t in after}
    common = [t for t in b if t in a]
    if not common:
        return math.nan, math.nan, math.nan, 0
    gain, low, high = paired_diff_ci([b[t] for t in common], [a[t] for t in common], seed=seed)
    return gain, low, high, len(common)
