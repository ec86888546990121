"""What every simulated user is: the scenario types and the :class:`SimulatedUser` protocol.

A conversation with a simulated user (driven by :mod:`clawrl.envs.sessions`):

1. ``task = user.start(problem)`` — the opening message (and, for the teacher, the student's
   worked solution it brings);
2. for each policy response: ``reply = await user.respond(task, messages, response, turn=i,
   final=...)`` — the user's next message in natural language, whether it ends the session,
   and the :class:`Assessment`: the simulator's own ground truth about that response;
3. evaluation calls ``await user.assess(task, response)`` on the first response only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

from clawrl.envs.problems import Problem

Message = dict[str, Any]
"""An OpenAI chat message (``{"role": ..., "content": ...}``)."""


class Scenario(StrEnum):
    """The built-in scenarios (``clawrl/scenarios/*.toml``); any scenario file works too."""

    STUDENT = "student"  # wants homework answers that do not look AI-written
    TEACHER = "teacher"  # wants a comment written to the student: verdict, praise, the fix


class UserKind(StrEnum):
    """How the simulated user decides."""

    RULE = "rule"  # a written, deterministic rubric and phrase banks
    LLM = "llm"  # an LLM role-plays the user and rates each response 0-10


@dataclass(frozen=True)
class Task:
    """One problem as a simulated user brings it.

    Attributes:
        problem: the problem.
        scenario: the scenario's name (``student``, ``teacher`` or a scenario file's).
        opening: the first user message.
        context: what the rubric needs besides the problem (the teacher's
            :class:`clawrl.envs.solutions.WorkedSolution`; ``None`` for the student).
        key: a stable string seeding every phrasing choice in this conversation.
    """

    problem: Problem
    scenario: str
    opening: str
    context: Any = None
    key: str = ""


@dataclass(frozen=True)
class Assessment:
    """The simulator's ground truth about one response.

    Attributes:
        reward: +1 the response satisfied the user, -1 it did not, ``None`` unknown (an LLM
            user whose rating could not be parsed).
        score: in [0, 1]: the rubric's fraction of checks met, or the LLM's rating / 10;
            ``None`` when unknown.
        checks: check name -> passed (applicable checks; empty for an LLM user).
        failed: names of the failed checks, in rubric order.
        evidence: failed check name -> what was found (a phrase, a count).
        raw: the LLM user's full answer (``None`` for rule-based users).
    """

    reward: int | None
    score: float | None
    checks: dict[str, bool] = field(default_factory=dict)
    failed: tuple[str, ...] = ()
    evidence: dict[str, str] = field(default_factory=dict)
    raw: str | None = None

    @property
    def satisfied(self) -> bool:
        """Whether the response satisfied the user (``reward == 1``)."""
        return self.reward == 1

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "reward": self.reward,
            "score": self.score,
            "checks": dict(self.checks),
            "failed": list(self.failed),
            "evidence": dict(self.evidence),
        }


@dataclass(frozen=True)
class UserReply:
    """The simulated user's reaction to one response.

    Attributes:
        text: the user's next message, natural language (the turn's next state).
        done: the user ends the session after this message.
        assessment: the ground truth about the response it reacts to.
    """

    text: str
    done: bool
    assessment: Assessment


@runtime_checkable
class SimulatedUser(Protocol):
    """A simulated user of one scenario (rule-based or LLM-backed)."""

    scenario: str
    """The scenario's name."""
    kind: UserKind
    check_names: tuple[str, ...]
    """The rubric's check names (empty for an LLM user)."""

    def start(self, problem: Problem) -> Task:
        """The task for ``problem``: the opening message and the rubric's context."""
        ...

    async def assess(self, task: Task, response: str) -> Assessment:
        """Ground truth about ``response`` as the first answer to ``task``.

        Raises:
            ChatEndpointError: an LLM user's endpoint failed.
        """
        ...

    async def respond(
        self, task: Task, messages: list[Message], response: str, *, turn: int, final: bool
    ) -> UserReply:
        """React to ``response`` (turn ``turn``, 0-based) after ``messages`` (which end with the
        user message it answers). ``final``: no further response will be requested, so an
        unsatisfied user signs off (still naming what is wrong).

        Raises:
            ChatEndpointError: an LLM user's endpoint failed.
        """
        ...
