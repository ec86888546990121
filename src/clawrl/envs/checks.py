"""The library of check kinds a scenario's rubric is built from (``[[checks]]`` in its TOML).

Every kind is a pydantic model with a ``kind`` tag and its own settings; :meth:`build` turns it
into a :class:`~clawrl.envs.rubric.Check` whose function returns ``(passed, evidence)``: the
evidence (the offending phrase, a count) is what the simulated user quotes back (the ``{evidence}``
slot of the check's complaints).

====================  ===================================================  ==================
kind                  passes when the response ...                         evidence
====================  ===================================================  ==================
``pattern_absent``    matches none of ``patterns`` (regex, case-insens.)   the match
``pattern_present``   matches at least one of ``patterns``                 —
``max_words``         has at most ``limit`` words                          the word count
``max_sentences``     has at most ``limit`` sentences                      the sentence count
``starts_with``       begins with one of ``prefixes`` (case-insensitive)   its first words
``ends_with``         ends with one of ``suffixes`` (case-insensitive)     its last words
``states_number``     contains a number in digits ("3", "1/2", "2.5")       —
``number_first``      has a number in digits within its first ``words``    its first words
                      words
``no_bold``           has no ``**bold**`` / ``__bold__``                   the bold text
``no_headers``        has no markdown heading (``#``, setext)              the heading
``no_numbered_list``  has no numbered list (two lines ``1.``, or one ``1``)  the line
``no_bullets``        has no bulleted list (``-``, ``*``, ``•`` lines)       the line
``no_markdown``       none of bold, headers, numbered or bulleted lists,   the markup
                      code fences, LaTeX
``praises_work``      says something the student did right (grading)       —
``names_fix``         points at the slip of flawed work and its fix        ``step k: W -> R``
                      (grading; not applicable to correct work)
``cites_work``        quotes a number of the student's work (grading)      —
====================  ===================================================  ==================

The grading kinds read the task's :class:`~clawrl.envs.solutions.WorkedSolution`; on a task
without one they do not apply.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from clawrl.envs.numbers import numbers_in
from clawrl.envs.rubric import Check, first_match, quote, word_count
from clawrl.envs.solutions import WorkedSolution

CheckFn = Callable[[str, Any], tuple[bool | None, str | None]]


class _Kind(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    def fn(self) -> CheckFn:  # pragma: no cover - every kind overrides it
        raise NotImplementedError


def _compile(patterns: list[str]) -> list[re.Pattern[str]]:
    out = []
    for p in patterns:
        try:
            out.append(re.compile(p, re.I | re.M))
        except re.error as e:
            raise ValueError(f"pattern {p!r} is not a valid regular expression: {e}") from e
    return out


class PatternAbsent(_Kind):
    """Fails when any pattern matches; the evidence is the earliest match."""

    kind: Literal["pattern_absent"] = "pattern_absent"
    patterns: list[str] = Field(min_length=1)

    @field_validator("patterns")
    @classmethod
    def _valid(cls, v: list[str]) -> list[str]:
        _compile(v)
        return v

    def fn(self) -> CheckFn:
        compiled = _compile(self.patterns)

        def check(response: str, _: Any) -> tuple[bool | None, str | None]:
            found = first_match(compiled, response)
            return (False, quote(found)) if found else (True, None)

        return check


class PatternPresent(_Kind):
    """Passes when any pattern matches."""

    kind: Literal["pattern_present"] = "pattern_present"
    patterns: list[str] = Field(min_length=1)

    @field_validator("patterns")
    @classmethod
    def _valid(cls, v: list[str]) -> list[str]:
        _compile(v)
        return v

    def fn(self) -> CheckFn:
        compiled = _compile(self.patterns)
        return lambda response, _: (any(p.search(response) for p in compiled), None)


class MaxWords(_Kind):
    """At most ``limit`` whitespace-separated words."""

    kind: Literal["max_words"] = "max_words"
    limit: int = Field(ge=1)

    def fn(self) -> CheckFn:
        def check(response: str, _: Any) -> tuple[bool | None, str | None]:
            n = word_count(response)
            return n <= self.limit, str(n)

        return check


_SENTENCE_END = re.compile(r"[.!?]+(?:\s|$)")
_LIST_MARKER = re.compile(r"^\s*(?:\(?\d{1,2}[.)]|[-*•+])\s+")


def sentence_count(text: str) -> int:
    """Sentences in ``text``: runs ended by ``.``, ``!`` or ``?`` (a last unterminated run
    counts; list items and lines without punctuation count as one each)."""
    count = 0
    for line in text.splitlines():
        line = _LIST_MARKER.sub("", line).strip()
        if not line:
            continue
        ends = list(_SENTENCE_END.finditer(line))
        count += len(ends)
        tail = line[ends[-1].end() :] if ends else line
        count += bool(tail.strip())  # an unterminated last run
    return count


class MaxSentences(_Kind):
    """At most ``limit`` sentences (:func:`sentence_count`)."""

    kind: Literal["max_sentences"] = "max_sentences"
    limit: int = Field(ge=1)

    def fn(self) -> CheckFn:
        def check(response: str, _: Any) -> tuple[bool | None, str | None]:
            n = sentence_count(response)
            return n <= self.limit, str(n)

        return check


def _first_words(text: str, n: int = 5) -> str:
    return quote(" ".join(text.split()[:n]), 40)


class StartsWith(_Kind):
    """Begins (after whitespace) with one of ``prefixes``, case-insensitively."""

    kind: Literal["starts_with"] = "starts_with"
    prefixes: list[str] = Field(min_length=1)

    def fn(self) -> CheckFn:
        wanted = [p.lower() for p in self.prefixes]

        def check(response: str, _: Any) -> tuple[bool | None, str | None]:
            head = response.lstrip().lower()
            ok = any(head.startswith(p) for p in wanted)
            return ok, None if ok else _first_words(response)

        return check


class EndsWith(_Kind):
    """Ends (before whitespace) with one of ``suffixes``, case-insensitively."""

    kind: Literal["ends_with"] = "ends_with"
    suffixes: list[str] = Field(min_length=1)

    def fn(self) -> CheckFn:
        wanted = [s.lower() for s in self.suffixes]

        def check(response: str, _: Any) -> tuple[bool | None, str | None]:
            tail = response.rstrip().lower()
            ok = any(tail.endswith(s) for s in wanted)
            return ok, None if ok else quote(" ".join(response.split()[-5:]), 40)

        return check


class StatesNumber(_Kind):
    """Contains a number at all (an empty or evasive reply gives no answer)."""

    kind: Literal["states_number"] = "states_number"

    def fn(self) -> CheckFn:
        return lambda response, _: (bool(re.search(r"\d", response)), None)


class NumberFirst(_Kind):
    """States a number within its first ``words`` words (the answer up front)."""

    kind: Literal["number_first"] = "number_first"
    words: int = Field(default=12, ge=1)

    def fn(self) -> CheckFn:
        def check(response: str, _: Any) -> tuple[bool | None, str | None]:
            head = " ".join(response.split()[: self.words])
            ok = re.search(r"\d", head) is not None
            # at most ``words`` words: a quote that reaches the number would contradict the user
            return ok, None if ok else _first_words(response, min(self.words, 5))

        return check


_BOLD = [re.compile(r"\*\*(?=\S)(.+?)(?<=\S)\*\*", re.S), re.compile(r"\b__(\S.*?\S)__\b")]
_HEADERS = [
    re.compile(r"^[ \t]{0,3}#{1,6}[ \t]+(\S.*)$", re.M),
    re.compile(r"^[ \t]*(\S.*)\n[ \t]*(?:={3,}|-{3,})[ \t]*$", re.M),
]
_NUMBERED = re.compile(r"^[ \t]*(?:\d{1,2}[.)]|\(\d{1,2}\))[ \t]+\S.*$", re.M)
_BULLET = re.compile(r"^[ \t]*[-*•+][ \t]+\S.*$", re.M)
_FENCE_OR_LATEX = re.compile(r"```|\\\(|\\\[|\\frac|\\times|\\text|\$\$|\\boxed")


def find_bold(response: str) -> str | None:
    """The first bold text, or ``**`` for stray markers, or ``None``."""
    for pat in _BOLD:
        if m := pat.search(response):
            return quote(m.group(1))
    return "**" if "**" in response else None


def find_header(response: str) -> str | None:
    """The first markdown heading's text, or ``None``."""
    for pat in _HEADERS:
        if m := pat.search(response):
            return quote(m.group(1).strip("#* "))
    return None


