"""Pass@k and its intervals.

Pass@k: the unbiased estimator of Chen et al. 2021 ("Evaluating Large Language Models Trained
on Code", arXiv:2107.03374, §2.1).

Harness evaluation statistics: per-task pass counts, Pass@1 with a bootstrap interval, per-family
Pass@1, and the paired gain of one evaluation over another.

A task's Pass@1 is ``c / n`` (the unbiased estimator of Chen et al. 2021 at k = 1); the mean over
tasks is the reported Pass@1. Its 95 % interval comes from a two-stage (cluster) bootstrap that
follows how the numbers arose: families are drawn with replacement, then tasks within each drawn
family, then each drawn task's passes are redrawn from Binomial(n, c / n). Tasks of one family
(variants of one kind of task) are alike, so treating them as independent would give too narrow
an interval; the binomial stage adds the noise of drawing only n rollouts per task, so a set of
tasks that all pass 1 of 4 does not get a zero-width interval. A gain is paired: the same draw of
families and tasks is applied to both evaluations. 2,000 resamples, percentile interval.

Two scopes (``over``): ``"families"`` (the default, above) answers "would it hold for other kinds of
task like these", so a gain carried by some families and lost by others stays uncertain however
many variants each family has. ``"tasks"`` keeps the families fixed and redraws tasks within each
one (a bootstrap over tasks stratified by family, then the binomial stage): it answers "does it
hold for other variants of these families", the population a split by variant (the built-in
suite's) samples from. ``clawrl harness eval`` and ``compare`` print a gain's interval in both.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from clawrl.stats import RESAMPLES, percentile_interval, t_interval
from clawrl.store import RolloutResult

_VARIANT = re.compile(r"^(.*?)-\d+$")
MIN_TASKS_FOR_VERDICT = 4
"""A gain over fewer shared tasks gets no beyond/within-noise verdict."""
SCOPES = ("families", "tasks")
"""What a bootstrap redraws (module docstring)."""
MIN_TASKS_PER_FAMILY = 3
"""The ``tasks`` scope gives no interval when a family has fewer tasks: redrawing one or two
tasks of a family understates its spread (one task: a zero-width interval)."""


def task_family(task_id: str) -> str:
    """The family of a task id: the id without a trailing ``-N`` (``copy-file-3`` ->
    ``copy-file``); an id without one is its own family."""
    match = _VARIANT.match(task_id)
    return match.group(1) if match else task_id


@dataclass(frozen=True)
class TaskCount:
    """One task's rollouts in an evaluation: ``n`` with a reward, ``c`` of them passing.

    Raises:
        ValueError: not ``0 <= c <= n`` or ``n < 1``.
    """

    task_id: str
    n: int
    c: int

    def __post_init__(self) -> None:
        if self.n < 1 or not 0 <= self.c <= self.n:
            raise ValueError(
                f"task {self.task_id}: need 0 <= c <= n and n >= 1, got {self.n=}, {self.c=}"
            )

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


def _binomial_rate(rng: random.Random, n: int, p: float) -> float:
    return sum(rng.random() < p for _ in range(n)) / n


def _bootstrap(
    pairs: Sequence[tuple[str, tuple[TaskCount, ...]]], seed: int, over: str = "families"
) -> list[float]:
    """Sorted bootstrap means of ``sum(sign * c/n)`` per task (see the module docstring):
    ``pairs`` holds per task id its one (level) or two (before, after: a gain) counts.

    Empty when ``over`` is ``tasks`` and a family has fewer than :data:`MIN_TASKS_PER_FAMILY`
    tasks (no interval).

    Raises:
        ValueError: ``over`` is not one of :data:`SCOPES`.
    """
    if over not in SCOPES:
        raise ValueError(f"over must be one of {SCOPES}, got {over!r}")
    families: dict[str, list[tuple[TaskCount, ...]]] = {}
    for task_id, counts in pairs:
        families.setdefault(task_family(task_id), []).append(counts)
    groups = list(families.values())
    if over == "tasks" and min(len(g) for g in groups) < MIN_TASKS_PER_FAMILY:
        return []
    rng = random.Random(seed)
    means = []
    for _ in range(RESAMPLES):
        total, tasks = 0.0, 0
        for g in range(len(groups)):
            pick = rng.randrange(len(groups))  # drawn in both scopes: one random stream
            group = groups[pick] if over == "families" else groups[g]
            for _ in range(len(group)):
                counts = group[rng.randrange(len(group))]
                rates = [_binomial_rate(rng, t.n, t.pass_at_1) for t in counts]
                total += rates[-1] - (rates[0] if len(rates) == 2 else 0.0)
                tasks += 1
        means.append(total / tasks)
    return sorted(means)


def pass_at_1_ci(
    counts: Sequence[TaskCount], *, seed: int = 0, over: str = "families"
) -> tuple[float, float, float]:
    """``(Pass@1, low, high)``: the mean of each task's ``c / n`` and its 95 % bootstrap interval
    over ``families`` or ``tasks`` (module docstring); ``nan`` for no tasks, and ``nan`` bounds
    over ``tasks`` when a family has fewer than :data:`MIN_TASKS_PER_FAMILY` tasks.

    Raises:
        ValueError: ``over`` is not one of :data:`SCOPES`.
    """
    if not counts:
        return math.nan, math.nan, math.nan
    mean = sum(t.pass_at_1 for t in counts) / len(counts)
    low, high = percentile_interval(_bootstrap([(t.task_id, (t,)) for t in counts], seed, over))
    return mean, low, high


def family_pass_at_1(counts: Sequence[TaskCount]) -> dict[str, tuple[float, int]]:
    """Family (:func:`task_family`) -> (Pass@1 over its tasks, number of tasks), sorted."""
    out: dict[str, list[float]] = {}
    for t in counts:
        out.setdefault(task_family(t.task_id), []).append(t.pass_at_1)
    return {f: (sum(v) / len(v), len(v)) for f, v in sorted(out.items())}


def mean_gain(before: Sequence[TaskCount], after: Sequence[TaskCount]) -> float:
    """Mean over the tasks both evaluations scored of ``after.c/n - before.c/n`` (``nan`` when
    none is shared): the point estimate of :func:`paired_gain`, without its bootstrap."""
    b = {t.task_id: t for t in before}
    a = {t.task_id: t for t in after}
    common = [t for t in b if t in a]
    if not common:
        return math.nan
    return sum(a[t].pass_at_1 - b[t].pass_at_1 for t in common) / len(common)


def paired_gain(
    before: Sequence[TaskCount],
    after: Sequence[TaskCount],
    *,
    seed: int = 0,
    over: str = "families",
) -> tuple[float, float, float, int]:
    """``(gain, low, high, tasks)``: mean over the tasks both evaluations scored of
    ``after.c/n - before.c/n``, with its 95 % paired bootstrap interval over ``families`` or
    ``tasks`` (module docstring); ``nan`` when no task is shared, and ``nan`` bounds over
    ``tasks`` when a family has fewer than :data:`MIN_TASKS_PER_FAMILY` shared tasks.

    Raises:
        ValueError: ``over`` is not one of :data:`SCOPES`.
    """
    b = {t.task_id: t for t in before}
    a = {t.task_id: t for t in after}
    common = [t for t in b if t in a]
    if not common:
        return math.nan, math.nan, math.nan, 0
    gain = mean_gain(before, after)
    low, high = percentile_interval(_bootstrap([(t, (b[t], a[t])) for t in common], seed, over))
    return gain, low, high, len(common)


def verdict(low: float, high: float, tasks: int) -> str:
    """``beyond noise`` when the interval of a gain excludes 0, ``within noise`` when it holds
    0, ``n/a`` without an interval or with fewer than :data:`MIN_TASKS_FOR_VERDICT` tasks."""
    if tasks < MIN_TASKS_FOR_VERDICT or not (math.isfinite(low) and math.isfinite(high)):
        return "n/a"
    return "beyond noise" if low > 0 or high < 0 else "within noise"


def describe_gain(before: Sequence[TaskCount], after: Sequence[TaskCount]) -> str:
    """``after - before`` as printed by ``clawrl harness eval`` and ``compare``: the paired gain
    with its interval over families and over tasks within families (module docstring), each with
    its :func:`verdict`; e.g. ``+0.312 over 16 tasks: [-0.125, +0.672] over families (within
    noise); [+0.094, +0.531] over tasks within families (beyond noise)``."""
    parts = []
    for over in SCOPES:
        gain, low, high, n = paired_gain(before, after, over=over)
        scope = "families" if over == "families" else "tasks within families"
        if over == "families" and len({task_family(t.task_id) for t in before}) < 2:
            parts.append("n/a over families (one family)")
        elif math.isfinite(low):
            parts.append(f"[{low:+.3f}, {high:+.3f}] over {scope} ({verdict(low, high, n)})")
        elif n and over == "tasks":
            parts.append(f"n/a over {scope} (a family has < {MIN_TASKS_PER_FAMILY} tasks)")
        else:
            parts.append(f"n/a over {scope}")
    return f"{gain:+.3f} over {n} tasks: " + "; ".join(parts)


def across_runs(gains: Sequence[float]) -> tuple[float, float, float]:
    """``(mean, low, high)``: the mean of one gain measured in several independent runs (training
    seeds) and its 95 % Student-t interval over runs, ``mean +- t(0.975, r - 1) * sd / sqrt(r)``
    (:func:`clawrl.stats.t_interval`). Unlike the bootstrap intervals, which hold one trained
    policy fixed, it measures how much the result of a training recipe moves from run to run; with 3 runs ``t``
    is 4.3, so it is wide. It holds the tasks fixed, and when every run's gain is taken over one
    evaluation of the base, that evaluation's own noise moves all gains together and is not in
    it (evaluate ``--version 0,N`` per run to include it). ``nan`` bounds for fewer than 2 runs.

    Raises:
        ValueError: no gains.
    """
    if not gains:
        raise ValueError("across_runs needs at least one gain")
    return t_interval(gains)


def pass_at_k(n: int, c: int, k: int) -> float:
    """``1 - C(n-c, k) / C(n, k)``: the chance that k of n samples (c correct) hold a correct one.

    Computed as ``1 - prod_{i=n-c+1}^{n} (1 - k / i)`` for numerical stability (as the paper's
    reference code).

    Raises:
        ValueError: not ``0 <= c <= n`` or not ``1 <= k <= n``.
    """
    if not (0 <= c <= n) or not (1 <= k <= n):
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def mean_pass_at_k(counts: Sequence[tuple[int, int]], k: int) -> float:
    """Mean of :func:`pass_at_k` over tasks given ``(n, c)`` per task."""
    if not counts:
        raise ValueError("no tasks")
    return sum(pass_at_k(n, c, k) for n, c in counts) / len(counts)
