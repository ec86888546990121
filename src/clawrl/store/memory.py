"""Preference memory: a user's remembered directives (``memory_entries``).

An entry is one short instruction in the user's words, kept with where it came from (the turn
whose next state carried it: a judge's hint, a feedback comment, or ``manual``) and a history of
what happened to it (merged with a near-duplicate, edited, replaced). Only ``active`` entries
are shown to the policy; the others stay for the record until ``clawrl memory forget`` removes
an entry's words for good (:meth:`clawrl.memory.MemoryKeeper.forget`). The rules that decide
merges and replacements live in :mod:`clawrl.memory`; this module only stores.

``user_id`` is ``""`` for the one served policy (per-user memory keys it by user).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from clawrl.errors import StoreError
from clawrl.store.db import Conn, StoreConflict
from clawrl.store.rows import dump_json, load_json
from clawrl.store.types import new_id


class MemoryStatus(StrEnum):
    """Where a memory entry stands."""

    ACTIVE = "active"  # shown to the policy
    REPLACED = "replaced"  # a newer directive contradicted it
    EVICTED = "evicted"  # pushed out by the cap (least recently updated)
    RETIRED = "retired"  # the weights alone follow it (MemoryKeeper.record_distillation)
    DISABLED = "disabled"  # turned off by hand (clawrl memory edit --off)
    FORGOTTEN = "forgotten"  # its text and history removed (clawrl memory forget)


class MemorySource(StrEnum):
    """Where an entry's directive came from."""

    HINT = "hint"  # the judge's hindsight hint on a turn
    FEEDBACK = "feedback"  # a POST /v1/feedback comment
    MANUAL = "manual"  # clawrl memory add / the HTTP route


@dataclass
class MemoryEntryRecord:
    """One remembered directive.

    Attributes:
        text: the directive (at most :data:`MAX_TEXT_CHARS` characters).
        user_id: whose memory (``""``: the served policy's).
        status: :class:`MemoryStatus`.
        source: :class:`MemorySource`; ``source_turn_id`` / ``source_session_id`` the turn it
            was taken from (``None`` for manual entries).
        support: how many directives merged into it (1 = said once).
        created_at / updated_at: seconds since the epoch (``updated_at``: last merge or edit).
        ended_at / end_reason: when and why it stopped being active.
        history: what happened to it, oldest first: ``{"at", "event", ...}`` dicts.
    """

    text: str
    source: MemorySource
    id: str = field(default_factory=new_id)
    user_id: str = ""
    status: MemoryStatus = MemoryStatus.ACTIVE
    source_turn_id: str | None = None
    source_session_id: str | None = None
    support: int = 1
    created_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)
    ended_at: float | None = None
    end_reason: str | None = None
    history: list[dict[str, Any]] = field(default_factory=list)


MAX_TEXT_CHARS = 500
"""Longest directive text kept (a memory entry is a sentence or two, not a document)."""

_COLUMNS = (
    "id", "user_id", "text", "status", "source", "source_turn_id", "source_session_id",
    "support", "created_at", "updated_at", "ended_at", "end_reason", "history",
)  # fmt: skip


MEMORY_SCHEMA_VERSION = 7
"""The first store schema with the memory tables (an older read-only store has no memory)."""


class _HasConnections(Protocol):
    schema_version: int

    def _write(self) -> AbstractContextManager[Conn]: ...
    def _read(self) -> AbstractContextManager[Conn]: ...
    def memory_source_taken(self, source_id: str) -> bool: ...


def _row(e: MemoryEntryRecord) -> tuple[Any, ...]:
    return (
        e.id, e.user_id, e.text, str(MemoryStatus(e.status)), str(MemorySource(e.source)),
        e.source_turn_id, e.source_session_id, int(e.support), float(e.created_at),
        float(e.updated_at), e.ended_at, e.end_reason, dump_json(e.history, "memory.history"),
    )  # fmt: skip


def _record(r: Any) -> MemoryEntryRecord:
    return MemoryEntryRecord(
        id=r["id"], user_id=r["user_id"], text=r["text"], status=MemoryStatus(r["status"]),
        source=MemorySource(r["source"]), source_turn_id=r["source_turn_id"],
        source_session_id=r["source_session_id"], support=int(r["support"]),
        created_at=float(r["created_at"]), updated_at=float(r["updated_at"]),
        ended_at=None if r["ended_at"] is None else float(r["ended_at"]),
        end_reason=r["end_reason"], history=load_json(r["history"]) or [],
    )  # fmt: skip


