"""Users: whose request each turn answered (``turns.user_id``), and what the store holds per user.

``user_adapters``: the versions of each user's own LoRA adapter (``clawrl serve
--per-user-adapters`` serves a user's requests with their latest version on top of the policy;
:mod:`clawrl.gateway.user_adapters`), recorded as :class:`PolicyVersionRecord` records the
shared policy's: the store is how every replica learns of a new version, and each user's
versions only increase.

A user id comes from the request (:mod:`clawrl.gateway.users` resolves it: a header, the body's
end-user field or the API key, in the order ``server.user_from`` gives); ``""`` is no user,
the served policy's, as in :class:`clawrl.store.memory.MemoryEntryRecord`. This module checks
ids and answers per-user questions (``clawrl users list``, the dashboard's filter); it trains
nothing.
"""

from __future__ import annotations

import time
import unicodedata
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

from clawrl.errors import StoreError
from clawrl.store.db import Conn, StoreConflict

USERS_SCHEMA_VERSION = 8
"""The store schema that records each turn's user (``turns.user_id``; migration 8)."""

MAX_USER_ID_CHARS = 256
"""The longest user id a turn records (OpenAI's ``user`` field allows 256 characters too)."""


def user_id_problem(value: object) -> str | None:
    """Why ``value`` cannot be a turn's user id, or ``None`` when it can.

    A user id is a string of at most :data:`MAX_USER_ID_CHARS` characters, without control
    characters (new lines, NUL, ...) and without surrounding white space; ``""`` means no user.
    """
    if not isinstance(value, str):
        return f"must be a string, got {type(value).__name__}"
    if len(value) > MAX_USER_ID_CHARS:
        return f"is {len(value)} characters long; at most {MAX_USER_ID_CHARS}"
    if value != value.strip():
        return "has white space at its start or end"
    if any(unicodedata.category(c) in ("Cc", "Cs") for c in value):
        return "contains a control character (such as a new line)"
    return None


@dataclass(frozen=True)
class UserSummary:
    """One user as the store knows them (``Store.users``).

    Attributes:
        user_id: the id (``""``: requests that named no user).
        sessions: sessions with at least one of the user's turns.
        turns: the user's turns (every status, side calls included).
        judged: of them, turns with a judgment row.
        trained: of them, turns a trainer step consumed (``samples.status = 'trained'``).
        last_seen: ``created_at`` of the user's latest turn (seconds since the epoch; for a
            user with an adapter and no turn yet, when the adapter was recorded).
        last_step: the latest trainer step that consumed one of the user's turns, or ``None``.
        adapter_version: the user's latest adapter version (``None``: served the policy alone).
    """

    user_id: str
    sessions: int
    turns: int
    judged: int
    trained: int
    last_seen: float
    last_step: int | None
    adapter_version: int | None = None


@dataclass(frozen=True)
class UserAdapterRecord:
    """One version of a user's adapter.

    Attributes:
        user_id: whose adapter (not ``""``).
        version: 1, 2, ... per user (the policy alone is "no version").
        weights: absolute path of the PEFT LoRA adapter directory every replica loads.
        step: the training step that produced it (``None``: loaded by hand).
        created_at: seconds since the epoch.
    """

    user_id: str
    version: int
    weights: str
    step: int | None = None
    created_at: float = field(default_factory=time.time)


def _adapter(r: Any) -> UserAdapterRecord:
    return UserAdapterRecord(
        user_id=r["user_id"], version=int(r["version"]), weights=r["weights"],
        step=None if r["step"] is None else int(r["step"]), created_at=float(r["created_at"]),
    )  # fmt: skip


class _HasUsers(Protocol):
    schema_version: int

    def _read(self) -> AbstractContextManager[Conn]: ...
    def _write(self) -> AbstractContextManager[Conn]: ...
    def latest_user_adapters(self) -> dict[str, UserAdapterRecord]: ...


