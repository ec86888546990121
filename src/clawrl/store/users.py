"""Users: whose request each turn answered (``turns.user_id``), and what the store holds per user.

A user id comes from the request (:mod:`clawrl.gateway.users` resolves it: a header, the body's
end-user field or the API key, in the order ``server.user_from`` gives); ``""`` is no user,
the served policy's, as in :class:`clawrl.store.memory.MemoryEntryRecord`. This module checks
ids and answers per-user questions (``clawrl users list``, the dashboard's filter); it trains
nothing.
"""

from __future__ import annotations

import unicodedata
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

from clawrl.errors import StoreError
from clawrl.store.db import Conn

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
        last_seen: ``created_at`` of the user's latest turn (seconds since the epoch).
        last_step: the latest trainer step that consumed one of the user's turns, or ``None``.
    """

    user_id: str
    sessions: int
    turns: int
    judged: int
    trained: int
    last_seen: float
    last_step: int | None


class _HasUsers(Protocol):
    schema_version: int

    def _read(self) -> AbstractContextManager[Conn]: ...


class UserQueries:
    """Per-user reads of a :class:`clawrl.store.Store` (a mixin)."""

    def users(self: _HasUsers) -> list[UserSummary]:
        """Every user with a recorded turn, most recently seen first (``""`` included when
        some requests named no user).

        Raises:
            StoreError: the store predates users (schema version < 8; ``clawrl store migrate``).
        """
        if self.schema_version < USERS_SCHEMA_VERSION:
            raise StoreError(
                f"this store is at schema version {self.schema_version}; users are recorded from "
                f"version {USERS_SCHEMA_VERSION} on: run `clawrl store migrate --store STORE`"
            )
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
            )
            for r in rows
        ]
