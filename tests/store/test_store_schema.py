"""The one schema declaration: version, migrations, agreement with the record dataclasses, and
the same schema on SQLite and PostgreSQL (every test runs on both backends where it applies)."""

from __future__ import annotations

import dataclasses
import threading

import pytest

from clawrl.errors import StoreError
from clawrl.store import SCHEMA_VERSION, Store
from clawrl.store.db import Database, open_database
from clawrl.store.memory import MEMORY_SCHEMA_VERSION, MemoryEntryRecord, MemorySourceClaim
from clawrl.store.migrations import MIGRATIONS, Migration, applied_version, migrate
from clawrl.store.rollouts import (
    GROUP_FIELDS,
    ROLLOUT_FIELDS,
    ROLLOUTS_SCHEMA_VERSION,
    VERIFIER_FIELDS,
)
from clawrl.store.rows import FEEDBACK_FIELDS, SESSION_FIELDS, TURN_FIELDS, turn_to_row
from clawrl.store.schema import (
    DERIVED_TURN_COLUMNS,
    MIGRATIONS_TABLE,
    SCHEMA,
    STORAGE_TURN_COLUMNS,
    Dialect,
    describe_schema,
    portable_schema,
    render_ddl,
    table_columns,
)
from clawrl.store.types import TurnRecord

EXTRA = """CREATE TABLE extra_verdicts (
    id TEXT PRIMARY KEY,
    turn_id TEXT NOT NULL REFERENCES turns (id),
    score REAL NOT NULL
)"""

NEXT = SCHEMA_VERSION + 1
TABLES = {"schema_migrations", "sessions", "turns", "feedback", "judgments", "samples",
          "policy_versions", "leases", "rollout_groups", "rollouts", "verifier_results",
          "memory_entries", "memory_sources", "user_adapters"}  # fmt: skip


def _build_by_migrations(db: Database, migrations: tuple[Migration, ...]) -> None:
    """A database as an older clawrl would have left it: the given migrations run one by one."""
    with db.write() as conn:
        conn.execute(render_ddl(MIGRATIONS_TABLE, conn.dialect))
        for m in migrations:
            for statement in m.statements:
                conn.execute(render_ddl(statement, conn.dialect))
            conn.execute(
                "INSERT INTO schema_migrations (version, description, applied_at) VALUES (?, ?, ?)",
                (m.version, m.description, 0.0),
            )


def _describe(db: Database, portable: bool = False) -> dict:
    with db.read() as conn:
        if portable:
            return portable_schema(conn, conn.dialect)
        return describe_schema(conn, conn.dialect)


@pytest.fixture
def open_db(store_target):
    """Factory: a :class:`Database` on ``store_target(name)``, closed after the test."""
    opened: list[Database] = []

    def make(name: str) -> Database:
        db = open_database(store_target(name))
        opened.append(db)
        return db

    yield make
    for db in opened:
        db.close()


def test_version_is_last_migration() -> None:
    assert [m.version for m in MIGRATIONS] == list(range(1, SCHEMA_VERSION + 1))
    assert MIGRATIONS[-1].version == SCHEMA_VERSION


def test_fresh_and_migrated_stores_have_identical_schema(store_target, open_db) -> None:
    with Store(store_target("fresh")) as store:
        assert store.schema_version == SCHEMA_VERSION
    # from version 1, from the last version before deltas, and from the last before rollouts
    for first in (1, 3, ROLLOUTS_SCHEMA_VERSION - 1):
        old = f"old{first}"
        _build_by_migrations(open_db(old), MIGRATIONS[:first])
        with Store(store_target(old)) as store:
            assert store.schema_version == SCHEMA_VERSION
        fresh, migrated = _describe(open_db("fresh")), _describe(open_db(old))
        assert fresh == migrated
        assert set(fresh) == TABLES
    db = open_db("fresh")
    with db.read() as conn:
        versions = [r[0] for r in conn.execute("SELECT version FROM schema_migrations")]
    assert sorted(versions) == [m.version for m in MIGRATIONS]


