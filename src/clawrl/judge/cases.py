"""The labeled judge set: turns with their right score and whether a hint exists.

Format: JSONL, one :class:`JudgeCase` per line::

    {"id": "correction-03", "category": "correction",
     "input": {"context": {"system": "...", "user": "..."},
               "output": {"content": "...", "tool_calls": [{"name": "...", "arguments": {}}]},
               "next_state": {"role": "user", "text": "..."}},
     "expected_score": -1, "has_hint": true, "reference_hint": "..."}

The shipped set (``clawrl/data/judge_cases.jsonl``, :func:`default_cases_path`) was written by
hand for clawrl: user replies (praise, neutral, redo, complaint, correction with a directive) in
varied phrasing, tool outputs (success, error, empty) and test verdicts (pass, fail).
"""

from __future__ import annotations

import json
from enum import StrEnum
from importlib import resources
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from clawrl.errors import JudgeError
from clawrl.judge.types import JudgeInput, Score


class CaseCategory(StrEnum):
    """What kind of next state a case has."""

    PRAISE = "praise"
    NEUTRAL = "neutral"
    REDO = "redo"
    COMPLAINT = "complaint"
    CORRECTION = "correction"  # a correction carrying a directive
    TOOL_SUCCESS = "tool_success"
    TOOL_ERROR = "tool_error"
    TOOL_EMPTY = "tool_empty"
    TEST_PASS = "test_pass"
    TEST_FAIL = "test_fail"


class JudgeCase(BaseModel):
    """One labeled turn.

    Attributes:
        id: unique, ``<category>-<nn>``.
        category: see :class:`CaseCategory`.
        input: what the judge sees.
        expected_score: the right score.
        has_hint: whether the next state carries a directive a hint should restate.
        reference_hint: a correct hint, for reading results (not used for scoring).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    category: CaseCategory
    input: JudgeInput
    expected_score: Score
    has_hint: bool
    reference_hint: str | None = None


def default_cases_path() -> Path:
    """Path of the shipped labeled set."""
    return Path(str(resources.files("clawrl") / "data" / "judge_cases.jsonl"))


BLIND_SHA256 = "e002aa0d6797e2cf09ff539d96751d70fdc31f95da809d827cc05f593f906d78"
"""SHA-256 of the blind set as frozen (``clawrl/data/judge_blind_cases.sha256``)."""


def blind_cases_path() -> Path:
    """Path of the blind held-out set: 210 cases written, before the trained judge existed,
    by someone who never saw the judge's prompts or outputs; never used for training or
    tuning (frozen: its SHA-256 is :data:`BLIND_SHA256`)."""
    return Path(str(resources.files("clawrl") / "data" / "judge_blind_cases.jsonl"))


BLIND_B_SHA256 = "0573505756af6e22aa003c5e249174a9d1a6f96ed83c75b0f871a84d5f095e9f"
"""SHA-256 of the second blind set as frozen (``clawrl/data/judge_blind_b_cases.sha256``)."""


def blind_b_cases_path() -> Path:
    """Path of the second blind held-out set: 240 cases written by someone who never saw the
    judge's code, prompts, cases or outputs, and frozen (its SHA-256 is
    :data:`BLIND_B_SHA256`) before any judge was scored on it. It exists because the first
    blind set was scored three times while heads were compared and then became training data
    for the next head: the first set is no longer held out, this one is."""
    return Path(str(resources.files("clawrl") / "data" / "judge_blind_b_cases.jsonl"))


def load_cases(path: str | Path | None = None) -> list[JudgeCase]:
    """Read a labeled set (default: the shipped one).

    Raises:
        JudgeError: the file is missing, a line is not valid JSON or not a valid case, or two
            cases share an id (the message names the line).
    """
    p = Path(path) if path is not None else default_cases_path()
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise JudgeError(f"cannot read judge cases {p}: {e}") from e
    cases: list[JudgeCase] = []
    seen: set[str] = set()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            case = JudgeCase.model_validate(json.loads(line))
        except (json.JSONDecodeError, ValidationError) as e:
            raise JudgeError(f"{p} line {n}: not a valid judge case: {e}") from e
        if case.id in seen:
            raise JudgeError(f"{p} line {n}: duplicate case id {case.id!r}")
        seen.add(case.id)
        cases.append(case)
    return cases