class UserQueries:
    """Per-user reads of a :class:`clawrl.store.Store` and the ``user_adapters`` table (a
    mixin)."""

    def publish_user_adapter(self: _HasUsers, record: UserAdapterRecord) -> None:
        """Record a version of a user's adapter (durable on return); the same version with
        the same weights again does nothing.

        Raises:
            StoreError: an empty or invalid user id, a version < 1, or one not above the user's
                latest (another writer published for this user).
        """
        _require_users(self)
        problem = user_id_problem(record.user_id)
        if problem is not None or not record.user_id:
            raise StoreError(f"user_adapters.user_id {problem or 'must not be empty'}")
        if int(record.version) < 1:
            raise StoreError(f"adapter versions start at 1, got {record.version}")
        with self._write() as conn:
            row = conn.execute(
                "SELECT MAX(version) FROM user_adapters WHERE user_id = ?", (record.user_id,)
            ).fetchone()
            latest = int(row[0] or 0)
            if record.version <= latest:
                same = conn.execute(
                    "SELECT weights FROM user_adapters WHERE user_id = ? AND version = ?",
                    (record.user_id, int(record.version)),
                ).fetchone()
                if same is not None and same[0] == record.weights:
                    return
                raise StoreError(
                    f"adapter version {record.version} of user {record.user_id!r} is not newer "
                    f"than their latest ({latest})"
                )
            try:
                conn.execute(
                    "INSERT INTO user_adapters (user_id, version, weights, step, created_at) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (record.user_id, int(record.version), str(record.weights), record.step,
                     float(record.created_at)),
                )  # fmt: skip
            except StoreConflict as exc:
                raise StoreError(
                    f"adapter version {record.version} of {record.user_id!r} exists already"
                ) from exc

    def latest_user_adapters(self: _HasUsers) -> dict[str, UserAdapterRecord]:
        """Each user's newest adapter version (users without one are absent)."""
        if self.schema_version < USERS_SCHEMA_VERSION:
            return {}
        with self._read() as conn:
            rows = conn.execute(
                "SELECT a.* FROM user_adapters a JOIN (SELECT user_id, MAX(version) AS v "
                "FROM user_adapters GROUP BY user_id) m "
                "ON a.user_id = m.user_id AND a.version = m.v"
            ).fetchall()
        return {r["user_id"]: _adapter(r) for r in rows}

    def user_adapter_versions(self: _HasUsers, user_id: str) -> list[UserAdapterRecord]:
        """Every version of ``user_id``'s adapter, oldest first."""
        if self.schema_version < USERS_SCHEMA_VERSION:
            return []
        with self._read() as conn:
            rows = conn.execute(
                "SELECT * FROM user_adapters WHERE user_id = ? ORDER BY version", (user_id,)
            ).fetchall()
        return [_adapter(r) for r in rows]

    def users(self: _HasUsers) -> list[UserSummary]:
        """Every user with a recorded turn, most recently seen first (``""`` included when
        some requests named no user).

        Raises:
            StoreError: the store predates users (schema version < 8; ``clawrl store migrate``).
        """
        _require_users(self)
        adapters = self.latest_user_adapters()
        with self._read() as conn:
            rows = conn.execute(
                """
                SELECT t.user_id AS user_id,
                    COUNT(DISTINCT t.session_id) AS n_sessions,
                    COUNT(*) AS n_turns,
                    COUNT(j.turn_id) AS n_judged,
                    SUM(CASE WHEN s.status = 'trained' THEN 1 ELSE 0 END) AS n_trained,
                    MAX(t.created_at) AS last_seen,
                    MAX(CASE WHEN s.status = 'trained' THEN s.step END) AS last_step
                FROM turns t
                LEFT JOIN judgments j ON j.turn_id = t.id
                LEFT JOIN samples s ON s.turn_id = t.id
                GROUP BY t.user_id
                ORDER BY MAX(t.created_at) DESC
                """
            ).fetchall()
        return [
            UserSummary(
                user_id=r["user_id"],
                sessions=int(r["n_sessions"]),
                turns=int(r["n_turns"]),
                judged=int(r["n_judged"]),
                trained=int(r["n_trained"] or 0),
                last_seen=float(r["last_seen"]),
                last_step=None if r["last_step"] is None else int(r["last_step"]),
                adapter_version=a.version if (a := adapters.get(r["user_id"])) else None,
            )
            for r in rows
        ] + [  # an adapter recorded for a user who has not called yet
            UserSummary(user_id=u, sessions=0, turns=0, judged=0, trained=0,
                        last_seen=a.created_at, last_step=None, adapter_version=a.version)
            for u, a in sorted(adapters.items())
            if u not in {r["user_id"] for r in rows}
        ]  # fmt: skip


def _require_users(store: _HasUsers) -> None:
    if store.schema_version < USERS_SCHEMA_VERSION:
        raise StoreError(
            f"this store is at schema version {store.schema_version}; users are recorded from "
            f"version {USERS_SCHEMA_VERSION} on: run `clawrl store migrate --store STORE`"
        )
