"""The judge worker: finds turns with a next state and no judgment, judges them, stores verdicts.

Runs as an asyncio task beside the gateway. It never blocks serving: judgments are awaited with
a timeout, and a failing judge (a time-out, a :class:`~clawrl.errors.JudgeError`) becomes a
stored "no judgment" with its reason (the trainer then counts the turn as ``drop/no_judgment``).
Harness mode judges a step's rollouts with the same code (:meth:`JudgeWorker.judge_sessions`).

Input building (:func:`judge_input`): the context is the turn's system prompt, its last user
message and the earlier messages; the output is the turn's parsed content and tool calls; the
next state is the text of the messages the environment added after the turn (user replies and
tool results, joined by blank lines) with the role the trajectory linker gave it, or explicit
feedback (``POST /v1/feedback``), which the judge takes as given. In harness mode no person
takes part in a rollout, so a worker made with ``observations=True`` judges a command's output
that the harness sent as a user message (the reference agent's and mini-swe-agent's ``Output:
... (exit code N)``) as a program's output (role ``environment``), not as a person's reply.

A turn whose session has ended and that never got a next state is stored with score ``None``
and reason ``no_next_state``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from clawrl.chat import ChatMessage, ToolCall
from clawrl.errors import JudgeError
from clawrl.judge.rules import exit_status
from clawrl.judge.types import (
    JudgeContext,
    JudgeInput,
    Judgment,
    NextStateText,
    NoJudgmentReason,
    TurnOutput,
)
from clawrl.store import DropReason, JudgmentRecord, Store, TurnKind, TurnRecord, TurnStatus
from clawrl.store.learning import WORKER_BACKEND
from clawrl.store.leases import holder_is_dead_here, judge_claim, lease_holder
from clawrl.trajectory import load_tree, next_state
from clawrl.trajectory.next_state import NextState, NextStateRole

log = logging.getLogger(__name__)

JudgeFn = Callable[[JudgeInput], Awaitable[Judgment]]

PURGE_EVERY_S = 600.0
"""How often a worker deletes claims that expired long ago (workers killed mid-judgment)."""


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for p in content:
            if isinstance(p, dict):
                inner = p.get("text", p.get("content", p.get("output", "")))
                parts.append(_text(inner))
            else:
                parts.append(str(p))
        return "\n".join(x for x in parts if x)
    return str(content)


def judged_role(ns: NextState, *, observations: bool = False) -> NextStateRole:
    """The role the judge reads ``ns`` as: the linker's role, except that with ``observations``
    (harness mode: every message after a turn comes from the harness, none from a person) a
    ``user`` next state that reports an exit status (:func:`clawrl.judge.rules.exit_status`: a
    command's output) is the environment's. The harness's other messages (mini-swe-agent's
    "Reply with one shell command ..." after a reply without one) stay ``user``: a correction."""
    if observations and ns.role == NextStateRole.USER and exit_status(_ns_text(ns)) is not None:
        return NextStateRole.ENVIRONMENT
    return ns.role


def _ns_text(ns: NextState) -> str:
    """The text of ``ns``'s messages, joined by blank lines (what the judge reads)."""
    return "\n\n".join(t for t in (_text(m.get("content")) for m in ns.messages) if t)


def judge_input(turn: TurnRecord, ns: NextState, *, observations: bool = False) -> JudgeInput:
    """Build the judge's typed input for ``turn`` and its next state (``observations``: see
    :func:`judged_role`)."""
    messages = turn.request_messages or []
    system = next((_text(m.get("content")) for m in messages if m.get("role") == "system"), None)
    last_user_i = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    user = _text(messages[last_user_i].get("content")) if last_user_i >= 0 else None
    history = []
    for m in messages[:last_user_i] if last_user_i >= 0 else messages:
        if m.get("role") in ("user", "assistant", "tool"):
            history.append(ChatMessage(role=m["role"], content=_text(m.get("content")) or None))
    out = turn.output or {}
    calls = [
        ToolCall(id=c.get("id", ""), name=c.get("name", ""), arguments=c.get("arguments") or {})
        for c in out.get("tool_calls", []) or []
        if isinstance(c, dict) and c.get("name")
    ]
    if ns.role == NextStateRole.FEEDBACK:
        fb = ns.feedback[-1]
        state = NextStateText(role=NextStateRole.FEEDBACK, text=fb.comment or "", reward=fb.reward)
    else:
        role = judged_role(ns, observations=observations)
        state = NextStateText(role=role, text=_ns_text(ns))
    return JudgeInput(
        context=JudgeContext(system=system, user=user, history=history),
        output=TurnOutput(content=out.get("content"), tool_calls=calls),
        next_state=state,
    )


