"""OpenAI chat-completions response objects: completions, stream chunks, logprobs, usage.

Conventions:

* ``logprobs.content`` has one entry per sampled token, the final stop token (EOS) included, so
  it has exactly ``usage.completion_tokens`` entries; each entry's ``top_logprobs`` has
  ``top_logprobs`` alternatives (``[]`` when 0 or absent). Log-probs are under the distribution
  actually sampled from (after temperature / top-k / top-p), in nats.
* ``message.reasoning_content`` (and ``delta.reasoning_content``) carries ``<think>`` text, as
  vLLM and DeepSeek do; absent when there is none.
* ``system_fingerprint`` is ``clawrl-policy-v{version}`` (:func:`clawrl.policy_version.fingerprint`).
"""

from __future__ import annotations

import json
import math
import secrets
from typing import Any

from clawrl.chat import ParsedCompletion, ToolCall
from clawrl.gateway.decode import token_piece
from clawrl.policy_version import fingerprint


def completion_id() -> str:
    """A fresh ``chatcmpl-`` id."""
    return "chatcmpl-" + secrets.token_hex(12)


LOGPROB_FLOOR = -9999.0
"""What a log-prob of ``-inf`` (a token top-k / top-p filtered out) is reported as: JSON has no
infinity, and OpenAI's API reports such tokens as -9999.0."""


def finite_logprob(value: float) -> float:
    """``value``, or :data:`LOGPROB_FLOOR` for ``-inf`` / NaN (never a non-JSON float)."""
    return value if math.isfinite(value) else LOGPROB_FLOOR


def logprob_entry(
    tokenizer: Any, token_id: int, logprob: float, top: list[tuple[int, float]]
) -> dict[str, Any]:
    """One ``logprobs.content`` entry: token text, its log-prob, UTF-8 bytes, alternatives
    (non-finite log-probs as :data:`LOGPROB_FLOOR`)."""
    piece = token_piece(tokenizer, token_id)
    return {
        "token": piece,
        "logprob": finite_logprob(float(logprob)),
        "bytes": list(piece.encode("utf-8")),
        "top_logprobs": [
            {
                "token": (alt := token_piece(tokenizer, tid)),
                "logprob": finite_logprob(float(lp)),
                "bytes": list(alt.encode("utf-8")),
            }
            for tid, lp in top
        ],
    }


def tool_call_json(call: ToolCall, index: int | None = None) -> dict[str, Any]:
    """A tool call as OpenAI sends it (arguments as a JSON string)."""
    out: dict[str, Any] = {
        "id": call.id,
        "type": "function",
        "function": {
            "name": call.name,
            "arguments": json.dumps(call.arguments, ensure_ascii=False),
        },
    }
    if index is not None:
        out = {"index": index, **out}
    return out


def message_json(parsed: ParsedCompletion) -> dict[str, Any]:
    """The assistant ``message`` of a non-streamed choice."""
    msg: dict[str, Any] = {"role": "assistant", "content": parsed.content}
    if parsed.reasoning is not None:
        msg["reasoning_content"] = parsed.reasoning
    if parsed.tool_calls:
        msg["tool_calls"] = [tool_call_json(c) for c in parsed.tool_calls]
    return msg


def usage_json(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """``usage`` with prompt tokens counted once per request."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def completion_json(
    *,
    id_: str,
    created: int,
    model: str,
    policy_version: int,
    choices: list[dict[str, Any]],
    usage: dict[str, int],
) -> dict[str, Any]:
    """A ``chat.completion`` object."""
    return {
        "id": id_,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "system_fingerprint": fingerprint(policy_version),
        "choices": choices,
        "usage": usage,
    }


def chunk_json(
    *,
    id_: str,
    created: int,
    model: str,
    policy_version: int,
    choices: list[dict[str, Any]],
    usage: dict[str, int] | None = None,
    include_usage: bool = False,
) -> dict[str, Any]:
    """A ``chat.completion.chunk`` object (``usage: null`` on every chunk when usage is asked)."""
    out: dict[str, Any] = {
        "id": id_,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "system_fingerprint": fingerprint(policy_version),
        "choices": choices,
    }
    if include_usage or usage is not None:
        out["usage"] = usage
    return out


def sse(data: dict[str, Any] | str) -> bytes:
    """One server-sent event ``data: ...\\n\\n``."""
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {text}\n\n".encode()
