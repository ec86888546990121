"""Where a user's memory goes in a main call's prompt, and how a recorded turn's memory is put
back (the OPD teacher) or left out (the student of context distillation).

The entries go in the system message, after what the client wrote there (a new system message
first when there is none), as::

    What this user asked for in earlier conversations:
    - Lead with the number.
    - Keep it to two sentences.

The turn records exactly that (``TurnRecord.memory``: ``{"entries": [ids], "text": the block,
"index": the system message's index, "mode": "appended" | "inserted"}``); its ``prompt_ids``
and ``request_messages`` hold it (what the policy saw), and :func:`without_memory` gives back
the client's messages.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from clawrl.chat import ChatMessage

if TYPE_CHECKING:
    from clawrl.store import Store


class MemoryOptions(Protocol):
    """What the gateway asks a memory (:class:`clawrl.memory.MemoryKeeper`)."""

    def options(
        self,
        store: Store,
        session_id: str | None,
        messages: Sequence[ChatMessage],
        recorded: Sequence[dict[str, Any] | None] = (),
    ) -> list[dict[str, Any] | None]:
        """The memory blocks to try for a main call, best first (``None``: no block), given
        the blocks of the recorded turns that gave its last answer (``recorded``): the gateway
        keeps the first under which the call continues a recorded turn exactly, else the first
        it continues at all, else the first."""
        ...


MEMORY_HEADER = "What this user asked for in earlier conversations:"
"""The first line of the memory block."""


def memory_block(texts: Sequence[str]) -> str:
    """The block added to the system message for these entry texts (``""`` for none)."""
    lines = [f"- {' '.join(t.split())}" for t in texts if t.strip()]
    return "\n".join([MEMORY_HEADER, *lines]) if lines else ""


def with_memory(
    messages: Sequence[ChatMessage], entry_ids: Sequence[str], texts: Sequence[str]
) -> tuple[list[ChatMessage], dict[str, Any] | None]:
    """The messages with the memory block in the system message, and what the turn records
    (``None`` and the messages unchanged when there is nothing to add)."""
    block = memory_block(texts)
    if not block:
        return list(messages), None
    mode = "appended" if messages and messages[0].role == "system" else "inserted"
    info: dict[str, Any] = {"entries": list(entry_ids), "text": block, "index": 0, "mode": mode}
    return apply_memory(messages, info), info


def apply_memory(messages: Sequence[ChatMessage], info: dict[str, Any] | None) -> list[ChatMessage]:
    """The client's messages with a recorded memory block put back where the gateway put it
    (``info`` from :func:`with_memory` or ``TurnRecord.memory``; ``None``: unchanged)."""
    out = list(messages)
    if not info:
        return out
    block = str(info["text"])
    if out and out[0].role == "system":
        first = out[0]
        text = f"{first.content}\n\n{block}" if first.content else block
        out[0] = first.model_copy(update={"content": text})
    else:
        out.insert(0, ChatMessage(role="system", content=block))
    return out


def without_memory(
    messages: Sequence[ChatMessage], info: dict[str, Any] | None
) -> list[ChatMessage]:
    """The client's messages: a turn's recorded messages less the memory block ``info`` put in
    (``None``: unchanged).

    Raises:
        ValueError: the messages do not hold that block where ``info`` says.
    """
    out = list(messages)
    if not info:
        return out
    block = str(info["text"])
    if info.get("mode") == "inserted":
        if not out or out[0].role != "system" or out[0].content != block:
            raise ValueError("the recorded messages do not start with the memory block")
        return out[1:]
    content = out[0].content or "" if out and out[0].role == "system" else ""
    if not content.endswith(block):
        raise ValueError("the recorded system message does not end with the memory block")
    rest = content[: -len(block)].removesuffix("\n\n")
    out[0] = out[0].model_copy(update={"content": rest or None})
    return out
