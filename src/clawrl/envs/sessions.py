"""Training conversations: simulated users talking to the gateway, one session per problem.

A session (:func:`run_session`):

1. the user's opening message; the policy answers (turn 0);
2. the user reacts in natural language (:meth:`SimulatedUser.respond`) — that reply is the
   turn's *next state* for the PRM judge — and the policy answers again; up to ``max_turns``
   judged answers. The user stops early once satisfied;
3. the user's last reply (thanks, or a sign-off that still names what is wrong) is sent as one
   more *closing call* (``closing_max_tokens`` tokens, not judged by the simulator), so the
   last judged answer has a next state too; ``closing_call=False`` skips it;
4. ``POST /v1/sessions/{id}/end``.

Every call goes to ``/s/{session_id}/v1/chat/completions``, so attribution is exact, and the
gateway's turn id comes back in the log with the simulator's ground truth
(:meth:`SessionLog.ground_truth`), which lets the demo measure the judge's agreement.

A failed call (:class:`~clawrl.envs.errors.ChatEndpointError`) ends that session with
``error`` set; the other sessions go on (a bad rollout is data, not a crash).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from clawrl.envs.client import DEFAULT_TIMEOUT_S, ChatClient
from clawrl.envs.errors import ChatEndpointError
from clawrl.envs.phrasing import stable_int
from clawrl.envs.problems import Problem
from clawrl.envs.user import Assessment, Message, SimulatedUser

DEFAULT_MAX_TURNS = 8
"""Judged policy answers per session at most."""
DEFAULT_MODEL = "policy"
"""Model name sent to the gateway (it serves its policy under any name)."""
CLOSING_MAX_TOKENS = 16


@dataclass
class TurnLog:
    """One policy call in a session.

    Attributes:
        index: 0-based position in the session.
        user_message: the user message the policy answered.
        response: the policy's answer.
        finish_reason: as the gateway reported it.
        turn_id: the gateway's turn id (``None`` when the server sent none).
        policy_version: the policy version that answered, when the server reports it.
        assessment: the simulator's ground truth about ``response``; ``None`` for the closing
            call.
        reply: the user's reaction to ``response`` (``None`` for the closing call).
        latency_s: seconds the call took.
    """

    index: int
    user_message: str
    response: str
    finish_reason: str | None
    turn_id: str | None
    policy_version: int | None
    assessment: Assessment | None
    reply: str | None
    latency_s: float

    @property
    def closing(self) -> bool:
        """Whether this is the closing call (carries the user's last reply, not judged)."""
        return self.assessment is None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "index": self.index,
            "user_message": self.user_message,
            "response": self.response,
            "finish_reason": self.finish_reason,
            "turn_id": self.turn_id,
            "policy_version": self.policy_version,
            "assessment": self.assessment.to_dict() if self.assessment else None,
            "reply": self.reply,
            "latency_s": self.latency_s,
        }


@dataclass
class SessionLog:
    """One simulated conversation.

    Attributes:
        session_id: the id sent to the gateway.
        problem_id: the problem's id.
        scenario: ``student`` or ``teacher``.
        user_kind: ``rule`` or ``llm``.
        turns: every policy call, in order (the closing call last).
        satisfied: the user ended satisfied.
        ended: the gateway acknowledged the session end.
        error: why the session stopped early (a failed call), else ``None``.
        wall_s: seconds the session took.
    """

    session_id: str
    problem_id: str
    scenario: str
    user_kind: str
    turns: list[TurnLog] = field(default_factory=list)
    satisfied: bool = False
    ended: bool = False
    error: str | None = None
    wall_s: float = 0.0

    @property
    def judged_turns(self) -> list[TurnLog]:
        """Turns the simulator assessed (all but the closing call)."""
        return [t for t in self.turns if t.assessment is not None]

    def ground_truth(self) -> dict[str, Assessment]:
        """Gateway turn id -> the simulator's assessment, for judged turns with an id."""
        return {
            t.turn_id: t.assessment
            for t in self.turns
            if t.turn_id is not None and t.assessment is not None
        }

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "session_id": self.session_id,
            "problem_id": self.problem_id,
            "scenario": self.scenario,
            "user_kind": self.user_kind,
            "satisfied": self.satisfied,
            "ended": self.ended,
            "error": self.error,
            "wall_s": self.wall_s,
            "turns": [t.to_dict() for t in self.turns],
        }


