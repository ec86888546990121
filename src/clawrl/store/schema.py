"""The one declaration of the store's current schema and its version, for SQLite and PostgreSQL.

``SCHEMA`` is what a fresh database is created from. Older databases are brought up to
``SCHEMA_VERSION`` by :data:`clawrl.store.migrations.MIGRATIONS`; tests check, on both backends,
that both roads give the same schema (:func:`describe_schema`), that the two backends' schemas
are the same in portable terms (:func:`portable_schema`), and that the record dataclasses match
the columns. See :mod:`clawrl.store.migrations` for how to add a version.

**One declaration, two dialects.** Every statement here and in the migrations is written in a
portable subset of SQL DDL: column types ``TEXT``, ``INTEGER``, ``REAL`` and ``BLOB``, ``PRIMARY
KEY``, ``NOT NULL``, ``DEFAULT`` literals, ``REFERENCES``, ``CHECK`` and ``CREATE INDEX``.
:func:`render_ddl` turns a statement into the dialect's DDL: SQLite runs it as written; for
PostgreSQL ``INTEGER`` becomes ``BIGINT`` (SQLite integers are 64-bit), ``REAL`` becomes
``DOUBLE PRECISION`` (SQLite's REAL is 8 bytes, PostgreSQL's 4), ``BLOB`` becomes ``BYTEA``, and
every table gets a first column ``rowid BIGINT GENERATED ALWAYS AS IDENTITY``: SQLite's implicit
insertion order, which the queries use to break ties between equal times.

Column conventions: ``*_ids`` are int32 little-endian BLOBs and ``sampling_logprobs`` a float64
little-endian BLOB (:mod:`clawrl.store.codec`); JSON columns are UTF-8 TEXT; times are REAL
seconds since the epoch; booleans are INTEGER 0/1. Enum-valued columns have no CHECK constraint
(SQLite cannot alter one without rebuilding the table); the store validates them instead.

**Turn prompts are stored as deltas** (version 4): a turn whose prompt extends an earlier
turn's ``prompt + completion`` (its *prefix turn*, ``prefix_turn_id``), or shares a long
start with it, stores in ``prompt_ids`` only the ids after the first ``prefix_len`` ids of that
turn's ``prompt + completion``, and in ``request_messages`` only the messages
after the first ``messages_prefix_len`` messages it shares with the prefix turn. The store
rebuilds the full ids and messages on read, and checks the rebuilt prompt against
``prompt_hash`` (sha256 of the full prompt). Rows with ``prefix_len = 0`` (every row written
before version 4) hold their full prompt.

**Harness rollouts** (version 6, :mod:`clawrl.store.rollouts`): ``rollout_groups`` (one per
GRPO group, with the trainer's decision), ``rollouts`` (one per harness rollout; its id is the
rollout's session id) and ``verifier_results`` (the verifier's reward, or its error).

**Preference memory** (version 7, :mod:`clawrl.store.memory`): ``memory_entries`` (a user's
remembered directives, with their source turn and history), ``memory_sources`` (each hint or
feedback comment the memory took, ``kind:id``, so any process takes it once) and
``turns.memory`` (what the gateway added to a turn's prompt from the memory, JSON, ``NULL``
when nothing).
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Any, Protocol


class Dialect(StrEnum):
    """The SQL dialect of a store backend."""

    SQLITE = "sqlite"
    POSTGRESQL = "postgresql"


class _Executes(Protocol):
    def execute(self, sql: str, params: Any = ...) -> Any: ...


SCHEMA_VERSION = 8
"""Version of :data:`SCHEMA`; equals the last migration's version."""

MIGRATIONS_TABLE = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version INTEGER PRIMARY KEY,
    description TEXT NOT NULL,
    applied_at REAL NOT NULL
)"""
"""Bookkeeping table: one row per applied migration (both on fresh and on migrated files)."""

MEMORY_ENTRIES = """CREATE TABLE memory_entries (
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
)"""
MEMORY_INDEX = (
    "CREATE INDEX idx_memory_entries_user ON memory_entries (user_id, status, updated_at)"
)
MEMORY_SOURCES = """CREATE TABLE memory_sources (
    id TEXT PRIMARY KEY,
    user_id TEXT NOT NULL DEFAULT '',
    entry_id TEXT,
    recorded_at REAL NOT NULL,
    taken_at REAL NOT NULL
)"""

USER_ADAPTERS = """CREATE TABLE user_adapters (
    user_id TEXT NOT NULL,
    version INTEGER NOT NULL,
    weights TEXT NOT NULL,
    step INTEGER,
    created_at REAL NOT NULL,
    PRIMARY KEY (user_id, version)
)"""

SCHEMA: tuple[str, ...] = (
    """