def find_numbered_list(response: str) -> str | None:
    """The first line of a numbered list (two numbered lines, or one starting at 1)."""
    lines = [m.group(0).strip() for m in _NUMBERED.finditer(response)]
    listed = len(lines) >= 2 or any(re.match(r"\(?1\b", x) for x in lines)
    return quote(lines[0], 30) if listed else None


def find_bullets(response: str) -> str | None:
    """The first line of a bulleted list, or ``None``."""
    m = _BULLET.search(response)
    return quote(m.group(0).strip(), 30) if m else None


def find_markdown(response: str) -> str | None:
    """The first markdown markup of any kind (bold, heading, list, code fence, LaTeX)."""
    for finder in (find_bold, find_header, find_numbered_list, find_bullets):
        if found := finder(response):
            return found
    m = _FENCE_OR_LATEX.search(response)
    return m.group(0) if m else None


class _Finder(_Kind):
    """Fails when ``finder`` finds something; the evidence is what it found."""

    def find(self, response: str) -> str | None:  # pragma: no cover - overridden
        raise NotImplementedError

    def fn(self) -> CheckFn:
        def check(response: str, _: Any) -> tuple[bool | None, str | None]:
            found = self.find(response)
            return (False, found) if found else (True, None)

        return check


class NoBold(_Finder):
    """No ``**bold**`` or ``__bold__`` markup."""

    kind: Literal["no_bold"] = "no_bold"

    def find(self, response: str) -> str | None:
        """What fails the check, or ``None``."""
        return find_bold(response)


