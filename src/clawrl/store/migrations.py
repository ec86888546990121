"""Schema migrations, from version 1 on, and the routine that applies them.

A fresh file is created from :data:`clawrl.store.schema.SCHEMA` and every migration is marked
applied; an older file gets the migrations it lacks, each in its own transaction, recorded in
``schema_migrations``. A file newer than the code is refused.

How to add a table or column (e.g. the judge's ``judgments`` or the trainer's ``samples``):

1. Append ``Migration(N + 1, "what it adds", ("CREATE TABLE ...", "CREATE INDEX ..."))`` to
   :data:`MIGRATIONS` (``ALTER TABLE t ADD COLUMN c ...`` for a column; a Python ``apply``
   callable for data changes). Never edit a migration that has shipped.
2. Make :data:`~clawrl.store.schema.SCHEMA` the result: same statements for a new table; for a new
   column, add it at the *end* of its ``CREATE TABLE`` (``ADD COLUMN`` appends).
3. Set :data:`~clawrl.store.schema.SCHEMA_VERSION` to ``N + 1``.
4. Add the field to the record dataclass and to the store's row codec.

``tests/store/test_store_schema.py`` fails if a fresh and a migrated file differ, if the
version is not the last migration's, or if record fields and columns disagree.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from clawrl.errors import StoreError
from clawrl.store.schema import MIGRATIONS_TABLE, SCHEMA, SCHEMA_VERSION


@dataclass(frozen=True)
class Migration:
    """One schema step.

    Attributes:
        version: the schema version after this step (1, 2, ...).
        description: one line on what it changes.
        statements: SQL statements executed in order, inside the migration's transaction.
        apply: optional Python step run after ``statements`` in the same transaction.
    """

    version: int
    description: str
    statements: tuple[str, ...] = ()
    apply: Callable[[sqlite3.Connection], None] | None = None


# Version 1, frozen as shipped: never edit (edit schema.SCHEMA and add a migration instead).
_V1: tuple[str, ...] = (
    """CREATE TABLE sessions (
    id TEXT PRIMARY KEY,
    source TEXT NOT NULL,
    created_at REAL NOT NULL,
    ended_at REAL,
    client TEXT,
    metadata TEXT NOT NULL DEFAULT '{}'
)""",
    "CREATE INDEX idx_sessions_created_at ON sessions (created_at)",
    """CREATE TABLE turns (
    id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES sessions (id),
    created_at REAL NOT NULL,
    parent_turn_id TEXT,
    segment INTEGER,
    kind TEXT NOT NULL,
    side_kind TEXT,
    protocol TEXT NOT NULL,
    status TEXT NOT NULL,
    finish_reason TEXT,
    error_kind TEXT,
    error_message TEXT,
    policy_version INTEGER NOT NULL,
    choice_index INTEGER NOT NULL DEFAULT 0,
    trainable INTEGER NOT NULL CHECK (trainable IN (0, 1)),
    untrainable_reason TEXT,
    session_source TEXT,
    output_hash TEXT,
    latency_s REAL,
    ttft_s REAL,
    prompt_len INTEGER NOT NULL,
    completion_len INTEGER NOT NULL,
    seq_len INTEGER NOT NULL,
    prompt_hash TEXT NOT NULL,
    seq_hash TEXT NOT NULL,
    sampling_params TEXT NOT NULL,
    client TEXT NOT NULL,
    output TEXT,
    tools TEXT,
    request_messages TEXT NOT NULL,
    prompt_ids BLOB NOT NULL,
    completion_ids BLOB NOT NULL,
    sampling_logprobs BLOB NOT NULL
)""",
    "CREATE INDEX idx_turns_session ON turns (session_id, created_at)",
    "CREATE INDEX idx_turns_output_hash ON turns (output_hash)",
    "CREATE INDEX idx_turns_created_at ON turns (created_at)",
    "CREATE INDEX idx_turns_seq_hash ON turns (seq_hash)",
    "CREATE INDEX idx_turns_prompt_hash ON turns (prompt_hash)",
    """CREATE TABLE feedback (
    id TEXT PRIMARY KEY,
    turn_id TEXT REFERENCES turns (id),
    session_id TEXT REFERENCES sessions (id),
    reward REAL NOT NULL CHECK (reward >= -1.0 AND reward <= 1.0),
    comment TEXT,
    created_at REAL NOT NULL,
    CHECK (turn_id IS NOT NULL OR session_id IS NOT NULL)
)""",
    "CREATE INDEX idx_feedback_turn ON feedback (turn_id)",
    "CREATE INDEX idx_feedback_session ON feedback (session_id)",
)

_V2: tuple[str, ...] = (
    """CREATE TABLE judgments (
    turn_id TEXT PRIMARY KEY REFERENCES turns (id),
    session_id TEXT NOT NULL REFERENCES sessions (id),
    score INTEGER,
    reason TEXT,
    votes TEXT NOT NULL DEFAULT '[]',
    hint TEXT,
    hint_meta TEXT NOT NULL DEFAULT '{}',
    backend TEXT NOT NULL,
    latency_s REAL,
    next_state_role TEXT,
    created_at REAL NOT NULL
)""",
    "CREATE INDEX idx_judgments_session ON judgments (session_id)",
    """CREATE TABLE samples (
    turn_id TEXT PRIMARY KEY REFERENCES turns (id),
    status TEXT NOT NULL,
    reason TEXT,
    step INTEGER,
    policy_version INTEGER,
    created_at REAL NOT NULL
)""",
    "CREATE INDEX idx_samples_status ON samples (status, reason)",
)

MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "initial schema: sessions, turns, feedback", _V1),
    Migration(2, "judge verdicts (judgments) and trainer bookkeeping (samples)", _V2),
    Migration(
        3,
        "judgments by time (the dashboard's latest judgments)",
        ("CREATE INDEX idx_judgments_created_at ON judgments (created_at)",),
    ),
)
"""Every schema step in order; ``MIGRATIONS[-1].version == SCHEMA_VERSION``."""


def applied_version(conn: sqlite3.Connection) -> int:
    """The highest applied migration version, 0 for a file without the bookkeeping table."""
    exists = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'"
    ).fetchone()
    if not exists:
        return 0
    row = conn.execute("SELECT MAX(version) FROM schema_migrations").fetchone()
    return int(row[0] or 0)


def _user_tables(conn: sqlite3.Connection) -> list[str]:
    return [
        r[0]
        for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' "
            "AND name NOT LIKE 'sqlite_%' AND name != 'schema_migrations'"
        )
    ]


def _run(conn: sqlite3.Connection, migration: Migration) -> None:
    for statement in migration.statements:
        conn.execute(statement)
    if migration.apply is not None:
        migration.apply(conn)
    conn.execute(
        "INSERT INTO schema_migrations (version, description, applied_at) VALUES (?, ?, ?)",
        (migration.version, migration.description, time.time()),
    )


def migrate(
    conn: sqlite3.Connection,
    *,
    migrations: Sequence[Migration] = MIGRATIONS,
    schema: Sequence[str] = SCHEMA,
    version: int = SCHEMA_VERSION,
    target: int | None = None,
) -> int:
    """Bring the database on ``conn`` (autocommit mode) to ``target`` (default ``version``).

    A file with no tables is created from ``schema`` when ``target == version`` (and all
    migrations up to ``version`` are marked applied), else by running migrations from 1.
    Safe against concurrent openers: each step runs in a ``BEGIN IMMEDIATE`` transaction and
    re-checks the version inside it. The keyword arguments exist for tests.

    Returns:
        The version the file is at afterwards.

    Raises:
        StoreError: the file is newer than the code, the migration list is inconsistent,
            or a statement failed (the failed step is rolled back).
    """
    target = version if target is None else target
    versions = [m.version for m in migrations]
    if versions != list(range(1, len(versions) + 1)) or versions[-1] != version:
        raise StoreError(f"migrations must be numbered 1..{version} in order, got {versions}")
    try:
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute(MIGRATIONS_TABLE)
            current = applied_version(conn)
            if current > version:
                raise StoreError(
                    f"store schema version {current} is newer than this clawrl ({version}); "
                    "upgrade clawrl"
                )
            if current == 0 and not _user_tables(conn) and target == version:
                for statement in schema:
                    conn.execute(statement)
                now = time.time()
                conn.executemany(
                    "INSERT INTO schema_migrations (version, description, applied_at) "
                    "VALUES (?, ?, ?)",
                    [(m.version, m.description, now) for m in migrations],
                )
                current = version
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        for migration in migrations:
            if migration.version <= current or migration.version > target:
                continue
            conn.execute("BEGIN IMMEDIATE")
            try:
                if applied_version(conn) < migration.version:  # another opener may have run it
                    _run(conn, migration)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            current = migration.version
    except sqlite3.Error as exc:
        raise StoreError(f"schema migration failed: {exc}") from exc
    return current
