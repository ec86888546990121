"""The two database backends behind :class:`clawrl.store.Store`, and what their SQL shares.

The store's queries are written once, in SQL that SQLite and PostgreSQL both run, with ``?`` and
``:name`` parameters. A backend (:class:`clawrl.store.sqlite.SQLiteDatabase`,
:class:`clawrl.store.postgres.PostgresDatabase`) hands out :class:`Conn` objects that run them:
PostgreSQL's rewrites the parameters to psycopg's style. The few things the dialects spell
differently are methods of :class:`Conn` (:meth:`Conn.json_text`, :meth:`Conn.like`,
:meth:`Conn.for_share`).

:func:`open_database` picks the backend from the target: a ``postgresql://`` (or
``postgres://``) URL, else a SQLite file path.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from functools import lru_cache
from typing import Any, Protocol

from clawrl.errors import StoreError
from clawrl.store.schema import Dialect

URL_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
"""A database URL (``postgresql://...``), which would otherwise become a directory name."""
POSTGRES_SCHEMES = ("postgresql", "postgres")


class StoreConflict(StoreError):
    """A write broke a uniqueness or foreign-key rule (an id taken, a sample decided twice)."""


class Row(tuple):  # type: ignore[type-arg]
    """A result row readable by position and by column name (like ``sqlite3.Row``)."""

    _index: dict[str, int]

    def __new__(cls, values: Sequence[Any], index: dict[str, int]) -> Row:
        row = super().__new__(cls, values)
        row._index = index
        return row

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            return tuple.__getitem__(self, self._index[key])
        return tuple.__getitem__(self, key)

    def keys(self) -> list[str]:
        """Column names, in order."""
        return list(self._index)


class Cursor(Protocol):
    """What a query returns (a DB-API cursor)."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...
    def __iter__(self) -> Iterator[Any]: ...


class Conn:
    """One connection, as the store's queries use it. Subclassed per backend.

    Attributes:
        dialect: the SQL dialect.
    """

    dialect: Dialect = Dialect.SQLITE

    def execute(self, sql: str, params: Any = ()) -> Cursor:
        """Run one statement with ``?`` (a sequence) or ``:name`` (a mapping) parameters.

        Raises:
            StoreConflict: a uniqueness or foreign-key rule was broken.
            StoreError: any other database error.
        """
        raise NotImplementedError

    def executemany(self, sql: str, rows: Sequence[Any]) -> None:
        """Run one statement once per parameter row (same errors as :meth:`execute`)."""
        raise NotImplementedError

    def json_text(self, column: str, key: str) -> str:
        """SQL for the text (or number) at top-level ``key`` of a JSON TEXT column."""
        if not key.replace("_", "").isalnum():
            raise StoreError(f"JSON key {key!r} is not a plain field name")
        return f"json_extract({column}, '$.{key}')"

    @property
    def like(self) -> str:
        """The case-insensitive (for ASCII letters) LIKE operator."""
        return "LIKE"

    @property
    def for_share(self) -> str:
        """A ``SELECT`` suffix that keeps the rows read from changing until the transaction
        ends (SQLite: empty, its writers are serialized already)."""
        return ""

    @property
    def for_update(self) -> str:
        """A ``SELECT`` suffix that locks the rows read for an update in this transaction
        (SQLite: empty)."""
        return ""

    def table_exists(self, name: str) -> bool:
        """Whether a table ``name`` exists (in the current schema)."""
        raise NotImplementedError

    def user_tables(self) -> list[str]:
        """The names of the tables in the database (current schema), bookkeeping excluded."""
        raise NotImplementedError

    def lock_migrations(self) -> None:
        """Serialize schema migrations with other openers until this transaction ends."""


class Database(Protocol):
    """A backend: connections for reads, one transaction per write.

    Attributes:
        dialect: its SQL dialect.
        target: what was opened, for messages (a URL's password is masked).
        read_only: every write fails.
    """

    dialect: Dialect
    target: str
    read_only: bool

    def read(self) -> AbstractContextManager[Conn]:
        """A connection for reads (each statement sees everything committed before it)."""
        ...

    def write(self) -> AbstractContextManager[Conn]:
        """One short write transaction, committed (and durable) when the block exits, rolled
        back when it raises.

        Raises:
            StoreError: the database is open read-only, or the write failed.
        """
        ...

    def compact(self, tables: Sequence[str]) -> bool:
        """Rewrite the storage so that deleted rows leave no bytes behind (SQLite: ``VACUUM``
        and a ``TRUNCATE`` checkpoint of the write-ahead log; PostgreSQL: ``VACUUM FULL`` of
        ``tables``). Returns whether that is complete (``False``: another process still reads
        an old snapshot of a SQLite file, so its log could not be emptied; run it again when
        it has stopped).

        Raises:
            StoreError: the database is open read-only, or the command failed.
        """
        ...

    def close(self) -> None:
        """Close every connection (idempotent)."""
        ...


def is_url(target: str | os.PathLike[str]) -> bool:
    """Whether ``target`` is a database URL rather than a file path."""
    return URL_SCHEME.match(str(target)) is not None


def mask_url(url: str) -> str:
    """``url`` with its password replaced by ``***`` (for messages and logs)."""
    return re.sub(r"^([a-z]+://[^:/@]*):[^@]*@", r"\1:***@", url)


def open_database(
    target: str | os.PathLike[str], *, timeout_s: float = 30.0, read_only: bool = False
) -> Database:
    """The backend for ``target``: a ``postgresql://`` URL or a SQLite file path.

    Raises:
        StoreError: a URL of another scheme, or the database cannot be opened.
    """
    scheme = URL_SCHEME.match(str(target))
    if scheme is None:
        head = str(target).split(":", 1)[0].lower()
        if ":" in str(target) and head in POSTGRES_SCHEMES:
            raise StoreError(
                f"the store {mask_url(str(target))!r} looks like a PostgreSQL URL without '://'; "
                "write postgresql://USER@HOST:PORT/DB (a file path would be taken literally)"
            )
        from clawrl.store.sqlite import SQLiteDatabase

        return SQLiteDatabase(target, timeout_s=timeout_s, read_only=read_only)
    if scheme.group(1).lower() not in POSTGRES_SCHEMES:
        raise StoreError(
            f"the store {mask_url(str(target))!r} is a {scheme.group(1)} URL; clawrl stores in a "
            "SQLite file (a path, e.g. --store clawrl.db) or PostgreSQL "
            "(--store postgresql://USER@HOST:PORT/DB)"
        )
    from clawrl.store.postgres import PostgresDatabase

    return PostgresDatabase(str(target), timeout_s=timeout_s, read_only=read_only)


@lru_cache(maxsize=512)
def pyformat(sql: str) -> str:
    """``sql`` with ``?`` and ``:name`` parameters as psycopg's ``%s`` and ``%(name)s`` (a
    literal ``%`` doubled); ``::type`` casts are left alone. Statements must not hold ``?`` or
    ``:word`` inside string literals (the store's do not)."""
    out = sql.replace("%", "%%").replace("?", "%s")
    return re.sub(r"(?<![:\w]):([A-Za-z_]\w*)", r"%(\1)s", out)
