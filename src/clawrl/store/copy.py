"""Copying a store between backends (SQLite -> PostgreSQL and back), verified.

Rows are copied as stored (delta-stored prompts stay deltas, so nothing is rebuilt), table by
table in insertion order, all in one transaction of the destination: a failed copy leaves the
destination as it was. Then each table is compared on both sides: its row count, and a sha256
over its rows in insertion order (:func:`table_digest`), which both backends compute alike
(integers, float64 values, text and bytes are the same in both).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any

from clawrl.errors import StoreError
from clawrl.store.core import Store
from clawrl.store.db import Conn
from clawrl.store.schema import SCHEMA_VERSION, table_columns

TABLES = (
    "sessions", "turns", "feedback", "judgments", "samples", "policy_versions",
    "rollout_groups", "rollouts", "verifier_results", "memory_entries",
    "memory_sources", "user_adapters",
)  # fmt: skip
"""Every table of the store with data, in an order that keeps references valid (``leases``
are not copied: they belong to the processes running on the source)."""


@dataclass(frozen=True)
class TableCopy:
    """One table's copy: rows and digest on each side."""

    table: str
    rows: int
    source_digest: str
    dest_digest: str
    dest_rows: int

    @property
    def verified(self) -> bool:
        """Same row count and same digest on both sides."""
        return self.rows == self.dest_rows and self.source_digest == self.dest_digest


def _value(v: Any) -> str:
    if v is None:
        return "N"
    if isinstance(v, bytes | bytearray | memoryview):
        return "b" + bytes(v).hex()
    if isinstance(v, bool):  # pragma: no cover - no boolean columns
        return f"i{int(v)}"
    if isinstance(v, int):
        return f"i{v}"
    if isinstance(v, float):
        return "f" + v.hex()
    return "s" + json.dumps(str(v), ensure_ascii=False)


def table_digest(conn: Conn, table: str) -> tuple[int, str]:
    """``(rows, sha256 hex)`` of ``table``'s rows in insertion order (every column but
    PostgreSQL's ``rowid``, in the declaration's order)."""
    columns = table_columns(conn, table, conn.dialect)
    h = hashlib.sha256()
    n = 0
    for row in conn.execute(f"SELECT {', '.join(columns)} FROM {table} ORDER BY rowid"):
        h.update(("\x1f".join(_value(v) for v in row) + "\x1e").encode())
        n += 1
    return n, h.hexdigest()


def copy_store(
    source: str | os.PathLike[str], dest: str | os.PathLike[str], *, batch: int = 500
) -> list[TableCopy]:
    """Copy every row of the store ``source`` into the empty store ``dest`` (created and
    migrated if new), then verify both by row counts and digests.

    Args:
        source: a SQLite file or ``postgresql://`` URL holding a store at the current schema.
        dest: a SQLite file or ``postgresql://`` URL; must hold no rows.
        batch: rows read and written per statement batch.

    Returns:
        One :class:`TableCopy` per table, all verified.

    Raises:
        StoreError: the source is not a store, is at an older schema (migrate it first), the
            destination has rows, a write failed (nothing is kept), or the verification
            found a difference.
    """
    if str(source) == str(dest):
        raise StoreError("the source and the destination are the same store")
    if not Store.exists(source):
        raise StoreError(f"no trajectory store at {source}")
    with Store(source, read_only=True) as src:
        if src.schema_version != SCHEMA_VERSION:
            raise StoreError(
                f"{src.target} is at schema version {src.schema_version}, this clawrl at "
                f"{SCHEMA_VERSION}: run `clawrl store migrate --store SOURCE` first"
            )
        with Store(dest) as dst:
            with dst._read() as conn:
                filled = [t for t in TABLES
                          if conn.execute(f"SELECT 1 FROM {t} LIMIT 1").fetchone()]  # fmt: skip
            if filled:
                raise StoreError(f"{dst.target} is not empty (rows in {', '.join(filled)})")
            with src._read() as rconn, dst._write() as wconn:
                for table in TABLES:
                    _copy_table(rconn, wconn, table, batch)
            out = []
            with src._read() as rconn, dst._read() as wconn:
                for table in TABLES:
                    n, a = table_digest(rconn, table)
                    m, b = table_digest(wconn, table)
                    out.append(TableCopy(table, n, a, b, m))
    bad = [c.table for c in out if not c.verified]
    if bad:
        raise StoreError(f"the copy differs from the source in {', '.join(bad)}")
    return out


def _copy_table(src: Conn, dst: Conn, table: str, batch: int) -> None:
    columns = table_columns(src, table, src.dialect)
    if columns != table_columns(dst, table, dst.dialect):
        raise StoreError(f"table {table} has different columns in the two stores")
    names = ", ".join(columns)
    insert = f"INSERT INTO {table} ({names}) VALUES ({', '.join('?' * len(columns))})"
    last: int | None = None
    while True:
        where = "" if last is None else "WHERE rowid > ? "
        rows = src.execute(
            f"SELECT rowid AS row_order, {names} FROM {table} {where}ORDER BY rowid LIMIT ?",
            ([] if last is None else [last]) + [batch],
        ).fetchall()
        if not rows:
            return
        dst.executemany(insert, [tuple(r)[1:] for r in rows])
        last = int(rows[-1][0])
