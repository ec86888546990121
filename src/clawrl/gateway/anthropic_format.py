"""Anthropic Messages response objects: messages, content blocks, stream events, errors.

Streamed answers follow Anthropic's event sequence::

    message_start            (usage.input_tokens = prompt tokens)
    ping
    content_block_start      thinking | text | tool_use, one block at a time, in output order
    content_block_delta      thinking_delta (+ one signature_delta before a thinking block
                             stops) | text_delta | input_json_delta (the whole arguments JSON)
    content_block_stop
    ...
    message_delta            stop_reason, stop_sequence, usage.output_tokens
    message_stop

A failure mid-stream ends the stream with ``event: error`` instead of the last three.

Conventions: ``stop_reason`` is ``tool_use`` when the answer has tool calls, ``max_tokens``
when the token budget ran out, ``stop_sequence`` (with the string) when a requested stop
sequence ended it, else ``end_turn``. ``usage.output_tokens`` counts every sampled token, the
final stop token included. Thinking blocks carry the reasoning text and the fixed signature
:data:`THINKING_SIGNATURE` (clawrl does not sign; clients echo it back and it is ignored).
Tool-use ids are ``toolu_`` + the parser's random hex.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from clawrl.chat import ParsedCompletion, ToolCall
from clawrl.errors import ContextLengthError, MaxTokensBeyondContextError

THINKING_SIGNATURE = "clawrl-unsigned"
ANTHROPIC_PATH_PARTS = ("/v1/messages",)

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def message_id() -> str:
    """A fresh ``msg_`` id."""
    return "msg_" + secrets.token_hex(12)


def tool_use_id(call_id: str) -> str:
    """The client-facing id of a parsed tool call: ``call_X`` -> ``toolu_X``."""
    return "toolu_" + call_id.removeprefix("call_")


def stop_reason(finish_reason: str | None, stop_sequence: str | None) -> str:
    """Anthropic's ``stop_reason`` for the gateway's finish reason (module docstring)."""
    if finish_reason == "tool_calls":
        return "tool_use"
    if finish_reason == "length":
        return "max_tokens"
    return "stop_sequence" if stop_sequence else "end_turn"


def usage_json(input_tokens: int, output_tokens: int) -> dict[str, Any]:
    """``usage``: prompt and sampled tokens (no prompt caching: cache counts are 0)."""
    return {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


def tool_use_block(call: ToolCall) -> dict[str, Any]:
    """A ``tool_use`` block (``input`` is the arguments object)."""
    return {"type": "tool_use", "id": call.id, "name": call.name, "input": call.arguments}


def content_blocks(parsed: ParsedCompletion) -> list[dict[str, Any]]:
    """The blocks of a non-streamed answer: thinking, text, then one tool_use per call."""
    blocks: list[dict[str, Any]] = []
    if parsed.reasoning:
        blocks.append(
            {"type": "thinking", "thinking": parsed.reasoning, "signature": THINKING_SIGNATURE}
        )
    if parsed.content:
        blocks.append({"type": "text", "text": parsed.content})
    blocks.extend(tool_use_block(c) for c in parsed.tool_calls)
    return blocks


def message_json(
    *,
    id_: str,
    model: str,
    content: list[dict[str, Any]],
    stop_reason_: str | None,
    stop_sequence: str | None,
    usage: dict[str, Any],
) -> dict[str, Any]:
    """A ``message`` object."""
    return {
        "id": id_,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason_,
        "stop_sequence": stop_sequence,
        "usage": usage,
    }


def event(data: dict[str, Any]) -> bytes:
    """One server-sent event, ``event: TYPE`` then ``data: JSON``."""
    return f"event: {data['type']}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


class BlockWriter:
    """Turns streamed pieces (reasoning, text, complete tool calls) into content-block events,
    opening and closing one block at a time."""

    def __init__(self) -> None:
        self.index = -1
        self.open: str | None = None

    def _start(self, block: dict[str, Any]) -> list[bytes]:
        out = self.close()
        self.index += 1
        self.open = block["type"]
        out.append(
            event({"type": "content_block_start", "index": self.index, "content_block": block})
        )
        return out

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return event({"type": "content_block_delta", "index": self.index, "delta": delta})

    def close(self) -> list[bytes]:
        """Close the open block, if any."""
        if self.open is None:
            return []
        out = []
        if self.open == "thinking":
            out.append(self._delta({"type": "signature_delta", "signature": THINKING_SIGNATURE}))
        out.append(event({"type": "content_block_stop", "index": self.index}))
        self.open = None
        return out

    def reasoning(self, text: str) -> list[bytes]:
        """Events for new reasoning text."""
        out = []
        if self.open != "thinking":
            out = self._start({"type": "thinking", "thinking": "", "signature": ""})
        out.append(self._delta({"type": "thinking_delta", "thinking": text}))
        return out

    def text(self, text: str) -> list[bytes]:
        """Events for new answer text."""
        out = []
        if self.open != "text":
            out = self._start({"type": "text", "text": ""})
        out.append(self._delta({"type": "text_delta", "text": text}))
        return out

    def tool_use(self, call: ToolCall) -> list[bytes]:
        """Events for one complete tool call: start, the arguments JSON, stop."""
        out = self._start({**tool_use_block(call), "input": {}})
        args = json.dumps(call.arguments, ensure_ascii=False)
        out.append(self._delta({"type": "input_json_delta", "partial_json": args}))
        out.extend(self.close())
        return out


def is_anthropic_path(path: str) -> bool:
    """Whether a request path is an Anthropic route (its errors take Anthropic's shape)."""
    return any(part in path for part in ANTHROPIC_PATH_PARTS)


def error_json(status: int, openai_body: dict[str, Any], exc: BaseException | None) -> dict:
    """Anthropic's error body ``{"type": "error", "error": {"type", "message"}}`` for an error
    the gateway would answer with ``status`` and the OpenAI-shaped ``openai_body``.

    A prompt that does not fit reads ``prompt is too long: N tokens > M maximum``, the message
    Claude Code parses to decide how much to compact; a prompt that fits without its
    ``max_tokens`` reads like Anthropic's ``input length and `max_tokens` exceed context
    limit: P + M > C, ...``.
    """
    inner = openai_body.get("error", {}) if isinstance(openai_body, dict) else {}
    message = str(inner.get("message", "error"))
    if isinstance(exc, MaxTokensBeyondContextError):  # Anthropic's own wording
        message = (
            f"input length and `max_tokens` exceed context limit: {exc.prompt_tokens} + "
            f"{exc.max_tokens} > {exc.max_context}, decrease input length or `max_tokens` and "
            "try again"
        )
    elif isinstance(exc, ContextLengthError):
        message = f"prompt is too long: {exc.prompt_tokens} tokens > {exc.max_context} maximum"
    kind = _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}