@dataclass(frozen=True)
class MemorySourceClaim:
    """A hint or feedback comment the memory takes (``memory_sources``).

    Attributes:
        id: ``hint:TURN_ID`` or ``feedback:FEEDBACK_ID``.
        recorded_at: when the judgment or feedback was recorded (seconds since the epoch).
        user_id: whose memory took it.
        entry_id: the entry it added or changed (``None``: it held no directive).
    """

    id: str
    recorded_at: float
    user_id: str = ""
    entry_id: str | None = None


def _check(e: MemoryEntryRecord) -> None:
    if not e.text.strip():
        raise StoreError("a memory entry needs a text")
    if len(e.text) > MAX_TEXT_CHARS:
        raise StoreError(f"a memory entry is at most {MAX_TEXT_CHARS} characters, got "
                         f"{len(e.text)}: keep one directive per entry")  # fmt: skip


class MemoryEntries:
    """Mixin for :class:`clawrl.store.Store`: the ``memory_entries`` table."""

    def change_memory(
        self: _HasConnections,
        *,
        add: Sequence[MemoryEntryRecord] = (),
        save: Sequence[MemoryEntryRecord] = (),
        source: MemorySourceClaim | None = None,
    ) -> bool:
        """Write one change of the memory in one transaction (durable on return): insert the
        entries ``add``, write every field of the existing entries ``save``, and take
        ``source``, the hint or comment the change came from.

        Returns:
            ``False``, writing nothing, when ``source`` was taken already (by this or another
            process: each source changes the memory once).

        Raises:
            StoreError: an empty or too long text, a bad status or source, a duplicate id, or
                an entry of ``save`` that does not exist.
        """
        for e in [*add, *save]:
            _check(e)
        try:
            with self._write() as conn:
                if source is not None:
                    conn.execute(
                        "INSERT INTO memory_sources (id, user_id, entry_id, recorded_at, "
                        "taken_at) VALUES (?, ?, ?, ?, ?)",
                        (source.id, source.user_id, source.entry_id, float(source.recorded_at),
                         time.time()),
                    )  # fmt: skip
                for e in add:
                    conn.execute(
                        f"INSERT INTO memory_entries ({', '.join(_COLUMNS)}) VALUES "
                        f"({', '.join('?' * len(_COLUMNS))})",
                        _row(e),
                    )
                for e in save:
                    cur = conn.execute(
                        f"UPDATE memory_entries SET {', '.join(f'{c} = ?' for c in _COLUMNS[1:])} "
                        "WHERE id = ?",
                        (*_row(e)[1:], e.id),
                    )
                    if cur.rowcount == 0:
                        raise StoreError(f"no memory entry {e.id!r}")
        except StoreConflict:
            if source is not None and self.memory_source_taken(source.id):
                return False
            raise
        return True

    def save_memory_if_unchanged(
        self: _HasConnections,
        entries: Sequence[tuple[MemoryEntryRecord, MemoryStatus, str, int]],
    ) -> list[str]:
        """Write every field of each entry, but only where its row still has the status, text
        and support it was read with (``(entry, status, text, support)``): an entry another
        process turned off, forgot, edited or merged into since is left as it is. One
        transaction; durable on return.

        Returns:
            The ids written.

        Raises:
            StoreError: an entry's fields are invalid.
        """
        for e, *_ in entries:
            _check(e)
        saved: list[str] = []
        with self._write() as conn:
            for e, status, text, support in entries:
                cur = conn.execute(
                    f"UPDATE memory_entries SET {', '.join(f'{c} = ?' for c in _COLUMNS[1:])} "
                    "WHERE id = ? AND status = ? AND text = ? AND support = ?",
                    (*_row(e)[1:], e.id, str(MemoryStatus(status)), text, int(support)),
                )
                if cur.rowcount:
                    saved.append(e.id)
        return saved

    def memory_source_taken(self: _HasConnections, source_id: str) -> bool:
        """Whether the hint or comment ``source_id`` (``kind:id``) changed the memory already."""
        if self.schema_version < MEMORY_SCHEMA_VERSION:
            return False
        with self._read() as conn:
            r = conn.execute("SELECT 1 FROM memory_sources WHERE id = ?", (source_id,)).fetchone()
        return r is not None

    def memory_cursor(self: _HasConnections, user_id: str = "") -> float:
        """When the newest source a user's memory took was recorded (0.0: none yet)."""
        if self.schema_version < MEMORY_SCHEMA_VERSION:
            return 0.0
        with self._read() as conn:
            r = conn.execute(
                "SELECT MAX(recorded_at) FROM memory_sources WHERE user_id = ?", (user_id,)
            ).fetchone()
        return float(r[0] or 0.0)

    def get_memory_entry(self: _HasConnections, entry_id: str) -> MemoryEntryRecord | None:
        """The entry with this id (any status), or ``None``."""
        if self.schema_version < MEMORY_SCHEMA_VERSION:
            return None
        with self._read() as conn:
            r = conn.execute("SELECT * FROM memory_entries WHERE id = ?", (entry_id,)).fetchone()
        return None if r is None else _record(r)

    def memory_entries(
        self: _HasConnections, user_id: str | None = "", *, active_only: bool = True
    ) -> list[MemoryEntryRecord]:
        """A user's entries, oldest first (``user_id=None``: every user's).

        Args:
            active_only: only those shown to the policy (:attr:`MemoryStatus.ACTIVE`).
        """
        if self.schema_version < MEMORY_SCHEMA_VERSION:
            return []
        where, params = [], []
        if user_id is not None:
            where.append("user_id = ?")
            params.append(user_id)
        if active_only:
            where.append("status = ?")
            params.append(str(MemoryStatus.ACTIVE))
        sql = "SELECT * FROM memory_entries"
        if where:
            sql += " WHERE " + " AND ".join(where)
        with self._read() as conn:
            rows = conn.execute(sql + " ORDER BY created_at, rowid", tuple(params)).fetchall()
        return [_record(r) for r in rows]

    def memory_sources_since(
        self: _HasConnections, since: float, limit: int = 1000
    ) -> list[dict[str, Any]]:
        """Directives recorded after ``since`` (seconds since the epoch), oldest first: judges'
        hints (``{"kind": "hint", ...}``; feedback judged into a hint is left out, its comment
        is listed instead) and feedback comments (``{"kind": "feedback", ...}``), each with
        ``id`` (``hint:TURN_ID`` or ``feedback:FEEDBACK_ID``), ``created_at``, ``turn_id``,
        ``session_id``, ``turn_at`` (when its turn was recorded; ``None`` without one) and
        ``text`` (the hint, or the whole comment: the caller picks its directive sentences)."""
        if self.schema_version < MEMORY_SCHEMA_VERSION:
            return []
        with self._read() as conn:
            hints = conn.execute(
                "SELECT j.created_at, j.turn_id, j.session_id, j.hint, t.created_at FROM judgments "
                "j LEFT JOIN turns t ON t.id = j.turn_id WHERE j.created_at > ? "
                "AND j.hint IS NOT NULL AND j.hint != '' AND j.backend != 'feedback' "
                "ORDER BY j.created_at LIMIT ?",
                (float(since), int(limit)),
            ).fetchall()
            comments = conn.execute(
                "SELECT f.created_at, f.turn_id, f.session_id, f.comment, f.reward, f.id, "
                "t.created_at FROM feedback f LEFT JOIN turns t ON t.id = f.turn_id WHERE "
                "f.created_at > ? AND f.comment IS NOT NULL AND f.comment != '' "
                "ORDER BY f.created_at LIMIT ?",
                (float(since), int(limit)),
            ).fetchall()
        out = [{"kind": "hint", "id": f"hint:{r[1]}", "created_at": float(r[0]), "turn_id": r[1],
                "session_id": r[2], "text": r[3],
                "turn_at": float(r[4]) if r[4] is not None else None} for r in hints]  # fmt: skip
        out += [{"kind": "feedback", "id": f"feedback:{r[5]}", "created_at": float(r[0]), "turn_id": r[1],
                 "session_id": r[2], "text": r[3], "reward": float(r[4]),
                 "turn_at": float(r[6]) if r[6] is not None else None} for r in comments]  # fmt: skip
        # a list cut at ``limit`` ends the window: later rows of the other come next time
        full = [float(rows[-1][0]) for rows in (hints, comments) if len(rows) >= limit]
        horizon = min(full) if full else float("inf")
        return sorted((d for d in out if d["created_at"] <= horizon), key=lambda d: d["created_at"])

    def session_memory(self: _HasConnections, session_id: str) -> tuple[bool, Any]:
        """``(True, memory)`` of the session's latest main turn (``TurnRecord.memory``, may be
        ``None``), or ``(False, None)`` when the session has no main turn yet."""
        if self.schema_version < MEMORY_SCHEMA_VERSION:
            return (False, None)
        with self._read() as conn:
            r = conn.execute(
                "SELECT memory FROM turns WHERE session_id = ? AND kind = 'main' "
                "ORDER BY created_at DESC, rowid DESC LIMIT 1",
                (session_id,),
            ).fetchone()
        return (False, None) if r is None else (True, load_json(r[0]))
