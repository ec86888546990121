"""The durable trajectory store: sessions, token-exact turns, feedback, judgments, samples and
harness rollouts.

:class:`Store` is one API over two backends (:mod:`clawrl.store.db`): a SQLite file (the
default: :mod:`clawrl.store.sqlite`) or a PostgreSQL database (``postgresql://...``:
:mod:`clawrl.store.postgres`), which several gateway replicas, the CLI and a trainer on any
machines may share. Every query is written once, in SQL both run. See
:mod:`clawrl.store.schema` for the one schema declaration, :mod:`clawrl.store.migrations` for
adding tables and columns, and :mod:`clawrl.store.chains` for how prompts are stored as deltas.

Durability: a write method returns after its transaction committed durably (SQLite: fsynced
WAL; PostgreSQL: ``synchronous_commit``), so a turn the gateway acknowledged survives ``kill
-9`` of the gateway.

Threads: every method is blocking and thread-safe; from asyncio call it in a worker thread
(``await asyncio.to_thread(store.record_turn, turn)``).

Consistency across processes: a write is visible to every reader, in this process or another
(another replica), as soon as its method returns. Session attribution reads (prefix, retry,
echo) therefore see every turn that was acknowledged before the call arrived.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any

from clawrl.errors import StoreError
from clawrl.store.chains import FullTurn, PromptChains, digest
from clawrl.store.codec import encode_ids, ids_digest, prefix_digests
from clawrl.store.db import Conn, Database, is_url, open_database
from clawrl.store.learning import LearningQueries
from clawrl.store.leases import Leases
from clawrl.store.memory import MemoryEntries
from clawrl.store.migrations import applied_version, migrate
from clawrl.store.rollouts import RolloutQueries
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
from clawrl.store.schema import SCHEMA_VERSION, Dialect
from clawrl.store.types import (
    FeedbackRecord,
    SessionRecord,
    SessionSource,
    SessionSummary,
    TurnKind,
    TurnRecord,
    new_id,
)
from clawrl.store.users import USERS_SCHEMA_VERSION, UserQueries
from clawrl.store.versions import PolicyVersions

READ_ONLY_MIN_VERSION = 2
"""The oldest store schema a read-only store reads (the first with judgments and samples)."""

_IMMUTABLE_TURN_FIELDS = frozenset({"id", "session_id", "created_at", "prompt_ids",
                                    "request_messages", "user_id"})  # fmt: skip
_SQL_CHUNK = 500  # bound on host parameters per IN (...) list


class Store(LearningQueries, PolicyVersions, Leases, RolloutQueries, MemoryEntries, UserQueries):
    """A durable, thread-safe store of sessions, turns and feedback (and judgments, samples,
    policy versions, leases, harness rollouts and memory entries: the mixins), in SQLite or PostgreSQL.

    Use as a context manager (``with Store(target) as store: ...``) or call :meth:`close`.

    Args:
        target: a SQLite file path (parent directories are created; ``:memory:`` is refused:
            each thread would see its own empty database), or a PostgreSQL URL
            ``postgresql://USER[:PASSWORD]@HOST[:PORT]/DB`` (the database must exist; the
            store's tables are created in its current schema).
        timeout_s: how long a write waits for a lock or a connection before failing.
        read_only: open an existing store for reading only (``clawrl dashboard``): nothing
            is created or migrated, every write fails; a schema from
            :data:`READ_ONLY_MIN_VERSION` to the current one is read as it is.

    Raises:
        StoreError: a URL of another scheme, the file or server cannot be opened (or is not
            SQLite), WAL is unavailable, the schema is newer than this code, or (read-only)
            there is no store there or it is older than :data:`READ_ONLY_MIN_VERSION`.
    """

    def __init__(
        self, target: str | os.PathLike[str], *, timeout_s: float = 30.0, read_only: bool = False
    ) -> None:
        self._db: Database = open_database(target, timeout_s=timeout_s, read_only=read_only)
        self.target = self._db.target
        self.dialect: Dialect = self._db.dialect
        self.timeout_s = timeout_s
        self.read_only = read_only
        self._chains = PromptChains()
        if read_only:
            self.schema_version = self._read_only_version()
        else:
            try:
                self.schema_version = migrate(self._db)
            except BaseException:
                self._db.close()
                raise

    def _read_only_version(self) -> int:
        try:
            with self._read() as conn:
                version = applied_version(conn)
        except StoreError as exc:
            self.close()
            raise StoreError(f"{self.target} is not a clawrl store: {exc}") from exc
        if version == 0:
            self.close()
            raise StoreError(f"no trajectory store at {self.target} (no clawrl tables there)")
        if not READ_ONLY_MIN_VERSION <= version <= SCHEMA_VERSION:
            self.close()
            raise StoreError(
                f"{self.target} has store schema version {version}; reading it needs "
                f"{READ_ONLY_MIN_VERSION}..{SCHEMA_VERSION}"
                + (" (upgrade clawrl)" if version > SCHEMA_VERSION else
                   " (migrate it: `clawrl store migrate --store TARGET`)")
            )  # fmt: skip
        return version

    @staticmethod
    def exists(target: str | os.PathLike[str], *, timeout_s: float = 30.0) -> bool:
        """Whether ``target`` holds a clawrl store (a SQLite file, or a PostgreSQL database
        whose current schema has the store's tables); nothing is created.

        Raises:
            StoreError: a PostgreSQL server that cannot be reached, or a bad URL.
        """
        if not is_url(target):
            return os.path.isfile(target)
        db = open_database(target, timeout_s=timeout_s, read_only=True)
        try:
            with db.read() as conn:
                return applied_version(conn) > 0
        finally:
            db.close()

    # -- connections -------------------------------------------------------------------------

    def _write(self) -> AbstractContextManager[Conn]:
        """One short write transaction, committed (and durable) on exit.

        Raises:
            StoreError: the store was opened read-only, or the write failed.
        """
        return self._db.write()

    def _read(self) -> AbstractContextManager[Conn]:
        return self._db.read()

    def close(self) -> None:
        """Close every connection this store opened (idempotent)."""
        self._db.close()

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
        self,
        limit: int = 50,
        offset: int = 0,
        *,
        query: str | None = None,
        user: str | None = None,
    ) -> list[SessionSummary]:
        """Sessions with counts, most recently created first.

        Args:
            query: keep only sessions whose id, client, source (attribution) or harness
                (``metadata.harness``) contains this text, case-insensitively for ASCII
                letters; ``None`` or ``""``: all.
            user: keep only sessions with a turn of this user (exact id; ``""``: turns that
                named no user); ``None``: every user's.
        """
        cols = "s.id, s.source, s.created_at, s.ended_at, s.client, s.metadata, s.row_order"
        with self._read() as conn:
            where, params = _session_filter(query, conn, self._user_filter(user))
            sql = f"""
            SELECT {cols},
                COUNT(t.id) AS n_turns,
                SUM(CASE WHEN t.trainable = 1 AND t.status = 'ok' THEN 1 ELSE 0 END) AS n_trainable,
                SUM(CASE WHEN t.kind = 'side' THEN 1 ELSE 0 END) AS n_side,
                SUM(CASE WHEN t.status != 'ok' THEN 1 ELSE 0 END) AS n_failed,
                SUM(t.prompt_len) AS n_prompt,
                SUM(t.completion_len) AS n_completion,
                MAX(t.created_at) AS last_turn_at,
                (SELECT COUNT(*) FROM feedback f WHERE f.session_id = s.id) AS n_feedback
            FROM (SELECT id, source, created_at, ended_at, client, metadata, rowid AS row_order
                  FROM sessions {where} ORDER BY created_at DESC, rowid DESC LIMIT ? OFFSET ?) s
            LEFT JOIN turns t ON t.session_id = s.id
            GROUP BY {cols}
            ORDER BY s.created_at DESC, s.row_order DESC
            """
            rows = conn.execute(sql, (*params, int(limit), int(offset))).fetchall()
            users = self._session_users(conn, [r["id"] for r in rows])
        return [
            SessionSummary(
                session=row_to_session(r),
                user_ids=users.get(r["id"], ()),
                turns=int(r["n_turns"]),
                trainable_turns=int(r["n_trainable"] or 0),
                side_turns=int(r["n_side"] or 0),
                failed_turns=int(r["n_failed"] or 0),
                feedback=int(r["n_feedback"]),
                prompt_tokens=int(r["n_prompt"] or 0),
                completion_tokens=int(r["n_completion"] or 0),
                last_turn_at=r["last_turn_at"],
            )
            for r in rows
        ]

    def count_sessions(self, query: str | None = None, *, user: str | None = None) -> int:
        """How many sessions :meth:`list_sessions` lists with this ``query`` and ``user``."""
        with self._read() as conn:
            where, params = _session_filter(query, conn, self._user_filter(user))
            return int(conn.execute(f"SELECT COUNT(*) FROM sessions {where}", params).fetchone()[0])

    def _user_filter(self, user: str | None) -> tuple[str, tuple[str, ...]] | None:
        """The session condition for ``user`` (``None``: none); a store that predates users
        holds only turns without one."""
        if user is None:
            return None
        if self.schema_version < USERS_SCHEMA_VERSION:
            return ("1 = 1", ()) if user == "" else ("1 = 0", ())
        return "id IN (SELECT session_id FROM turns WHERE user_id = ?)", (user,)

    def _session_users(self, conn: Conn, session_ids: Sequence[str]) -> dict[str, tuple[str, ...]]:
        """The users (sorted, ``""`` left out) whose turns each of ``session_ids`` holds."""
        if not session_ids or self.schema_version < USERS_SCHEMA_VERSION:
            return {}
        found: dict[str, set[str]] = {}
        for i in range(0, len(session_ids), _SQL_CHUNK):
            chunk = list(session_ids[i : i + _SQL_CHUNK])
            marks = ", ".join("?" for _ in chunk)
            for r in conn.execute(
                f"SELECT DISTINCT session_id, user_id FROM turns "
                f"WHERE session_id IN ({marks}) AND user_id != ''",
                chunk,
            ).fetchall():
                found.setdefault(r[0], set()).add(r[1])
        return {k: tuple(sorted(v)) for k, v in found.items()}

    def activity(self, since: float) -> dict[str, float]:
        """Traffic since ``since`` (seconds since the epoch) and totals: ``"requests"`` (calls:
        turns of choice 0), ``"completion_tokens"`` and ``"prompt_tokens"`` of turns created
        since then, plus ``"sessions_total"`` and ``"turns_total"``."""
        with self._read() as conn:
            recent = conn.execute(
                "SELECT COALESCE(SUM(CASE WHEN choice_index = 0 THEN 1 ELSE 0 END), 0), "
                "COALESCE(SUM(completion_len), 0), "
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

    def _turns(self, conn: Conn, rows: Sequence[Any]) -> list[TurnRecord]:
        """Turn records of ``turns`` rows, their delta-stored prompts rebuilt
        (:mod:`clawrl.store.chains`)."""
        if not rows:
            return []
        full = self._chains.resolve(conn, rows)
        return [row_to_turn(r, full[r["id"]]) for r in rows]

    def _full_turn(self, turn_id: str) -> FullTurn | None:
        """A turn's full ids and messages (remembered, or rebuilt), or ``None`` when unknown."""
        cached = self._chains.get(turn_id)
        if cached is not None:
            return cached
        from clawrl.store.chains import CHAIN_COLUMNS

        with self._read() as conn:
            row = conn.execute(
                f"SELECT {CHAIN_COLUMNS} FROM turns WHERE id = ?", (turn_id,)
            ).fetchone()
            return None if row is None else self._chains.resolve(conn, [row])[turn_id]

    def record_turn(self, turn: TurnRecord) -> str:
        """Insert ``turn`` durably (committed and fsynced on return) and return its id.

        ``output_hash`` is computed from ``output`` when ``None`` (and set on ``turn``). When
        ``parent_turn_id`` names a turn whose ``prompt + completion`` starts this prompt (id
        for id), only what this prompt adds is stored (:mod:`clawrl.store.chains`); reads
        return the full ids either way.

        Raises:
            StoreError: the session does not exist, the id is taken, or a field is invalid.
        """
        self.record_turns([turn])
        return turn.id

    def record_turns(
        self, turns: Sequence[TurnRecord], *, session: SessionRecord | None = None
    ) -> None:
        """Insert several turns (the choices of one call) in one durable transaction, after
        creating ``session`` if it does not exist yet (the gateway creates a new session with
        its first turn: one commit, not two). Each turn as in :meth:`record_turn`.

        Raises:
            StoreError: a turn's session does not exist, an id is taken, or a field is
                invalid (nothing is written).
        """
        rows = []
        for turn in turns:
            row = turn_to_row(turn)
            full = FullTurn(row["prompt_ids"], row["completion_ids"], tuple(turn.request_messages))
            base_id = turn.parent_turn_id
            base = self._full_turn(base_id) if base_id else None
            delta = base_id is not None and base is not None and self._chains.compress(
                row, base_id, base, turn.request_messages
            )  # fmt: skip
            rows.append((turn, row, full, base_id if delta else None, base))
        with self._write() as conn:
            if session is not None:
                srow = session_to_row(session)
                conn.execute(insert_sql("sessions", list(srow), or_ignore=True), srow)
            for i, (turn, row, _, base_id, base) in enumerate(rows):
                if base_id is not None and base is not None:
                    found = conn.execute(
                        f"SELECT seq_hash FROM turns WHERE id = ?{conn.for_share}", (base_id,)
                    ).fetchone()
                    if found is None or found[0] != digest(base.seq):  # changed since read
                        row = turn_to_row(turn)
                        rows[i] = (turn, row, rows[i][2], None, None)
                conn.execute(insert_sql("turns", list(row)), row)
        for turn, row, full, _, _ in rows:
            turn.output_hash = row["output_hash"]
            self._chains.put(turn.id, full)

    def update_turn(self, turn_id: str, **changes: Any) -> TurnRecord:
        """Change fields of a recorded turn (e.g. ``status=TurnStatus.INCOMPLETE``) and return it.

        Any :class:`TurnRecord` field but ``id``, ``session_id``, ``created_at``, ``prompt_ids``
        and ``request_messages`` (what the engine and the client gave) may change; derived
        columns are recomputed, and ``output_hash`` too when ``output`` changes without it.
        ``completion_ids`` may not change once a later turn's prompt is stored as its delta.

        Raises:
            StoreError: unknown turn, unknown or immutable field, an invalid value, or a
                completion that later turns build on.
        """
        bad = set(changes) - (set(TURN_FIELDS) - _IMMUTABLE_TURN_FIELDS)
        if bad:
            raise StoreError(f"cannot update turn field(s) {sorted(bad)}")
        if "output" in changes and "output_hash" not in changes:
            changes["output_hash"] = None
        with self._write() as conn:
            found = conn.execute(f"SELECT * FROM turns WHERE id = ?{conn.for_update}",
                                 (turn_id,)).fetchone()  # fmt: skip
            if found is None:
                raise StoreError(f"unknown turn {turn_id!r}")
            current = self._turns(conn, [found])[0]
            turn = replace(current, **changes)
            if turn.completion_ids != current.completion_ids:
                child = conn.execute(
                    "SELECT id FROM turns WHERE prefix_turn_id = ? LIMIT 1", (turn_id,)
                ).fetchone()
                if child is not None:
                    raise StoreError(f"cannot change the completion of turn {turn_id!r}: turn "
                                     f"{child[0]!r} is stored as its continuation")  # fmt: skip
            row = turn_to_row(turn)
            turn.output_hash = row["output_hash"]
            keep = {"id", "prompt_ids", "request_messages", "prefix_turn_id", "prefix_len",
                    "messages_prefix_len"}  # fmt: skip
            sets = ", ".join(f"{c} = :{c}" for c in row if c not in keep)
            conn.execute(f"UPDATE turns SET {sets} WHERE id = :id",
                         {k: v for k, v in row.items() if k not in keep or k == "id"})  # fmt: skip
        self._chains.forget([turn_id])
        return turn

    def get_turn(self, turn_id: str) -> TurnRecord | None:
        """The turn, or ``None`` when unknown."""
        with self._read() as conn:
            row = conn.execute("SELECT * FROM turns WHERE id = ?", (turn_id,)).fetchone()
            return None if row is None else self._turns(conn, [row])[0]

    def session_turns(self, session_id: str) -> list[TurnRecord]:
        """The session's turns ordered by ``created_at`` (then insertion order)."""
        with self._read() as conn:
            rows = conn.execute(
                "SELECT * FROM turns WHERE session_id = ? ORDER BY created_at, rowid",
                (session_id,),
            ).fetchall()
            return self._turns(conn, rows)

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
                f"SELECT 1 FROM turns WHERE session_id = ? "
                f"AND {conn.json_text('client', 'agent_id')} = ? LIMIT 1",
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
            return self._turns(conn, conn.execute(sql, params).fetchall())

    def find_turns_by_output_hashes(
        self, output_hashes: Sequence[str], session_id: str | None = None, limit: int = 20
    ) -> dict[str, list[TurnRecord]]:
        """:meth:`find_turns_by_output_hash` for several hashes in one query: ``hash -> turns``
        (newest first, at most ``limit`` each; every hash asked for is a key). The gateway
        looks up every assistant message of a history at once: one round trip instead of one
        per message."""
        wanted = list(dict.fromkeys(output_hashes))
        out: dict[str, list[TurnRecord]] = {h: [] for h in wanted}
        with self._read() as conn:
            for start in range(0, len(wanted), _SQL_CHUNK):
                chunk = wanted[start : start + _SQL_CHUNK]
                where = f"output_hash IN ({', '.join('?' * len(chunk))})"
                params: list[Any] = [*chunk]
                if session_id is not None:
                    where += " AND session_id = ?"
                    params.append(session_id)
                rows = conn.execute(
                    "SELECT * FROM (SELECT t.*, ROW_NUMBER() OVER (PARTITION BY output_hash "
                    "ORDER BY created_at DESC, rowid DESC) AS nth FROM turns t "
                    f"WHERE {where}) ranked WHERE nth <= ? ORDER BY created_at DESC, nth",
                    [*params, int(limit)],
                ).fetchall()
                for turn in self._turns(conn, rows):
                    out[turn.output_hash or ""].append(turn)
        return out

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
        want = list(prompt_ids)
        with self._read() as conn:
            turns = self._turns(conn, conn.execute(sql, params).fetchall())
        return [t for t in turns if t.prompt_ids == want]

    def find_extendable_turns(
        self,
        prompt_ids: Sequence[int],
        since_s: float | None = 3600.0,
        limit: int = 20,
        *,
        now: float | None = None,
        lengths: Iterable[int] | None = None,
        session_id: str | None = None,
    ) -> list[TurnRecord]:
        """Turns of open sessions whose ``prompt_ids + completion_ids`` is a prefix of
        ``prompt_ids`` (equal length included), longest first, newest first among equals.

        For session inference: the best match is the call this prompt continues. A retry of a
        failed call (no completion ids) matches the failed call itself.

        Method (exact, not approximate): each turn stores ``seq_len`` and ``seq_hash``
        (sha256 of its int32 ids). (1) read the distinct ``seq_len`` values of recent open
        turns that are ``<= len(prompt_ids)``; (2) hash ``prompt_ids[:m]`` for each such ``m``
        in one pass; (3) fetch turns by the indexed ``seq_hash``; (4) keep only those whose
        (rebuilt) ids equal ``prompt_ids[:seq_len]`` token for token.

        Args:
            prompt_ids: the new call's prompt, shape ``[p]``.
            since_s: only turns created within this many seconds before ``now`` (``None``:
                all; sessions are rarely ended, so an unbounded search grows with the file).
            limit: most turns returned.
            lengths: the only ``seq_len`` values to look for (e.g. the positions next to the
                template's end-of-turn tokens: :func:`clawrl.gateway.attribution.turn_ends`),
                which skips step (1), a scan of the window's turns that grows with traffic;
                ``None``: every length a recent open turn has.
            session_id: only turns of this session.
        """
        n = len(prompt_ids)
        where = "s.ended_at IS NULL AND t.seq_len <= ?"
        params: list[Any] = [n]
        if session_id is not None:
            where += " AND t.session_id = ?"
            params.append(session_id)
        if since_s is not None:
            where += " AND t.created_at >= ?"
            params.append((time.time() if now is None else now) - since_s)
        join = "FROM turns t JOIN sessions s ON s.id = t.session_id"
        with self._read() as conn:
            if lengths is None:
                lengths = [
                    r[0]
                    for r in conn.execute(f"SELECT DISTINCT t.seq_len {join} WHERE {where}", params)
                ]
            digests = prefix_digests(prompt_ids, lengths)
            if not digests:
                return []
            found: list[Any] = []
            values = list(digests.values())
            for start in range(0, len(values), _SQL_CHUNK):
                chunk = values[start : start + _SQL_CHUNK]
                marks = ", ".join("?" * len(chunk))
                found += conn.execute(
                    f"SELECT t.*, t.rowid AS row_order {join} WHERE {where} AND t.seq_hash IN ({marks})",
                    [*params, *chunk],
                ).fetchall()
            found.sort(key=lambda r: (-r["seq_len"], -r["created_at"], -r["row_order"]))
            want = encode_ids(prompt_ids)
            full = self._chains.resolve(conn, found) if found else {}
        matches = [r for r in found if want.startswith(full[r["id"]].seq)]  # equal ids, not digests
        return [row_to_turn(r, full[r["id"]]) for r in matches[:limit]]  # decode only these

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
        with self._read() as conn:
            where, params = _recent_where(conn, since_s, inferred_only, main_only, client_match,
                                          now)  # fmt: skip
            rows = conn.execute(
                f"SELECT t.* FROM turns t JOIN sessions s ON s.id = t.session_id WHERE {where} "
                "ORDER BY t.created_at DESC, t.rowid DESC LIMIT ?",
                [*params, int(limit)],
            ).fetchall()
            return self._turns(conn, rows)

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
        context_lengths: Iterable[int] | None = None,
    ) -> list[TurnRecord]:
        """Recent main turns of inferred open sessions whose prompt is ``context +
        generation_ids`` with ``context`` (at least ``min_context`` tokens) a strict prefix of
        ``prompt_ids``, and ``prompt_ids`` not their whole prompt: calls whose answer the client
        dropped before going on (:func:`clawrl.gateway.attribution.link_call`, rule 4). Newest
        first. Found like :meth:`find_extendable_turns`: the distinct prompt lengths ``m`` of
        recent candidates, the digest of ``prompt_ids[:m - g] + generation_ids`` for each, an
        indexed lookup by ``prompt_hash``, then an id-for-id check. Turns with prefilled ids (a
        forced tool call) are not found.

        Args:
            context_lengths: the only ``len(context)`` values to look for (positions next to
                the template's end-of-turn tokens), which skips the scan of the window's
                prompt lengths; ``None``: every length a recent candidate has.
        """
        g = len(generation_ids)
        n = len(prompt_ids)
        with self._read() as conn:
            where, params = _recent_where(conn, since_s, True, True, client_match, now)
            where += " AND t.prompt_len - ? >= ? AND t.prompt_len - ? < ?"
            params += [g, int(min_context), g, n]
            join = "FROM turns t JOIN sessions s ON s.id = t.session_id"
            if context_lengths is not None:
                lengths = sorted({c + g for c in context_lengths if min_context <= c < n})
            else:
                lengths = sorted(
                    r[0]
                    for r in conn.execute(
                        f"SELECT DISTINCT t.prompt_len {join} WHERE {where}", params
                    )
                )
            if not lengths:
                return []
            want, gen = encode_ids(prompt_ids), encode_ids(generation_ids)
            hasher, done, wanted = hashlib.sha256(), 0, []
            for m in lengths:
                hasher.update(want[4 * done : 4 * (m - g)])
                done = m - g
                h = hasher.copy()
                h.update(gen)
                wanted.append(h.hexdigest())
            rows: list[Any] = []
            for start in range(0, len(wanted), _SQL_CHUNK):
                chunk = wanted[start : start + _SQL_CHUNK]
                rows += conn.execute(
                    f"SELECT t.*, t.rowid AS row_order {join} WHERE {where} "
                    f"AND t.prompt_hash IN ({', '.join('?' * len(chunk))})",
                    [*params, *chunk],
                ).fetchall()
            rows.sort(key=lambda r: (-r["created_at"], -r["row_order"]))
            full = self._chains.resolve(conn, rows) if rows else {}
        out = []
        for r in rows:
            prompt = full[r["id"]].prompt
            context = prompt[: len(prompt) - 4 * g]
            if prompt.endswith(gen) and want.startswith(context) and want[: len(prompt)] != prompt:
                out.append(row_to_turn(r, full[r["id"]]))
        return out[:limit]

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


