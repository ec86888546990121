"""Helpers for judge tests: inputs, a scripted backend, vote builders."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from clawrl.judge import (
    AbstainReason,
    BackendKind,
    JudgeContext,
    JudgeInput,
    NextStateRole,
    NextStateText,
    Score,
    TurnOutput,
    Vote,
)
from clawrl.judge.backends import vote_from_text


def make_input(text: str = "Thanks, that worked!", role: str = "user", **kw) -> JudgeInput:
    """A small turn whose next state is ``text`` from ``role``."""
    return JudgeInput(
        context=JudgeContext(system="You are helpful.", user="What is 2+2?"),
        output=TurnOutput(content="4"),
        next_state=NextStateText(role=NextStateRole(role), text=text, **kw),
    )


def vote(index: int, score: int | None, hint: str | None = None) -> Vote:
    """A vote with ``score`` (None: abstention, reason no_score_field) and an OK hint."""
    from clawrl.judge import HintStatus

    return Vote(
        index=index,
        score=None if score is None else Score(score),
        abstain_reason=AbstainReason.NO_SCORE_FIELD if score is None else None,
        hint=hint,
        hint_status=HintStatus.OK if hint else HintStatus.ABSENT,
    )


class ScriptedBackend:
    """Returns scripted outputs per vote index, optionally after a delay (seconds) per index.

    ``outputs[i]`` may be a string (parsed like a model's output) or an exception to raise.
    """

    kind = BackendKind.GENERATIVE
    model = "scripted"
    writes_hints = True

    def __init__(self, outputs, delays=None, batched=False):
        self.outputs = list(outputs)
        self.delays = dict(delays or {})
        self.batched = batched
        self.calls: list[list[int]] = []
        self.cancelled: list[int] = []
        self.closed = False
        self.in_flight = 0
        self.max_in_flight = 0

    async def votes(self, inp: JudgeInput, indices: Sequence[int]) -> list[Vote]:
        self.calls.append(list(indices))
        out = []
        for i in indices:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                await asyncio.sleep(self.delays.get(i, 0))
            except asyncio.CancelledError:
                self.cancelled.append(i)
                raise
            finally:
                self.in_flight -= 1
            item = self.outputs[i % len(self.outputs)]
            if isinstance(item, BaseException):
                raise item
            out.append(vote_from_text(i, item, seed=i))
        return out

    async def aclose(self) -> None:
        self.closed = True


@pytest.fixture()
def inp() -> JudgeInput:
    return make_input()


@pytest.fixture()
def mk_input():
    """``mk_input(text, role, **next_state_fields) -> JudgeInput``."""
    return make_input


@pytest.fixture()
def mk_vote():
    """``mk_vote(index, score_or_None, hint=None) -> Vote``."""
    return vote


@pytest.fixture()
def scripted():
    """The :class:`ScriptedBackend` class."""
    return ScriptedBackend
