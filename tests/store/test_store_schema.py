"""The one schema declaration: version, migrations, and agreement with the record dataclasses."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from clawrl.errors import StoreError
from clawrl.store import SCHEMA_VERSION, Store
from clawrl.store.migrations import MIGRATIONS, Migration, applied_version, migrate
from clawrl.store.rows import FEEDBACK_FIELDS, SESSION_FIELDS, TURN_FIELDS, turn_to_row
from clawrl.store.schema import (
    DERIVED_TURN_COLUMNS,
    MIGRATIONS_TABLE,
    SCHEMA,
    describe_schema,
    table_columns,
)
from clawrl.store.types import TurnRecord

JUDGMENTS = """CREATE TABLE extra_verdicts (
    id TEXT PRIMARY KEY,
    turn_id TEXT NOT NULL REFERENCES turns (id),
    score REAL NOT NULL
)"""


def _connect(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path, isolation_level=None)


def _build_by_migrations(path: Path, migrations: tuple[Migration, ...]) -> None:
    """A file as an older clawrl would have left it: the given migrations run one by one."""
    conn = _connect(path)
    conn.execute(MIGRATIONS_TABLE)
    for m in migrations:
        for statement in m.statements:
            conn.execute(statement)
        conn.execute(
            "INSERT INTO schema_migrations VALUES (?, ?, ?)", (m.version, m.description, 0.0)
        )
    conn.close()


def _describe(path: Path) -> dict:
    conn = _connect(path)
    try:
        return describe_schema(conn)
    finally:
        conn.close()


NEXT = SCHEMA_VERSION + 1


def test_version_is_last_migration() -> None:
    assert [m.version for m in MIGRATIONS] == list(range(1, SCHEMA_VERSION + 1))
    assert MIGRATIONS[-1].version == SCHEMA_VERSION


def test_fresh_and_migrated_files_have_identical_schema(tmp_path: Path) -> None:
    with Store(tmp_path / "fresh.db") as store:
        assert store.schema_version == SCHEMA_VERSION
    _build_by_migrations(tmp_path / "old.db", MIGRATIONS[:1])
    with Store(tmp_path / "old.db") as store:
        assert store.schema_version == SCHEMA_VERSION
    fresh, migrated = _describe(tmp_path / "fresh.db"), _describe(tmp_path / "old.db")
    assert fresh == migrated
    assert set(fresh) == {
        "schema_migrations",
        "sessions",
        "turns",
        "feedback",
        "judgments",
        "samples",
    }
    conn = _connect(tmp_path / "fresh.db")
    versions = [r[0] for r in conn.execute("SELECT version FROM schema_migrations")]
    conn.close()
    assert versions == [m.version for m in MIGRATIONS]


def test_record_fields_match_columns(tmp_path: Path) -> None:
    """Fails when a record dataclass and its table drift apart (code vs schema)."""
    with Store(tmp_path / "s.db") as store:
        conn = store._conn()
        turns = table_columns(conn, "turns")
        assert set(turns) == set(TURN_FIELDS) | set(DERIVED_TURN_COLUMNS)
        assert len(turns) == len(TURN_FIELDS) + len(DERIVED_TURN_COLUMNS)
        assert set(turn_to_row(TurnRecord("s", [1])).keys()) == set(turns)
        assert table_columns(conn, "sessions") == list(SESSION_FIELDS)
        assert set(table_columns(conn, "feedback")) == set(FEEDBACK_FIELDS)


def test_declaration_matches_a_file_built_from_it(tmp_path: Path) -> None:
    conn = _connect(tmp_path / "decl.db")
    for statement in SCHEMA:
        conn.execute(statement)
    conn.execute(MIGRATIONS_TABLE)
    conn.close()
    with Store(tmp_path / "store.db"):
        pass
    assert _describe(tmp_path / "decl.db") == _describe(tmp_path / "store.db")


def test_a_new_migration_upgrades_old_files_and_keeps_data(tmp_path: Path) -> None:
    migrations = (*MIGRATIONS, Migration(NEXT, "extra", (JUDGMENTS,)))
    schema = (*SCHEMA, JUDGMENTS)
    old = tmp_path / "old.db"
    with Store(old) as store:  # a current file with data
        session = store.new_session()
        turn_id = store.record_turn(TurnRecord(session.id, [1, 2], [3], [-0.5]))
    conn = _connect(old)
    assert migrate(conn, migrations=migrations, schema=schema, version=NEXT) == NEXT
    assert applied_version(conn) == NEXT
    conn.execute("INSERT INTO extra_verdicts VALUES ('j', ?, 1.0)", (turn_id,))
    conn.close()
    fresh = _connect(tmp_path / "fresh.db")
    migrate(fresh, migrations=migrations, schema=schema, version=NEXT)
    fresh.close()
    assert _describe(old) == _describe(tmp_path / "fresh.db")
    # Forgetting to update the declaration is caught by the comparison.
    drifted = _connect(tmp_path / "drifted.db")
    migrate(drifted, migrations=migrations, schema=SCHEMA, version=NEXT)
    drifted.close()
    assert _describe(old) != _describe(tmp_path / "drifted.db")
    # This code refuses the newer file instead of misreading it.
    with pytest.raises(StoreError, match="newer"):
        Store(old)


def test_failed_migration_rolls_back(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    with Store(path):
        pass
    bad = (*MIGRATIONS, Migration(NEXT, "bad", ("CREATE TABLE x (a INT)", "NOT SQL")))
    conn = _connect(path)
    with pytest.raises(StoreError, match="migration failed"):
        migrate(conn, migrations=bad, schema=SCHEMA, version=NEXT)
    assert applied_version(conn) == SCHEMA_VERSION
    assert "x" not in describe_schema(conn)
    conn.close()


def test_misnumbered_migrations_are_refused(tmp_path: Path) -> None:
    conn = _connect(tmp_path / "s.db")
    with pytest.raises(StoreError, match="numbered"):
        migrate(conn, migrations=(Migration(2, "x"),), schema=SCHEMA, version=2)
    conn.close()


def test_opening_twice_concurrently_is_safe(tmp_path: Path) -> None:
    import threading

    path = tmp_path / "s.db"
    errors: list[BaseException] = []

    def open_it() -> None:
        try:
            with Store(path) as store:
                store.new_session()
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=open_it) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors
    with Store(path) as store:
        assert len(store.list_sessions()) == 4