class NoHeaders(_Finder):
    """No markdown headings."""

    kind: Literal["no_headers"] = "no_headers"

    def find(self, response: str) -> str | None:
        """What fails the check, or ``None``."""
        return find_header(response)


class NoNumberedList(_Finder):
    """No numbered list."""

    kind: Literal["no_numbered_list"] = "no_numbered_list"

    def find(self, response: str) -> str | None:
        """What fails the check, or ``None``."""
        return find_numbered_list(response)


class NoBullets(_Finder):
    """No bulleted list."""

    kind: Literal["no_bullets"] = "no_bullets"

    def find(self, response: str) -> str | None:
        """What fails the check, or ``None``."""
        return find_bullets(response)


class NoMarkdown(_Finder):
    """No markdown: bold, headings, lists, code fences or LaTeX."""

    kind: Literal["no_markdown"] = "no_markdown"

    def find(self, response: str) -> str | None:
        """What fails the check, or ``None``."""
        return find_markdown(response)


# ----------------------------------------------------------------------------- grading kinds

_PRAISE = re.compile(
    r"\b(?:good|great|nice(?:ly)?|well done|did well|excellent|solid|neat(?:ly)?|careful(?:ly)?"
    r"|correctly|clear(?:ly)?|awesome|perfect(?:ly)?|spot on|impressive|strong|smart|proud"
    r"|(?:is|was|are|were|got (?:it|that|this)) (?:right|correct)|on the right track)\b",
    re.I,
)
_NEGATION = re.compile(
    r"\b(?:not|never|isn't|wasn't|aren't|don't|doesn't|hardly)\s+(?:\w+\s+)?$", re.I
)
_FIX_CUE = re.compile(
    r"\b(?:mistake|error|wrong|incorrect|should|instead|not|isn't|fix|check|recheck"
    r"|double[- ]check|slip|careful|look again|redo|recalculate|re-calculate|actually|oops"
    r"|typo|off)\b",
    re.I,
)
_ORDINALS = ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth")
_STEP_REF = re.compile(r"\b(?:step|line)\s*#?\s*(\d+)\b", re.I)


