"""Typed inputs and outputs of the PRM judge.

Input: :class:`JudgeInput` = the request context (system prompt, last user message, optional
earlier messages), the judged turn's output (content + tool calls) and the next state (its text
and who produced it). Output: :class:`Judgment` (score, votes, abstentions, raw outputs, backend,
latency) with an optional :class:`Hint`.

These types import neither torch nor the store, so the judge can be driven by anything that can
describe a turn (the trajectory linker, the labeled set, tests).
"""

from __future__ import annotations

from enum import IntEnum, StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from clawrl.chat.types import ChatMessage, ToolCall
from clawrl.trajectory.next_state import NextStateRole


class Score(IntEnum):
    """A turn's score: +1 the next state shows it worked, -1 it failed, 0 no evidence."""

    GOOD = 1
    BAD = -1
    NEUTRAL = 0

    @property
    def label(self) -> str:
        """``"+1"``, ``"-1"`` or ``"0"``."""
        return "0" if self == 0 else f"{int(self):+d}"


class BackendKind(StrEnum):
    """Judge backends (see :mod:`clawrl.judge.backends`)."""

    GENERATIVE = "generative"  # local engine, sampled free-form verdicts
    CHOICE = "choice"  # local engine, calibrated log-probs of the allowed verdicts
    HEAD = "head"  # local judge model, trained probes on its hidden states (the default)
    OPENAI = "openai"  # any OpenAI-compatible ``/chat/completions`` endpoint
    FEEDBACK = "feedback"  # no backend: explicit feedback used as given


class AbstainReason(StrEnum):
    """Why one vote gave no score. An abstention is never counted as -1 or 0."""

    NO_SCORE_FIELD = "no_score_field"  # no line starting with ``Score:``
    INVALID_SCORE = "invalid_score"  # the last ``Score:`` line holds no single +1 / -1 / 0
    REFUSAL = "refusal"  # the model declined to judge (and wrote no valid score line)
    EMPTY = "empty"  # the output was empty
    LOW_MARGIN = "low_margin"  # choice mode: the best verdict did not beat the runner-up
    TIMEOUT = "timeout"  # the vote did not finish within the judge's timeout
    BACKEND_ERROR = "backend_error"  # the engine or endpoint failed (after retries)


class HintStatus(StrEnum):
    """What one vote's hint tag held (see :func:`clawrl.judge.parse.parse_hint`)."""

    OK = "ok"
    ABSENT = "absent"  # no ``<hint>`` tag
    NONE = "none"  # the tag says there is no directive (empty, ``none``, ``N/A`` ...)
    TOO_SHORT = "too_short"
    TOO_LONG = "too_long"
    UNTERMINATED = "unterminated"  # ``<hint>`` never closed


class HintSelection(StrEnum):
    """How the returned hint was chosen."""

    SINGLE = "single"  # exactly one valid vote carried a hint
    CONSENSUS = "consensus"  # the candidate with the highest mean overlap with the others
    HEURISTIC = "heuristic"  # choice mode: a directive sentence copied from the next state
    FEEDBACK = "feedback"  # the comment of explicit feedback


class NoJudgmentReason(StrEnum):
    """Why a judgment has no score."""

    ALL_ABSTAINED = "all_abstained"  # every vote abstained (the votes say why)
    TIMEOUT = "timeout"  # every vote abstained because the judge ran out of time
    JUDGE_ERROR = "judge_error"  # the judge raised a JudgeError (recorded by the judge worker)


class JudgeContext(BaseModel):
    """What the policy saw when it produced the judged turn.

    Attributes:
        system: the system prompt, if any.
        user: the last user message before the turn (``None`` if the turn followed a tool
            result with no user message in between — then ``history`` should carry it).
        history: earlier messages, oldest first (optional; prompts show only the last few).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    system: str | None = None
    user: str | None = None
    history: list[ChatMessage] = Field(default_factory=list)


class TurnOutput(BaseModel):
    """The judged turn: what the policy answered.

    Attributes:
        content: the visible text (``None`` or ``""`` when the turn only called tools).
        tool_calls: the calls it made, in order.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    content: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)


