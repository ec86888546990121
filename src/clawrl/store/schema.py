"""The one declaration of the store's current schema, and its version.

``SCHEMA`` is what a fresh database is created from. Older files are brought up to
``SCHEMA_VERSION`` by :data:`clawrl.store.migrations.MIGRATIONS`; tests check that both roads
give the same schema (:func:`describe_schema`) and that the record dataclasses match the
columns. See :mod:`clawrl.store.migrations` for how to add a version.

Column conventions: ``*_ids`` are int32 little-endian BLOBs and ``sampling_logprobs`` a float64
little-endian BLOB (:mod:`clawrl.store.codec`); JSON columns are UTF-8 TEXT; times are REAL
seconds since the epoch; booleans are INTEGER 0/1. Enum-valued columns have no CHECK constraint
(SQLite cannot alter one without rebuilding the table); the store validates them instead.
"""

from __future__ import annotations

import re
import sqlite3
from typing import Any

SCHEMA_VERSION = 3
"""Version of :data:`SCHEMA`; equals the last migration's version."""

MIGRATIONS_TABLE = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version INTEGER PRIMARY KEY,
    description TEXT NOT NULL,
    applied_at REAL NOT NULL
)"""
"""Bookkeeping table: one row per applied migration (both on fresh and on migrated files)."""

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
    sampling_logprobs BLOB NOT NULL
)""",
    "CREATE INDEX idx_turns_session ON turns (session_id, created_at)",
    "CREATE INDEX idx_turns_output_hash ON turns (output_hash)",
    "CREATE INDEX idx_turns_created_at ON turns (created_at)",
    "CREATE INDEX idx_turns_seq_hash ON turns (seq_hash)",
    "CREATE INDEX idx_turns_prompt_hash ON turns (prompt_hash)",
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
)
"""The current schema, statement by statement (executed in order on a fresh file)."""

DERIVED_TURN_COLUMNS: dict[str, str] = {
    "prompt_len": "len(prompt_ids) in tokens",
    "completion_len": "len(completion_ids) in tokens",
    "seq_len": "prompt_len + completion_len",
    "prompt_hash": "ids_digest(prompt_ids): finds retries (same prompt)",
    "seq_hash": "ids_digest(prompt_ids + completion_ids): find_extendable_turns' index",
}
"""Columns of ``turns`` that the store computes; every other column is a ``TurnRecord`` field."""


def _normalize_sql(sql: str | None) -> str | None:
    return None if sql is None else re.sub(r"\s+", " ", sql).strip()


def describe_schema(conn: sqlite3.Connection) -> dict[str, Any]:
    """A normalized description of a database's schema, comparable with ``==``.

    Covers, per table: columns (name, declared type, not-null, default, primary-key position, in
    order), foreign keys, and indexes (name, uniqueness, columns, normalized SQL). CHECK
    constraints are not visible through SQLite's pragmas and are not compared.
    """
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


def table_columns(conn: sqlite3.Connection, table: str) -> list[str]:
    """Column names of ``table`` in order (empty when it does not exist)."""
    return [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]
