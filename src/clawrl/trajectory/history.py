"""Linking a call to the turn it continues by the conversation's messages, when the template
re-rendered that turn's answer to other ids than the policy sampled.

A chat template may rewrite earlier answers when it renders them again: Gemma 3 trims their
whitespace, Qwen3 and DeepSeek-R1 drop their reasoning, a native-tools template re-serialises
tool-call arguments in its own format, gpt-oss ends them with another token. The client does
its part too: it echoes the answer's parsed content (stripped), omits the reasoning, and
re-serialises tool-call arguments with its own spacing. Then the next call's prompt does not
extend the earlier turn's ``prompt + completion`` and the id rule of
:mod:`clawrl.trajectory.tree` finds no parent, but the conversation still says what came next.

**Message rule.** A call whose messages are ``M`` continues turn ``T`` when ``T`` recorded a
non-empty answer (completion ids, and parsed content or tool calls) and, with
``n = len(T.request_messages)``:

1. ``M[:n]`` equals ``T.request_messages`` message by message;
2. ``M[n]`` is an assistant message equal to ``T``'s answer (``T.output``);
3. ``M`` has at least one message after ``M[n]``: the next state.

Equality of two messages (:func:`message_key`): the same role; the same text once every
whitespace run is collapsed to one space and the ends are trimmed; the same tool calls, in
order, by name and arguments compared as parsed JSON (key order and spacing do not count).
Reasoning, tool-call ids, ``tool_call_id`` and participant names do not count: clients drop or
rewrite them, and the template renders them as it likes. A client that changed what an answer
says (other words, other arguments) or another conversation never matches.

The link this gives (kind ``history_rewritten``) keeps each turn's own ids: the training row of
``T`` is ``T.prompt_ids + T.completion_ids`` as sampled, and the continuing call's prompt is
what the template rendered (what the engine received). Only the next state of ``T`` comes from
the continuing call. How the re-rendered history differed from the sampled ids is recorded by
the gateway on the continuing turn (``client.history_link``, :class:`HistoryChange` values).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Any

HISTORY_LINK_FACT = "history_link"
"""The key of a turn's ``client`` facts under which the gateway records a message link: ``{"turn_id",
"changes", "next_state_at"}`` (see :mod:`clawrl.gateway.prepare`)."""


class HistoryChange(StrEnum):
    """How the prompt of a continuing call differs from the earlier turn's sampled ids."""

    REASONING_DROPPED = "reasoning_dropped"  # the sampled reasoning is not in the prompt
    WHITESPACE = "whitespace"  # the answer's text differs in whitespace only (trimmed, collapsed)
    TOOL_CALL_JSON = "tool_call_json"  # tool calls rendered again from their parsed arguments:
    # re-serialised JSON, or the template's own call format
    RENDERING = "rendering"  # the template frames the answer its own way (another end token)
    EARLIER_HISTORY = "earlier_history"  # the ids before the answer differ too (the template
    # re-rendered earlier messages, e.g. dropped their reasoning once a new question came)
    TOKENIZATION = "tokenization"  # the same text, tokenized to other ids
    UNKNOWN = "unknown"  # not recorded (a turn recorded before the gateway described links)


def _text(content: Any) -> str:
    """The text of a message's content (a string, or a list of parts with ``text``)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return str(content)


def _objects(value: Any) -> list[Mapping[str, Any]]:
    """The JSON objects of a list (``[]`` for anything else: a malformed stored row)."""
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []


def _arguments(value: Any) -> Any:
    """Tool-call arguments as parsed JSON (a string that is JSON is parsed)."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:  # not JSON: compared as the text it is
            return value
    return value


def _call(call: Mapping[str, Any]) -> list[Any]:
    """``[name, arguments]`` of a neutral ``{"name", "arguments"}`` or OpenAI-shaped call."""
    fn = call.get("function")
    source = fn if isinstance(fn, Mapping) else call
    return [source.get("name"), _arguments(source.get("arguments"))]


def message_key(message: Any) -> str:
    """What two messages must share to be equal under the module's message rule: role,
    whitespace-collapsed text, tool calls (name, parsed arguments), as canonical JSON. A stored
    message that is no JSON object (a malformed row) equals only the same value."""
    if not isinstance(message, Mapping):
        return json.dumps(["?", repr(message)])
    text = " ".join(_text(message.get("content")).split())
    calls = [_call(c) for c in _objects(message.get("tool_calls"))]
    return json.dumps(
        [message.get("role"), text, calls],
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )


def answer_message(output: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A turn's parsed ``output`` as the assistant message a client echoes, or ``None`` when
    it said nothing (no content and no tool calls: nothing to echo)."""
    if not isinstance(output, Mapping):
        return None
    calls = _objects(output.get("tool_calls"))
    if not (_text(output.get("content")).strip() or calls):
        return None
    return {"role": "assistant", "content": output.get("content"), "tool_calls": calls}


def answer_keys(
    request_messages: Sequence[Mapping[str, Any]], output: Mapping[str, Any] | None
) -> list[str] | None:
    """The keys a continuing call's first ``n + 1`` messages must have: the turn's messages,
    then its answer (``None`` when the turn has no answer to continue from)."""
    answer = answer_message(output)
    if answer is None:
        return None
    return [*(message_key(m) for m in request_messages), message_key(answer)]


def key_digests(keys: Sequence[str]) -> list[str]:
    """``out[k]``: the sha256 of ``keys[:k]`` (``k = 0 .. len(keys)``), one pass."""
    hasher = hashlib.sha256()
    out = [hasher.hexdigest()]
    for key in keys:
        hasher.update(key.encode("utf-8", "surrogatepass") + b"\x00")
        out.append(hasher.hexdigest())
    return out


def continues(
    messages: Sequence[Mapping[str, Any]],
    request_messages: Sequence[Mapping[str, Any]],
    output: Mapping[str, Any] | None,
) -> bool:
    """Whether a call with ``messages`` continues the turn that saw ``request_messages`` and
    answered ``output`` (the module's message rule)."""
    keys = answer_keys(request_messages, output)
    if keys is None or len(messages) <= len(keys):
        return False
    return all(message_key(m) == k for m, k in zip(messages, keys, strict=False))
