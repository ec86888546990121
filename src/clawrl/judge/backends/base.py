"""What every judge backend provides, and the text-to-vote step shared by generative backends."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from clawrl.judge.parse import parse_hint, parse_score
from clawrl.judge.types import AbstainReason, BackendKind, HintStatus, JudgeInput, Vote


@runtime_checkable
class JudgeBackend(Protocol):
    """A source of votes.

    Attributes:
        kind: which backend this is.
        model: the judge model's name, recorded on every judgment.
        batched: ``True`` when all votes of one judgment come from one call (choice mode: one
            forward pass); ``False`` when each vote is its own call, so the judge runs one task
            per vote and a slow vote times out alone.
        writes_hints: ``True`` when votes carry ``<hint>`` tags (generative, openai); ``False``
            when hints come from :func:`clawrl.judge.hints.extract_directive` (choice).
    """

    kind: BackendKind
    model: str
    batched: bool
    writes_hints: bool

    async def votes(self, inp: JudgeInput, indices: Sequence[int]) -> list[Vote]:
        """Produce the votes numbered ``indices`` for ``inp``, one per index, in that order.

        Expected failures (engine errors, HTTP errors after retries, unparseable output) are
        returned as abstentions, not raised. Cancellation (the judge's timeout) must be honoured
        promptly.
        """
        ...

    async def aclose(self) -> None:
        """Release connections; the backend takes no more calls."""
        ...


def vote_from_text(
    index: int,
    text: str,
    *,
    seed: int | None = None,
    latency_s: float = 0.0,
    truncated: bool = False,
) -> Vote:
    """Parse one generated output into a :class:`Vote` (score field and hint tag).

    Args:
        index: the vote's index.
        text: the raw output.
        seed: the sampling seed used.
        latency_s: seconds the vote took.
        truncated: the output hit its token limit (noted in the detail of an abstention).

    Returns:
        The vote; an abstention carries the parse reason.
    """
    score = parse_score(text)
    hint = parse_hint(text)
    detail = score.detail
    if score.score is None and truncated:
        detail = f"{detail}; output cut at max_tokens"
    return Vote(
        index=index,
        score=score.score,
        abstain_reason=score.reason,
        detail=detail,
        raw=text,
        hint=hint.text,
        hint_status=hint.status,
        seed=seed,
        latency_s=max(latency_s, 0.0),
    )


def failed_vote(index: int, reason: AbstainReason, detail: str, *, seed: int | None = None) -> Vote:
    """An abstention for a vote that produced no output (timeout, backend error)."""
    return Vote(
        index=index,
        score=None,
        abstain_reason=reason,
        detail=detail,
        hint_status=HintStatus.ABSENT,
        seed=seed,
    )
