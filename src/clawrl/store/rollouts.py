"""Store records and queries of harness mode: rollout groups, rollouts and verifier results.

``rollout_groups``: one row per GRPO group (the rollouts of one task by one harness in one
training step, or one task's k evaluation rollouts), written before its rollouts start, with
the trainer's decision on it once made (:class:`GroupDecision`). ``rollouts``: one row per
rollout, written when it ends (its id is its gateway session's id), with how it ended
(:class:`RolloutStatus`) and why (``reason``: the harness or verifier error, or the limit that
killed the harness). ``verifier_results``: the verifier's verdict on a rollout, written in the
same transaction as the rollout: a reward and sub-scores, or the error that kept it from giving
one (``reward`` NULL). A rollout whose harness never ran has no verifier result.

A store older than :data:`ROLLOUTS_SCHEMA_VERSION` (opened read-only) has no rollouts: reads
return nothing.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any, Protocol

from clawrl.errors import StoreError
from clawrl.store.db import Conn, StoreConflict
from clawrl.store.rows import dump_json, insert_sql, load_json

ROLLOUTS_SCHEMA_VERSION = 6
"""The first store schema with the rollout tables."""

_SQL_CHUNK = 500  # bound on host parameters per IN (...) list


class RolloutStatus(StrEnum):
    """How a rollout ended. Only ``ok`` rollouts have a reward; the others say why not."""

    OK = "ok"  # the verifier gave a reward (the harness may have timed out: ``timed_out``)
    HARNESS_ERROR = "harness_error"  # the harness could not be prepared, started or run
    VERIFIER_ERROR = "verifier_error"  # the verifier crashed or printed no valid verdict


class RolloutPurpose(StrEnum):
    """What a rollout group was run for."""

    TRAIN = "train"
    EVAL = "eval"
    WARM_START = "warm_start"  # a demonstration replayed for the warm start (harness/warmstart.py)


class GroupDecision(StrEnum):
    """What the trainer did with a training group (``group/...`` metrics)."""

    KEPT = "kept"  # rewards differ: trained with group-relative advantages
    ZERO_VARIANCE = "zero_variance"  # every reward equal: zero advantage, left out
    TOO_SMALL = "too_small"  # fewer than two rewarded rollouts with a trainable turn


@dataclass
class RolloutGroupRecord:
    """One rollout group.

    Attributes:
        id: the group id (uuid4 hex); samples carry it as their GRPO group.
        run_id: the harness run (one ``clawrl harness train`` or ``eval``) it belongs to.
        label: ``task/harness/step`` (train) or ``eval/task/harness``, for people.
        task_id / harness: what its rollouts run.
        purpose: :class:`RolloutPurpose`.
        step: the training step (1, 2, ...) whose rollouts it holds; ``None`` for evaluation.
        policy_version: the policy version the engine served when the group started.
        size: rollouts planned in the group.
        decision: the trainer's :class:`GroupDecision` (``None``: not decided, or evaluation).
        reward_mean: mean verifier reward of its rewarded rollouts (set with ``decision``).
        created_at: seconds since the epoch.
    """

    id: str
    run_id: str
    label: str
    task_id: str
    harness: str
    purpose: RolloutPurpose
    step: int | None
    policy_version: int
    size: int
    decision: GroupDecision | None = None
    reward_mean: float | None = None
    created_at: float = field(default_factory=time.time)


@dataclass
class RolloutRecord:
    """How one rollout ended.

    Attributes:
        id: the rollout id, which is its gateway session's id.
        group_id: its :class:`RolloutGroupRecord`.
        isolation: the sandbox kind used (``bwrap`` or ``fallback``).
        status: :class:`RolloutStatus`.
        reason: why it is not a clean run: the harness or verifier error, or the limit that
            killed the harness (``time limit (600 s)``); ``None`` when nothing went wrong.
        harness_exit: the harness's exit status (``None``: it never ran).
        timed_out: the harness hit the task's time limit.
        wall_s: seconds for sandbox, harness and verifier.
        created_at: when it ended, seconds since the epoch.
        harness_tail: the last lines of the harness's stdout and stderr.
    """

    id: str
    group_id: str
    isolation: str
    status: RolloutStatus
    reason: str | None = None
    harness_exit: int | None = None
    timed_out: bool = False
    wall_s: float = 0.0
    created_at: float = field(default_factory=time.time)
    harness_tail: str = ""


@dataclass
class VerifierResultRecord:
    """The verifier's verdict on one rollout.

    Attributes:
        rollout_id: the rollout.
        reward: the reward in [0, 1]; ``None`` when the verifier failed (``error`` says how).
        error: the verifier's error, if it gave no verdict.
        scores: its named sub-scores.
        created_at: seconds since the epoch.
    """

    rollout_id: str
    reward: float | None
    error: str | None = None
    scores: dict[str, float] = field(default_factory=dict)
    created_at: float = field(default_factory=time.time)


@dataclass(frozen=True)
class RolloutResult:
    """A rollout as read back: its row, its group and its verifier result (if any)."""

    rollout: RolloutRecord
    group: RolloutGroupRecord
    verifier: VerifierResultRecord | None

    @property
    def reward(self) -> float | None:
        """The verifier's reward; ``None`` unless the rollout is ``ok``."""
        if self.rollout.status != RolloutStatus.OK or self.verifier is None:
            return None
        return self.verifier.reward

    @property
    def task_id(self) -> str:
        return self.group.task_id

    @property
    def harness(self) -> str:
        return self.group.harness