CREATE TABLE sessions (
    id TEXT PRIMARY KEY,
    source TEXT NOT NULL,
    created_at REAL NOT NULL,
    ended_at REAL,
    client TEXT,
    metadata TEXT NOT NULL DEFAULT '{}'
)""",
    "CREATE INDEX idx_sessions_created_at ON sessions (created_at)",
    # Small columns first, large JSON and BLOB columns last, so scans that read only the small
    # ones stay on the first page of each row.
    """
CREATE TABLE turns (
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
    sampling_logprobs BLOB NOT NULL,
    prefix_turn_id TEXT,
    prefix_len INTEGER NOT NULL DEFAULT 0,
    messages_prefix_len INTEGER NOT NULL DEFAULT 0,
    memory TEXT,
    user_id TEXT NOT NULL DEFAULT '',
    adapter_version INTEGER
)""",
    "CREATE INDEX idx_turns_session ON turns (session_id, created_at)",
    "CREATE INDEX idx_turns_output_hash ON turns (output_hash)",
    "CREATE INDEX idx_turns_created_at ON turns (created_at)",
    "CREATE INDEX idx_turns_seq_hash ON turns (seq_hash)",
    "CREATE INDEX idx_turns_prompt_hash ON turns (prompt_hash)",
    "CREATE INDEX idx_turns_prefix_turn ON turns (prefix_turn_id)",
    "CREATE INDEX idx_turns_user ON turns (user_id, created_at)",
    """
CREATE TABLE feedback (
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
    "CREATE INDEX idx_judgments_created_at ON judgments (created_at)",
    """CREATE TABLE samples (
    turn_id TEXT PRIMARY KEY REFERENCES turns (id),
    status TEXT NOT NULL,
    reason TEXT,
    step INTEGER,
    policy_version INTEGER,
    created_at REAL NOT NULL
)""",
    "CREATE INDEX idx_samples_status ON samples (status, reason)",
    """CREATE TABLE policy_versions (
    version INTEGER PRIMARY KEY,
    weights TEXT,
    weights_kind TEXT NOT NULL,
    step INTEGER,
    created_at REAL NOT NULL
)""",
    """CREATE TABLE leases (
    name TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    expires_at REAL NOT NULL
)""",
    # harness mode (version 6): rollouts.id is the rollout's session id
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
    # preference memory (version 7, clawrl.store.memory)
    MEMORY_ENTRIES,
    MEMORY_INDEX,
    MEMORY_SOURCES,
    # users' adapter versions (version 8, clawrl.store.users)
    USER_ADAPTERS,
)
"""The current schema, statement by statement (executed in order on a fresh file)."""

DERIVED_TURN_COLUMNS: dict[str, str] = {
    "prompt_len": "len(prompt_ids) in tokens",
    "completion_len": "len(completion_ids) in tokens",
    "seq_len": "prompt_len + completion_len",
    "prompt_hash": "ids_digest(prompt_ids): finds retries (same prompt); checks rebuilt prompts",
    "seq_hash": "ids_digest(prompt_ids + completion_ids): find_extendable_turns' index",
}
"""Columns of ``turns`` that the store computes; every other column is a ``TurnRecord`` field
or one of :data:`STORAGE_TURN_COLUMNS`."""

STORAGE_TURN_COLUMNS: dict[str, str] = {
    "prefix_turn_id": "the turn whose prompt + completion the stored prompt extends (or NULL)",
    "prefix_len": "how many leading prompt ids are that turn's first ids (0: prompt_ids whole)",
    "messages_prefix_len": "how many leading request messages are the prefix turn's",
}
"""Columns of ``turns`` that say how a prompt is stored as a delta (module docstring); the store
reads them to rebuild full ids, and they are no ``TurnRecord`` field."""