def test_both_dialects_have_the_same_schema(pg_cluster, tmp_path) -> None:
    """The one declaration gives SQLite and PostgreSQL the same tables, columns, types,
    defaults, keys and indexes (in portable terms), fresh and migrated."""
    from clawrl.testing.postgres import schema_url

    targets = {"sqlite": str(tmp_path / "s.db"), "postgresql": schema_url(pg_cluster)}
    described = {}
    for name, target in targets.items():
        with Store(target):
            pass
        db = open_database(target)
        try:
            described[name] = _describe(db, portable=True)
        finally:
            db.close()
    assert described["sqlite"] == described["postgresql"]
    assert set(described["sqlite"]) == TABLES
    turns = [c[0] for c in described["postgresql"]["turns"]["columns"]]
    assert turns[-6:-3] == list(STORAGE_TURN_COLUMNS)
    assert turns[-3:] == ["memory", "user_id", "adapter_version"]


def test_render_ddl() -> None:
    pg = render_ddl(SCHEMA[2], Dialect.POSTGRESQL)
    assert "rowid BIGINT GENERATED ALWAYS AS IDENTITY" in pg
    assert "created_at DOUBLE PRECISION NOT NULL" in pg and "prompt_ids BYTEA NOT NULL" in pg
    assert "policy_version BIGINT NOT NULL" in pg and " REAL" not in pg and "BLOB" not in pg
    assert render_ddl("ALTER TABLE t ADD COLUMN x REAL", Dialect.POSTGRESQL).endswith(
        "x DOUBLE PRECISION"
    )
    assert render_ddl(SCHEMA[2], Dialect.SQLITE) == SCHEMA[2]


def test_record_fields_match_columns(store_target) -> None:
    """Fails when a record dataclass and its table drift apart (code vs schema)."""
    with Store(store_target("s")) as store, store._read() as conn:
        turns = table_columns(conn, "turns", conn.dialect)
        stored = set(TURN_FIELDS) | set(DERIVED_TURN_COLUMNS) | set(STORAGE_TURN_COLUMNS)
        assert set(turns) == stored
        assert len(turns) == len(stored)
        assert set(turn_to_row(TurnRecord("s", [1])).keys()) == set(turns)
        assert table_columns(conn, "sessions", conn.dialect) == list(SESSION_FIELDS)
        assert set(table_columns(conn, "feedback", conn.dialect)) == set(FEEDBACK_FIELDS)
        assert table_columns(conn, "rollout_groups", conn.dialect) == list(GROUP_FIELDS)
        assert table_columns(conn, "rollouts", conn.dialect) == list(ROLLOUT_FIELDS)
        assert table_columns(conn, "verifier_results", conn.dialect) == list(VERIFIER_FIELDS)
        entry_fields = [f.name for f in dataclasses.fields(MemoryEntryRecord)]
        assert sorted(table_columns(conn, "memory_entries", conn.dialect)) == sorted(entry_fields)
        claim_fields = {f.name for f in dataclasses.fields(MemorySourceClaim)}
        assert set(table_columns(conn, "memory_sources", conn.dialect)) == claim_fields | {
            "taken_at"
        }


def test_old_read_only_stores_have_no_memory(store_target, open_db) -> None:
    """A store of schema 6 opened read-only (clawrl dashboard over an old run) reads its turns
    and has an empty memory (the memory tables and turns.memory came with version 7)."""
    from clawrl.store import SessionSource

    db = open_db("six")
    _build_by_migrations(db, MIGRATIONS[: MEMORY_SCHEMA_VERSION - 1])
    with db.write() as conn:
        conn.execute(
            "INSERT INTO sessions (id, source, created_at, metadata) VALUES (?, ?, ?, ?)",
            ("s", SessionSource.HEADER.value, 1.0, "{}"),
        )
    with Store(store_target("six"), read_only=True) as store:
        assert store.schema_version == MEMORY_SCHEMA_VERSION - 1
        assert store.memory_entries(None, active_only=False) == []
        assert store.memory_sources_since(0.0) == [] and store.memory_cursor() == 0.0
        assert store.session_memory("s") == (False, None)


