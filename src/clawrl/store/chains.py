"""Turn prompts stored as deltas of their prefix turn, and their exact rebuild on read.

A session's calls repeat each other: call k's prompt is call k-1's prompt and completion plus a
few new messages. Storing every prompt whole makes a session's size grow with the square of its
length. So a turn whose prompt extends an earlier turn's ``prompt + completion`` (its *prefix
turn*: the parent the gateway found, verified here id for id) stores only what it adds, as the
prefix tree's nodes do:

* ``prompt_ids``: the ids after the first ``prefix_len`` ids of the prefix turn's ``prompt +
  completion`` (all of them, ``prefix_len = seq_len``, when the prompt extends that turn; or
  the leading ids both share, at least :data:`MIN_SHARED_IDS`, when a harness rewrote part of
  the history);
* ``request_messages``: the messages after the first ``messages_prefix_len``, which equal the
  prefix turn's first ones.

Reading rebuilds ``prompt = (prefix.prompt + prefix.completion)[:prefix_len] + tail``
(recursively: the prefix
turn may be a delta too; one recursive query fetches the chain) and checks it against the row's
``prompt_hash`` (sha256 of the full prompt). An LRU of recently rebuilt turns (this process's)
makes the chain walk rare: the gateway reads the turn a call continues, then records the call
against it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from clawrl.errors import StoreError
from clawrl.lru import LRU
from clawrl.store.db import Conn

CHAIN_COLUMNS = (
    "id, prefix_turn_id, prefix_len, messages_prefix_len, prompt_hash, prompt_ids, "
    "completion_ids, request_messages"
)
"""The columns a rebuild needs from each turn of a chain."""


@dataclass(frozen=True)
class FullTurn:
    """A turn's full, rebuilt ids and messages.

    Attributes:
        prompt: the full prompt ids, int32 little-endian (:func:`clawrl.store.encode_ids`).
        completion: the completion ids, same encoding.
        messages: the full request messages (JSON objects; shared, never mutate them).
    """

    prompt: bytes
    completion: bytes
    messages: tuple[Any, ...]

    @property
    def seq(self) -> bytes:
        """``prompt + completion``, encoded."""
        return self.prompt + self.completion


def shared_prefix(a: Sequence[Any], b: Sequence[Any]) -> int:
    """How many leading items ``a`` and ``b`` have in common."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


MIN_SHARED_IDS = 256
"""A prompt that does not contain its parent's whole ``prompt + completion`` is stored as a
delta only when it shares at least this many leading ids with it."""


