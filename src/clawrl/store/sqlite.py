"""The SQLite trajectory store.

Durability: WAL journal with ``synchronous=FULL``: every write transaction is fsynced to the WAL
before its method returns, so what the gateway acknowledged (it records a turn before sending
the HTTP response) survives ``kill -9`` of the server and also an OS crash or power loss.
(``NORMAL`` would already survive ``kill -9``, since the WAL's writes sit in the OS page cache,
but not a power loss; one fsync per recorded turn is cheap next to generating it.)

Threads: every method is blocking and thread-safe; from asyncio call it in a worker thread
(``await asyncio.to_thread(store.record_turn, turn)``). Each thread gets its own connection (created on first use, closed by
:meth:`Store.close`), so reads run concurrently under WAL; writes are serialized by one lock per
``Store`` and run as short ``BEGIN IMMEDIATE`` transactions. Other processes (the CLI, a trainer)
may open the same file; SQLite's busy timeout (``timeout_s``) arbitrates between them.
"""

from __future__ import annotations

import os
import re
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import quote

from clawrl.errors import StoreError
from clawrl.store.codec import encode_ids, ids_digest, prefix_digests
from clawrl.store.learning import LearningQueries
from clawrl.store.migrations import applied_version, migrate
from clawrl.store.rows import (
    TURN_FIELDS,
    feedback_to_row,
    insert_sql,
    load_json,
    row_to_feedback,
    row_to_session,
    row_to_turn,
    session_to_row,
    turn_to_row,
)
from clawrl.store.schema import SCHEMA_VERSION
from clawrl.store.types import (
    FeedbackRecord,
    SessionRecord,
    SessionSource,
    SessionSummary,
    TurnKind,
    TurnRecord,
    new_id,
)

READ_ONLY_MIN_VERSION = 2
"""The oldest store schema a read-only store reads (the first with judgments and samples)."""

_IMMUTABLE_TURN_FIELDS = frozenset({"id", "session_id", "created_at"})
_SQL_CHUNK = 500  # bound on host parameters per IN (...) list


_URL_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
"""A database URL (``postgresql://...``), which would otherwise become a directory name."""