GROUP_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(RolloutGroupRecord))
ROLLOUT_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(RolloutRecord))
VERIFIER_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(VerifierResultRecord))


def _group_row(g: RolloutGroupRecord) -> dict[str, Any]:
    if g.size < 1:
        raise StoreError(f"rollout group {g.id} must plan at least one rollout, got {g.size}")
    return {
        "id": g.id, "run_id": g.run_id, "label": g.label, "task_id": g.task_id,
        "harness": g.harness, "purpose": RolloutPurpose(g.purpose).value, "step": g.step,
        "policy_version": int(g.policy_version), "size": int(g.size),
        "decision": None if g.decision is None else GroupDecision(g.decision).value,
        "reward_mean": g.reward_mean, "created_at": float(g.created_at),
    }  # fmt: skip


def _rollout_row(r: RolloutRecord) -> dict[str, Any]:
    return {
        "id": r.id, "group_id": r.group_id, "isolation": r.isolation,
        "status": RolloutStatus(r.status).value, "reason": r.reason,
        "harness_exit": r.harness_exit, "timed_out": 1 if r.timed_out else 0,
        "wall_s": float(r.wall_s), "created_at": float(r.created_at),
        "harness_tail": r.harness_tail,
    }  # fmt: skip


def _verifier_row(v: VerifierResultRecord) -> dict[str, Any]:
    if v.reward is None and not v.error:
        raise StoreError(f"verifier result of {v.rollout_id}: no reward and no error")
    return {
        "rollout_id": v.rollout_id, "reward": None if v.reward is None else float(v.reward),
        "error": v.error, "scores": dump_json(v.scores, "verifier scores"),
        "created_at": float(v.created_at),
    }  # fmt: skip


def _group(r: Mapping[str, Any], prefix: str = "") -> RolloutGroupRecord:
    decision = r[f"{prefix}decision"]
    return RolloutGroupRecord(
        id=r[f"{prefix}id"],
        run_id=r[f"{prefix}run_id"],
        label=r[f"{prefix}label"],
        task_id=r[f"{prefix}task_id"],
        harness=r[f"{prefix}harness"],
        purpose=RolloutPurpose(r[f"{prefix}purpose"]),
        step=r[f"{prefix}step"],
        policy_version=int(r[f"{prefix}policy_version"]),
        size=int(r[f"{prefix}size"]),
        decision=None if decision is None else GroupDecision(decision),
        reward_mean=r[f"{prefix}reward_mean"],
        created_at=float(r[f"{prefix}created_at"]),
    )


def _result(r: Mapping[str, Any]) -> RolloutResult:
    rollout = RolloutRecord(
        id=r["id"],
        group_id=r["group_id"],
        isolation=r["isolation"],
        status=RolloutStatus(r["status"]),
        reason=r["reason"],
        harness_exit=r["harness_exit"],
        timed_out=bool(r["timed_out"]),
        wall_s=float(r["wall_s"]),
        created_at=float(r["created_at"]),
        harness_tail=r["harness_tail"],
    )
    verifier = None
    if r["v_rollout_id"] is not None:
        verifier = VerifierResultRecord(
            rollout_id=r["v_rollout_id"],
            reward=r["v_reward"],
            error=r["v_error"],
            scores=load_json(r["v_scores"]) or {},
            created_at=float(r["v_created_at"]),
        )
    return RolloutResult(rollout, _group(r, "g_"), verifier)


_SELECT_RESULTS = (
    "SELECT r.*, "
    + ", ".join(f"g.{c} AS g_{c}" for c in GROUP_FIELDS)
    + ", "
    + ", ".join(f"v.{c} AS v_{c}" for c in VERIFIER_FIELDS)
    + " FROM rollouts r JOIN rollout_groups g ON g.id = r.group_id "
    "LEFT JOIN verifier_results v ON v.rollout_id = r.id"
)


class _HasConnections(Protocol):
    schema_version: int

    def _write(self) -> AbstractContextManager[Conn]: ...
    def _read(self) -> AbstractContextManager[Conn]: ...