def judgment_record(turn: TurnRecord, judgment: Judgment, role: str) -> JudgmentRecord:
    """The store row for a :class:`Judgment`."""
    return JudgmentRecord(
        turn_id=turn.id,
        session_id=turn.session_id,
        score=None if judgment.score is None else int(judgment.score),
        reason=None if judgment.no_judgment_reason is None else str(judgment.no_judgment_reason),
        votes=[v.model_dump(mode="json") for v in judgment.votes],
        hint=judgment.hint.text if judgment.hint else None,
        hint_meta=judgment.hint.model_dump(mode="json") if judgment.hint else {},
        backend=f"{judgment.backend}:{judgment.model}" if judgment.model else str(judgment.backend),
        latency_s=judgment.latency_s,
        next_state_role=role,
    )


class JudgeWorker:
    """Polls the store and judges every turn that has a next state.

    Args:
        store: the trajectory store.
        judge: ``async (JudgeInput) -> Judgment`` (e.g. a ``clawrl.judge`` judge's method).
        timeout_s: the most seconds one judgment may take; past it the turn is stored with no
            judgment (reason ``timeout``) and serving is unaffected.
        concurrency: judgments in flight at once.
        poll_interval_s: seconds between polls when idle.
        observations: a user message that reports an exit status is a command's output (harness
            mode; :func:`judged_role`). The stored judgment's ``next_state_role`` is the role
            the judge read.

    Runs as an asyncio task beside the gateway (``clawrl serve --method ...``) or as its own
    process (``clawrl judge worker``; several may run on one store). A worker claims a turn in
    the store while it judges it (a lease of ``timeout_s`` + 60 s: another worker skips it),
    and a judgment is stored only if the turn has none yet (the first verdict wins), so a
    worker killed mid-judgment and restarted, or two workers on one store, store one verdict
    per turn and rarely judge one twice.
    """

    def __init__(
        self,
        store: Store,
        judge: JudgeFn,
        *,
        timeout_s: float = 120.0,
        concurrency: int = 4,
        poll_interval_s: float = 0.5,
        observations: bool = False,
    ) -> None:
        self.store = store
        self.observations = observations
        self.judge = judge
        self.timeout_s = timeout_s
        self.poll_interval_s = poll_interval_s
        self.concurrency = concurrency
        self.on_judgment: Callable[[JudgmentRecord], None] | None = None
        """Called with each stored judgment (``clawrl judge worker`` prints one line)."""
        self._sem: asyncio.Semaphore | None = None
        self.judged = 0
        self.failed = 0
        self.duplicates = 0
        """Judgments not stored because the turn had one by then (another worker's)."""
        self.claimed_elsewhere = 0
        """Turns skipped because another worker's claim on them was live."""
        self.holder = lease_holder()
        """This worker's name in its claims (host:pid:nonce)."""
        self.score_counts: dict[str, int] = {}

    def _keep(self, rec: JudgmentRecord) -> bool:
        """Store ``rec`` unless the turn was judged meanwhile (another worker): the first
        verdict wins, so a trainer that read it never sees its evidence change."""
        stored = self.store.record_judgment(rec, replace=False)
        if not stored:
            self.duplicates += 1
            log.info("turn %s was judged by another worker meanwhile: kept that", rec.turn_id)
        return stored

    def _stored(self, rec: JudgmentRecord) -> None:
        if self.on_judgment is not None:
            self.on_judgment(rec)

    def _claim(self, turn_id: str) -> bool:
        """Claim the turn in the store while judging it (:func:`clawrl.store.leases.
        judge_claim`); False when another worker's claim on it is live, or it got judged."""
        name, ttl = judge_claim(turn_id), self.timeout_s + 60
        other = self.store.acquire_lease(name, self.holder, ttl)
        if other is not None and holder_is_dead_here(other.holder):  # a worker killed here
            other = self.store.acquire_lease(name, self.holder, ttl, force=True)
        if other is not None:
            self.claimed_elsewhere += 1
            return False
        if self.store.get_judgment(turn_id) is not None:  # judged since it was listed
            self.store.release_lease(judge_claim(turn_id), self.holder)
            return False
        return True

    async def _judge_one(self, turn: TurnRecord, ns: NextState) -> None:
        if self._sem is None:  # made in the running loop (a worker may outlive one)
            self._sem = asyncio.Semaphore(max(1, self.concurrency))
        async with self._sem:
            if not await asyncio.to_thread(self._claim, turn.id):
                return
            try:
                await self._judge_claimed(turn, ns)
            finally:
                await asyncio.to_thread(self.store.release_lease, judge_claim(turn.id), self.holder)

    async def _judge_claimed(self, turn: TurnRecord, ns: NextState) -> None:
        """Judge a turn this worker claimed and store the verdict."""
        inp = judge_input(turn, ns, observations=self.observations)
        role = str(judged_role(ns, observations=self.observations))
        t0 = time.perf_counter()
        try:
            judgment = await asyncio.wait_for(self.judge(inp), self.timeout_s)
            rec = judgment_record(turn, judgment, role)
        except (TimeoutError, JudgeError) as e:
            self.failed += 1
            reason = NoJudgmentReason.JUDGE_ERROR
            if isinstance(e, TimeoutError):
                reason = NoJudgmentReason.TIMEOUT
            else:
                log.warning("judging turn %s failed: %s", turn.id, e)
            rec = JudgmentRecord(
                turn.id,
                turn.session_id,
                None,
                WORKER_BACKEND,
                reason=str(reason),
                latency_s=time.perf_counter() - t0,
                next_state_role=role,
            )
        if not await asyncio.to_thread(self._keep, rec):
            return
        self.judged += 1
        key = "none" if rec.score is None else f"{rec.score:+d}"
        self.score_counts[key] = self.score_counts.get(key, 0) + 1
        self._stored(rec)

    def _pending(self, session_id: str) -> list[tuple[TurnRecord, NextState | None]]:
        tree = load_tree(self.store, session_id)
        session = self.store.get_session(session_id)
        ended = session is not None and session.ended_at is not None
        out = []
        for tid, node in tree.nodes.items():
            t = node.turn
            if t.status != TurnStatus.OK or not t.trainable or t.kind != TurnKind.MAIN:
                continue
            if self.store.get_judgment(tid) is not None:
                continue
            ns = next_state(tree, tid)
            if ns is not None or ended:
                out.append((t, ns))
        return out

    async def poll_once(self) -> int:
        """Judge everything judgeable now; returns how many turns were judged."""
        sessions = await asyncio.to_thread(self.store.sessions_with_unjudged_turns, 200)
        return await self.judge_sessions(sessions)

    async def judge_sessions(self, sessions: Iterable[str]) -> int:
        """Judge the unjudged turns of ``sessions`` that have a next state, and store a
        ``no_next_state`` row for those of an ended session that never got one (harness mode
        calls this for a step's rollouts); returns how many turns were sent to the judge.

        A judge that times out or raises :class:`~clawrl.errors.JudgeError` is stored as a
        judgment without a score (reason ``timeout`` / ``judge_error``) and counted in
        :attr:`failed`, not raised.

        Raises:
            StoreError: the store failed.
        """
        tasks = []
        for sid in sessions:
            for turn, ns in await asyncio.to_thread(self._pending, sid):
                if ns is None:  # the session ended without a next state for this turn
                    rec = JudgmentRecord(
                        turn.id, sid, None, WORKER_BACKEND, reason=str(DropReason.NO_NEXT_STATE)
                    )
                    if await asyncio.to_thread(self._keep, rec):
                        self._stored(rec)
                    continue
                tasks.append(self._judge_one(turn, ns))
        await asyncio.gather(*tasks)
        return len(tasks)

    async def run(self, stop: asyncio.Event) -> None:
        """Poll until ``stop`` is set."""
        purged_at = 0.0
        while not stop.is_set():
            if time.monotonic() - purged_at > PURGE_EVERY_S:  # claims of killed workers
                await asyncio.to_thread(self.store.purge_leases)
                purged_at = time.monotonic()
            n = await self.poll_once()
            if n == 0:
                try:
                    await asyncio.wait_for(stop.wait(), self.poll_interval_s)
                except TimeoutError:
                    continue
