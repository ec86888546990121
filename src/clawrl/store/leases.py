"""Leases: which process may do a piece of work now, held in the store with an expiry.

The separate processes (``clawrl train``, ``clawrl judge worker``) coordinate only through the
store; a lease is how one of them says "mine until T" there:

* ``trainer``: the one trainer of a store. Rank 0 of ``clawrl train`` takes it before it
  resumes and renews it while it runs; a second trainer waits until it is free (or until its
  holder's process is seen dead on this host), so two trainers never write the same output
  directory or the same ``samples`` rows. A ``kill -9`` leaves the lease to expire.
* ``judge:TURN_ID``: a judge worker's claim on one turn while it judges it, so several workers
  do not judge the same turn (the first stored verdict wins anyway: this only saves the work).

A lease is a row ``(name, holder, expires_at)``. Taking it is one statement that inserts the
row, or takes it over when it expired or is the caller's own; the holder then re-reads it
(portable between SQLite and PostgreSQL, atomic in both). Times are the store clients' clocks
(``time.time()``), so machines sharing a store need roughly synchronised clocks (NTP); the TTLs
used are tens of seconds.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

from clawrl.store.db import Conn

TRAINER_LEASE = "trainer"
"""The lease of the one trainer of a store."""


def holder_is_dead_here(holder: str) -> bool:
    """Whether a lease ``holder`` (``host:pid:nonce``) names a process of this host that no
    longer exists (a trainer or worker killed here: its lease need not lapse first)."""
    host, _, rest = holder.partition(":")
    pid_text = rest.partition(":")[0]
    if host != socket.gethostname() or not pid_text.isdigit() or int(pid_text) == os.getpid():
        return False
    try:
        os.kill(int(pid_text), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


def lease_holder() -> str:
    """A new holder name for this process: ``host:pid:nonce``."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def judge_claim(turn_id: str) -> str:
    """The lease name of a judge worker's claim on one turn."""
    return f"judge:{turn_id}"


@dataclass(frozen=True)
class Lease:
    """A lease as stored.

    Attributes:
        name: what it is for (:data:`TRAINER_LEASE`, :func:`judge_claim`).
        holder: who holds it (e.g. ``host:pid:nonce``).
        expires_at: seconds since the epoch when it lapses unless renewed.
    """

    name: str
    holder: str
    expires_at: float


class _HasConnections(Protocol):
    def _write(self) -> AbstractContextManager[Conn]: ...
    def _read(self) -> AbstractContextManager[Conn]: ...


_TAKE = (
    "INSERT INTO leases (name, holder, expires_at) VALUES (?, ?, ?) "
    "ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at "
    "WHERE leases.expires_at < ? OR leases.holder = excluded.holder"
)


class Leases:
    """Mixin for :class:`clawrl.store.Store`: the ``leases`` table (module docstring)."""

    def acquire_lease(
        self: _HasConnections, name: str, holder: str, ttl_s: float, *, force: bool = False
    ) -> Lease | None:
        """Take or renew the lease ``name`` for ``ttl_s`` seconds from now.

        Args:
            name: the lease.
            holder: the caller's identity; renewing is acquiring again with the same holder.
            ttl_s: seconds until it lapses unless renewed (> 0).
            force: take it even from a live holder (the caller knows that holder is dead).

        Returns:
            ``None`` when it is the caller's now (taken or renewed), else the lease another
            holder has.

        Raises:
            ValueError: ``ttl_s`` is not positive.
        """
        if ttl_s <= 0:
            raise ValueError(f"a lease's ttl must be positive, got {ttl_s}")
        now = time.time()
        with self._write() as conn:
            # force: every stored expiry counts as past
            conn.execute(_TAKE, (name, holder, now + ttl_s, 1e300 if force else now))
            r = conn.execute(
                "SELECT holder, expires_at FROM leases WHERE name = ?", (name,)
            ).fetchone()
        if r is None or r[0] == holder:
            return None
        return Lease(name, str(r[0]), float(r[1]))

    def release_lease(self: _HasConnections, name: str, holder: str) -> None:
        """Give the lease up, if ``holder`` still has it."""
        with self._write() as conn:
            conn.execute("DELETE FROM leases WHERE name = ? AND holder = ?", (name, holder))

    def get_lease(self: _HasConnections, name: str) -> Lease | None:
        """The lease ``name`` as stored (it may have expired), or ``None``."""
        with self._read() as conn:
            r = conn.execute(
                "SELECT holder, expires_at FROM leases WHERE name = ?", (name,)
            ).fetchone()
        return None if r is None else Lease(name, str(r[0]), float(r[1]))

    def purge_leases(self: _HasConnections, expired_for_s: float = 3600.0) -> int:
        """Delete leases that expired more than ``expired_for_s`` seconds ago (claims of
        workers that were killed); returns how many."""
        with self._write() as conn:
            cur = conn.execute(
                "DELETE FROM leases WHERE expires_at < ?", (time.time() - expired_for_s,)
            )
            return max(0, cur.rowcount)