PORTABLE_TYPES = ("TEXT", "INTEGER", "REAL", "BLOB")
"""Column types the declaration may use."""

_PG_TYPES = {"TEXT": "TEXT", "INTEGER": "BIGINT", "REAL": "DOUBLE PRECISION", "BLOB": "BYTEA"}
_PORTABLE_FROM_PG = {"text": "TEXT", "bigint": "INTEGER", "double precision": "REAL",
                     "bytea": "BLOB"}  # fmt: skip
_COLUMN_TYPE = re.compile(r"(?m)^(\s*[a-z_][a-z0-9_]*\s+)(TEXT|INTEGER|REAL|BLOB)\b")
_ADD_COLUMN_TYPE = re.compile(r"(ADD COLUMN\s+[a-z_][a-z0-9_]*\s+)(TEXT|INTEGER|REAL|BLOB)\b")
_CREATE_TABLE = re.compile(r"^(\s*CREATE TABLE (?:IF NOT EXISTS )?[a-z_][a-z0-9_]*\s*\()\s*")
ROWID_COLUMN = "rowid"
"""The insertion-order column PostgreSQL tables get (SQLite has it implicitly)."""


def render_ddl(statement: str, dialect: Dialect) -> str:
    """A portable DDL statement (module docstring) in ``dialect``'s SQL.

    Column definitions must start their line (``    name TYPE ...``) in ``CREATE TABLE``; an
    ``ALTER TABLE t ADD COLUMN name TYPE`` is rendered too. Everything else is passed through.
    """
    if dialect == Dialect.SQLITE:
        return statement
    out = _COLUMN_TYPE.sub(lambda m: m.group(1) + _PG_TYPES[m.group(2)], statement)
    out = _ADD_COLUMN_TYPE.sub(lambda m: m.group(1) + _PG_TYPES[m.group(2)], out)
    return _CREATE_TABLE.sub(
        lambda m: f"{m.group(1)}\n    {ROWID_COLUMN} BIGINT GENERATED ALWAYS AS IDENTITY,\n    ",
        out,
        count=1,
    )


def _normalize_sql(sql: str | None) -> str | None:
    return None if sql is None else re.sub(r"\s+", " ", sql).strip()


def describe_schema(conn: _Executes, dialect: Dialect = Dialect.SQLITE) -> dict[str, Any]:
    """A normalized description of a database's schema, comparable with ``==`` (same dialect).

    Covers, per table: columns (name, declared type, not-null, default, primary-key position, in
    order), foreign keys, and indexes (name, uniqueness, columns, normalized SQL). CHECK
    constraints are not compared (SQLite's pragmas do not show them). PostgreSQL: the tables of
    the connection's current schema (``search_path``).
    """
    if dialect == Dialect.POSTGRESQL:
        return _describe_postgres(conn)
    out: dict[str, Any] = {}
    tables = [
        r[0]
        for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' "
            "ORDER BY name"
        )
    ]
    for table in tables:
        columns = [
            (r[1], r[2].upper(), bool(r[3]), r[4], r[5])
            for r in conn.execute(f"PRAGMA table_info({table})")
        ]
        fks = sorted((r[2], r[3], r[4]) for r in conn.execute(f"PRAGMA foreign_key_list({table})"))
        indexes = {}
        for r in conn.execute(f"PRAGMA index_list({table})"):
            name = r[1]
            cols = [c[2] for c in conn.execute(f"PRAGMA index_info({name})")]
            sql = conn.execute(
                "SELECT sql FROM sqlite_master WHERE type = 'index' AND name = ?", (name,)
            ).fetchone()
            indexes[name] = (bool(r[2]), cols, _normalize_sql(sql[0] if sql else None))
        out[table] = {"columns": columns, "foreign_keys": fks, "indexes": indexes}
    return out


