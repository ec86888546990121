"""The PostgreSQL backend: a psycopg 3 connection pool, one transaction per write.

Open it with a URL (``postgresql://USER[:PASSWORD]@HOST:PORT/DB``; libpq's query parameters
work, e.g. ``?options=-csearch_path%3Dteam_a`` keeps the store's tables in the schema
``team_a``). Several processes, on any machines, may share one database: every gateway replica,
the CLI, a trainer.

Durability: a write returns after its ``COMMIT``, which with PostgreSQL's default
``synchronous_commit = on`` waits until the commit's WAL record is flushed to disk, so a turn the
gateway acknowledged survives ``kill -9`` of the gateway and a crash of the database server.

Connections: a pool (:class:`psycopg_pool.ConnectionPool`) of at most ``max_connections``
autocommit connections; a read runs each statement on its own snapshot of everything
committed (READ COMMITTED), a write runs in one transaction.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote

from clawrl.errors import StoreError
from clawrl.store.db import Conn, Cursor, Row, StoreConflict, mask_url, pyformat
from clawrl.store.schema import Dialect

_MIGRATION_LOCK = 0x636C6177726C  # pg_advisory_xact_lock key of schema migrations ("clawrl")


_INDEXES: dict[tuple[bytes, ...], dict[str, int]] = {}


def _row_factory(cursor: Any) -> Callable[[Sequence[Any]], Any]:
    # column names straight from the result (cursor.description builds an object per column,
    # per query: a measurable share of a gateway call), their index dict shared per shape
    res = cursor.pgresult
    if res is None or not res.nfields:
        return tuple
    names = tuple(res.fname(i) or b"" for i in range(res.nfields))
    index = _INDEXES.get(names)
    if index is None:
        index = {n.decode(): i for i, n in reversed(list(enumerate(names)))}
        if len(_INDEXES) < 1024:
            _INDEXES[names] = index
    return lambda values: Row(values, index)


class PostgresConn(Conn):
    """A :class:`~clawrl.store.db.Conn` over one psycopg connection."""

    dialect = Dialect.POSTGRESQL

    def __init__(self, raw: Any) -> None:
        self.raw = raw

    def execute(self, sql: str, params: Any = ()) -> Cursor:
        import psycopg

        try:
            return self.raw.execute(pyformat(sql), params)  # type: ignore[no-any-return]
        except psycopg.errors.IntegrityError as exc:
            raise StoreConflict(f"store write refused: {exc}".strip()) from exc
        except psycopg.Error as exc:
            raise StoreError(f"store query failed: {exc}".strip()) from exc

    def executemany(self, sql: str, rows: Sequence[Any]) -> None:
        import psycopg

        try:
            with self.raw.cursor() as cur:
                cur.executemany(pyformat(sql), rows)
        except psycopg.errors.IntegrityError as exc:
            raise StoreConflict(f"store write refused: {exc}".strip()) from exc
        except psycopg.Error as exc:
            raise StoreError(f"store query failed: {exc}".strip()) from exc

    def json_text(self, column: str, key: str) -> str:
        super().json_text(column, key)  # checks the key
        return f"({column}::jsonb ->> '{key}')"

    @property
    def like(self) -> str:
        return "ILIKE"

    @property
    def for_share(self) -> str:
        return " FOR SHARE"

    @property
    def for_update(self) -> str:
        return " FOR UPDATE"

    def table_exists(self, name: str) -> bool:
        return bool(self.execute("SELECT to_regclass(?) IS NOT NULL", (name,)).fetchone()[0])

    def user_tables(self) -> list[str]:
        return [
            r[0]
            for r in self.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = "
                "current_schema() AND table_type = 'BASE TABLE' "
                "AND table_name != 'schema_migrations'"
            )
        ]

    def lock_migrations(self) -> None:
        self.execute("SELECT pg_advisory_xact_lock(?)", (_MIGRATION_LOCK,))


class PostgresDatabase:
    """A PostgreSQL database as a store backend (:class:`clawrl.store.db.Database`).

    Args:
        url: ``postgresql://...`` (libpq connection URL).
        timeout_s: how long to wait for a connection (to the server, or a free one of the pool)
            before failing.
        read_only: every session is ``default_transaction_read_only``: writes fail.
        max_connections: the pool's size (threads beyond it wait for a connection).

    Raises:
        StoreError: the server cannot be reached, refuses the login, the database does not
            exist, or the URL is malformed (the message names the URL, password masked).
    """

    dialect = Dialect.POSTGRESQL

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 30.0,
        read_only: bool = False,
        max_connections: int = 16,
    ) -> None:
        import psycopg
        from psycopg_pool import ConnectionPool

        self.url = url
        self.target = mask_url(url)
        self.timeout_s = timeout_s
        self.read_only = read_only
        connect_timeout = max(2, int(timeout_s))
        try:  # one plain connection first: its error says why (refused, no database, ...)
            with psycopg.connect(url, connect_timeout=connect_timeout) as probe:
                if probe.execute("SELECT current_schema()").fetchone()[0] is None:  # type: ignore[index]
                    raise StoreError(
                        f"{self.target}: no schema to keep the store's tables in "
                        "(the search_path names none that exists)"
                    )
        except psycopg.Error as exc:
            raise StoreError(f"cannot connect to the store {self.target}: {exc}".strip()) from exc

        def configure(conn: Any) -> None:
            if read_only:
                conn.execute("SET default_transaction_read_only = on")

        self._pool = ConnectionPool(
            url,
            min_size=1,
            max_size=max_connections,
            kwargs={"autocommit": True, "row_factory": _row_factory,
                    "connect_timeout": connect_timeout},
            configure=configure,
            timeout=timeout_s,
            open=False,
            name="clawrl-store",
        )  # fmt: skip
        self._pool.open(wait=False)
        self._closed = False

    @contextmanager
    def _connection(self) -> Iterator[Any]:
        from psycopg_pool import PoolTimeout

        if self._closed:
            raise StoreError("the store is closed")
        try:
            with self._pool.connection(timeout=self.timeout_s) as raw:
                yield raw
        except PoolTimeout as exc:
            raise StoreError(f"no connection to the store {self.target}: {exc}") from exc

    @contextmanager
    def read(self) -> Iterator[PostgresConn]:
        """A pooled connection for reads (autocommit: each statement its own snapshot)."""
        with self._connection() as raw:
            yield PostgresConn(raw)

    @contextmanager
    def write(self) -> Iterator[PostgresConn]:
        """One transaction, committed on exit (durable: ``synchronous_commit``).

        Raises:
            StoreError: the store is open read-only, or the transaction failed.
        """
        import psycopg

        if self.read_only:
            raise StoreError(f"the store {self.target} is open read-only")
        with self._connection() as raw:
            try:
                with raw.transaction():
                    yield PostgresConn(raw)
            except psycopg.errors.IntegrityError as exc:
                raise StoreConflict(f"store write refused: {exc}".strip()) from exc
            except psycopg.Error as exc:
                raise StoreError(f"store write failed: {exc}".strip()) from exc

    def compact(self, tables: Sequence[str]) -> bool:
        """``VACUUM FULL`` of ``tables`` (each rewritten without dead rows):
        :meth:`clawrl.store.db.Database.compact`."""
        import psycopg
        from psycopg import sql

        if self.read_only:
            raise StoreError(f"the store {self.target} is open read-only")
        with self._connection() as raw:
            for table in tables:
                try:
                    raw.execute(sql.SQL("VACUUM FULL {}").format(sql.Identifier(table)))
                except psycopg.Error as exc:
                    raise StoreError(f"cannot compact {table}: {exc}".strip()) from exc
        return True

    def close(self) -> None:
        """Close the pool (idempotent)."""
        if not self._closed:
            self._closed = True
            self._pool.close()


def schema_url(url: str, schema: str, *, fresh: bool = False) -> str:
    """``url`` with its tables kept in the PostgreSQL schema ``schema`` (``search_path``),
    which is created here (and, with ``fresh``, dropped with everything in it first).

    Raises:
        StoreError: ``schema`` is not a plain lower-case identifier, or the server refused.
    """
    import psycopg

    if not schema.replace("_", "").isalnum() or schema.lower() != schema:
        raise StoreError(f"schema name {schema!r} is not a plain lower-case identifier")
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            if fresh:
                conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
            conn.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
    except psycopg.Error as exc:
        raise StoreError(f"cannot create the schema {schema} in {mask_url(url)}: {exc}") from exc
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}options={quote(f'-csearch_path={schema}')}"