def _step_mentioned(response: str, step: int) -> bool:
    if any(int(m.group(1)) == step for m in _STEP_REF.finditer(response)):
        return True
    if step <= len(_ORDINALS):
        ordinal = _ORDINALS[step - 1]
        return (
            re.search(rf"\b{ordinal} (?:step|line|part|calculation)\b", response, re.I) is not None
        )
    return False


def _numbers_outside_refs(response: str) -> set[str]:
    return set(numbers_in(_STEP_REF.sub(" ", response)))


class PraisesWork(_Kind):
    """Says something the student did right (a praise word, not negated in its clause)."""

    kind: Literal["praises_work"] = "praises_work"

    def fn(self) -> CheckFn:
        def check(response: str, work: Any) -> tuple[bool | None, str | None]:
            if not isinstance(work, WorkedSolution):
                return None, None
            for m in _PRAISE.finditer(response):
                if not _NEGATION.search(response[max(0, m.start() - 30) : m.start()]):
                    return True, None
            return False, None

        return check


class NamesFix(_Kind):
    """For flawed work: points at the slip (its step, or the wrong or right value) with a
    correction cue; not applicable to correct work."""

    kind: Literal["names_fix"] = "names_fix"

    def fn(self) -> CheckFn:
        def check(response: str, work: Any) -> tuple[bool | None, str | None]:
            if not isinstance(work, WorkedSolution) or work.flaw is None:
                return None, None
            flaw = work.flaw
            evidence = f"step {flaw.step}: {flaw.wrong_value} -> {flaw.right_value}"
            values = _numbers_outside_refs(response)
            pointed = _step_mentioned(response, flaw.step) or bool(
                values & {flaw.wrong_value, flaw.right_value}
            )
            return (True, None) if pointed and _FIX_CUE.search(response) else (False, evidence)

        return check


class CitesWork(_Kind):
    """Quotes a number from the student's work (or the slipped step's right value)."""

    kind: Literal["cites_work"] = "cites_work"

    def fn(self) -> CheckFn:
        def check(response: str, work: Any) -> tuple[bool | None, str | None]:
            if not isinstance(work, WorkedSolution):
                return None, None
            wanted = set(work.numbers()) | ({work.flaw.right_value} if work.flaw else set())
            return bool(_numbers_outside_refs(response) & wanted), None

        return check


CheckKind = Annotated[
    PatternAbsent
    | PatternPresent
    | MaxWords
    | MaxSentences
    | StartsWith
    | EndsWith
    | StatesNumber
    | NumberFirst
    | NoBold
    | NoHeaders
    | NoNumberedList
    | NoBullets
    | NoMarkdown
    | PraisesWork
    | NamesFix
    | CitesWork,
    Field(discriminator="kind"),
]
"""Discriminated union (by ``kind``) of every check kind."""

CHECK_KINDS = (
    "pattern_absent", "pattern_present", "max_words", "max_sentences", "starts_with",
    "ends_with", "states_number", "number_first", "no_bold", "no_headers", "no_numbered_list",
    "no_bullets", "no_markdown", "praises_work", "names_fix", "cites_work",
)  # fmt: skip


def build_check(name: str, description: str, kind: _Kind) -> Check[Any]:
    """The :class:`Check` named ``name`` of a check kind."""
    return Check(name, description, kind.fn())
