"""The memory of a served policy: takes directives from the store, keeps the entries, hands the
gateway what to add to a main call.

Sources (:meth:`MemoryKeeper.sync`, run by the gateway before it prepares a main call, at most
every ``sync_s`` seconds, and at once by ``POST /v1/feedback``):

* a judge's hindsight hint on a turn (``judgments.hint``): already a directive in the user's
  words;
* the comment of explicit feedback (``feedback.comment``): its directive sentences, chosen by
  :func:`clawrl.judge.hints.extract_directive` (a comment with none adds nothing).

Each directive goes through :func:`clawrl.memory.rules.decide` (add, merge into a
near-duplicate, or replace a contradicted entry); past ``max_entries`` active entries the one
updated least recently is evicted. Every change is logged (logger ``clawrl.memory``) and kept in
the entry's ``history``.

Exactly once, across processes: a change and the claim of the source it came from
(``memory_sources``, ``hint:TURN`` / ``feedback:ID``) are written in one transaction, so a
source that another process (a replica, ``clawrl memory``) took first changes nothing here. The
keeper reads only rows recorded after the newest source taken, less :data:`OVERLAP_S` (rows
committed out of order). On a store that had hints before memory was turned on, the first sync
takes them all (the cap keeps the newest).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from clawrl.chat import ChatMessage
from clawrl.judge.hints import extract_directive
from clawrl.judge.types import NextStateRole
from clawrl.memory.prompt import with_memory
from clawrl.memory.rules import decide
from clawrl.store import MemoryEntryRecord, MemorySource, MemoryStatus, Store
from clawrl.store.memory import MAX_TEXT_CHARS, MemorySourceClaim

log = logging.getLogger("clawrl.memory")

OVERLAP_S = 5.0
"""Seconds re-read before the newest directive taken (rows whose commit came late)."""

FORGOTTEN_TEXT = "(forgotten)"
"""The text a forgotten entry keeps (its words are gone)."""

RECENT_BLOCKS = 4
"""Memory blocks handed out earlier that a continuing conversation may still carry."""

HISTORY_LIMIT = 50
"""Events kept in an entry's history (the oldest go first; the first is kept)."""


@dataclass(frozen=True)
class MemorySnapshot:
    """What a main call gets: the active entries' ids and texts, oldest first."""

    entry_ids: tuple[str, ...]
    texts: tuple[str, ...]


@dataclass
class _Change:
    """One change of the memory, written by :meth:`Store.change_memory`."""

    entry: MemoryEntryRecord | None = None
    add: list[MemoryEntryRecord] = field(default_factory=list)
    save: list[MemoryEntryRecord] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)