class Store(LearningQueries):
    """A durable, thread-safe store of sessions, turns and feedback in one SQLite file.

    Use as a context manager (``with Store(path) as store: ...``) or call :meth:`close`.

    Args:
        path: the database file; parent directories are created. ``:memory:`` is refused
            (each thread would see its own empty database).
        timeout_s: how long a write waits for another process's lock before failing.
        read_only: open an existing store for reading only (``clawrl dashboard``): no
            directory or file is created, nothing is migrated, every write fails; a schema from
            :data:`READ_ONLY_MIN_VERSION` to the current one is read as it is.

    Raises:
        StoreError: the path is a database URL (``postgresql://...``), the file cannot be
            opened, is not SQLite, cannot use WAL, has a schema newer than this code, or
            (read-only) does not exist or is older than
            :data:`READ_ONLY_MIN_VERSION`.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, timeout_s: float = 30.0, read_only: bool = False
    ) -> None:
        if str(path) == ":memory:" or str(path).startswith("file::memory:"):
            raise StoreError("the store needs a file path (':memory:' is per-connection)")
        scheme = _URL_SCHEME.match(str(path))
        if scheme:
            raise StoreError(
                f"the store {str(path)!r} is a {scheme.group(1)} URL; this clawrl stores in a "
                "SQLite file only (give a file path, e.g. --store clawrl.db)"
            )
        self.path = Path(path)
        self.timeout_s = timeout_s
        self.read_only = read_only
        if read_only:
            if not self.path.is_file():
                raise StoreError(f"no store at {self.path}")
        else:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreError(f"cannot create the directory {self.path.parent}: {exc}") from exc
        self._local = threading.local()
        self._conns: dict[threading.Thread, sqlite3.Connection] = {}
        self._conns_lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._closed = False
        if read_only:
            self.schema_version = self._read_only_version()
        else:
            self.schema_version = migrate(self._conn())

    def _read_only_version(self) -> int:
        try:
            version = applied_version(self._conn())
        except sqlite3.Error as exc:
            self.close()
            raise StoreError(f"{self.path} is not a clawrl store: {exc}") from exc
        if not READ_ONLY_MIN_VERSION <= version <= SCHEMA_VERSION:
            self.close()
            raise StoreError(
                f"{self.path} has store schema version {version}; reading it needs "
                f"{READ_ONLY_MIN_VERSION}..{SCHEMA_VERSION}"
                + (" (upgrade clawrl)" if version > SCHEMA_VERSION else
                   " (open it once read-write, e.g. `clawrl sessions list --store FILE`, to "
                   "migrate it)")
            )  # fmt: skip
        return version

    # -- connections -------------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        # Switching a new file to WAL needs an exclusive lock, and SQLite answers SQLITE_BUSY
        # at once (without calling the busy handler) when that could deadlock with another
        # opener doing the same. Retry such "locked"/"busy" answers until ``timeout_s``.
        deadline = time.monotonic() + self.timeout_s
        delay = 0.005
        while True:
            try:
                return self._connect_once()
            except sqlite3.OperationalError as exc:
                message = str(exc).lower()
                transient = "locked" in message or "busy" in message
                if not transient or time.monotonic() + delay > deadline:
                    raise StoreError(f"cannot open the store {self.path}: {exc}") from exc
                time.sleep(delay)
                delay = min(delay * 2, 0.2)
            except sqlite3.Error as exc:
                raise StoreError(f"cannot open the store {self.path}: {exc}") from exc

    def _connect_once(self) -> sqlite3.Connection:
        if self.read_only:
            uri = f"file:{quote(str(self.path.resolve()))}?mode=ro"
            conn = sqlite3.connect(
                uri, uri=True, timeout=self.timeout_s, isolation_level=None,
                check_same_thread=False,
            )  # fmt: skip
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA query_only=ON")
            conn.execute(f"PRAGMA busy_timeout={int(self.timeout_s * 1000)}")
            return conn
        conn = sqlite3.connect(
            self.path, timeout=self.timeout_s, isolation_level=None, check_same_thread=False
        )
        try:
            conn.row_factory = sqlite3.Row
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreError(f"{self.path}: WAL journal mode unavailable (got {mode!r})")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("PRAGMA foreign_keys=ON")
            conn.execute(f"PRAGMA busy_timeout={int(self.timeout_s * 1000)}")
        except BaseException:
            conn.close()
            raise
        return conn

    def _conn(self) -> sqlite3.Connection:
        if self._closed:
            raise StoreError("the store is closed")
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is not None:
            return conn
        conn = self._connect()
        with self._conns_lock:
            # Close connections of threads that have ended (e.g. a recycled worker pool).
            for thread in [t for t in self._conns if not t.is_alive()]:
                self._conns.pop(thread).close()
            self._conns[threading.current_thread()] = conn
        self._local.conn = conn
        return conn

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One short write transaction, committed (and fsynced) on exit.

        Raises:
            StoreError: the store was opened read-only.
        """
        if self.read_only:
            raise StoreError(f"the store {self.path} is open read-only")
        conn = self._conn()
        with self._write_lock:
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise StoreError(f"cannot start a write transaction: {exc}") from exc
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException as exc:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                if isinstance(exc, sqlite3.Error):
                    raise StoreError(f"store write failed: {exc}") from exc
                raise

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        conn = self._conn()
        try:
            yield conn
        except sqlite3.Error as exc:
            raise StoreError(f"store read failed: {exc}") from exc

    def close(self) -> None:
        """Close every connection this store opened (idempotent)."""
        with self._conns_lock:
            self._closed = True
            for conn in self._conns.values():
                conn.close()
            self._conns.clear()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- sessions ------------------------------------------------------------------------------

    def new_session(
        self,
        source: SessionSource = SessionSource.INFERRED,
        *,
        client: str | None = None,
        metadata: dict[str, Any] | None = None,
        session_id: str | None = None,
        created_at: float | None = None,
    ) -> SessionRecord:
        """Create a session (``session_id`` defaults to a uuid4 hex).

        Raises:
            StoreError: the id exists already, or a field is invalid.
        """
        session = SessionRecord(
            id=new_id() if session_id is None else session_id,
            source=source,
            created_at=time.time() if created_at is None else created_at,
            client=client,
            metadata=dict(metadata or {}),
        )
        row = session_to_row(session)
        with self._write() as conn:
            conn.execute(insert_sql("sessions", list(row)), row)
        return session

    def get_or_create_session(
        self,
        session_id: str,
        source: SessionSource,
        client: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> SessionRecord:
        """The session ``session_id``, created with ``source``/``client``/``metadata`` if new.

        Atomic under concurrent callers (one of them creates it, all get the same record);
        an existing session keeps its original source, client and metadata.
        """
        session = SessionRecord(
            id=session_id,
            source=source,
            created_at=time.time(),
            client=client,
            metadata=dict(metadata or {}),
        )
        row = session_to_row(session)
        with self._write() as conn:
            conn.execute(insert_sql("sessions", list(row), or_ignore=True), row)
            found = conn.execute("SELECT * FROM sessions WHERE id = ?", (session_id,)).fetchone()
        return row_to_session(found)

    def get_session(self, session_id: str) -> SessionRecord | None:
        """The session, or ``None`` when unknown."""
        with self._read() as conn:
            row = conn.execute("SELECT * FROM sessions WHERE id = ?", (session_id,)).fetchone()
        return None if row is None else row_to_session(row)

    def end_session(self, session_id: str, ended_at: float | None = None) -> None:
        """Mark the session ended (``find_extendable_turns`` then ignores it). Idempotent: an
        ended session keeps its first end time.

        Raises:
            StoreError: the session does not exist.
        """
        when = time.time() if ended_at is None else ended_at
        with self._write() as conn:
            cur = conn.execute(
                "UPDATE sessions SET ended_at = COALESCE(ended_at, ?) WHERE id = ?",
                (when, session_id),
            )
            if cur.rowcount == 0:
                raise StoreError(f"unknown session {session_id!r}")

    def list_sessions(
        self, limit: int = 50, offset: int = 0, *, query: str | None = None
    ) -> list[SessionSummary]:
        """Sessions with counts, most recently created first.

        Args:
            query: keep only sessions whose id, client, source (attribution) or harness
                (``metadata.harness``) contains this text, case-insensitively for ASCII
                letters (SQLite's LIKE); ``None`` or ``""``: all.
        """
        where, params = _session_filter(query)
        sql = f"""
        SELECT s.*,
            COUNT(t.id) AS n_turns,
            COALESCE(SUM(t.trainable = 1 AND t.status = 'ok'), 0) AS n_trainable,
            COALESCE(SUM(t.kind = 'side'), 0) AS n_side,
            COALESCE(SUM(t.status != 'ok'), 0) AS n_failed,
            COALESCE(SUM(t.prompt_len), 0) AS n_prompt,
            COALESCE(SUM(t.completion_len), 0) AS n_completion,
            MAX(t.created_at) AS last_turn_at,
            (SELECT COUNT(*) FROM feedback f WHERE f.session_id = s.id) AS n_feedback
        FROM (SELECT * FROM sessions {where} ORDER BY created_at DESC, rowid DESC
              LIMIT ? OFFSET ?) s
        LEFT JOIN turns t ON t.session_id = s.id
        GROUP BY s.id
        ORDER BY s.created_at DESC, s.rowid DESC
        """
        with self._read() as conn:
            rows = conn.execute(sql, (*params, int(limit), int(offset))).fetchall()
        return [
            SessionSummary(
                session=row_to_session(r),
                turns=r["n_turns"],
                trainable_turns=r["n_trainable"],
                side_turns=r["n_side"],
                failed_turns=r["n_failed"],
                feedback=r["n_feedback"],
                prompt_tokens=r["n_prompt"],
                completion_tokens=r["n_completion"],
                last_turn_at=r["last_turn_at"],
            )
            for r in rows
        ]

    def count_sessions(self, query: str | None = None) -> int:
        """How many sessions :meth:`list_sessions` lists with this ``query``."""
        where, params = _session_filter(query)
        with self._read() as conn:
            return int(conn.execute(f"SELECT COUNT(*) FROM sessions {where}", params).fetchone()[0])

    def activity(self, since: float) -> dict[str, float]:
        """Traffic since ``since`` (seconds since the epoch) and totals: ``"requests"`` (calls:
        turns of choice 0), ``"completion_tokens"`` and ``"prompt_tokens"`` of turns created
        since then, plus ``"sessions_total"`` and ``"turns_total"``."""
        with self._read() as conn:
            recent = conn.execute(
                "SELECT COALESCE(SUM(choice_index = 0), 0), COALESCE(SUM(completion_len), 0), "
                "COALESCE(SUM(prompt_len), 0) FROM turns WHERE created_at >= ?",
                (float(since),),
            ).fetchone()
            sessions = conn.execute("SELECT COUNT(*) FROM sessions").fetchone()[0]
            turns = conn.execute("SELECT COUNT(*) FROM turns").fetchone()[0]
        return {
            "requests": float(recent[0]),
            "completion_tokens": float(recent[1]),
            "prompt_tokens": float(recent[2]),
            "sessions_total": float(sessions),
            "turns_total": float(turns),
        }

    def session_ids(self) -> list[str]:
        """Every session id, oldest first."""
        with self._read() as conn:
            return [
                r[0] for r in conn.execute("SELECT id FROM sessions ORDER BY created_at, rowid")
            ]

    # -- turns ---------------------------------------------------------------------------------

    def record_turn(self, turn: TurnRecord) -> str:
        """Insert ``turn`` durably (committed and fsynced on return) and return its id.

        ``output_hash`` is computed from ``output`` when ``None`` (and set on ``turn``).

        Raises:
            StoreError: the session does not exist, the id is taken, or a field is invalid.
        """
        row = turn_to_row(turn)
        with self._write() as conn:
            conn.execute(insert_sql("turns", list(row)), row)
        turn.output_hash = row["output_hash"]
        return turn.id

    def update_turn(self, turn_id: str, **changes: Any) -> TurnRecord:
        """Change fields of a recorded turn (e.g. ``status=TurnStatus.INCOMPLETE``) and return it.

        Any :class:`TurnRecord` field but ``id``, ``session_id`` and ``created_at`` may change;
        derived columns are recomputed, and ``output_hash`` too when ``output`` changes
        without it.

        Raises:
            StoreError: unknown turn, unknown or immutable field, or an invalid value.
        """
        bad = set(changes) - (set(TURN_FIELDS) - _IMMUTABLE_TURN_FIELDS)
        if bad:
            raise StoreError(f"cannot update turn field(s) {sorted(bad)}")
        if "output" in changes and "output_hash" not in changes:
            changes["output_hash"] = None
        with self._write() as conn:
            found = conn.execute("SELECT * FROM turns WHERE id = ?", (turn_id,)).fetchone()
            if found is None:
                raise StoreError(f"unknown turn {turn_id!r}")
            turn = replace(row_to_turn(found), **changes)
            row = turn_to_row(turn)
            turn.output_hash = row["output_hash"]
            sets = ", ".join(f"{c} = :{c}" for c in row if c != "id")
            conn.execute(f"UPDATE turns SET {sets} WHERE id = :id", row)
        return turn

    def get_turn(self, turn_id: str) -> TurnRecord | None:
        """The turn, or ``None`` when unknown."""
        with self._read() as conn:
            row = conn.execute("SELECT * FROM turns WHERE id = ?", (turn_id,)).fetchone()
        return None if row is None else row_to_turn(row)

    def session_turns(self, session_id: str) -> list[TurnRecord]:
        """The session's turns ordered by ``created_at`` (then insertion order)."""
        with self._read() as conn:
            rows = conn.execute(
                "SELECT * FROM turns WHERE session_id = ? ORDER BY created_at, rowid",
                (session_id,),
            ).fetchall()
        return [row_to_turn(r) for r in rows]

    def session_outputs(self, session_id: str) -> list[tuple[str, float, dict[str, Any], Any]]:
        """``(turn id, created_at, client facts, parsed output)`` of the session's turns, oldest
        first: what the turns said and who said it, without decoding any ids (subagent
        spawn links, :func:`clawrl.gateway.attribution.spawning_turn`)."""
        with self._read() as conn:
            rows = conn.execute(
                "SELECT id, created_at, client, output FROM turns WHERE session_id = ? "
                "ORDER BY created_at, rowid",
                (session_id,),
            ).fetchall()
        return [(r[0], r[1], load_json(r[2]) or {}, load_json(r[3])) for r in rows]

    def has_agent_turn(self, session_id: str, agent_id: str) -> bool:
        """Whether the session holds a turn whose ``client.agent_id`` is ``agent_id`` (a
        subagent's calls after its first; one indexed scan of the session, no ids decoded)."""
        with self._read() as conn:
            row = conn.execute(
                "SELECT 1 FROM turns WHERE session_id = ? "
                "AND json_extract(client, '$.agent_id') = ? LIMIT 1",
                (session_id, agent_id),
            ).fetchone()
        return row is not None

    def find_turns_by_output_hash(
        self, output_hash: str, session_id: str | None = None, limit: int = 20
    ) -> list[TurnRecord]:
        """Turns whose recorded output hashes to ``output_hash`` (any status), newest first.

        The gateway uses this to splice a turn's exact completion ids when a history
        assistant message matches (:func:`clawrl.store.output_hash`).
        """
        sql = "SELECT * FROM turns WHERE output_hash = ?"
        params: list[Any] = [output_hash]
        if session_id is not None:
            sql += " AND session_id = ?"
            params.append(session_id)
        sql += " ORDER BY created_at DESC, rowid DESC LIMIT ?"
        params.append(int(limit))
        with self._read() as conn:
            rows = conn.execute(sql, params).fetchall()
        return [row_to_turn(r) for r in rows]

    def find_turns_by_prompt(
        self,
        prompt_ids: Sequence[int],
        *,
        session_id: str | None = None,
        since_s: float | None = None,
        limit: int = 20,
        now: float | None = None,
    ) -> list[TurnRecord]:
        """Turns whose ``prompt_ids`` equal ``prompt_ids`` exactly (retries, ``n > 1`` choices),
        newest first; looked up by the indexed prompt digest and verified id by id.

        Args:
            since_s: only turns created within this many seconds before ``now``.
        """
        sql = "SELECT * FROM turns WHERE prompt_hash = ?"
        params: list[Any] = [ids_digest(prompt_ids)]
        if session_id is not None:
            sql += " AND session_id = ?"
            params.append(session_id)
        if since_s is not None:
            sql += " AND created_at >= ?"
            params.append((time.time() if now is None else now) - since_s)
        sql += " ORDER BY created_at DESC, rowid DESC LIMIT ?"
        params.append(int(limit))
        want = encode_ids(prompt_ids)
        with self._read() as conn:
            rows = conn.execute(sql, params).fetchall()
        return [row_to_turn(r) for r in rows if bytes(r["prompt_ids"]) == want]

    def find_extendable_turns(
        self,
        prompt_ids: Sequence[int],
        since_s: float | None = 3600.0,
        limit: int = 20,
        *,
        now: float | None = None,
    ) -> list[TurnRecord]:
        """Turns of open sessions whose ``prompt_ids + completion_ids`` is a prefix of
        ``prompt_ids`` (equal length included), longest first, newest first among equals.

        For session inference: the best match is the call this prompt continues. A retry of a
        failed call (no completion ids) matches the failed call itself.

        Method (exact, not approximate): each turn stores ``seq_len`` and ``seq_hash``
        (sha256 of its int32 ids). (1) read the distinct ``seq_len`` values of recent open
        turns that are ``<= len(prompt_ids)``; (2) hash ``prompt_ids[:m]`` for each such ``m``
        in one pass; (3) fetch turns by the indexed ``seq_hash``; (4) keep only those whose
        stored ids equal ``prompt_ids[:seq_len]`` token for token.

        Args:
            prompt_ids: the new call's prompt, shape ``[p]``.
            since_s: only turns created within this many seconds before ``now`` (``None``:
                all; sessions are rarely ended, so an unbounded search grows with the file).
            limit: most turns returned.
        """
        n = len(prompt_ids)
        where = "s.ended_at IS NULL AND t.seq_len <= ?"
        params: list[Any] = [n]
        if since_s is not None:
            where += " AND t.created_at >= ?"
            params.append((time.time() if now is None else now) - since_s)
        join = "FROM turns t JOIN sessions s ON s.id = t.session_id"
        with self._read() as conn:
            lengths = [
                r[0]
                for r in conn.execute(f"SELECT DISTINCT t.seq_len {join} WHERE {where}", params)
            ]
            if not lengths:
                return []
            digests = prefix_digests(prompt_ids, lengths)
            want = encode_ids(prompt_ids)
            found: list[sqlite3.Row] = []
            values = list(digests.values())
            for start in range(0, len(values), _SQL_CHUNK):
                chunk = values[start : start + _SQL_CHUNK]
                marks = ", ".join("?" * len(chunk))
                found += conn.execute(
                    f"SELECT t.*, t.rowid AS row_order {join} WHERE {where} AND t.seq_hash IN ({marks})",
                    [*params, *chunk],
                ).fetchall()
        matches = []
        for row in found:
            seq = bytes(row["prompt_ids"]) + bytes(row["completion_ids"])
            if want[: len(seq)] == seq:  # verify: equal ids, not just equal digests
                matches.append(row)
        matches.sort(key=lambda r: (-r["seq_len"], -r["created_at"], -r["row_order"]))
        return [row_to_turn(r) for r in matches[:limit]]

    def recent_turns(
        self,
        since_s: float = 3600.0,
        limit: int = 200,
        *,
        inferred_only: bool = False,
        main_only: bool = False,
        client_match: Mapping[str, Any] | None = None,
        now: float | None = None,
    ) -> list[TurnRecord]:
        """Turns of open sessions created within ``since_s`` seconds before ``now``, newest
        first.

        Args:
            since_s: the window (seconds).
            limit: most turns returned.
            inferred_only: only turns of sessions that were inferred (a client that names its
                sessions is never joined by inference).
            main_only: only turns of kind ``main``.
            client_match: only turns whose ``client`` facts have these values (compared in
                SQL, e.g. ``{"user_agent": ..., "api_key_fingerprint": ...}``; ``None`` values
                match a missing key).
        """
        where, params = self._recent_where(since_s, inferred_only, main_only, client_match, now)
        return self._newest_turns(where, params, limit)

    def find_dropped_answer_turns(
        self,
        prompt_ids: Sequence[int],
        generation_ids: Sequence[int],
        *,
        since_s: float = 600.0,
        min_context: int = 32,
        client_match: Mapping[str, Any] | None = None,
        limit: int = 20,
        now: float | None = None,
    ) -> list[TurnRecord]:
        """Recent main turns of inferred open sessions whose prompt is ``context +
        generation_ids`` with ``context`` (at least ``min_context`` tokens) a strict prefix of
        ``prompt_ids``, and ``prompt_ids`` not their whole prompt: calls whose answer the client
        dropped before going on (:func:`clawrl.gateway.attribution.link_call`, rule 4). Newest
        first; the comparison runs in SQL on the stored bytes, so only matches are decoded.
        Turns with prefilled ids (a forced tool call) are not found.
        """
        gen = encode_ids(generation_ids)
        want = encode_ids(prompt_ids)
        g = len(generation_ids)
        where, params = self._recent_where(since_s, True, True, client_match, now)
        where += (
            " AND t.prompt_len - ? >= ? AND t.prompt_len - ? < ?"
            " AND substr(t.prompt_ids, 4 * (t.prompt_len - ?) + 1) = ?"
            " AND substr(t.prompt_ids, 1, 4 * (t.prompt_len - ?)) = substr(?, 1, 4 * (t.prompt_len - ?))"
            " AND substr(?, 1, 4 * t.prompt_len) != t.prompt_ids"
        )
        params += [g, int(min_context), g, len(prompt_ids), g, gen, g, want, g, want]
        return self._newest_turns(where, params, limit)

    def _newest_turns(self, where: str, params: list[Any], limit: int) -> list[TurnRecord]:
        """Turns (joined with their session as ``s``) matching ``where``, newest first."""
        with self._read() as conn:
            rows = conn.execute(
                f"SELECT t.* FROM turns t JOIN sessions s ON s.id = t.session_id WHERE {where} "
                "ORDER BY t.created_at DESC, t.rowid DESC LIMIT ?",
                [*params, int(limit)],
            ).fetchall()
        return [row_to_turn(r) for r in rows]

    @staticmethod
    def _recent_where(
        since_s: float,
        inferred_only: bool,
        main_only: bool,
        client_match: Mapping[str, Any] | None,
        now: float | None,
    ) -> tuple[str, list[Any]]:
        where = "s.ended_at IS NULL AND t.created_at >= ?"
        params: list[Any] = [(time.time() if now is None else now) - since_s]
        if inferred_only:
            where += " AND s.source = ?"
            params.append(SessionSource.INFERRED.value)
        if main_only:
            where += " AND t.kind = ?"
            params.append(TurnKind.MAIN.value)
        for key, value in (client_match or {}).items():
            if not key.replace("_", "").isalnum():
                raise StoreError(f"client_match key {key!r} is not a plain field name")
            if value is None:
                where += f" AND json_extract(t.client, '$.{key}') IS NULL"
            else:
                where += f" AND json_extract(t.client, '$.{key}') = ?"
                params.append(value)
        return where, params

    # -- feedback ------------------------------------------------------------------------------

    def add_feedback(
        self,
        reward: float,
        *,
        turn_id: str | None = None,
        session_id: str | None = None,
        comment: str | None = None,
        created_at: float | None = None,
    ) -> FeedbackRecord:
        """Record explicit feedback on a turn or a session (``reward`` in [-1, 1]).

        With only ``turn_id``, ``session_id`` is filled from the turn.

        Raises:
            StoreError: reward out of range, neither id given, unknown turn or session, or
                a turn that is not in the given session.
        """
        fb = FeedbackRecord(
            reward=reward,
            turn_id=turn_id,
            session_id=session_id,
            comment=comment,
            created_at=time.time() if created_at is None else created_at,
        )
        row = feedback_to_row(fb)
        with self._write() as conn:
            if turn_id is not None:
                found = conn.execute(
                    "SELECT session_id FROM turns WHERE id = ?", (turn_id,)
                ).fetchone()
                if found is None:
                    raise StoreError(f"unknown turn {turn_id!r}")
                if session_id is not None and session_id != found[0]:
                    raise StoreError(f"turn {turn_id!r} is not in session {session_id!r}")
                fb.session_id = row["session_id"] = found[0]
            conn.execute(insert_sql("feedback", list(row)), row)
        return fb

    def feedback_for(
        self, *, turn_id: str | None = None, session_id: str | None = None
    ) -> list[FeedbackRecord]:
        """Feedback rows, oldest first: for a turn (``turn_id``), or every row of a session,
        turn-level and session-level (``session_id``).

        Raises:
            StoreError: neither or both ids given.
        """
        if (turn_id is None) == (session_id is None):
            raise StoreError("feedback_for takes exactly one of turn_id, session_id")
        column, value = ("turn_id", turn_id) if turn_id is not None else ("session_id", session_id)
        with self._read() as conn:
            rows = conn.execute(
                f"SELECT * FROM feedback WHERE {column} = ? ORDER BY created_at, rowid", (value,)
            ).fetchall()
        return [row_to_feedback(r) for r in rows]


def _session_filter(query: str | None) -> tuple[str, tuple[str, ...]]:
    """``WHERE`` clause and parameters for a session search (LIKE with ``%`` and ``_`` escaped)."""
    if not query:
        return "", ()
    escaped = query.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    like = f"%{escaped}%"
    cols = ("id", "COALESCE(client, '')", "source",
            "COALESCE(json_extract(metadata, '$.harness'), '')")  # fmt: skip
    return "WHERE " + " OR ".join(f"{c} LIKE ? ESCAPE '\\'" for c in cols), (like,) * len(cols)
