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
nothing. :meth:`UserQueries.forget_user` removes everything the store holds of one user
(``clawrl users forget``).
"""

from __future__ import annotations

import dataclasses
import json
import time
import unicodedata
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

from clawrl.errors import StoreError
from clawrl.store.chains import CHAIN_COLUMNS, PromptChains
from clawrl.store.db import Conn, Database, StoreConflict

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


@dataclass(frozen=True)
class ForgottenUser:
    """What :meth:`UserQueries.forget_user` removed.

    Attributes:
        user_id: the user.
        turns: their turns deleted (with their judgments, samples and feedback).
        sessions: sessions deleted (no other user's turn was left in them).
        memory_entries: memory entries deleted (theirs, or taken from one of their turns).
        adapter_dirs: the weights directories their adapter versions named (the caller
            deletes them from disk).
        rewritten: other users' turns that were stored as deltas of one of theirs, now stored
            whole (their own prompts are theirs and stay).
        trained_shared: their turns a shared-policy step had trained (the shared weights keep
            what those steps learned): the step's version and step number are a
            ``policy_versions`` row's and not one of their ``user_adapters`` rows'.
        trained_either: their trained turns whose version and step match both (a shared step
            and a step of their own adapter numbered alike: which one trained it is unknown).
        compacted: the storage holds no bytes of the deleted rows any more (``False``: another
            process still reads an old SQLite snapshot; stop it and compact again).
    """

    user_id: str
    turns: int
    sessions: int
    memory_entries: int
    adapter_dirs: list[str]
    rewritten: int
    trained_shared: int
    compacted: bool
    trained_either: int = 0


_FORGET_TABLES = ("turns", "judgments", "samples", "feedback", "sessions", "memory_entries",
                  "memory_sources", "user_adapters")  # fmt: skip


def _chunks(ids: Sequence[str], size: int = 500) -> list[Sequence[str]]:
    return [ids[i : i + size] for i in range(0, len(ids), size)]


def _marks(ids: Sequence[str]) -> str:
    return ", ".join("?" for _ in ids)


class _HasUsers(Protocol):
    schema_version: int
    _chains: PromptChains
    _db: Database

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

    def trained_user_adapter_versions(self: _HasUsers) -> int:
        """How many users' adapter versions a training step made (every user's, summed; the
        online learner's step count after a restart)."""
        if self.schema_version < USERS_SCHEMA_VERSION:
            return 0
        with self._read() as conn:
            row = conn.execute(
                "SELECT COUNT(*) FROM user_adapters WHERE step IS NOT NULL"
            ).fetchone()
        return int(row[0] or 0)

    def session_user_ids(self: _HasUsers, session_id: str) -> set[str]:
        """The users whose turns ``session_id`` holds (``""`` for turns without a user)."""
        if self.schema_version < USERS_SCHEMA_VERSION:
            return {""}
        with self._read() as conn:
            rows = conn.execute(
                "SELECT DISTINCT user_id FROM turns WHERE session_id = ?", (session_id,)
            ).fetchall()
        return {r[0] for r in rows}

    def forget_user(self: _HasUsers, user_id: str) -> ForgottenUser:
        """Remove everything the store holds of ``user_id``, then compact the storage so that
        no byte of it stays in the files (``clawrl users forget``): their turns with those
        turns' judgments, samples and feedback; every judgment and feedback of a session they
        spoke in (a next state may be their message); sessions left without a turn; memory
        entries that are theirs, came from one of their turns, or took in one of their
        directives (their history names their turn or feedback), and the memory's claims on
        their hints and feedback; their adapter versions. Another user's turn stored as a delta
        of one of theirs (:mod:`clawrl.store.chains`) is first stored whole (a turn that
        continued their conversation holds their words in its own prompt: it stays, as that
        user's request). One transaction: all or nothing. Compacting rewrites the whole store
        (SQLite ``VACUUM`` holds the write lock meanwhile; PostgreSQL ``VACUUM FULL`` locks each
        table): run it when the servers on this store are idle. PostgreSQL's write-ahead log
        and archives are the server's: they keep what they kept.

        Returns:
            What was removed (:class:`ForgottenUser`; the adapter directories are for the
            caller to delete).

        Raises:
            StoreError: ``""`` (requests that named no user are not a user), an id a turn
                could not hold, or a store before users (schema version < 8).
        """
        _require_users(self)
        problem = user_id_problem(user_id)
        if problem is not None or not user_id:
            raise StoreError(f"user id {user_id!r} {problem or 'is empty: no user to forget'}")
        with self._write() as conn:
            out = _forget(conn, self._chains, user_id)
        compacted = self._db.compact(_FORGET_TABLES)
        return dataclasses.replace(out, compacted=compacted)

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


def _forget(conn: Conn, chains: PromptChains, user_id: str) -> ForgottenUser:
    """The deletes of :meth:`UserQueries.forget_user`, in one transaction (``compacted``
    unset)."""
    turn_ids = [r[0] for r in conn.execute("SELECT id FROM turns WHERE user_id = ?", (user_id,))]
    sessions = sorted({r[0] for r in conn.execute(
        "SELECT DISTINCT session_id FROM turns WHERE user_id = ?", (user_id,))})  # fmt: skip
    rewritten = trained_shared = trained_either = 0
    for part in _chunks(turn_ids):
        # another user's turn stored as a delta of one of these: store it whole first
        dependents = conn.execute(
            f"SELECT {CHAIN_COLUMNS} FROM turns WHERE prefix_turn_id IN ({_marks(part)}) "
            "AND user_id != ?", (*part, user_id),
        ).fetchall()  # fmt: skip
        full = chains.resolve(conn, dependents) if dependents else {}
        for tid, turn in full.items():
            conn.execute(
                "UPDATE turns SET prompt_ids = ?, request_messages = ?, prefix_turn_id = NULL, "
                "prefix_len = 0, messages_prefix_len = 0 WHERE id = ?",
                (turn.prompt, json.dumps(list(turn.messages), ensure_ascii=False,
                                         separators=(",", ":")), tid),
            )  # fmt: skip
        rewritten += len(full)
        for (shared, own) in conn.execute(
            "SELECT EXISTS (SELECT 1 FROM policy_versions p WHERE p.version = s.policy_version "
            "AND p.step = s.step), EXISTS (SELECT 1 FROM user_adapters a WHERE a.user_id = "
            "t.user_id AND a.version = s.policy_version AND a.step = s.step) FROM samples s "
            f"JOIN turns t ON t.id = s.turn_id WHERE s.turn_id IN ({_marks(part)}) "
            "AND s.status = 'trained'", tuple(part),
        ):  # fmt: skip
            trained_shared += int(bool(shared) and not own)
            trained_either += int(bool(shared) and bool(own))
    # what else holds their words: every judgment and feedback of a session they spoke in
    # (a next state may be their message), memory entries whose history names one of their
    # turns or feedback (a directive of theirs merged into another entry), the memory's claims
    # on their hints and feedback
    feedback_ids = [r[0] for part in _chunks(sessions) for r in conn.execute(
        f"SELECT id FROM feedback WHERE session_id IN ({_marks(part)})", tuple(part))]  # fmt: skip
    for part in _chunks(turn_ids):
        feedback_ids += [r[0] for r in conn.execute(
            f"SELECT id FROM feedback WHERE turn_id IN ({_marks(part)})", tuple(part))]  # fmt: skip
    marks = set(turn_ids) | set(feedback_ids)
    merged = [r[0] for r in conn.execute("SELECT id, history FROM memory_entries").fetchall()
              if any(m in (r[1] or "") for m in marks)]  # fmt: skip
    sources = [f"hint:{t}" for t in turn_ids] + [f"feedback:{f}" for f in feedback_ids]
    merged_entries = 0
    for part in _chunks(merged):
        merged_entries += conn.execute(
            f"DELETE FROM memory_entries WHERE id IN ({_marks(part)})", tuple(part)
        ).rowcount
    for part in _chunks(sources):
        conn.execute(f"DELETE FROM memory_sources WHERE id IN ({_marks(part)})", tuple(part))
    for part in _chunks(sessions):
        for table in ("judgments", "feedback"):
            conn.execute(f"DELETE FROM {table} WHERE session_id IN ({_marks(part)})", tuple(part))
    entries = merged_entries
    for part in _chunks(turn_ids):
        for table in ("judgments", "samples", "feedback"):
            conn.execute(f"DELETE FROM {table} WHERE turn_id IN ({_marks(part)})", tuple(part))
        entries += conn.execute(
            f"DELETE FROM memory_entries WHERE source_turn_id IN ({_marks(part)})", tuple(part)
        ).rowcount
    entries += conn.execute("DELETE FROM memory_entries WHERE user_id = ?", (user_id,)).rowcount
    conn.execute("DELETE FROM memory_sources WHERE user_id = ?", (user_id,))
    conn.execute("DELETE FROM turns WHERE user_id = ?", (user_id,))
    emptied = [
        sid for part in _chunks(sessions)
        for (sid,) in conn.execute(
            f"SELECT id FROM sessions s WHERE id IN ({_marks(part)}) AND NOT EXISTS "
            "(SELECT 1 FROM turns t WHERE t.session_id = s.id) AND NOT EXISTS "
            "(SELECT 1 FROM rollouts r WHERE r.id = s.id)", tuple(part),
        )
    ]  # fmt: skip
    for part in _chunks(emptied):
        for table, column in (("feedback", "session_id"), ("judgments", "session_id"),
                              ("memory_entries", "source_session_id"), ("sessions", "id")):  # fmt: skip
            n = conn.execute(
                f"DELETE FROM {table} WHERE {column} IN ({_marks(part)})", tuple(part)
            ).rowcount
            if table == "memory_entries":
                entries += n
    dirs = [r[0] for r in conn.execute(
        "SELECT weights FROM user_adapters WHERE user_id = ? ORDER BY version", (user_id,))]  # fmt: skip
    conn.execute("DELETE FROM user_adapters WHERE user_id = ?", (user_id,))
    chains.forget(turn_ids)
    return ForgottenUser(user_id, len(turn_ids), len(emptied), entries, dirs, rewritten,
                         trained_shared, compacted=False, trained_either=trained_either)  # fmt: skip


def _require_users(store: _HasUsers) -> None:
    if store.schema_version < USERS_SCHEMA_VERSION:
        raise StoreError(
            f"this store is at schema version {store.schema_version}; users are recorded from "
            f"version {USERS_SCHEMA_VERSION} on: run `clawrl store migrate --store STORE`"
        )