class MemoryKeeper:
    """A store's preference memory (one user: ``user_id``, ``""`` for the served policy).

    Args:
        store: where the entries and their sources live.
        max_entries: most active entries (the cap; >= 1).
        sync_s: least seconds between two reads of new directives from the store.
        user_id: whose memory.
        retire_gap: nats per token; an entry is retired once the mean gap of its last
            ``retire_turns`` distilled turns is at most this (:meth:`record_distillation`).
        retire_turns: distilled turns an entry needs before it can be retired.

    Raises:
        ValueError: ``max_entries`` < 1, ``retire_turns`` < 1 or ``retire_gap`` < 0.
    """

    def __init__(
        self,
        store: Store,
        *,
        max_entries: int = 8,
        sync_s: float = 1.0,
        user_id: str = "",
        retire_gap: float = 0.05,
        retire_turns: int = 8,
    ) -> None:
        if max_entries < 1:
            raise ValueError(f"memory.max_entries must be >= 1, got {max_entries}")
        if retire_turns < 1 or retire_gap < 0:
            raise ValueError("memory.retire_turns must be >= 1 and memory.retire_gap >= 0")
        self.store = store
        self.retire_gap = retire_gap
        self.retire_turns = retire_turns
        self.max_entries = max_entries
        self.sync_s = sync_s
        self.user_id = user_id
        self._lock = threading.Lock()
        self._synced_at = -float("inf")
        self._cursor = store.memory_cursor(user_id)
        self._recent: deque[dict[str, Any]] = deque(maxlen=RECENT_BLOCKS)

    # -- reading ----------------------------------------------------------------------------
    def snapshot(self) -> MemorySnapshot:
        """The active entries now (synced first when ``sync_s`` has passed)."""
        self.sync()
        entries = self.store.memory_entries(self.user_id)
        return MemorySnapshot(tuple(e.id for e in entries), tuple(e.text for e in entries))

    def options(
        self,
        store: Store,
        session_id: str | None,
        messages: Sequence[ChatMessage],
        recorded: Sequence[dict[str, Any] | None] = (),
    ) -> list[dict[str, Any] | None]:
        """The memory blocks to try for a main call (:class:`clawrl.memory.prompt.MemoryOptions`),
        best first:

        * a conversation's first call (no assistant message): the memory as it is now;
        * a later call of a named session: the block its last main turn had;
        * any other later call: the blocks of the recorded turns that gave its last answer
          (``recorded``), the memory now, the blocks handed out recently, then none.

        A recorded block loses the lines of entries forgotten since (forgetting wins over
        continuing a conversation token-exactly).
        """
        snap = self.snapshot()
        current = with_memory(messages, snap.entry_ids, snap.texts)[1]
        if not any(m.role == "assistant" for m in messages):
            if current is not None:
                with self._lock:
                    if all(r["text"] != current["text"] for r in self._recent):
                        self._recent.appendleft(current)
            return [current]
        if session_id is not None:
            found, last = store.session_memory(session_id)
            if found:
                return [self._again(messages, last)]
        with self._lock:
            recent = list(self._recent)
        out: list[dict[str, Any] | None] = []
        for info in [*recorded, current, *recent, None]:
            again = self._again(messages, info)
            text = None if again is None else again["text"]
            if all((o["text"] if o else None) != text for o in out):
                out.append(again)
        return out

    def _again(
        self, messages: Sequence[ChatMessage], info: dict[str, Any] | None
    ) -> dict[str, Any] | None:
        """A recorded block for these messages (its mode follows them), less forgotten lines."""
        if not info:
            return None
        ids, lines = list(info.get("entries") or []), _lines(str(info["text"]))
        if len(ids) != len(lines):
            return None  # not a block this code wrote
        kept = [(i, t) for i, t in zip(ids, lines, strict=True) if not self._forgotten(i)]
        return with_memory(messages, [i for i, _ in kept], [t for _, t in kept])[1]

    def _forgotten(self, entry_id: str) -> bool:
        e = self.store.get_memory_entry(entry_id)
        return e is None or e.status == MemoryStatus.FORGOTTEN

    # -- taking directives ------------------------------------------------------------------
    def sync(self, *, force: bool = False) -> int:
        """Take the directives recorded since the last sync; returns how many changed the
        memory. Reads the store at most every ``sync_s`` seconds unless ``force``."""
        with self._lock:
            now = time.monotonic()
            if not force and now - self._synced_at < self.sync_s:
                return 0
            self._synced_at = now
            changed = 0
            # a batch in conversation order, not in the order its judges finished (they run
            # concurrently): merging, replacing and evicting depend on the order, and the same
            # sessions judged again must leave the same memory
            batch = self.store.memory_sources_since(self._cursor - OVERLAP_S)
            for src in sorted(batch, key=_conversation_order):
                self._cursor = max(self._cursor, src["created_at"])
                if self.store.memory_source_taken(src["id"]):
                    continue
                text: str | None = src["text"]
                if src["kind"] == "feedback":
                    found = extract_directive(src["text"], NextStateRole.FEEDBACK,
                                              negative=src["reward"] < 0)  # fmt: skip
                    text = found.text if found is not None else None
                source = MemorySource.HINT if src["kind"] == "hint" else MemorySource.FEEDBACK
                claim = MemorySourceClaim(src["id"], src["created_at"], self.user_id)
                if self._remember(text or "", source, src["turn_id"], src["session_id"], claim):
                    changed += 1
            return changed

    def remember(
        self,
        text: str,
        source: MemorySource = MemorySource.MANUAL,
        *,
        turn_id: str | None = None,
        session_id: str | None = None,
    ) -> MemoryEntryRecord | None:
        """Take one directive by hand (``clawrl memory add``, ``POST /v1/memory``); returns the
        entry it added or changed (``None``: an empty text)."""
        with self._lock:
            return self._remember(text, source, turn_id, session_id, None)

    def _remember(
        self,
        text: str,
        source: MemorySource,
        turn_id: str | None,
        session_id: str | None,
        claim: MemorySourceClaim | None,
    ) -> MemoryEntryRecord | None:
        text = " ".join(text.split())[:MAX_TEXT_CHARS]
        if not text:
            if claim is not None:  # looked at: not read again by anyone
                self.store.change_memory(source=claim)
            return None
        change = self._plan(text, source, turn_id, session_id, claim)
        assert change.entry is not None
        if claim is not None:
            claim = MemorySourceClaim(claim.id, claim.recorded_at, claim.user_id, change.entry.id)
        if not self.store.change_memory(add=change.add, save=change.save, source=claim):
            return None  # another process took this source first
        for line in change.lines:
            log.info("memory: %s", line)
        return change.entry

    def _plan(
        self,
        text: str,
        source: MemorySource,
        turn_id: str | None,
        session_id: str | None,
        claim: MemorySourceClaim | None,
    ) -> _Change:
        now = time.time()
        event: dict[str, Any] = {"at": now, "source": str(source), "turn_id": turn_id,
                                 "text": text}  # fmt: skip
        if claim is not None:
            event.update(source_id=claim.id, recorded_at=claim.recorded_at)
        active = self.store.memory_entries(self.user_id)
        d = decide([e.text for e in active], text)
        change = _Change()
        if d.action == "merge" and d.target is not None:
            e = active[d.target]
            e.support += 1
            e.text, e.updated_at = text, now
            _forget_gaps(e)  # the words changed: their gaps measured the old ones
            _push(e, {**event, "event": "merged"})
            change.entry, change.save = e, [e]
            change.lines.append(f"merged {text!r} into {e.id[:8]} (support {e.support})")
            return change
        new = MemoryEntryRecord(text=text, source=source, user_id=self.user_id,
                                source_turn_id=turn_id, source_session_id=session_id,
                                created_at=now, updated_at=now)  # fmt: skip
        change.entry, change.add = new, [new]
        if d.action == "replace" and d.target is not None:
            old = active.pop(d.target)
            _end(old, MemoryStatus.REPLACED, f"replaced by {new.id}: {d.why}", now)
            change.save.append(old)
            _push(new, {**event, "event": "added", "replaces": old.id})
            change.lines.append(f"{text!r} replaces {old.text!r}")
        else:
            _push(new, {**event, "event": "added"})
            change.lines.append(f"added {text!r} (from {source})")
        self._evict(active, 1, now, change)
        return change

    def _evict(
        self, active: list[MemoryEntryRecord], coming: int, now: float, change: _Change
    ) -> None:
        """End the least recently updated of ``active`` so that ``coming`` more fit the cap."""
        over = len(active) + coming - self.max_entries
        for e in sorted(active, key=lambda e: e.updated_at)[: max(0, over)]:
            _end(e, MemoryStatus.EVICTED, f"over the cap of {self.max_entries} entries", now)
            change.save.append(e)
            change.lines.append(f"evicted {e.text!r} (cap {self.max_entries})")

    # -- distillation -----------------------------------------------------------------------
    def record_distillation(
        self, turns: Sequence[tuple[str, Sequence[str], float]], *, step: int
    ) -> list[MemoryEntryRecord]:
        """Record the teacher-student gaps of a training step's distilled turns and retire the
        entries the weights alone now follow.

        The gap of a turn (:func:`clawrl.trainer.samples.mean_gap`) is that of its whole
        block: each entry the block held gets it. An active entry is **retired** once it has at
        least ``retire_turns`` gaps and the mean of its last ``retire_turns`` is at most
        ``retire_gap`` nats per token: with the current weights, the memory no longer changes
        what the policy does on the turns it was shown in. (This says the memory adds nothing
        beyond the weights, which also holds when neither follows a directive.) The last
        ``retire_turns`` gaps are kept in one ``distilled`` history event per entry (a
        turn counts once; a merge or an edit of its text drops them); each retirement is logged
        and kept in its history. New conversations no longer get a retired entry (one that
        began with it keeps its block); an entry said again later comes back as a new one.
        An entry another process changed meanwhile (turned off, forgotten, edited, merged
        into) is left as it is, its gaps unrecorded (:meth:`Store.save_memory_if_unchanged`).

        Args:
            turns: ``(turn id, entry ids of its block, gap in nats per token)`` per turn.
            step: the training step these turns were trained in.

        Returns:
            The entries retired now.
        """
        by_entry: dict[str, list[tuple[str, float]]] = {}
        for turn_id, entry_ids, gap in turns:
            for entry_id in entry_ids:
                by_entry.setdefault(entry_id, []).append((turn_id, float(gap)))
        retired: list[MemoryEntryRecord] = []
        with self._lock:
            save: list[tuple[MemoryEntryRecord, MemoryStatus, str, int]] = []
            now = time.time()
            for entry_id, seen in by_entry.items():
                e = self.store.get_memory_entry(entry_id)
                if e is None or e.user_id != self.user_id or e.status != MemoryStatus.ACTIVE:
                    continue
                read_as = (e.status, e.text, e.support)
                event = next((h for h in e.history if h.get("event") == "distilled"), None)
                if event is not None:  # moved to the end: the history's trim keeps it
                    e.history.remove(event)
                else:
                    event = {"event": "distilled", "turns": [], "gaps": []}
                known = set(event["turns"])
                fresh = [(t, g) for t, g in seen if t not in known]  # a retried step: once
                keep = self.retire_turns
                event["turns"] = [*event["turns"], *(t for t, _ in fresh)][-keep:]
                event["gaps"] = [*event["gaps"], *(round(g, 6) for _, g in fresh)][-keep:]
                event["at"], event["step"] = now, step
                gaps = event["gaps"]
                mean = sum(gaps) / len(gaps) if gaps else 0.0
                event["mean_gap"] = round(mean, 6)
                _push(e, event)
                if len(gaps) >= keep and mean <= self.retire_gap:
                    why = (f"the weights alone follow it: mean gap {mean:.3f} nats/token over its "
                           f"last {keep} distilled turns <= {self.retire_gap} (step {step})")  # fmt: skip
                    _end(e, MemoryStatus.RETIRED, why, now)
                    retired.append(e)
                save.append((e, *read_as))
            saved = set(self.store.save_memory_if_unchanged(save)) if save else set()
        retired = [e for e in retired if e.id in saved]
        for e in retired:
            log.info("memory: retired %s %r: %s", e.id[:8], e.text, e.end_reason)
        return retired

    # -- by hand ----------------------------------------------------------------------------
    def edit(
        self, entry_id: str, *, text: str | None = None, active: bool | None = None
    ) -> MemoryEntryRecord:
        """Change an entry by hand: its text, or turn it off (``active=False``: status
        ``disabled``) or back on (``active=True``; past the cap the least recently updated
        other entry is evicted). Logged and kept in its history.

        Raises:
            KeyError: no entry has that id (or it was forgotten).
            ValueError: an empty text, or turning on an entry that was replaced, evicted or
                retired (add it again instead).
        """
        with self._lock:
            e = self.store.get_memory_entry(entry_id)
            if e is None or e.user_id != self.user_id or e.status == MemoryStatus.FORGOTTEN:
                raise KeyError(entry_id)
            now = time.time()
            change = _Change(entry=e, save=[e])
            if text is not None:
                text = " ".join(text.split())[:MAX_TEXT_CHARS]
                if not text:
                    raise ValueError("a memory entry needs a text")
                _push(e, {"at": now, "event": "edited", "old": e.text, "text": text})
                _forget_gaps(e)
                e.text, e.updated_at = text, now
            if active is False and e.status == MemoryStatus.ACTIVE:
                _end(e, MemoryStatus.DISABLED, "turned off by hand", now)
            elif active is True and e.status != MemoryStatus.ACTIVE:
                if e.status != MemoryStatus.DISABLED:
                    raise ValueError(f"entry {entry_id} was {e.status}: add it again instead")
                e.status, e.ended_at, e.end_reason, e.updated_at = (
                    MemoryStatus.ACTIVE, None, None, now
                )  # fmt: skip
                _push(e, {"at": now, "event": "enabled"})
                others = [x for x in self.store.memory_entries(self.user_id) if x.id != e.id]
                self._evict(others, 1, now, change)
            self.store.change_memory(save=change.save)
            log.info("memory: edited %s: %r (%s)", e.id[:8], e.text, e.status)
            for line in change.lines:
                log.info("memory: %s", line)
            return e

    def forget(self, entry_id: str) -> bool:
        """Remove an entry's text and history for good (``False``: no such entry, or forgotten
        already). The row stays as a ``forgotten`` marker without words; blocks handed out
        earlier lose its line (:meth:`options`). Turns recorded before keep what their prompt
        held: that is what the policy saw."""
        with self._lock:
            e = self.store.get_memory_entry(entry_id)
            if e is None or e.user_id != self.user_id or e.status == MemoryStatus.FORGOTTEN:
                return False
            now = time.time()
            e.text, e.status = FORGOTTEN_TEXT, MemoryStatus.FORGOTTEN
            e.ended_at, e.end_reason = now, "forgotten"
            e.history = [{"at": now, "event": "forgotten"}]
            self.store.change_memory(save=[e])
            self._recent = deque(
                (r for r in self._recent if entry_id not in (r.get("entries") or [])),
                maxlen=RECENT_BLOCKS,
            )
            log.info("memory: forgot %s", entry_id[:8])
            return True


