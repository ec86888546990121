"""Store records and queries of the online loop: judge verdicts and trainer bookkeeping.

``judgments``: one row per judged turn — the majority score (or ``None`` with the reason there
is no judgment), the votes, the selected hindsight hint. ``samples``: one row per turn the
trainer has consumed — ``trained`` (with the step and the policy version it produced) or
``dropped`` with a reason. A turn is trained at most once because its ``samples`` row is
written in the same transaction as the decision, and the trainer only picks turns without one.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from clawrl.errors import StoreError
from clawrl.store.db import Conn, StoreConflict
from clawrl.store.rows import dump_json, load_json


class SampleStatus(StrEnum):
    """What the trainer did with a judged turn."""

    TRAINED = "trained"
    DROPPED = "dropped"


class DropReason(StrEnum):
    """Why a turn was not trained on (``drop/<reason>`` in metrics)."""

    NO_NEXT_STATE = "no_next_state"
    NO_JUDGMENT = "no_judgment"
    ZERO_SCORE = "zero_score"
    NO_HINT = "no_hint"
    UNTRAINABLE = "untrainable"
    STALE = "stale"
    TEACHER_FAILED = "teacher_failed"
    NO_USER = "no_user"
    ADAPTER_REFUSED = "adapter_refused"


DROP_EXPLANATIONS: dict[str, str] = {
    DropReason.UNTRAINABLE: "the call failed, was cut off, or was an evaluation request",
    DropReason.NO_NEXT_STATE: "the session ended before the user replied to this answer",
    DropReason.NO_JUDGMENT: "every judge vote abstained (too unsure)",
    DropReason.ZERO_SCORE: "the judge saw no evidence either way (score 0) and no hint",
    DropReason.NO_HINT: "OPD needs a hint and the judge found no directive in the reply",
    DropReason.STALE: "sampled by a policy too many versions behind",
    DropReason.TEACHER_FAILED: "scoring the hint-enhanced prompt failed",
    DropReason.NO_USER: "per-user adapters train each user's own turns: the request named no user",
    DropReason.ADAPTER_REFUSED: "the user's recorded adapter cannot be trained further (its "
    "rank or layers do not fit trainer.lora_rank on all linear layers)",
}
"""What each :class:`DropReason` means, in words (the demo report, the dashboard)."""


WORKER_BACKEND = "worker"
"""``JudgmentRecord.backend`` of rows the judge worker writes itself: a turn it never sent to
the judge (``no_next_state``) or a judge call that timed out (``timeout``)."""


@dataclass
class JudgmentRecord:
    """The judge's verdict on one turn.

    Attributes:
        turn_id / session_id: the judged turn.
        score: majority score in {+1, -1, 0}; ``None`` = no judgment (all votes abstained,
            the judge failed): ``reason`` says why.
        votes: per vote ``{"score": int|None, "hint": str|None, "raw": str, "abstain": str|None}``.
        hint: the selected hindsight hint, if any; ``hint_meta`` how it was selected.
        backend: e.g. ``generative:smollm2-135m``, ``choice``, ``openai:URL``, ``feedback``.
        latency_s: seconds the judgment took.
        next_state_role: user | tool | environment | feedback.
    """

    turn_id: str
    session_id: str
    score: int | None
    backend: str
    reason: str | None = None
    votes: list[dict[str, Any]] = field(default_factory=list)
    hint: str | None = None
    hint_meta: dict[str, Any] = field(default_factory=dict)
    latency_s: float | None = None
    next_state_role: str | None = None
    created_at: float = field(default_factory=time.time)

    @property
    def skipped(self) -> bool:
        """Bookkeeping, not a verdict: the worker's row for a turn nothing came after."""
        return self.backend == WORKER_BACKEND and self.reason == DropReason.NO_NEXT_STATE


@dataclass
class SampleRecord:
    """The trainer's decision on one turn (trained at ``step`` producing ``policy_version``)."""

    turn_id: str
    status: SampleStatus
    reason: str | None = None
    step: int | None = None
    policy_version: int | None = None
    created_at: float = field(default_factory=time.time)


class _HasConnections(Protocol):
    def _write(self) -> AbstractContextManager[Conn]: ...
    def _read(self) -> AbstractContextManager[Conn]: ...


_J_COLS = (
    "turn_id", "session_id", "score", "reason", "votes", "hint", "hint_meta", "backend",
    "latency_s", "next_state_role", "created_at",
)  # fmt: skip
_S_COLS = ("turn_id", "status", "reason", "step", "policy_version", "created_at")
_UPSERT_JUDGMENT = (
    f"INSERT INTO judgments ({', '.join(_J_COLS)}) VALUES ({', '.join('?' for _ in _J_COLS)}) "
    "ON CONFLICT (turn_id) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in _J_COLS if c != "turn_id")
)

_INSERT_JUDGMENT = (
    f"INSERT INTO judgments ({', '.join(_J_COLS)}) VALUES ({', '.join('?' for _ in _J_COLS)}) "
    "ON CONFLICT (turn_id) DO NOTHING"
)