def _describe_postgres(conn: _Executes) -> dict[str, Any]:
    out: dict[str, Any] = {}
    tables = [
        r[0]
        for r in conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = "
            "current_schema() AND table_type = 'BASE TABLE' ORDER BY table_name"
        )
    ]
    for table in tables:
        pk = {
            r[0]: r[1]
            for r in conn.execute(
                "SELECT a.attname, array_position(c.conkey, a.attnum) FROM pg_constraint c "
                "JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = ANY (c.conkey) "
                "WHERE c.conrelid = to_regclass(?) AND c.contype = 'p'",
                (table,),
            )
        }
        columns = [
            (r[0], r[1], r[2] == "NO", r[3], pk.get(r[0], 0))
            for r in conn.execute(
                "SELECT column_name, data_type, is_nullable, column_default FROM "
                "information_schema.columns WHERE table_schema = current_schema() AND "
                "table_name = ? ORDER BY ordinal_position",
                (table,),
            )
        ]
        fks = sorted(
            (r[0], r[1], r[2])
            for r in conn.execute(
                "SELECT ccu.table_name, kcu.column_name, ccu.column_name FROM "
                "information_schema.table_constraints tc JOIN "
                "information_schema.key_column_usage kcu ON kcu.constraint_name = "
                "tc.constraint_name AND kcu.table_schema = tc.table_schema JOIN "
                "information_schema.constraint_column_usage ccu ON ccu.constraint_name = "
                "tc.constraint_name AND ccu.table_schema = tc.table_schema WHERE "
                "tc.constraint_type = 'FOREIGN KEY' AND tc.table_schema = current_schema() "
                "AND tc.table_name = ?",
                (table,),
            )
        )
        indexes = {}
        for r in conn.execute(
            "SELECT ic.relname, ix.indisunique, ix.indisprimary, pg_get_indexdef(ix.indexrelid), "
            "ARRAY(SELECT a.attname FROM unnest(ix.indkey) WITH ORDINALITY k(n, o) JOIN "
            "pg_attribute a ON a.attrelid = ix.indrelid AND a.attnum = k.n ORDER BY k.o) "
            "FROM pg_index ix JOIN pg_class ic ON ic.oid = ix.indexrelid "
            "WHERE ix.indrelid = to_regclass(?)",
            (table,),
        ):
            sql = re.sub(r" ON [A-Za-z0-9_]+\.", " ON ", r[3])  # the schema's name aside
            indexes[r[0]] = (bool(r[1]), bool(r[2]), list(r[4]), _normalize_sql(sql))
        out[table] = {"columns": columns, "foreign_keys": fks, "indexes": indexes}
    return out


def portable_schema(conn: _Executes, dialect: Dialect) -> dict[str, Any]:
    """:func:`describe_schema` in the declaration's portable terms, equal across dialects for
    the same declaration: per table, columns ``(name, portable type, not-null, default,
    primary key?)`` without PostgreSQL's ``rowid``, sorted foreign keys, and the named
    (non-primary-key) indexes ``name -> (unique, columns)``."""
    out: dict[str, Any] = {}
    for table, desc in describe_schema(conn, dialect).items():
        columns = []
        for name, typ, notnull, default, pk in desc["columns"]:
            if dialect == Dialect.POSTGRESQL:
                if name == ROWID_COLUMN:
                    continue
                typ = _PORTABLE_FROM_PG.get(typ, typ)
                if isinstance(default, str):
                    default = re.sub(r"::[a-z ]+$", "", default)
            columns.append((name, typ, notnull or bool(pk), default, bool(pk)))
        if dialect == Dialect.POSTGRESQL:
            indexes = {n: (i[0], i[2]) for n, i in desc["indexes"].items() if not i[1]}
        else:
            indexes = {n: (i[0], i[1]) for n, i in desc["indexes"].items()
                       if not n.startswith("sqlite_autoindex")}  # fmt: skip
        out[table] = {"columns": columns, "foreign_keys": desc["foreign_keys"], "indexes": indexes}
    return out


def table_columns(conn: _Executes, table: str, dialect: Dialect = Dialect.SQLITE) -> list[str]:
    """Column names of ``table`` in order (empty when it does not exist); PostgreSQL's ``rowid``
    is left out."""
    if dialect == Dialect.POSTGRESQL:
        return [
            r[0]
            for r in conn.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_schema = "
                "current_schema() AND table_name = ? ORDER BY ordinal_position",
                (table,),
            )
            if r[0] != ROWID_COLUMN
        ]
    return [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]