def _conversation_order(src: dict[str, Any]) -> tuple[str, float, str]:
    """Sort key of a directive in a sync batch: its session, when its turn was recorded, its
    id (:meth:`clawrl.store.Store.memory_sources_since`)."""
    at = src.get("turn_at")
    return (src.get("session_id") or "", src["created_at"] if at is None else at, src["id"])


def entry_json(e: MemoryEntryRecord, *, history: bool = False) -> dict[str, Any]:
    """An entry as JSON (``/v1/memory``, ``clawrl memory list --json``); with its history
    when ``history``."""
    out = {"object": "memory.entry", **asdict(e)}
    out["status"], out["source"] = str(e.status), str(e.source)
    if not history:
        out.pop("history")
    return out


def _end(e: MemoryEntryRecord, status: MemoryStatus, why: str, now: float) -> None:
    e.status, e.ended_at, e.end_reason = status, now, why
    _push(e, {"at": now, "event": str(status), "why": why})


def _forget_gaps(e: MemoryEntryRecord) -> None:
    """Drop an entry's distillation gaps (its text changed: they measured other words)."""
    e.history = [h for h in e.history if h.get("event") != "distilled"]


def _push(e: MemoryEntryRecord, event: dict[str, Any]) -> None:
    e.history.append(event)
    if len(e.history) > HISTORY_LIMIT:
        e.history[1:] = e.history[-(HISTORY_LIMIT - 1) :]


def _lines(block: str) -> list[str]:
    """The entry texts of a memory block (its ``- `` lines)."""
    return [line[2:] for line in block.splitlines()[1:] if line.startswith("- ")]