def _recent_where(
    conn: Conn,
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
            where += f" AND {conn.json_text('t.client', key)} IS NULL"
        else:
            where += f" AND {conn.json_text('t.client', key)} = ?"
            params.append(value if isinstance(value, str) or conn.dialect == Dialect.SQLITE
                          else str(value))  # fmt: skip
    return where, params


def _session_filter(
    query: str | None, conn: Conn, user: tuple[str, tuple[str, ...]] | None = None
) -> tuple[str, tuple[str, ...]]:
    """``WHERE`` clause and parameters for a session search (LIKE with ``%`` and ``_`` escaped,
    case-insensitive for ASCII letters on both backends), and-ed with ``user``'s condition."""
    parts: list[str] = []
    params: tuple[str, ...] = ()
    if query:
        escaped = query.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        like = f"%{escaped}%"
        cols = ("id", "COALESCE(client, '')", "source",
                f"COALESCE({conn.json_text('metadata', 'harness')}, '')")  # fmt: skip
        parts.append("(" + " OR ".join(f"{c} {conn.like} ? ESCAPE '\\'" for c in cols) + ")")
        params = (like,) * len(cols)
    if user is not None:
        parts.append(user[0])
        params = (*params, *user[1])
    return ("WHERE " + " AND ".join(parts), params) if parts else ("", ())