async def run_session(
    client: ChatClient,
    user: SimulatedUser,
    problem: Problem,
    *,
    session_id: str,
    model: str = DEFAULT_MODEL,
    temperature: float | None = None,
    max_tokens: int | None = 256,
    max_turns: int = DEFAULT_MAX_TURNS,
    closing_call: bool = True,
    closing_max_tokens: int = CLOSING_MAX_TOKENS,
    system_prompt: str | None = None,
    seed: int | None = None,
) -> SessionLog:
    """One conversation between ``user`` and the policy (see the module docstring).

    Args:
        client: a client of the gateway.
        user: the simulated user.
        problem: the problem the user brings.
        session_id: the gateway session id.
        model: the model name to request.
        temperature: policy sampling temperature (``None``: the gateway's default).
        max_tokens: new tokens per answer at most (``None``: the gateway's default).
        max_turns: judged answers at most (>= 1).
        closing_call: send the user's last reply as one more call.
        closing_max_tokens: new tokens for the closing call's answer.
        system_prompt: a system message to start every conversation with.
        seed: the base of every call's sampling seed (call ``n`` sends
            :func:`request_seed` ``(seed, session_id, n)``); ``None``: unseeded sampling.

    Returns:
        The log; ``error`` is set when a call failed (the session stops there).

    Raises:
        ValueError: ``max_turns < 1``.
    """
    if max_turns < 1:
        raise ValueError(f"max_turns must be >= 1, got {max_turns}")
    start = time.perf_counter()
    task = user.start(problem)
    log = SessionLog(session_id, problem.id, user.scenario, user.kind.value)
    messages: list[Message] = (
        [{"role": "system", "content": system_prompt}] if system_prompt else []
    )
    messages.append({"role": "user", "content": task.opening})
    try:
        for turn in range(max_turns):
            result = await client.complete(
                messages,
                model=model,
                temperature=temperature,
                max_tokens=max_tokens,
                session_id=session_id,
                seed=request_seed(seed, session_id, turn),
            )
            final = turn == max_turns - 1
            reply = await user.respond(task, messages, result.content, turn=turn, final=final)
            log.turns.append(
                TurnLog(
                    index=turn,
                    user_message=str(messages[-1]["content"]),
                    response=result.content,
                    finish_reason=result.finish_reason,
                    turn_id=result.turn_ids[0] if result.turn_ids else None,
                    policy_version=result.policy_version,
                    assessment=reply.assessment,
                    reply=reply.text,
                    latency_s=result.latency_s,
                )
            )
            messages += [
                {"role": "assistant", "content": result.content},
                {"role": "user", "content": reply.text},
            ]
            log.satisfied = reply.assessment.satisfied
            if reply.done:
                break
        if closing_call:
            result = await client.complete(
                messages,
                model=model,
                temperature=temperature,
                max_tokens=closing_max_tokens,
                session_id=session_id,
                seed=request_seed(seed, session_id, len(log.turns)),
            )
            log.turns.append(
                TurnLog(
                    index=len(log.turns),
                    user_message=str(messages[-1]["content"]),
                    response=result.content,
                    finish_reason=result.finish_reason,
                    turn_id=result.turn_ids[0] if result.turn_ids else None,
                    policy_version=result.policy_version,
                    assessment=None,
                    reply=None,
                    latency_s=result.latency_s,
                )
            )
    except ChatEndpointError as e:
        log.error = str(e)
    if log.turns:
        try:
            await client.end_session(session_id)
            log.ended = True
        except ChatEndpointError as e:
            log.error = log.error or f"ending the session failed: {e}"
    log.wall_s = time.perf_counter() - start
    return log


def request_seed(seed: int | None, session_id: str, call: int) -> int | None:
    """The sampling seed of a session's ``call``-th call (``None`` when ``seed`` is): fixed by
    the run's seed, the session id and the call, whatever else is in flight."""
    return None if seed is None else stable_int(seed, session_id, call) % 2**31


def new_run_id() -> str:
    """A short random id that keeps session ids of separate runs apart."""
    return uuid.uuid4().hex[:8]


