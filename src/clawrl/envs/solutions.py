"""Students' worked solutions for the teacher scenario: correct ones and ones with a known slip.

A worked solution is the problem's GSM8K-format solution (:attr:`Problem.solution`) shown as
numbered steps. A *flawed* one has one arithmetic slip: step ``k`` writes a wrong result, and
every later step that used that result carries the error forward (its calculation is redone on
the wrong number), so the final answer is wrong too — the way a real student's error
propagates. The flaw (step, right value, wrong value) is known, so the teacher's rubric can
check that the grader's comments name it.

A slip is planted only where it is unambiguous: the step's result must not also be a number of
the question or of another step, and after propagation every calculation must re-check and the
final answer must differ from the right one. Otherwise another step is tried, and a problem
with no such step gets a correct solution.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from enum import StrEnum

from clawrl.envs.numbers import NUMBER_RE, canonical, numbers_in, safe_eval
from clawrl.envs.problems import Problem

ANNOTATION_RE = re.compile(r"<<([^<>=]+)=([^<>]+)>>")
"""A GSM8K calculator annotation ``<<expr=result>>``."""

_AFTER_RE = re.compile(r"^(\s*\$?)(-?\d(?:[\d,]*\d)?(?:\.\d+)?)")


class FlawKind(StrEnum):
    """What is wrong with a worked solution."""

    ARITHMETIC = "arithmetic"  # one step's calculation has a wrong result, carried forward


@dataclass(frozen=True)
class Flaw:
    """The known mistake in a worked solution.

    Attributes:
        kind: what kind of mistake.
        step: the 1-based number of the step with the slip (as shown to the grader).
        right_value: what that step's result should be (canonical string).
        wrong_value: what the student wrote instead (canonical string).
    """

    kind: FlawKind
    step: int
    right_value: str
    wrong_value: str


@dataclass(frozen=True)
class WorkedSolution:
    """A student's worked solution to a problem.

    Attributes:
        problem: the problem.
        steps: the steps as shown (annotations removed), without numbering.
        answer: the student's final answer (canonical string).
        flaw: the known mistake, or ``None`` for a correct solution.
    """

    problem: Problem
    steps: tuple[str, ...]
    answer: str
    flaw: Flaw | None = None

    @property
    def correct(self) -> bool:
        """Whether the solution has no mistake."""
        return self.flaw is None

    def render(self) -> str:
        """The solution as the teacher pastes it: ``Step 1: ...`` lines and ``Answer: N``."""
        lines = [f"Step {i}: {s}" for i, s in enumerate(self.steps, 1)]
        return "\n".join([*lines, f"Answer: {self.answer}"])

    def numbers(self) -> frozenset[str]:
        """Canonical numbers that appear in the steps and the answer (not the step numbers)."""
        found = {n for s in self.steps for n in numbers_in(s)}
        found.add(self.answer)
        return frozenset(found)


def display(line: str) -> str:
    """A GSM8K solution line as a person reads it: annotations removed, spaces tidied."""
    return " ".join(ANNOTATION_RE.sub("", line).split())


def _results(line: str) -> list[str]:
    out = []
    for m in ANNOTATION_RE.finditer(line):
        try:
            out.append(canonical(m.group(2)))
        except ValueError:
            continue
    return out


def _replace_numbers(text: str, mapping: dict[str, str]) -> str:
    def sub(m: re.Match[str]) -> str:
        try:
            key = canonical(m.group(0))
        except ValueError:
            return m.group(0)
        return mapping.get(key, m.group(0))

    return NUMBER_RE.sub(sub, text)


def _rewrite(line: str, mapping: dict[str, str], forced: str | None) -> str | None:
    """Carry ``mapping`` into one line; ``forced`` overrides its (single) result. ``None`` when
    an annotation cannot be recomputed."""
    out: list[str] = []
    pos = 0
    for m in ANNOTATION_RE.finditer(line):
        out.append(_replace_numbers(line[pos : m.start()], mapping))
        expr = _replace_numbers(m.group(1), mapping)
        try:
            old = canonical(m.group(2))
            new = forced if forced is not None else canonical(safe_eval(expr))
        except ValueError:
            return None
        if new != old:
            mapping[old] = new
        out.append(f"<<{expr}={new}>>")
        pos = m.end()
        after = _AFTER_RE.match(line[pos:])
        if after:  # the visible copy of the result, right after the annotation
            out.append(after.group(1) + new)
            pos += after.end()
    out.append(_replace_numbers(line[pos:], mapping))
    return "".join(out)


def _consistent(lines: list[str], skip: int) -> bool:
    """Every calculation re-checks, except line ``skip`` (the slip)."""
    for i, line in enumerate(lines):
        if i == skip:
            continue
        for m in ANNOTATION_RE.finditer(line):
            try:
                if canonical(safe_eval(m.group(1))) != canonical(m.group(2)):
                    return False
            except ValueError:
                return False
            after = _AFTER_RE.match(line[m.end() :])
            if after and canonical(after.group(2)) != canonical(m.group(2)):
                return False
    return True


def _slip(value: str, taken: set[str], r: random.Random) -> str | None:
    """A plausible wrong result near ``value`` that is none of the numbers in ``taken``."""
    v = float(value)
    deltas = (1, 2, 3, 10, -1, -2, -3, -10) if v == int(v) else (1, -1, 0.5, -0.5)
    options = [canonical(v + d) for d in deltas if v + d > 0]
    options = [o for o in options if o not in taken]
    return r.choice(options) if options else None


def _try_flaw(problem: Problem, k: int, r: random.Random) -> WorkedSolution | None:
    lines = list(problem.solution)
    (right,) = _results(lines[k])
    taken = {n for x in lines for n in numbers_in(x)} | set(numbers_in(problem.question))
    wrong = _slip(right, taken, r)
    if wrong is None:
        return None
    mapping: dict[str, str] = {}
    new_lines: list[str] = lines[:k]
    for i in range(k, len(lines)):
        rewritten = _rewrite(lines[i], mapping, wrong if i == k else None)
        if rewritten is None:
            return None
        new_lines.append(rewritten)
    answer = mapping.get(problem.answer, problem.answer)
    if answer == problem.answer or not _consistent(new_lines, k):
        return None
    return WorkedSolution(
        problem=problem,
        steps=tuple(display(x) for x in new_lines),
        answer=answer,
        flaw=Flaw(FlawKind.ARITHMETIC, k + 1, right, wrong),
    )


def _candidates(problem: Problem) -> list[int]:
    lines = problem.solution
    question = set(numbers_in(problem.question))
    out = []
    for k, line in enumerate(lines):
        res = _results(line)
        if len(res) != 1 or res[0] in question:
            continue
        earlier = {n for x in lines[:k] for n in numbers_in(display(x))}
        other_results = {v for j, x in enumerate(lines) if j != k for v in _results(x)}
        if res[0] in earlier or res[0] in other_results:
            continue
        out.append(k)
    return out


def correct_solution(problem: Problem) -> WorkedSolution:
    """The problem's own solution as a student's correct work."""
    return WorkedSolution(
        problem=problem,
        steps=tuple(display(x) for x in problem.solution),
        answer=problem.answer,
    )


def make_worked_solution(
    problem: Problem, *, seed: int = 0, flaw_rate: float = 0.5
) -> WorkedSolution:
    """A student's worked solution to ``problem``, flawed with probability ``flaw_rate``.

    Deterministic in ``(seed, problem.id)``. A problem without a solution, or where no
    unambiguous slip exists (see the module docstring), gets its correct solution.

    Args:
        problem: the problem (its :attr:`Problem.solution` lines are used).
        seed: the seed.
        flaw_rate: probability in [0, 1] of planting a slip.

    Raises:
        ValueError: ``flaw_rate`` outside [0, 1].
    """
    if not 0.0 <= flaw_rate <= 1.0:
        raise ValueError(f"flaw_rate must be in [0, 1], got {flaw_rate}")
    r = random.Random(f"{seed}:{problem.id}:solution")
    if r.random() >= flaw_rate:
        return correct_solution(problem)
    candidates = _candidates(problem)
    r.shuffle(candidates)
    for k in candidates:
        worked = _try_flaw(problem, k, r)
        if worked is not None:
            return worked
    return correct_solution(problem)
