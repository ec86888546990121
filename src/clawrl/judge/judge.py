"""The judge: m votes under one deadline, majority, hint; explicit feedback used as given.

:meth:`Judge.judge` never waits longer than ``timeout_s`` (plus the time to cancel): votes still
running at the deadline are cancelled and recorded as ``timeout`` abstentions, and the judgment
is made from the votes that finished. Backend failures are abstentions too. Neither raises, so a
slow or failing judge costs its caller (a background worker, off the serving path) at most
``timeout_s`` per turn and never an exception for an expected failure.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from clawrl.errors import ClawrlError
from clawrl.judge.backends.base import JudgeBackend, failed_vote
from clawrl.judge.hints import DEFAULT_QUORUM, extract_directive, select_hint
from clawrl.judge.types import (
    AbstainReason,
    BackendKind,
    Hint,
    HintSelection,
    JudgeInput,
    Judgment,
    NextStateRole,
    Score,
    Vote,
)
from clawrl.judge.votes import majority


def feedback_score(reward: float) -> Score:
    """The score of explicit feedback: the sign of its reward (0 stays 0)."""
    if reward > 0:
        return Score.GOOD
    if reward < 0:
        return Score.BAD
    return Score.NEUTRAL


def feedback_judgment(inp: JudgeInput) -> Judgment:
    """Explicit feedback (role ``feedback`` with a reward) as a judgment, without votes.

    The score is the sign of the reward and ``reward`` keeps its value; the comment's directive
    sentences (:func:`clawrl.judge.hints.extract_directive`) become the hint.

    Raises:
        ValueError: ``inp`` is not explicit feedback with a reward.
    """
    ns = inp.next_state
    if ns.role != NextStateRole.FEEDBACK or ns.reward is None:
        raise ValueError("feedback_judgment needs a feedback next state with a reward")
    found = extract_directive(ns.text, NextStateRole.FEEDBACK, negative=ns.reward < 0)
    hint = Hint(text=found.text, selection=HintSelection.FEEDBACK) if found else None
    return Judgment(
        score=feedback_score(ns.reward),
        backend=BackendKind.FEEDBACK,
        hint=hint,
        reward=ns.reward,
    )


def judgment_from_votes(
    inp: JudgeInput,
    votes: Sequence[Vote],
    *,
    backend: BackendKind,
    model: str = "",
    writes_hints: bool = True,
    hint_quorum: float = DEFAULT_QUORUM,
    latency_s: float = 0.0,
) -> Judgment:
    """Aggregate votes into a judgment: the majority (:func:`clawrl.judge.votes.majority`)
    and the hint (:func:`~clawrl.judge.hints.select_hint` when the votes write hints, else
    :func:`~clawrl.judge.hints.extract_directive`); a judgment without a score has no hint.

    Also used to re-judge with the first k votes of a recorded judgment (votes are independent
    of m: vote i has the same seed or template whatever m is).
    """
    tally = majority(votes)
    hint: Hint | None = None
    if tally.score is not None:
        if writes_hints:
            hint = select_hint(votes, quorum=hint_quorum)
        else:
            hint = extract_directive(
                inp.next_state.text, inp.next_state.role, negative=tally.score == -1
            )
    detail = tally.detail
    if tally.tie:
        counts = ", ".join(f"{s.label}: {n}" for s, n in sorted(tally.counts.items()))
        detail = f"tie ({counts}) gives 0"
    return Judgment(
        score=tally.score,
        no_judgment_reason=tally.reason,
        detail=detail,
        votes=list(votes),
        hint=hint,
        backend=backend,
        model=model,
        latency_s=latency_s,
    )


class Judge:
    """Majority-voted turn scores and hindsight hints.

    Args:
        backend: where the votes come from.
        votes: m, the number of independent votes per judgment.
        timeout_s: wall-clock limit of one judgment (seconds).
        hint_quorum: see :func:`clawrl.judge.hints.select_hint`.

    Raises:
        ValueError: ``votes < 1`` or ``timeout_s <= 0``.
    """

    def __init__(
        self,
        backend: JudgeBackend,
        *,
        votes: int = 3,
        timeout_s: float = 60.0,
        hint_quorum: float = DEFAULT_QUORUM,
    ) -> None:
        if votes < 1:
            raise ValueError(f"votes must be >= 1, got {votes}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.backend = backend
        self.votes = votes
        self.timeout_s = timeout_s
        self.hint_quorum = hint_quorum

    async def judge(self, inp: JudgeInput) -> Judgment:
        """Judge one turn.

        Explicit feedback with a reward is returned as given (:func:`feedback_judgment`).
        Otherwise m votes run concurrently; the score is their majority
        (:func:`clawrl.judge.votes.majority`: ties give 0, all abstentions give no judgment)
        and the hint comes from the votes (:func:`~clawrl.judge.hints.select_hint`) or, for
        backends that write none, from :func:`~clawrl.judge.hints.extract_directive`. A judgment
        without a score carries no hint.

        Returns:
            The :class:`Judgment`; never raises for timeouts or backend failures.
        """
        if inp.next_state.role == NextStateRole.FEEDBACK and inp.next_state.reward is not None:
            return feedback_judgment(inp)
        start = time.perf_counter()
        votes = await self._collect(inp)
        return judgment_from_votes(
            inp,
            votes,
            backend=self.backend.kind,
            model=self.backend.model,
            writes_hints=self.backend.writes_hints,
            hint_quorum=self.hint_quorum,
            latency_s=time.perf_counter() - start,
        )

    async def judge_many(
        self, inputs: Sequence[JudgeInput], *, concurrency: int = 8
    ) -> list[Judgment]:
        """Judge several turns, at most ``concurrency`` at a time; results in input order."""
        gate = asyncio.Semaphore(max(1, concurrency))

        async def one(inp: JudgeInput) -> Judgment:
            async with gate:
                return await self.judge(inp)

        return list(await asyncio.gather(*(one(i) for i in inputs)))

    async def aclose(self) -> None:
        """Close the backend."""
        await self.backend.aclose()

    async def _collect(self, inp: JudgeInput) -> list[Vote]:
        indices = list(range(self.votes))
        groups = [indices] if self.backend.batched else [[i] for i in indices]
        tasks = {asyncio.ensure_future(self.backend.votes(inp, g)): g for g in groups}
        done, pending = await asyncio.wait(tasks, timeout=self.timeout_s)
        by_index: dict[int, Vote] = {}
        for task in pending:
            task.cancel()
            task.add_done_callback(_retrieve)
            for i in tasks[task]:
                by_index[i] = failed_vote(
                    i, AbstainReason.TIMEOUT, f"no answer within {self.timeout_s:g}s"
                )
        for task in done:
            group = tasks[task]
            error = task.exception()
            if error is None:
                for vote in task.result():
                    by_index[vote.index] = vote
            elif isinstance(error, ClawrlError):
                for i in group:
                    by_index[i] = failed_vote(i, AbstainReason.BACKEND_ERROR, str(error))
            else:
                raise error  # a bug, not an expected failure
        missing = "the backend returned no vote with this index"
        return [
            by_index.get(i) or failed_vote(i, AbstainReason.BACKEND_ERROR, missing) for i in indices
        ]


def _retrieve(task: asyncio.Future[list[Vote]]) -> None:
    """Consume a cancelled vote task's outcome so asyncio does not log it as unretrieved."""
    if not task.cancelled():
        task.exception()