async def arun_sessions(
    base_url: str,
    user: SimulatedUser,
    problems: Sequence[Problem],
    *,
    concurrency: int = 4,
    model: str = DEFAULT_MODEL,
    temperature: float | None = None,
    max_tokens: int | None = 256,
    max_turns: int = DEFAULT_MAX_TURNS,
    closing_call: bool = True,
    system_prompt: str | None = None,
    api_key: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    session_prefix: str = "sim-",
    progress: Callable[[SessionLog], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    seed: int | None = None,
    run_id: str | None = None,
) -> list[SessionLog]:
    """Run one session per problem against the gateway, ``concurrency`` at a time.

    Session ids are ``{session_prefix}{scenario}-{run id}-{index}-{problem id}``.

    Args:
        base_url: the gateway (``http://127.0.0.1:8000``, with or without ``/v1``).
        user: the simulated user.
        problems: one session each, started in this order.
        concurrency: sessions in flight at once (>= 1).
        model, temperature, max_tokens, max_turns, closing_call, system_prompt: as
            :func:`run_session`.
        api_key: the gateway's API key, if it requires one.
        timeout_s: per-request timeout, seconds.
        session_prefix: prefix of every session id (``eval-`` is reserved for evaluation).
        progress: called with each finished session's log (in the event loop's thread).
        should_stop: polled before each session starts; ``True`` starts no more (sessions in
            flight finish).
        seed: seeds every call's sampling (:func:`request_seed`); ``None``: unseeded.
        run_id: the run id in the session ids (default: a random one, :func:`new_run_id`); a
            fixed one with a seed makes every session, and so every call's seed, the same in
            two runs.

    Returns:
        The logs of the sessions that ran, in problem order.

    Raises:
        ValueError: ``concurrency < 1``, or a session prefix starting with ``eval-``.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    if session_prefix.startswith("eval-"):
        raise ValueError("session ids starting with 'eval-' are reserved for evaluation")
    run_id = run_id or new_run_id()
    sem = asyncio.Semaphore(concurrency)
    results: list[SessionLog | None] = [None] * len(problems)

    async with ChatClient(base_url, api_key=api_key, timeout_s=timeout_s) as client:

        async def one(i: int, problem: Problem) -> None:
            async with sem:
                if should_stop is not None and should_stop():
                    return
                sid = f"{session_prefix}{user.scenario}-{run_id}-{i}-{problem.id}"
                log = await run_session(
                    client,
                    user,
                    problem,
                    session_id=sid,
                    model=model,
                    temperature=temperature,
                    max_tokens=max_tokens,
                    max_turns=max_turns,
                    closing_call=closing_call,
                    system_prompt=system_prompt,
                    seed=seed,
                )
                results[i] = log
                if progress is not None:
                    progress(log)

        await asyncio.gather(*(one(i, p) for i, p in enumerate(problems)))
    return [r for r in results if r is not None]


def run_sessions(
    base_url: str,
    user: SimulatedUser,
    problems: Sequence[Problem],
    *,
    concurrency: int = 4,
    model: str = DEFAULT_MODEL,
    temperature: float | None = None,
    max_tokens: int | None = 256,
    max_turns: int = DEFAULT_MAX_TURNS,
    closing_call: bool = True,
    system_prompt: str | None = None,
    api_key: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    session_prefix: str = "sim-",
    progress: Callable[[SessionLog], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    seed: int | None = None,
    run_id: str | None = None,
) -> list[SessionLog]:
    """Synchronous :func:`arun_sessions` (same arguments; runs its own event loop, so call it
    from a plain thread — from async code, await :func:`arun_sessions`).

    Raises:
        ValueError: as :func:`arun_sessions`.
    """
    return asyncio.run(
        arun_sessions(
            base_url,
            user,
            problems,
            concurrency=concurrency,
            model=model,
            temperature=temperature,
            max_tokens=max_tokens,
            max_turns=max_turns,
            closing_call=closing_call,
            system_prompt=system_prompt,
            api_key=api_key,
            timeout_s=timeout_s,
            session_prefix=session_prefix,
            progress=progress,
            should_stop=should_stop,
            seed=seed,
            run_id=run_id,
        )
    )
