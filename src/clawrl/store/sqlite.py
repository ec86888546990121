"""The SQLite backend: one file, WAL, a connection per thread, serialized writes.

Durability: WAL journal with ``synchronous=FULL``: every write transaction is fsynced to the WAL
before its method returns, so what the gateway acknowledged (it records a turn before sending
the HTTP response) survives ``kill -9`` of the server and also an OS crash or power loss.
(``NORMAL`` would already survive ``kill -9``, since the WAL's writes sit in the OS page cache,
but not a power loss; one fsync per recorded turn is cheap next to generating it.)

Threads: each thread gets its own connection (created on first use, closed by
:meth:`SQLiteDatabase.close`), so reads run concurrently under WAL; writes are serialized by one
lock per database object and run as short ``BEGIN IMMEDIATE`` transactions. Other processes
(the CLI, a trainer, another gateway on the same machine) may open the same file; SQLite's busy
timeout (``timeout_s``) arbitrates between them.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

from clawrl.errors import StoreError
from clawrl.store.db import Conn, Cursor, StoreConflict
from clawrl.store.schema import Dialect


class SQLiteConn(Conn):
    """A :class:`~clawrl.store.db.Conn` over one ``sqlite3`` connection."""

    dialect = Dialect.SQLITE

    def __init__(self, raw: sqlite3.Connection) -> None:
        self.raw = raw

    def execute(self, sql: str, params: Any = ()) -> Cursor:
        try:
            return self.raw.execute(sql, params)
        except sqlite3.IntegrityError as exc:
            raise StoreConflict(f"store write refused: {exc}") from exc
        except sqlite3.Error as exc:
            raise StoreError(f"store query failed: {exc}") from exc

    def executemany(self, sql: str, rows: Sequence[Any]) -> None:
        try:
            self.raw.executemany(sql, rows)
        except sqlite3.IntegrityError as exc:
            raise StoreConflict(f"store write refused: {exc}") from exc
        except sqlite3.Error as exc:
            raise StoreError(f"store query failed: {exc}") from exc

    def table_exists(self, name: str) -> bool:
        row = self.raw.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)
        ).fetchone()
        return row is not None

    def user_tables(self) -> list[str]:
        return [
            r[0]
            for r in self.raw.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' "
                "AND name NOT LIKE 'sqlite_%' AND name != 'schema_migrations'"
            )
        ]


class SQLiteDatabase:
    """One SQLite file as a store backend (:class:`clawrl.store.db.Database`).

    Args:
        path: the database file; parent directories are created. ``:memory:`` is refused
            (each thread would see its own empty database).
        timeout_s: how long a write waits for another process's lock before failing.
        read_only: open an existing file for reading only: no directory or file is created,
            every write fails.

    Raises:
        StoreError: ``:memory:``, a directory that cannot be created, or (read-only) no file.
    """

    dialect = Dialect.SQLITE

    def __init__(
        self, path: str | os.PathLike[str], *, timeout_s: float = 30.0, read_only: bool = False
    ) -> None:
        if str(path) == ":memory:" or str(path).startswith("file::memory:"):
            raise StoreError("the store needs a file path (':memory:' is per-connection)")
        self.path = Path(path)
        self.target = str(self.path)
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
        self._conns: dict[threading.Thread, SQLiteConn] = {}
        self._conns_lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._closed = False

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

    def conn(self) -> SQLiteConn:
        """This thread's connection (opened on first use).

        Raises:
            StoreError: the database is closed or cannot be opened.
        """
        if self._closed:
            raise StoreError("the store is closed")
        conn: SQLiteConn | None = getattr(self._local, "conn", None)
        if conn is not None:
            return conn
        conn = SQLiteConn(self._connect())
        with self._conns_lock:
            # Close connections of threads that have ended (e.g. a recycled worker pool).
            for thread in [t for t in self._conns if not t.is_alive()]:
                self._conns.pop(thread).raw.close()
            self._conns[threading.current_thread()] = conn
        self._local.conn = conn
        return conn

    @contextmanager
    def write(self) -> Iterator[SQLiteConn]:
        """One ``BEGIN IMMEDIATE`` transaction, committed (and fsynced) on exit.

        Raises:
            StoreError: the database is open read-only, or the transaction failed.
        """
        if self.read_only:
            raise StoreError(f"the store {self.path} is open read-only")
        conn = self.conn()
        raw = conn.raw
        with self._write_lock:
            try:
                raw.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise StoreError(f"cannot start a write transaction: {exc}") from exc
            try:
                yield conn
                raw.execute("COMMIT")
            except BaseException as exc:
                if raw.in_transaction:
                    raw.execute("ROLLBACK")
                if isinstance(exc, sqlite3.Error):
                    raise StoreError(f"store write failed: {exc}") from exc
                raise

    @contextmanager
    def read(self) -> Iterator[SQLiteConn]:
        """This thread's connection, for reads."""
        conn = self.conn()
        try:
            yield conn
        except sqlite3.Error as exc:
            raise StoreError(f"store read failed: {exc}") from exc

    def compact(self, tables: Sequence[str]) -> bool:
        """``VACUUM`` (the file rebuilt without free pages) and ``wal_checkpoint(TRUNCATE)``
        (the log emptied): :meth:`clawrl.store.db.Database.compact`."""
        if self.read_only:
            raise StoreError(f"the store {self.path} is open read-only")
        raw = self.conn().raw
        with self._write_lock:
            try:
                raw.execute("VACUUM")
                busy, log_frames, done = raw.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            except sqlite3.Error as exc:
                raise StoreError(f"cannot compact {self.path}: {exc}") from exc
        return not busy and log_frames in (0, done)

    def close(self) -> None:
        """Close every connection this database opened (idempotent)."""
        with self._conns_lock:
            self._closed = True
            for conn in self._conns.values():
                conn.raw.close()
            self._conns.clear()