class RolloutQueries:
    """Mixin for :class:`clawrl.store.Store`: rollout groups, rollouts, verifier results."""

    def record_rollout_groups(self: _HasConnections, groups: Sequence[RolloutGroupRecord]) -> None:
        """Insert rollout groups in one transaction (all or none; durable on return).

        Raises:
            StoreError: a group id exists already, or a field is invalid (size < 1, an
                unknown purpose or decision).
        """
        rows = [_group_row(g) for g in groups]
        if not rows:
            return
        with self._write() as conn:
            try:
                conn.executemany(insert_sql("rollout_groups", GROUP_FIELDS), rows)
            except StoreConflict as exc:
                raise StoreError(f"a rollout group was recorded already: {exc}") from exc

    def record_rollout(
        self: _HasConnections, rollout: RolloutRecord, verifier: VerifierResultRecord | None
    ) -> None:
        """Insert how a rollout ended and its verifier result, in one transaction (durable on
        return).

        Raises:
            StoreError: the rollout was recorded already, its session or group does not exist,
                the verifier result names another rollout or has neither reward nor error, or a
                field is invalid.
        """
        row = _rollout_row(rollout)
        vrow = None if verifier is None else _verifier_row(verifier)
        if verifier is not None and verifier.rollout_id != rollout.id:
            raise StoreError(
                f"verifier result of {verifier.rollout_id} given with rollout {rollout.id}"
            )
        with self._write() as conn:
            try:
                conn.execute(insert_sql("rollouts", ROLLOUT_FIELDS), row)
                if vrow is not None:
                    conn.execute(insert_sql("verifier_results", VERIFIER_FIELDS), vrow)
            except StoreConflict as exc:
                raise StoreError(
                    f"rollout {rollout.id} refused (recorded already, or no such session or "
                    f"group): {exc}"
                ) from exc

    def decide_rollout_groups(
        self: _HasConnections, decisions: Mapping[str, tuple[GroupDecision, float | None]]
    ) -> None:
        """Record the trainer's decision and mean reward per group id, in one transaction.

        Raises:
            StoreError: an unknown group id (nothing is written then).
        """
        with self._write() as conn:
            for group_id, (decision, mean) in decisions.items():
                cur = conn.execute(
                    "UPDATE rollout_groups SET decision = ?, reward_mean = ? WHERE id = ?",
                    (GroupDecision(decision).value, mean, group_id),
                )
                if cur.rowcount == 0:
                    raise StoreError(f"unknown rollout group {group_id!r}")

    def rollout_groups(self: _HasConnections, run_id: str) -> list[RolloutGroupRecord]:
        """The groups of harness run ``run_id``, oldest first."""
        if self.schema_version < ROLLOUTS_SCHEMA_VERSION:
            return []
        with self._read() as conn:
            rows = conn.execute(
                "SELECT * FROM rollout_groups WHERE run_id = ? ORDER BY created_at, rowid",
                (run_id,),
            ).fetchall()
        return [_group(r) for r in rows]

    def rollout_results(
        self: _HasConnections,
        *,
        run_id: str | None = None,
        group_ids: Iterable[str] | None = None,
        rollout_ids: Iterable[str] | None = None,
    ) -> list[RolloutResult]:
        """Recorded rollouts with their groups and verifier results, oldest first.

        Args:
            run_id: only rollouts of this harness run.
            group_ids: only rollouts of these groups.
            rollout_ids: only these rollouts (session ids; those that are no rollout are
                left out).

        Raises:
            StoreError: both ``group_ids`` and ``rollout_ids`` given.
        """
        if self.schema_version < ROLLOUTS_SCHEMA_VERSION:
            return []
        wheres: list[tuple[str, list[Any]]] = []
        if run_id is not None:
            wheres.append(("g.run_id = ?", [run_id]))
        chunked = [(col, list(dict.fromkeys(ids))) for col, ids in
                   (("r.group_id", group_ids), ("r.id", rollout_ids)) if ids is not None]  # fmt: skip
        out: list[RolloutResult] = []
        with self._read() as conn:
            for where, params in _chunks(wheres, chunked):
                sql = _SELECT_RESULTS + (f" WHERE {where}" if where else "")
                rows = conn.execute(sql + " ORDER BY r.created_at, r.rowid", params).fetchall()
                out.extend(_result(r) for r in rows)
        out.sort(key=lambda x: x.rollout.created_at)
        return out

    def get_rollout(self: _HasConnections, rollout_id: str) -> RolloutResult | None:
        """The rollout whose session is ``rollout_id``, or ``None`` (no rollout: a session
        that is not a harness rollout, or one still running)."""
        found = RolloutQueries.rollout_results(self, rollout_ids=[rollout_id])
        return found[0] if found else None


def _chunks(
    fixed: list[tuple[str, list[Any]]], lists: list[tuple[str, list[str]]]
) -> Iterable[tuple[str, list[Any]]]:
    """``WHERE`` clauses and parameters: ``fixed`` conditions, and each ``(column, values)`` as
    ``column IN (...)`` in chunks of at most ``_SQL_CHUNK`` values (an empty list: nothing)."""
    base = " AND ".join(w for w, _ in fixed)
    params = [p for _, ps in fixed for p in ps]
    if not lists:
        yield base, params
        return
    if len(lists) > 1:
        raise StoreError("rollout_results takes group_ids or rollout_ids, not both")
    column, values = lists[0]
    for start in range(0, len(values), _SQL_CHUNK):
        chunk = values[start : start + _SQL_CHUNK]
        where = f"{column} IN ({', '.join('?' * len(chunk))})"
        yield (f"{base} AND {where}" if base else where), [*params, *chunk]
