"""Measuring a judge on a labeled set (``clawrl judge eval``).

Definitions (all over the cases of the set):

* **accuracy** = cases whose judgment score equals the expected score / all cases; a case with
  no judgment counts as wrong. **judged accuracy** is the same over judged cases only, and
  **coverage** = judged cases / all cases.
* **confusion**: rows expected score, columns predicted score or ``none`` (no judgment).
* **hint precision** = cases with a hint that should have one / cases with a hint; **hint
  recall** = cases with a hint that should have one / cases that should have one (``None`` when
  the denominator is 0). Whether the hint's *text* is right is not scored here; read it with
  ``--output``.
* **judgments/s** = cases / wall-clock seconds of the whole run (cases run ``concurrency`` at a
  time, the votes of each concurrently).
* **majority baseline** = accuracy of always answering the set's most common score.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from clawrl.judge.cases import CaseCategory, JudgeCase
from clawrl.judge.hints import DEFAULT_QUORUM
from clawrl.judge.judge import Judge, judgment_from_votes
from clawrl.judge.types import BackendKind, Judgment, Score


@dataclass(frozen=True)
class CaseResult:
    """One case and the judge's judgment of it."""

    case: JudgeCase
    judgment: Judgment

    @property
    def correct(self) -> bool:
        """The judged score equals the expected one (no judgment is never correct)."""
        return self.judgment.score == self.case.expected_score

    @property
    def hinted(self) -> bool:
        """The judgment carries a hint."""
        return self.judgment.hint is not None


def _ratio(num: int, den: int) -> float | None:
    return num / den if den else None


@dataclass(frozen=True)
class EvalReport:
    """The measurements of one run over a labeled set (definitions in the module doc)."""

    results: list[CaseResult]
    wall_s: float
    backend: str
    model: str
    votes: int
    writes_hints: bool = True
    hint_quorum: float = DEFAULT_QUORUM

    @property
    def n(self) -> int:
        """Number of cases."""
        return len(self.results)

    @property
    def accuracy(self) -> float | None:
        return _ratio(sum(r.correct for r in self.results), self.n)

    @property
    def coverage(self) -> float | None:
        return _ratio(sum(r.judgment.score is not None for r in self.results), self.n)

    @property
    def judged_accuracy(self) -> float | None:
        judged = [r for r in self.results if r.judgment.score is not None]
        return _ratio(sum(r.correct for r in judged), len(judged))

    @property
    def confusion(self) -> dict[tuple[Score, Score | None], int]:
        """``{(expected, predicted or None): count}`` over all cases."""
        return dict(Counter((r.case.expected_score, r.judgment.score) for r in self.results))

    @property
    def hint_precision(self) -> float | None:
        hinted = [r for r in self.results if r.hinted]
        return _ratio(sum(r.case.has_hint for r in hinted), len(hinted))

    @property
    def hint_recall(self) -> float | None:
        wanted = [r for r in self.results if r.case.has_hint]
        return _ratio(sum(r.hinted for r in wanted), len(wanted))

    @property
    def sign_error_rate(self) -> float | None:
        """Cases whose judged score has the opposite sign of the expected one (+1 judged -1 or
        -1 judged +1), as a fraction of all cases: the errors that train the wrong way."""
        flipped = sum(
            r.judgment.score is not None and int(r.judgment.score) * int(r.case.expected_score) < 0
            for r in self.results
        )
        return _ratio(flipped, self.n)

    @property
    def judgments_per_s(self) -> float | None:
        return self.n / self.wall_s if self.wall_s > 0 else None

    @property
    def majority_baseline(self) -> float | None:
        counts = Counter(r.case.expected_score for r in self.results)
        return _ratio(max(counts.values(), default=0), self.n)

    def per_category(self) -> dict[CaseCategory, tuple[int, int]]:
        """``{category: (correct, total)}`` in :class:`CaseCategory` order."""
        out: dict[CaseCategory, tuple[int, int]] = {}
        for cat in CaseCategory:
            rs = [r for r in self.results if r.case.category == cat]
            if rs:
                out[cat] = (sum(r.correct for r in rs), len(rs))
        return out

    def abstentions(self) -> Counter[str]:
        """Abstained votes by reason, over all cases."""
        return Counter(
            v.abstain_reason.value
            for r in self.results
            for v in r.judgment.votes
            if v.abstain_reason is not None
        )

    def first_votes(self, k: int) -> EvalReport:
        """The report m = ``k`` would have given: each judgment re-aggregated from its first
        ``k`` votes (:func:`clawrl.judge.judge.judgment_from_votes`; vote i's seed or template
        does not depend on m). Explicit-feedback judgments are kept; speed is not measured
        (``wall_s = 0``).

        Raises:
            ValueError: ``k`` is not in ``1..votes``.
        """
        if not 1 <= k <= self.votes:
            raise ValueError(f"k must be in 1..{self.votes}, got {k}")
        results = []
        for r in self.results:
            j = r.judgment
            if j.backend != BackendKind.FEEDBACK:
                j = judgment_from_votes(
                    r.case.input,
                    j.votes[:k],
                    backend=j.backend,
                    model=j.model,
                    writes_hints=self.writes_hints,
                    hint_quorum=self.hint_quorum,
                )
            results.append(CaseResult(r.case, j))
        return replace(self, results=results, wall_s=0.0, votes=k)

    def metrics(self) -> dict[str, Any]:
        """``/``-namespaced metrics of the run (``None`` where undefined)."""
        out: dict[str, Any] = {
            "eval/cases": self.n,
            "eval/accuracy": self.accuracy,
            "eval/coverage": self.coverage,
            "eval/judged_accuracy": self.judged_accuracy,
            "eval/majority_baseline": self.majority_baseline,
            "eval/hint_precision": self.hint_precision,
            "eval/hint_recall": self.hint_recall,
            "eval/sign_error_rate": self.sign_error_rate,
            "eval/judgments_per_s": self.judgments_per_s,
            "time/eval_s": self.wall_s,
            "judge/votes": self.votes,
        }
        for reason, count in sorted(self.abstentions().items()):
            out[f"judge/abstain/{reason}"] = count
        for cat, (ok, total) in self.per_category().items():
            out[f"eval/accuracy/{cat.value}"] = ok / total
        return out


async def evaluate(
    judge: Judge,
    cases: Sequence[JudgeCase],
    *,
    concurrency: int = 4,
    progress: Callable[[int, int], None] | None = None,
) -> EvalReport:
    """Judge every case and measure the results.

    Args:
        judge: the judge under test.
        cases: the labeled set.
        concurrency: cases judged at a time.
        progress: called as ``progress(done, total)`` after each judgment.

    Returns:
        The :class:`EvalReport`.
    """
    gate = asyncio.Semaphore(max(1, concurrency))
    done = 0

    async def one(case: JudgeCase) -> Judgment:
        nonlocal done
        async with gate:
            j = await judge.judge(case.input)
        done += 1
        if progress is not None:
            progress(done, len(cases))
        return j

    start = time.perf_counter()
    judgments = await asyncio.gather(*(one(c) for c in cases))
    wall = time.perf_counter() - start
    return EvalReport(
        results=[CaseResult(c, j) for c, j in zip(cases, judgments, strict=True)],
        wall_s=wall,
        backend=judge.backend.kind.value,
        model=judge.backend.model,
        votes=judge.votes,
        writes_hints=judge.backend.writes_hints,
        hint_quorum=judge.hint_quorum,
    )