def _judgment_row(j: JudgmentRecord) -> tuple[Any, ...]:
    if j.score not in (None, -1, 0, 1):
        raise StoreError(f"judgment score must be -1, 0, +1 or None, got {j.score!r}")
    return (
        j.turn_id, j.session_id, j.score, j.reason, dump_json(j.votes, "votes"), j.hint,
        dump_json(j.hint_meta, "hint_meta"), j.backend, j.latency_s, j.next_state_role,
        j.created_at,
    )  # fmt: skip


def _row_judgment(r: Any) -> JudgmentRecord:
    return JudgmentRecord(
        turn_id=r["turn_id"],
        session_id=r["session_id"],
        score=r["score"],
        reason=r["reason"],
        votes=load_json(r["votes"]) or [],
        hint=r["hint"],
        hint_meta=load_json(r["hint_meta"]) or {},
        backend=r["backend"],
        latency_s=r["latency_s"],
        next_state_role=r["next_state_role"],
        created_at=r["created_at"],
    )


class LearningQueries:
    """Mixin for :class:`clawrl.store.Store`: judgments and samples."""

    def record_judgment(
        self: _HasConnections, judgment: JudgmentRecord, *, replace: bool = True
    ) -> bool:
        """Insert the judgment of a turn (durable when this returns).

        Args:
            judgment: the verdict.
            replace: replace a judgment the turn already has (True), or keep that one
                (False: the first verdict wins, so judge workers racing on a turn, or one
                redoing a turn after a crash, never change evidence a trainer may have used).

        Returns:
            Whether this judgment was stored (False: ``replace`` is False and the turn already
            had one).

        Raises:
            StoreError: unknown turn, bad score.
        """
        row = _judgment_row(judgment)
        with self._write() as conn:
            cur = conn.execute(_UPSERT_JUDGMENT if replace else _INSERT_JUDGMENT, row)
            return replace or cur.rowcount > 0

    def get_judgment(self: _HasConnections, turn_id: str) -> JudgmentRecord | None:
        """The judgment of a turn, or None."""
        with self._read() as conn:
            r = conn.execute("SELECT * FROM judgments WHERE turn_id = ?", (turn_id,)).fetchone()
        return None if r is None else _row_judgment(r)

    def judgments_for_session(self: _HasConnections, session_id: str) -> list[JudgmentRecord]:
        """Every judgment of a session, oldest first."""
        with self._read() as conn:
            rows = conn.execute(
                "SELECT * FROM judgments WHERE session_id = ? ORDER BY created_at", (session_id,)
            ).fetchall()
        return [_row_judgment(r) for r in rows]

    def sessions_with_unjudged_turns(self: _HasConnections, limit: int = 100) -> list[str]:
        """Sessions having an ok, trainable main turn without a judgment, most recent first."""
        with self._read() as conn:
            rows = conn.execute(
                "SELECT t.session_id, MAX(t.created_at) AS last FROM turns t "
                "LEFT JOIN judgments j ON j.turn_id = t.id "
                "WHERE j.turn_id IS NULL AND t.status = 'ok' AND t.trainable = 1 "
                "AND t.kind = 'main' GROUP BY t.session_id ORDER BY last DESC LIMIT ?",
                (limit,),
            ).fetchall()
        return [r[0] for r in rows]

    def judged_untrained_turns(self: _HasConnections, limit: int = 1000) -> list[str]:
        """Turn ids with a judgment and no ``samples`` row, oldest judgment first."""
        with self._read() as conn:
            rows = conn.execute(
                "SELECT j.turn_id FROM judgments j LEFT JOIN samples s ON s.turn_id = j.turn_id "
                "WHERE s.turn_id IS NULL ORDER BY j.created_at LIMIT ?",
                (limit,),
            ).fetchall()
        return [r[0] for r in rows]

    def record_samples(self: _HasConnections, records: list[SampleRecord]) -> None:
        """Write several trainer decisions in one transaction (all or none).

        Raises:
            StoreError: a turn already has a decision (a sample is never trained twice).
        """
        marks = ", ".join("?" for _ in _S_COLS)
        with self._write() as conn:
            for rec in records:
                try:
                    conn.execute(
                        f"INSERT INTO samples ({', '.join(_S_COLS)}) VALUES ({marks})",
                        (
                            rec.turn_id,
                            str(rec.status),
                            rec.reason,
                            rec.step,
                            rec.policy_version,
                            rec.created_at,
                        ),
                    )
                except StoreConflict as exc:
                    raise StoreError(f"turn {rec.turn_id} already has a sample decision") from exc

    def get_sample(self: _HasConnections, turn_id: str) -> SampleRecord | None:
        """The trainer's decision on a turn, or None."""
        with self._read() as conn:
            r = conn.execute("SELECT * FROM samples WHERE turn_id = ?", (turn_id,)).fetchone()
        if r is None:
            return None
        return SampleRecord(
            r["turn_id"],
            SampleStatus(r["status"]),
            r["reason"],
            r["step"],
            r["policy_version"],
            r["created_at"],
        )

    def sample_counts(self: _HasConnections) -> dict[str, int]:
        """``{"trained": n, "drop/<reason>": n, ...}`` over the whole store."""
        with self._read() as conn:
            rows = conn.execute(
                "SELECT status, reason, COUNT(*) FROM samples GROUP BY status, reason"
            ).fetchall()
        out: dict[str, int] = {}
        for status, reason, n in rows:
            key = "trained" if status == SampleStatus.TRAINED else f"drop/{reason}"
            out[key] = out.get(key, 0) + int(n)
        return out

    def iter_judgments(self: _HasConnections) -> Iterator[JudgmentRecord]:
        """All judgments, oldest first (for reports)."""
        with self._read() as conn:
            rows = conn.execute("SELECT * FROM judgments ORDER BY created_at").fetchall()
        for r in rows:
            yield _row_judgment(r)

    def judgment_counts(self: _HasConnections) -> dict[str, int]:
        """Judgments by outcome: ``{"+1": n, "-1": n, "0": n, "none/<reason>": n,
        "skipped/<reason>": n, "hinted": n}``. ``none/`` rows are turns the judge gave no
        verdict (all votes abstained, a failure); ``skipped/`` rows are turns the judge worker
        never sent to the judge (the worker's ``no_next_state`` rows: the session ended first);
        ``hinted`` counts verdicts with a non-empty hint."""
        with self._read() as conn:
            rows = conn.execute(
                "SELECT score, reason, CASE WHEN backend = ? AND reason = ? THEN 1 ELSE 0 END, "
                "COUNT(*), SUM(CASE WHEN hint IS NOT NULL AND hint != '' THEN 1 ELSE 0 END) "
                "FROM judgments GROUP BY 1, 2, 3",
                (WORKER_BACKEND, str(DropReason.NO_NEXT_STATE)),
            ).fetchall()
        out: dict[str, int] = {}
        for score, reason, skipped, n, hinted in rows:
            if score is not None:
                key = "0" if score == 0 else f"{int(score):+d}"
            else:
                key = f"{'skipped' if skipped else 'none'}/{reason or 'unknown'}"
            out[key] = out.get(key, 0) + int(n)
            out["hinted"] = out.get("hinted", 0) + int(hinted or 0)
        return out

    def training_progress(self: _HasConnections) -> tuple[int, int]:
        """(the last training step, the policy version it produced) recorded in ``samples``;
        ``(0, 0)`` before any step."""
        with self._read() as conn:
            row = conn.execute(
                "SELECT COALESCE(MAX(step), 0), COALESCE(MAX(policy_version), 0) FROM samples "
                "WHERE status = 'trained'"
            ).fetchone()
        return int(row[0]), int(row[1])

    def judgment_scores(self: _HasConnections) -> dict[str, int | None]:
        """Turn id -> the judge's score, for every judgment (two columns only)."""
        with self._read() as conn:
            return {r[0]: r[1] for r in conn.execute("SELECT turn_id, score FROM judgments")}

    def recent_judgments(self: _HasConnections, limit: int = 500) -> list[JudgmentRecord]:
        """The ``limit`` newest judgments, newest first."""
        with self._read() as conn:
            rows = conn.execute(
                "SELECT * FROM judgments ORDER BY created_at DESC LIMIT ?", (int(limit),)
            ).fetchall()
        return [_row_judgment(r) for r in rows]

    def learning_backlog(self: _HasConnections) -> dict[str, int]:
        """``{"unjudged": n, "ready": n}``: ok, trainable main turns without a judgment yet
        (including those still waiting for their next state), and judged turns the trainer
        has not decided on yet."""
        with self._read() as conn:
            unjudged = conn.execute(
                "SELECT COUNT(*) FROM turns t LEFT JOIN judgments j ON j.turn_id = t.id "
                "WHERE j.turn_id IS NULL AND t.status = 'ok' AND t.trainable = 1 "
                "AND t.kind = 'main'"
            ).fetchone()[0]
            ready = conn.execute(
                "SELECT COUNT(*) FROM judgments j LEFT JOIN samples s ON s.turn_id = j.turn_id "
                "WHERE s.turn_id IS NULL"
            ).fetchone()[0]
        return {"unjudged": int(unjudged), "ready": int(ready)}

    def session_learning(
        self: _HasConnections, session_id: str
    ) -> tuple[dict[str, JudgmentRecord], dict[str, SampleRecord]]:
        """A session's judgments and trainer decisions, each keyed by turn id."""
        with self._read() as conn:
            jrows = conn.execute(
                "SELECT * FROM judgments WHERE session_id = ?", (session_id,)
            ).fetchall()
            srows = conn.execute(
                "SELECT s.* FROM samples s JOIN turns t ON t.id = s.turn_id WHERE t.session_id = ?",
                (session_id,),
            ).fetchall()
        samples = {
            r["turn_id"]: SampleRecord(
                r["turn_id"], SampleStatus(r["status"]), r["reason"], r["step"],
                r["policy_version"], r["created_at"],
            )
            for r in srows
        }  # fmt: skip
        return {r["turn_id"]: _row_judgment(r) for r in jrows}, samples
