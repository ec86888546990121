"""Messages a harness sends once and never again in later history: not rendered.

Linking turns into a trajectory needs each call's prompt to extend the previous call's
``prompt + completion`` (:mod:`clawrl.trajectory.tree`). A harness that appends a message to
one request only, and leaves it out of the history of the next, breaks that for every call
after the first. Such messages are recognised by markers the harness writes itself and are left
out of the prompt (and of the stored ``request_messages``), with a note on the turn; the policy
never sees them, so every prompt stays a prefix of the next one.

=========================  =================================================================
harness                    message left out
=========================  =================================================================
OpenClaw (2026.9.x)        a ``user`` message whose text is wrapped in
                           ``<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>`` …
                           ``<<<END_OPENCLAW_INTERNAL_CONTEXT>>>`` (active exec sessions and
                           subagents, appended after the newest message of each request)
=========================  =================================================================
"""

from __future__ import annotations

from collections.abc import Sequence

from clawrl.chat import ChatMessage

OPENCLAW_CONTEXT = (
    "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>",
    "<<<END_OPENCLAW_INTERNAL_CONTEXT>>>",
)
"""(opening marker, closing marker) of OpenClaw's ephemeral context message."""


def is_ephemeral(message: ChatMessage) -> bool:
    """Whether ``message`` is one of the module table's ephemeral messages."""
    if message.role != "user" or not message.content:
        return False
    text = message.content.strip()
    return text.startswith(OPENCLAW_CONTEXT[0]) and text.endswith(OPENCLAW_CONTEXT[1])


def drop_ephemeral(messages: Sequence[ChatMessage]) -> tuple[list[ChatMessage], list[str]]:
    """``messages`` without the ephemeral ones, and one note per message left out
    (``dropped:openclaw_internal_context@INDEX``, the index in the client's list). A request
    of nothing but ephemeral messages is kept whole."""
    kept: list[ChatMessage] = []
    notes: list[str] = []
    for i, m in enumerate(messages):
        if is_ephemeral(m):
            notes.append(f"dropped:openclaw_internal_context@{i}")
        else:
            kept.append(m)
    return (kept, notes) if kept else (list(messages), [])
