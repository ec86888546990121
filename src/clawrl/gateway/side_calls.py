"""Recognising side calls: requests a harness makes beside its main trajectory.

A side call (a title for the session, a compaction summary, a memory extraction) is recorded as
a turn of kind ``side`` with a :class:`clawrl.store.SideKind`; the trajectory tree then never
takes it as a turn's next state while a main call is there (:meth:`SessionTree.next_child`),
and the judge skips it.

Detection is deliberately conservative: only signals a harness sends itself, or prompt text
copied from the harness's own source (versions named below), count. A call that is not
recognised stays ``main`` — a side call mistaken for main costs one odd branch in the tree; a main
call mistaken for side would lose a training turn.

==================  ==========================================================================
signal              side kind
==================  ==========================================================================
Codex header        ``x-codex-turn-metadata`` JSON with ``request_kind: "compaction"``
                    -> ``compaction`` (any other non-``turn`` kind -> ``other``)
last user message   contains both ``CRITICAL: Respond with TEXT ONLY`` and ``Your task is to
                    create a detailed summary of`` (Claude Code ``/compact`` and
                    auto-compaction, 2.1.x), or ``You are performing a CONTEXT CHECKPOINT
                    COMPACTION. Create a handoff summary`` (Codex's local compaction prompt,
                    0.17x) -> ``compaction``. Whole phrases of the harness's own prompt, so a
                    user who merely quotes one marker is not taken for a compaction.
a system message    starts with ``You are a title generator.`` (opencode 1.x title agent)
                    or contains ``You are naming a coding session so the user can pick it
                    out`` (Claude Code 2.1.x interactive session title, sent with an
                    ``output_config`` json_schema of one ``title`` field) -> ``title``;
                    starts with ``You are now acting as the managed memory extraction
                    subagent`` (Qwen Code 0.24.x) -> ``memory``; starts with ``You are an
                    expert software engineer that generates concise, one-line Git commit
                    messages`` (aider 0.86.x) -> ``commit_message``
==================  ==========================================================================

Every side call is stored untrainable (reason ``side_call``), is never a turn's next state, and
never receives a session-level verdict (:mod:`clawrl.trajectory.next_state`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from clawrl.chat import ChatMessage
from clawrl.store import SideKind

CODEX_TURN_METADATA = "x-codex-turn-metadata"
COMPACTION_MARKERS: tuple[tuple[str, ...], ...] = (
    ("CRITICAL: Respond with TEXT ONLY", "Your task is to create a detailed summary of"),
    ("You are performing a CONTEXT CHECKPOINT COMPACTION. Create a handoff summary",),
)
"""Each entry: phrases that must all appear in the last user message."""
TITLE_SYSTEM_PREFIXES = ("You are a title generator.",)
TITLE_SYSTEM_MARKERS = ("You are naming a coding session so the user can pick it out",)
MEMORY_SYSTEM_PREFIXES = ("You are now acting as the managed memory extraction subagent",)
COMMIT_SYSTEM_PREFIXES = (
    "You are an expert software engineer that generates concise, one-line Git commit messages",
)


def codex_turn_metadata(headers: Mapping[str, str]) -> dict[str, Any]:
    """The JSON object of Codex's ``x-codex-turn-metadata`` header (``{}`` when absent or not
    a JSON object)."""
    raw = headers.get(CODEX_TURN_METADATA)
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):  # not JSON, or nested too deep to parse
        return {}
    return value if isinstance(value, dict) else {}


def side_kind_from_headers(headers: Mapping[str, str]) -> str | None:
    """The side kind a harness signals in its headers, or ``None`` (a main call)."""
    kind = codex_turn_metadata(headers).get("request_kind")
    if not isinstance(kind, str) or kind in ("", "turn"):
        return None
    return SideKind.COMPACTION.value if kind == "compaction" else SideKind.OTHER.value


def side_kind_from_messages(messages: Sequence[ChatMessage]) -> str | None:
    """The side kind recognised from the prompt text (module table), or ``None``."""
    last_user = next((m for m in reversed(messages) if m.role == "user"), None)
    text = (last_user.content or "") if last_user is not None else ""
    if any(all(phrase in text for phrase in marker) for marker in COMPACTION_MARKERS):
        return SideKind.COMPACTION.value
    systems = [(m.content or "").lstrip() for m in messages if m.role == "system"]
    if any(t.startswith(TITLE_SYSTEM_PREFIXES) for t in systems):
        return SideKind.TITLE.value
    if any(marker in t for t in systems for marker in TITLE_SYSTEM_MARKERS):
        return SideKind.TITLE.value
    if any(t.startswith(MEMORY_SYSTEM_PREFIXES) for t in systems):
        return SideKind.MEMORY.value
    if any(t.startswith(COMMIT_SYSTEM_PREFIXES) for t in systems):
        return SideKind.COMMIT_MESSAGE.value
    return None