def shared_bytes(a: bytes, b: bytes) -> int:
    """The length of the longest common prefix of ``a`` and ``b`` (binary search over slice
    comparisons, which run in C)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def digest(data: bytes) -> str:
    """sha256 hex of encoded ids (equals :func:`clawrl.store.ids_digest` of the decoded ids)."""
    return hashlib.sha256(data).hexdigest()


class PromptChains:
    """Rebuilds delta-stored turns (module docstring) and remembers the last ``capacity``.

    Thread-safe. Entries never go stale in a way that goes unnoticed: every rebuilt prompt is
    checked against its row's ``prompt_hash``, and on a mismatch the chain is read again from
    the database.
    """

    def __init__(self, capacity: int = 256) -> None:
        self._cache: LRU[FullTurn] = LRU(capacity)

    def get(self, turn_id: str) -> FullTurn | None:
        """The remembered full turn, or ``None``."""
        return self._cache.get(turn_id)

    def put(self, turn_id: str, full: FullTurn) -> None:
        """Remember ``full`` as ``turn_id``'s (evicting the least recently used)."""
        self._cache.put(turn_id, full)

    def forget(self, turn_ids: Iterable[str]) -> None:
        """Drop remembered turns (their completion changed)."""
        self._cache.pop(turn_ids)

    def resolve(self, conn: Conn, rows: Sequence[Mapping[str, Any]]) -> dict[str, FullTurn]:
        """The full turn of each row (rows of ``turns`` with at least :data:`CHAIN_COLUMNS`).

        Raises:
            StoreError: a prefix turn is missing, or a rebuilt prompt does not hash to its
                row's ``prompt_hash`` even when read afresh (a corrupt store).
        """
        try:
            return self._resolve(conn, rows, use_cache=True)
        except _Stale:
            return self._resolve(conn, rows, use_cache=False)

    def _resolve(
        self, conn: Conn, rows: Sequence[Mapping[str, Any]], *, use_cache: bool
    ) -> dict[str, FullTurn]:
        stored: dict[str, Mapping[str, Any]] = {r["id"]: r for r in rows}
        known: dict[str, FullTurn] = {}
        missing: set[str] = set()
        for r in rows:
            base = r["prefix_turn_id"]
            if base is None or base in stored:
                continue
            cached = self.get(base) if use_cache else None
            if cached is not None:
                known[base] = cached
            else:
                missing.add(base)
        if missing:
            marks = ", ".join("?" * len(missing))
            chain = conn.execute(
                "WITH RECURSIVE chain(id) AS ("
                f"SELECT id FROM turns WHERE id IN ({marks}) "
                "UNION SELECT t.prefix_turn_id FROM turns t JOIN chain c ON t.id = c.id "
                "WHERE t.prefix_turn_id IS NOT NULL) "
                f"SELECT {CHAIN_COLUMNS} FROM turns WHERE id IN (SELECT id FROM chain)",
                sorted(missing),
            ).fetchall()
            for r in chain:
                stored.setdefault(r["id"], r)
        out: dict[str, FullTurn] = {}
        for r in rows:
            out[r["id"]] = self._build(r["id"], stored, known, use_cache=use_cache)
        return out

    def _build(
        self,
        turn_id: str,
        stored: Mapping[str, Mapping[str, Any]],
        known: dict[str, FullTurn],
        *,
        use_cache: bool,
    ) -> FullTurn:
        # walk up to a turn already known (or a root), then rebuild down: no recursion limit
        path: list[str] = []
        current: str | None = turn_id
        while current is not None and current not in known:
            row = stored.get(current)
            if row is None:
                raise StoreError(f"turn {path[-1] if path else turn_id!r}: its prefix turn "
                                 f"{current!r} is missing from the store")  # fmt: skip
            path.append(current)
            current = row["prefix_turn_id"]
        for tid in reversed(path):
            row = stored[tid]
            base_id = row["prefix_turn_id"]
            tail = bytes(row["prompt_ids"])
            messages = json.loads(row["request_messages"])
            if base_id is None:
                prompt, full_messages = tail, tuple(messages)
            else:
                base = known[base_id]
                k, m = int(row["prefix_len"]), int(row["messages_prefix_len"])
                seq = base.seq
                if len(seq) < 4 * k or len(base.messages) < m:
                    raise (
                        _Stale()
                        if use_cache
                        else StoreError(
                            f"turn {tid!r}: its prefix turn {base_id!r} has {len(seq) // 4} ids and "
                            f"{len(base.messages)} messages, fewer than {k} and {m}"
                        )
                    )
                prompt, full_messages = seq[: 4 * k] + tail, (*base.messages[:m], *messages)
            if digest(prompt) != row["prompt_hash"]:
                if use_cache:
                    raise _Stale()
                raise StoreError(f"turn {tid!r}: its stored prompt does not rebuild to its "
                                 "prompt_hash (corrupt store)")  # fmt: skip
            full = FullTurn(prompt, bytes(row["completion_ids"]), full_messages)
            known[tid] = full
            self.put(tid, full)
        return known[turn_id]

    @staticmethod
    def compress(
        row: dict[str, Any], base_id: str, base: FullTurn, messages: Sequence[Any]
    ) -> bool:
        """Turn a full ``turns`` row into its delta against ``base`` (in place), when the row's
        prompt starts with ``base``'s whole ``prompt + completion``, or shares at least
        :data:`MIN_SHARED_IDS` leading ids with it (a harness that rewrote the last message).

        Args:
            row: the full row (:func:`clawrl.store.rows.turn_to_row`), ``prompt_ids`` encoded.
            base_id: the prefix turn's id.
            base: its full ids and messages.
            messages: the row's full request messages (decoded).

        Returns:
            Whether the row is now a delta (``False``: left whole).
        """
        seq = base.seq
        prompt = row["prompt_ids"]
        k = len(seq) if prompt.startswith(seq) else shared_bytes(prompt, seq) // 4 * 4
        if not seq or (k < len(seq) and k < 4 * MIN_SHARED_IDS):
            return False
        shared = shared_prefix(base.messages, messages)
        row["prompt_ids"] = prompt[k:]
        row["prefix_turn_id"] = base_id
        row["prefix_len"] = k // 4
        row["messages_prefix_len"] = shared
        row["request_messages"] = json.dumps(
            list(messages[shared:]), ensure_ascii=False, separators=(",", ":")
        )
        return True


class _Stale(Exception):
    """A remembered turn no longer matches the database: read the chain again."""