def test_migrating_to_rollouts_keeps_the_sessions_and_records_rollouts(store_target, open_db):
    """A store of the version before the rollout tables, with a harness session, migrates to
    the current version; its session stays and a rollout of it can then be recorded."""
    from clawrl.store import (
        RolloutGroupRecord,
        RolloutPurpose,
        RolloutRecord,
        RolloutStatus,
        SessionSource,
    )

    db = open_db("old")
    _build_by_migrations(db, MIGRATIONS[: ROLLOUTS_SCHEMA_VERSION - 1])
    with db.write() as conn:
        conn.execute(
            "INSERT INTO sessions (id, source, created_at, metadata) VALUES (?, ?, ?, ?)",
            ("r1", SessionSource.HARNESS.value, 1.0, '{"task": "t"}'),
        )
        assert not conn.table_exists("rollouts")
    with Store(store_target("old")) as store:
        assert store.schema_version == SCHEMA_VERSION >= ROLLOUTS_SCHEMA_VERSION
        assert store.get_session("r1").metadata == {"task": "t"}
        assert store.get_rollout("r1") is None
        group = RolloutGroupRecord("g", "run", "t/h/1", "t", "h", RolloutPurpose.TRAIN, 1, 0, 1)
        store.record_rollout_groups([group])
        store.record_rollout(RolloutRecord("r1", "g", "bwrap", RolloutStatus.HARNESS_ERROR,
                                           reason="no program"), None)  # fmt: skip
        assert store.get_rollout("r1").rollout.reason == "no program"


def test_declaration_matches_a_store_built_from_it(open_db, store_target) -> None:
    decl = open_db("decl")
    with decl.write() as conn:
        for statement in SCHEMA:
            conn.execute(render_ddl(statement, conn.dialect))
        conn.execute(render_ddl(MIGRATIONS_TABLE, conn.dialect))
    with Store(store_target("store")):
        pass
    assert _describe(decl) == _describe(open_db("store"))


def test_a_new_migration_upgrades_old_stores_and_keeps_data(store_target, open_db) -> None:
    migrations = (*MIGRATIONS, Migration(NEXT, "extra", (EXTRA,)))
    schema = (*SCHEMA, EXTRA)
    with Store(store_target("old")) as store:  # a current store with data
        session = store.new_session()
        turn_id = store.record_turn(TurnRecord(session.id, [1, 2], [3], [-0.5]))
    old = open_db("old")
    assert migrate(old, migrations=migrations, schema=schema, version=NEXT) == NEXT
    with old.write() as conn:
        assert applied_version(conn) == NEXT
        conn.execute("INSERT INTO extra_verdicts (id, turn_id, score) VALUES ('j', ?, 1.0)",
                      (turn_id,))  # fmt: skip
    migrate(open_db("fresh"), migrations=migrations, schema=schema, version=NEXT)
    assert _describe(old) == _describe(open_db("fresh"))
    # Forgetting to update the declaration is caught by the comparison.
    migrate(open_db("drifted"), migrations=migrations, schema=SCHEMA, version=NEXT)
    assert _describe(old) != _describe(open_db("drifted"))
    # This code refuses the newer store instead of misreading it.
    with pytest.raises(StoreError, match="newer"):
        Store(store_target("old"))


def test_failed_migration_rolls_back(store_target, open_db) -> None:
    with Store(store_target("s")):
        pass
    bad = (*MIGRATIONS, Migration(NEXT, "bad", ("CREATE TABLE x (a INTEGER)", "NOT SQL")))
    db = open_db("s")
    with pytest.raises(StoreError, match="migration failed"):
        migrate(db, migrations=bad, schema=SCHEMA, version=NEXT)
    with db.read() as conn:
        assert applied_version(conn) == SCHEMA_VERSION
        assert "x" not in conn.user_tables()


def test_misnumbered_migrations_are_refused(open_db) -> None:
    with pytest.raises(StoreError, match="numbered"):
        migrate(open_db("s"), migrations=(Migration(2, "x"),), schema=SCHEMA, version=2)


def test_opening_concurrently_is_safe(store_target) -> None:
    target = store_target("s")
    errors: list[BaseException] = []

    def open_it() -> None:
        try:
            with Store(target) as store:
                store.new_session()
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=open_it) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors
    with Store(target) as store:
        assert len(store.list_sessions()) == 4
