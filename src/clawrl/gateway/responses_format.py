"""OpenAI Responses objects: the response, its output items, and the stream's events.

Output items, in the order the policy wrote them: ``reasoning`` (its text as one
``reasoning_text`` content part; ``summary`` empty; no ``encrypted_content``), ``message``
(one ``output_text`` part), ``function_call`` (``call_id`` = the parser's ``call_…`` id,
``arguments`` a JSON string, ``namespace`` when the tool came from a ``namespace`` tool) or
``custom_tool_call`` (``input``) per tool call.

Streamed answers follow the Responses event sequence, every event with a ``sequence_number``::

    response.created, response.in_progress
    per item: response.output_item.added
              message:   response.content_part.added, response.output_text.delta...,
                         response.output_text.done, response.content_part.done
              reasoning: response.reasoning_text.delta..., response.reasoning_text.done
              call:      response.function_call_arguments.delta (whole JSON),
                         response.function_call_arguments.done
                         (custom: response.custom_tool_call_input.delta / .done)
              response.output_item.done
    response.completed    (or response.incomplete with reason max_output_tokens)

A failure mid-stream ends with ``response.failed`` (``response.error`` set).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from typing import Any

from clawrl.chat import ParsedCompletion, ToolCall
from clawrl.chat.responses_items import CUSTOM_INPUT, ToolOrigin


def new_id(prefix: str) -> str:
    """A fresh id ``PREFIX_`` + 24 hex digits (``resp``, ``msg``, ``rs``, ``fc``, ``ctc``)."""
    return f"{prefix}_" + secrets.token_hex(12)


def usage_json(input_tokens: int, output_tokens: int) -> dict[str, Any]:
    """Responses ``usage`` (no prompt caching, reasoning tokens not counted apart)."""
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + output_tokens,
    }


def reasoning_item(id_: str, text: str) -> dict[str, Any]:
    """A ``reasoning`` output item with its text."""
    return {
        "id": id_,
        "type": "reasoning",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
        "status": "completed",
    }


def message_item(id_: str, text: str, status: str = "completed") -> dict[str, Any]:
    """An assistant ``message`` output item with one ``output_text`` part."""
    parts = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
    return {
        "id": id_,
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": parts if text or status == "completed" else [],
    }


def call_item(id_: str, call: ToolCall, origin: ToolOrigin, done: bool = True) -> dict[str, Any]:
    """A ``function_call`` (or ``custom_tool_call``) output item for a parsed call."""
    status = "completed" if done else "in_progress"
    if origin.kind == "custom":
        text = call.arguments.get(CUSTOM_INPUT, "")
        return {
            "id": id_,
            "type": "custom_tool_call",
            "status": status,
            "call_id": call.id,
            "name": call.name,
            "input": (text if isinstance(text, str) else json.dumps(text)) if done else "",
        }
    item = {
        "id": id_,
        "type": "function_call",
        "status": status,
        "call_id": call.id,
        "name": call.name,
        "arguments": json.dumps(call.arguments, ensure_ascii=False) if done else "",
    }
    if origin.namespace:
        item["namespace"] = origin.namespace
    return item


def output_items(
    parsed: ParsedCompletion, origin: Callable[[str], ToolOrigin]
) -> list[dict[str, Any]]:
    """The output of a non-streamed answer: reasoning, message, then one item per call."""
    out: list[dict[str, Any]] = []
    if parsed.reasoning:
        out.append(reasoning_item(new_id("rs"), parsed.reasoning))
    if parsed.content:
        out.append(message_item(new_id("msg"), parsed.content))
    for call in parsed.tool_calls:
        prefix = "ctc" if origin(call.name).kind == "custom" else "fc"
        out.append(call_item(new_id(prefix), call, origin(call.name)))
    return out


def response_json(
    *,
    id_: str,
    created_at: float,
    model: str,
    status: str,
    output: list[dict[str, Any]],
    usage: dict[str, Any] | None,
    echo: dict[str, Any],
    error: dict[str, Any] | None = None,
    incomplete_reason: str | None = None,
) -> dict[str, Any]:
    """A ``response`` object; ``echo`` holds request fields the object repeats (instructions,
    tools, tool_choice, parallel_tool_calls, temperature, top_p, max_output_tokens, store,
    metadata, reasoning, text)."""
    return {
        "id": id_,
        "object": "response",
        "created_at": int(created_at),
        "status": status,
        "error": error,
        "incomplete_details": {"reason": incomplete_reason} if incomplete_reason else None,
        "model": model,
        "output": output,
        "previous_response_id": None,
        "truncation": "disabled",
        "usage": usage,
        "user": None,
        **echo,
    }


class EventWriter:
    """Builds the stream's events: numbers them, tracks open items and collects the output."""

    def __init__(self, origin: Callable[[str], ToolOrigin]) -> None:
        self.seq = 0
        self.output: list[dict[str, Any]] = []
        self._origin = origin
        self._open: dict[str, Any] | None = None  # the item being streamed
        self._text = ""

    def event(self, data: dict[str, Any]) -> bytes:
        """One server-sent event (``event: TYPE`` + ``data: JSON``) with the next sequence
        number."""
        data = {**data, "sequence_number": self.seq}
        self.seq += 1
        return f"event: {data['type']}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()

    def _index(self) -> int:
        return len(self.output)

    def _add(self, item: dict[str, Any]) -> list[bytes]:
        out = self.close()
        self._open, self._text = item, ""
        out.append(
            self.event(
                {"type": "response.output_item.added", "output_index": self._index(), "item": item}
            )
        )
        if item["type"] == "message":
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            out.append(
                self.event({**self._where(), "type": "response.content_part.added", "part": part})
            )
        return out

    def _where(self) -> dict[str, Any]:
        assert self._open is not None
        return {"item_id": self._open["id"], "output_index": self._index(), "content_index": 0}

    def close(self) -> list[bytes]:
        """Finish the open message or reasoning item, if any."""
        if self._open is None:
            return []
        item, text, out = self._open, self._text, []
        if item["type"] == "message":
            done = message_item(item["id"], text)
            part = done["content"][0]
            out.append(
                self.event({**self._where(), "type": "response.output_text.done", "text": text})
            )
            out.append(
                self.event({**self._where(), "type": "response.content_part.done", "part": part})
            )
        else:
            done = reasoning_item(item["id"], text)
            out.append(
                self.event({**self._where(), "type": "response.reasoning_text.done", "text": text})
            )
        out.append(
            self.event(
                {"type": "response.output_item.done", "output_index": self._index(), "item": done}
            )
        )
        self.output.append(done)
        self._open = None
        return out

    def text(self, delta: str) -> list[bytes]:
        """Events for new answer text."""
        out = []
        if self._open is None or self._open["type"] != "message":
            out = self._add(message_item(new_id("msg"), "", status="in_progress"))
        self._text += delta
        out.append(
            self.event(
                {
                    **self._where(),
                    "type": "response.output_text.delta",
                    "delta": delta,
                    "logprobs": [],
                }
            )
        )
        return out

    def reasoning(self, delta: str) -> list[bytes]:
        """Events for new reasoning text."""
        out = []
        if self._open is None or self._open["type"] != "reasoning":
            out = self._add({"id": new_id("rs"), "type": "reasoning", "summary": []})
        self._text += delta
        out.append(
            self.event({**self._where(), "type": "response.reasoning_text.delta", "delta": delta})
        )
        return out

    def call(self, call: ToolCall) -> list[bytes]:
        """Events for one complete tool call."""
        out = self.close()
        origin = self._origin(call.name)
        custom = origin.kind == "custom"
        item_id = new_id("ctc" if custom else "fc")
        index = self._index()
        out.append(
            self.event(
                {
                    "type": "response.output_item.added",
                    "output_index": index,
                    "item": call_item(item_id, call, origin, done=False),
                }
            )
        )
        done = call_item(item_id, call, origin)
        where = {"item_id": item_id, "output_index": index}
        if custom:
            text = done["input"]
            out.append(
                self.event(
                    {**where, "type": "response.custom_tool_call_input.delta", "delta": text}
                )
            )
            out.append(
                self.event({**where, "type": "response.custom_tool_call_input.done", "input": text})
            )
        else:
            args = done["arguments"]
            out.append(
                self.event(
                    {**where, "type": "response.function_call_arguments.delta", "delta": args}
                )
            )
            out.append(
                self.event(
                    {
                        **where,
                        "type": "response.function_call_arguments.done",
                        "arguments": args,
                        "name": call.name,
                    }
                )
            )
        out.append(
            self.event({"type": "response.output_item.done", "output_index": index, "item": done})
        )
        self.output.append(done)
        return out
