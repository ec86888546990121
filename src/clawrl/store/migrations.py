"""Schema migrations, from version 1 on, and the routine that applies them.

One history for both backends: a fresh database (a SQLite file or a PostgreSQL schema) is
created from :data:`clawrl.store.schema.SCHEMA` and every migration is marked applied; an older
one gets the migrations it lacks, each in its own transaction, recorded in
``schema_migrations``. Statements are portable DDL (:func:`clawrl.store.schema.render_ddl`
renders them per dialect). A database newer than the code is refused.

How to add a table or column (e.g. the judge's ``judgments`` or the trainer's ``samples``):

1. Append ``Migration(N + 1, "what it adds", ("CREATE TABLE ...", "CREATE INDEX ..."))`` to
   :data:`MIGRATIONS` (``ALTER TABLE t ADD COLUMN c ...`` for a column; a Python ``apply``
   callable for data changes). Never edit a migration that has shipped.
2. Make :data:`~clawrl.store.schema.SCHEMA` the result: same statements for a new table; for a new
   column, add it at the *end* of its ``CREATE TABLE`` (``ADD COLUMN`` appends).
3. Set :data:`~clawrl.store.schema.SCHEMA_VERSION` to ``N + 1``.
4. Add the field to the record dataclass and to the store's row codec.

``tests/store/test_store_schema.py`` fails, on SQLite and on PostgreSQL, if a fresh and a
migrated database differ, if the two backends' schemas differ in portable terms, if the version
is not the last migration's, or if record fields and columns disagree.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from clawrl.errors import StoreError
from clawrl.store.db import Conn, Database
from clawrl.store.schema import MIGRATIONS_TABLE, SCHEMA, SCHEMA_VERSION, render_ddl
from clawrl.store.users import USERS_SCHEMA_VERSION


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
    apply: Callable[[Conn], None] | None = None


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

_V4: tuple[str, ...] = (
    "ALTER TABLE turns ADD COLUMN prefix_turn_id TEXT",
    "ALTER TABLE turns ADD COLUMN prefix_len INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE turns ADD COLUMN messages_prefix_len INTEGER NOT NULL DEFAULT 0",
    "CREATE INDEX idx_turns_prefix_turn ON turns (prefix_turn_id)",
    """CREATE TABLE policy_versions (
    version INTEGER PRIMARY KEY,
    weights TEXT,
    weights_kind TEXT NOT NULL,
    step INTEGER,
    created_at REAL NOT NULL
)""",
)

_V6: tuple[str, ...] = (
    """CREATE TABLE rollout_groups (
    id TEXT PRIMARY KEY,
    run_id TEXT NOT NULL,
    label TEXT NOT NULL,
    task_id TEXT NOT NULL,
    harness TEXT NOT NULL,
    purpose TEXT NOT NULL,
    step INTEGER,
    policy_version INTEGER NOT NULL,
    size INTEGER NOT NULL CHECK (size >= 1),
    decision TEXT,
    reward_mean REAL,
    created_at REAL NOT NULL
)""",
    "CREATE INDEX idx_rollout_groups_run ON rollout_groups (run_id, created_at)",
    """CREATE TABLE rollouts (
    id TEXT PRIMARY KEY REFERENCES sessions (id),
    group_id TEXT NOT NULL REFERENCES rollout_groups (id),
    isolation TEXT NOT NULL,
    status TEXT NOT NULL,
    reason TEXT,
    harness_exit INTEGER,
    timed_out INTEGER NOT NULL CHECK (timed_out IN (0, 1)),
    wall_s REAL NOT NULL,
    created_at REAL NOT NULL,
    harness_tail TEXT NOT NULL DEFAULT ''
)""",
    "CREATE INDEX idx_rollouts_group ON rollouts (group_id)",
    """CREATE TABLE verifier_results (
    rollout_id TEXT PRIMARY KEY REFERENCES rollouts (id),
    reward REAL,
    error TEXT,
    scores TEXT NOT NULL DEFAULT '{}',
    created_at REAL NOT NULL,
    CHECK (reward IS NOT NULL OR error IS NOT NULL)
)""",
)

# Version 7, frozen as shipped: never edit.
_V7: tuple[str, ...] = (
    "ALTER TABLE turns ADD COLUMN memory TEXT",
    """CREATE TABLE memory_entries (
    id TEXT PRIMARY KEY,
    user_id TEXT NOT NULL DEFAULT '',
    text TEXT NOT NULL,
    status TEXT NOT NULL,
    source TEXT NOT NULL,
    source_turn_id TEXT,
    source_session_id TEXT,
    support INTEGER NOT NULL DEFAULT 1,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    ended_at REAL,
    end_reason TEXT,
    history TEXT NOT NULL DEFAULT '[]'
)""",
    "CREATE INDEX idx_memory_entries_user ON memory_entries (user_id, status, updated_at)",
    """CREATE TABLE memory_sources (
    id TEXT PRIMARY KEY,
    user_id TEXT NOT NULL DEFAULT '',
    entry_id TEXT,
    recorded_at REAL NOT NULL,
    taken_at REAL NOT NULL
)""",
)

MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "initial schema: sessions, turns, feedback", _V1),
    Migration(2, "judge verdicts (judgments) and trainer bookkeeping (samples)", _V2),
    Migration(
        3,
        "judgments by time (the dashboard's latest judgments)",
        ("CREATE INDEX idx_judgments_created_at ON judgments (created_at)",),
    ),
    Migration(
        4,
        "prompts stored as deltas of their prefix turn; published policy versions (replicas)",
        _V4,
    ),
    Migration(
        5,
        "leases: the one trainer of a store, judge workers' claims on turns",
        (
            """CREATE TABLE leases (
    name TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    expires_at REAL NOT NULL
)""",
        ),
    ),
    Migration(
        6,
        "harness mode: rollout groups, rollouts and verifier results (was rollouts.jsonl)",
        _V6,
    ),
    Migration(
        7,
        "preference memory: memory_entries, memory_sources, and what a turn's prompt got from it "
        "(turns.memory)",
        _V7,
    ),
    Migration(
        USERS_SCHEMA_VERSION,
        "users: whose request each turn answered (turns.user_id, '' for none), the version of "
        "that user's adapter that sampled it (turns.adapter_version), users' adapter versions "
        "(user_adapters)",
        (
            "ALTER TABLE turns ADD COLUMN user_id TEXT NOT NULL DEFAULT ''",
            "ALTER TABLE turns ADD COLUMN adapter_version INTEGER",
            "CREATE INDEX idx_turns_user ON turns (user_id, created_at)",
            """CREATE TABLE user_adapters (
    user_id TEXT NOT NULL,
    version INTEGER NOT NULL,
    weights TEXT NOT NULL,
    step INTEGER,
    created_at REAL NOT NULL,
    PRIMARY KEY (user_id, version)
)""",
        ),
    ),
)
"""Every schema step in order; ``MIGRATIONS[-1].version == SCHEMA_VERSION``."""


def applied_version(conn: Conn) -> int:
    """The highest applied migration version, 0 for a database without the bookkeeping table."""
    if not conn.table_exists("schema_migrations"):
        return 0
    row = conn.execute("SELECT MAX(version) FROM schema_migrations").fetchone()
    return int(row[0] or 0)


def _run(conn: Conn, migration: Migration) -> None:
    for statement in migration.statements:
        conn.execute(render_ddl(statement, conn.dialect))
    if migration.apply is not None:
        migration.apply(conn)
    conn.execute(
        "INSERT INTO schema_migrations (version, description, applied_at) VALUES (?, ?, ?)",
        (migration.version, migration.description, time.time()),
    )


class _Newer(Exception):
    """The database is newer than the code (raised inside the transaction, then reported)."""


def migrate(
    db: Database,
    *,
    migrations: Sequence[Migration] = MIGRATIONS,
    schema: Sequence[str] = SCHEMA,
    version: int = SCHEMA_VERSION,
    target: int | None = None,
) -> int:
    """Bring the database ``db`` to ``target`` (default ``version``).

    A database with no tables is created from ``schema`` when ``target == version`` (and all
    migrations up to ``version`` are marked applied), else by running migrations from 1.
    Safe against concurrent openers: each step runs in its own write transaction, holding the
    migration lock (SQLite: ``BEGIN IMMEDIATE``; PostgreSQL: an advisory lock), and re-checks
    the version inside it. The keyword arguments exist for tests.

    Returns:
        The version the database is at afterwards.

    Raises:
        StoreError: the database is newer than the code, the migration list is inconsistent,
            or a statement failed (the failed step is rolled back).
    """
    target = version if target is None else target
    versions = [m.version for m in migrations]
    if versions != list(range(1, len(versions) + 1)) or versions[-1] != version:
        raise StoreError(f"migrations must be numbered 1..{version} in order, got {versions}")
    current = 0
    try:
        with db.write() as conn:
            conn.lock_migrations()
            conn.execute(render_ddl(MIGRATIONS_TABLE, conn.dialect))
            current = applied_version(conn)
            if current > version:
                raise _Newer()
            if current == 0 and not conn.user_tables() and target == version:
                for statement in schema:
                    conn.execute(render_ddl(statement, conn.dialect))
                now = time.time()
                conn.executemany(
                    "INSERT INTO schema_migrations (version, description, applied_at) "
                    "VALUES (?, ?, ?)",
                    [(m.version, m.description, now) for m in migrations],
                )
                current = version
        for migration in migrations:
            if migration.version <= current or migration.version > target:
                continue
            with db.write() as conn:
                conn.lock_migrations()
                if applied_version(conn) < migration.version:  # another opener may have run it
                    _run(conn, migration)
            current = migration.version
    except _Newer:
        raise StoreError(
            f"store schema version {current} is newer than this clawrl ({version}); upgrade clawrl"
        ) from None
    except StoreError as exc:
        raise StoreError(f"schema migration failed: {exc}") from exc
    return current
