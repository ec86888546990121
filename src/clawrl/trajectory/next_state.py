"""The next state of a turn: what the environment said after it.

Next-state rule, for a turn T:

1. If T has a main child, the next state comes from one child C, :meth:`SessionTree.next_child`
   (the first main child by creation with status ok, else the first main child; a side call
   such as a compaction or a title request is never a next state); the other children
   (retries of the next call, side calls) are listed in ``other_child_ids``.

   - ``ids`` = ``C.prompt_ids[len(T.prompt_ids) + len(T.completion_ids):]``: the tokens the
     environment added after T's sampled completion (tool results, the user's next message,
     template tokens), exactly as the engine received them. When C is linked to T by
     ``history_rewritten`` (C's prompt holds the template's re-rendering of T's answer, not
     T's ids), ``ids`` = ``C.prompt_ids[at:]``, ``at`` being where the gateway found the
     re-rendered answer's end (``client.history_link.next_state_at``); without it, no ids and
     ``note`` says so. ``changes`` then says how C's prompt differs from T's sampled ids.
   - ``messages`` = ``C.request_messages[len(T.request_messages) + 1:]``: T saw
     ``len(T.request_messages)`` messages and the client's copy of T's own answer is one
     assistant message, so everything after that is new. If the message at that index is not
     an assistant message (the client merged, split or trimmed history), the messages after
     C's last assistant message are used instead and ``note`` says so.
   - ``role``: ``tool`` if any new message is a tool result (role ``tool``, or a ``user``
     message with ``tool_result`` / ``function_call_output`` parts), else ``user`` if any is a
     user message, else ``environment``.

2. If T has no main child, explicit feedback is the next state (role ``feedback``, no ids): the
   rows about T, else, for a main-kind leaf, the session-level rows (e.g. a verdict at session
   end). Without either, T has no next state (``None``).

Feedback rows about T are attached to its next state in both cases.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from clawrl.store import FeedbackRecord, TurnKind, TurnRecord
from clawrl.trajectory.history import HISTORY_LINK_FACT
from clawrl.trajectory.tree import LinkKind, SessionTree

_TOOL_PART_TYPES = frozenset({"tool_result", "function_call_output"})


class NextStateRole(StrEnum):
    """Who produced the next state."""

    USER = "user"
    TOOL = "tool"
    ENVIRONMENT = "environment"  # ids without user/tool messages (e.g. template tokens only)
    FEEDBACK = "feedback"  # explicit feedback rows, no child call


@dataclass
class NextState:
    """What came after a turn.

    Attributes:
        turn_id: the turn T.
        role: see :class:`NextStateRole`.
        ids: environment token ids after T's completion, shape ``[k]`` (empty for feedback).
        messages: the neutral messages the environment added (empty for feedback).
        child_turn_id: the child call C they were taken from (``None`` for feedback).
        other_child_ids: T's other children (retries, side calls), creation order.
        feedback: explicit feedback rows about T (or the session, for a leaf without its own).
        note: how the rule was applied when not plainly (fallbacks, choices among children).
        changes: for a child linked by ``history_rewritten``, how its prompt differs from T's
            sampled ids (:class:`~clawrl.trajectory.history.HistoryChange` values); empty
            when the child extends T's ids.
    """

    turn_id: str
    role: NextStateRole
    ids: list[int] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    child_turn_id: str | None = None
    other_child_ids: list[str] = field(default_factory=list)
    feedback: list[FeedbackRecord] = field(default_factory=list)
    note: str | None = None
    changes: list[str] = field(default_factory=list)


def _is_tool_message(message: dict[str, Any]) -> bool:
    if message.get("role") == "tool":
        return True
    content = message.get("content")
    return (
        message.get("role") == "user"
        and isinstance(content, list)
        and any(isinstance(p, dict) and p.get("type") in _TOOL_PART_TYPES for p in content)
    )


def message_role(messages: list[dict[str, Any]]) -> NextStateRole:
    """``tool`` if any message is a tool result, else ``user`` if any is a user message, else
    ``environment``."""
    if any(_is_tool_message(m) for m in messages):
        return NextStateRole.TOOL
    if any(m.get("role") == "user" for m in messages):
        return NextStateRole.USER
    return NextStateRole.ENVIRONMENT


def next_state(tree: SessionTree, turn_id: str) -> NextState | None:
    """The next state of ``turn_id`` (see the module docstring), or ``None`` when nothing came
    after it. Raises ``KeyError`` for a turn that is not in ``tree``."""
    node = tree.node(turn_id)
    turn = node.turn
    feedback = tree.turn_feedback(turn_id)
    child_id = tree.next_child(turn_id)
    if child_id is None:
        if not feedback and turn.kind == TurnKind.MAIN:
            feedback = tree.session_feedback()
        if not feedback:
            return None
        return NextState(turn_id, NextStateRole.FEEDBACK, feedback=feedback)
    child_node = tree.node(child_id)
    child = child_node.turn
    notes = []
    others = [c for c in node.children if c != child_id]
    if others:
        notes.append(f"{len(node.children)} children; took the first successful main one")
    seen = len(turn.request_messages)
    later = child.request_messages
    if len(later) > seen and later[seen].get("role") == "assistant":
        messages = later[seen + 1 :]
    else:
        last = max((i for i, m in enumerate(later) if m.get("role") == "assistant"), default=-1)
        messages = later[last + 1 :]
        notes.append("message counts do not line up; took messages after the last assistant one")
    changes: list[str] = []
    if child_node.link == LinkKind.HISTORY_REWRITTEN:
        changes = list(child_node.changes)
        at = _rewritten_at(child, turn_id)
        if at is None:
            notes.append("history rewritten: where the new messages start is not recorded")
        ids = [] if at is None else child.prompt_ids[at:]
    else:
        ids = child.prompt_ids[len(turn.prompt_ids) + len(turn.completion_ids) :]
    return NextState(
        turn_id=turn_id,
        role=message_role(messages),
        ids=ids,
        messages=messages,
        child_turn_id=child_id,
        other_child_ids=others,
        feedback=feedback,
        note="; ".join(notes) or None,
        changes=changes,
    )


def _rewritten_at(child: TurnRecord, parent_id: str) -> int | None:
    """Where the ids after the re-rendered answer of ``parent_id`` start in ``child``'s prompt,
    as the gateway recorded it (``None``: not recorded, or not for that parent)."""
    fact = (child.client or {}).get(HISTORY_LINK_FACT)
    if not isinstance(fact, dict) or fact.get("turn_id") != parent_id:
        return None
    at = fact.get("next_state_at")
    if isinstance(at, int) and not isinstance(at, bool) and 0 <= at <= len(child.prompt_ids):
        return at
    return None
