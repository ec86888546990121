"""Rubrics: named, deterministic checks on one response, and the score they give.

A :class:`Rubric` is a list of :class:`Check` s. Each check reads the response (and the task
it answers) and returns a :class:`CheckResult`: passed, failed, or not applicable
(``passed=None``, e.g. "names the mistake" for a solution without one), with *evidence* — the
offending phrase, the word count — that the simulated user quotes in its reply.

The score of a response is the fraction of applicable checks it meets, in [0, 1]. The user is
satisfied (ground-truth reward +1) exactly when every applicable check passes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

C = TypeVar("C")


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one check on one response.

    Attributes:
        name: the check's name.
        passed: ``True`` / ``False``, or ``None`` when the check does not apply.
        evidence: what was found when it failed (a phrase quoted from the response, a count),
            else ``None``.
    """

    name: str
    passed: bool | None
    evidence: str | None = None


@dataclass(frozen=True)
class RubricResult:
    """All check results of one response.

    Attributes:
        checks: one result per check, in the rubric's order.
    """

    checks: tuple[CheckResult, ...]

    @property
    def applicable(self) -> tuple[CheckResult, ...]:
        """The results whose check applies."""
        return tuple(c for c in self.checks if c.passed is not None)

    @property
    def score(self) -> float:
        """Fraction of applicable checks passed, in [0, 1] (1.0 when none applies)."""
        app = self.applicable
        return sum(1 for c in app if c.passed) / len(app) if app else 1.0

    @property
    def passed(self) -> dict[str, bool]:
        """Check name -> passed, for applicable checks."""
        return {c.name: bool(c.passed) for c in self.applicable}

    @property
    def failed(self) -> tuple[str, ...]:
        """Names of the failed checks, in the rubric's order."""
        return tuple(c.name for c in self.checks if c.passed is False)

    @property
    def satisfied(self) -> bool:
        """Whether every applicable check passed."""
        return not self.failed

    def result(self, name: str) -> CheckResult:
        """The result of the check called ``name``.

        Raises:
            KeyError: no such check.
        """
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(name)


@dataclass(frozen=True)
class Check(Generic[C]):
    """A named check.

    Attributes:
        name: a short identifier (``no_bold``); never shown to the policy.
        description: what the check requires, in a sentence (for docs and ``--help``).
        fn: ``(response, context) -> (passed | None, evidence | None)``.
    """

    name: str
    description: str
    fn: Callable[[str, C], tuple[bool | None, str | None]]


class Rubric(Generic[C]):
    """A list of checks scored together.

    Args:
        name: the rubric's name (e.g. ``student``).
        checks: the checks, in the order they are reported.

    Raises:
        ValueError: duplicate check names.
    """

    def __init__(self, name: str, checks: Sequence[Check[C]]) -> None:
        names = [c.name for c in checks]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate check names in rubric {name!r}: {names}")
        self.name = name
        self.checks = tuple(checks)

    @property
    def check_names(self) -> tuple[str, ...]:
        """The checks' names, in order."""
        return tuple(c.name for c in self.checks)

    def evaluate(self, response: str, context: C) -> RubricResult:
        """Run every check on ``response`` (the assistant's text) for ``context`` (its task)."""
        out = []
        for check in self.checks:
            passed, evidence = check.fn(response, context)
            out.append(CheckResult(check.name, passed, evidence if passed is False else None))
        return RubricResult(tuple(out))


def word_count(text: str) -> int:
    """Whitespace-separated words in ``text``."""
    return len(text.split())


def first_match(patterns: Sequence[re.Pattern[str]], text: str) -> str | None:
    """The text of the earliest match of any pattern in ``text``, or ``None``."""
    best: re.Match[str] | None = None
    for pat in patterns:
        m = pat.search(text)
        if m and (best is None or m.start() < best.start()):
            best = m
    return best.group(0).strip() if best else None


def quote(text: str, limit: int = 40) -> str:
    """``text`` on one line, cut to ``limit`` characters with an ellipsis."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"