class NextStateText(BaseModel):
    """The next state as the judge reads it: who produced it and its text (the trajectory's
    :class:`~clawrl.trajectory.NextState`, which holds ids, messages and links, rendered to text
    by :func:`clawrl.judge.worker.judge_input`).

    Attributes:
        role: who produced it (:class:`NextStateRole`).
        text: the user's message, the tool output, the verifier line, or the feedback comment
            (``""`` when there is none, e.g. a tool that printed nothing).
        reward: explicit feedback only: the reward in [-1, 1] as given (``None`` otherwise).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    role: NextStateRole
    text: str = ""
    reward: float | None = Field(default=None, ge=-1.0, le=1.0)

    @model_validator(mode="after")
    def _reward_only_for_feedback(self) -> NextStateText:
        if self.reward is not None and self.role != NextStateRole.FEEDBACK:
            raise ValueError(f"only feedback carries a reward, not {self.role.value}")
        return self


class JudgeInput(BaseModel):
    """Everything the judge sees about one turn."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    context: JudgeContext
    output: TurnOutput
    next_state: NextStateText


class Vote(BaseModel):
    """One independent judge sample.

    Attributes:
        index: 0-based position among the judgment's votes.
        score: the parsed score, or ``None`` for an abstention.
        abstain_reason: set exactly when ``score is None``.
        detail: free text explaining an abstention or a backend error.
        raw: the raw output (generated text; for choice mode, the calibrated verdict scores).
        hint: this vote's hint text when its tag was valid (``None`` otherwise).
        hint_status: what the hint tag held.
        seed: the sampling seed (generative/openai) or the template number (choice).
        latency_s: seconds this vote took (0 when it never finished).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    index: int = Field(ge=0)
    score: Score | None
    abstain_reason: AbstainReason | None = None
    detail: str | None = None
    raw: str = ""
    hint: str | None = None
    hint_status: HintStatus = HintStatus.ABSENT
    seed: int | None = None
    latency_s: float = Field(default=0.0, ge=0.0)

    @model_validator(mode="after")
    def _reason_iff_abstained(self) -> Vote:
        if (self.score is None) != (self.abstain_reason is not None):
            raise ValueError("abstain_reason is set exactly when score is None")
        return self


class Hint(BaseModel):
    """A hindsight hint: 1-3 sentences on how the turn should have been done.

    Attributes:
        text: the hint.
        supporting_votes: indices of the votes whose hint agrees with ``text`` (token-overlap
            F1 >= :data:`clawrl.judge.hints.SUPPORT_THRESHOLD`), the chosen vote included.
            Empty for heuristic and feedback hints.
        selection: how it was chosen.
        support: mean ROUGE-1 F1 of the chosen hint against the other candidates (0 when
            there is a single candidate or none).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    text: str
    supporting_votes: list[int] = Field(default_factory=list)
    selection: HintSelection
    support: float = 0.0


class Judgment(BaseModel):
    """The judge's verdict on one turn.

    Attributes:
        score: majority of the valid votes (ties give 0), the sign of explicit feedback, or
            ``None`` when there is no judgment.
        no_judgment_reason: set exactly when ``score is None``.
        detail: a human-readable account of a missing judgment (e.g. abstention counts).
        votes: every vote, abstentions included, in index order (empty for feedback).
        hint: the selected hint, if any.
        backend: which backend produced it.
        model: the judge model's name (spec, endpoint model or ``""``).
        latency_s: wall-clock seconds of the whole judgment.
        reward: explicit feedback only: the reward as given, in [-1, 1].
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    score: Score | None
    no_judgment_reason: NoJudgmentReason | None = None
    detail: str | None = None
    votes: list[Vote] = Field(default_factory=list)
    hint: Hint | None = None
    backend: BackendKind
    model: str = ""
    latency_s: float = Field(default=0.0, ge=0.0)
    reward: float | None = None

    @model_validator(mode="after")
    def _reason_iff_no_score(self) -> Judgment:
        if (self.score is None) != (self.no_judgment_reason is not None):
            raise ValueError("no_judgment_reason is set exactly when score is None")
        return self

    @property
    def valid_votes(self) -> list[Vote]:
        """Votes with a score."""
        return [v for v in self.votes if v.score is not None]

    @property
    def abstentions(self) -> list[Vote]:
        """Votes without a score."""
        return [v for v in self.votes if v.score is None]

    @property
    def raw_outputs(self) -> list[str]:
        """The raw output of every vote, in index order."""
        return [v.raw for v in self.votes]

    def metrics(self) -> dict[str, Any]:
        """``/``-namespaced metrics of this judgment (counts, seconds)."""
        out: dict[str, Any] = {
            "judge/votes": len(self.votes),
            "judge/votes_valid": len(self.valid_votes),
            "judge/votes_abstained": len(self.abstentions),
            "judge/latency_s": self.latency_s,
            "judge/has_score": int(self.score is not None),
            "judge/has_hint": int(self.hint is not None),
        }
        for v in self.abstentions:
            assert v.abstain_reason is not None
            key = f"judge/abstain/{v.abstain_reason.value}"
            out[key] = out.get(key, 0) + 1
        return out
