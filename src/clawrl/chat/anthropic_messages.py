"""Anthropic Messages request parts (system, messages, tools, tool_choice) -> neutral chat types.

Accepted, as Claude Code and the ``anthropic`` SDK send them (recorded in tests/fixtures/traffic/):

* ``system`` as a string or a list of ``text`` blocks, joined with ``"\\n"``; it becomes the first
  neutral ``system`` message. A text block starting with ``x-anthropic-billing-header:`` (Claude
  Code puts one first) is request metadata, not an instruction: it is dropped and noted
  (``dropped:billing_header``), so a per-request value in it cannot change the prompt ids.
* ``messages[i].role`` ``user``, ``assistant`` or ``system`` (Claude Code sends a ``system``
  message inside ``messages``: it stays where it is, as a neutral ``system`` message).
* ``content`` as a string or a list of blocks. Text blocks of one message are joined with
  ``"\\n"``; empty text blocks are skipped. ``cache_control`` (and any unknown key) on a block is
  ignored: it changes nothing the policy sees.
* user ``tool_result`` blocks become neutral ``tool`` messages *in block order* (text blocks
  around them become ``user`` messages), so parallel results in one user message render exactly
  like consecutive OpenAI ``tool`` messages. Their ``content`` is a string or a list of text
  blocks; ``is_error: true`` renders as ``"Error: " + content`` (the policy must see that the
  call failed). The result's ``name`` is the function name of the ``tool_use`` it answers, found
  by id, else by position among the previous assistant message's calls (ids are never rendered,
  and clients that rewrite them change nothing). A result that answers no ``tool_use`` (an orphan:
  none with its id, none left by position) is a 400, as in Anthropic's API.
* assistant ``tool_use`` blocks become tool calls (``input`` is the arguments object);
  ``thinking`` blocks become the message's reasoning (rendered like any assistant reasoning, so
  a turn's rendering stays what the policy generated); ``redacted_thinking`` blocks carry no text
  and are dropped (noted as ``dropped:redacted_thinking``); a ``signature`` is ignored.
* ``image`` and ``document`` blocks (also inside a ``tool_result``) are a 400 with code
  ``unsupported_content_type``: the policy is text-only.
* ``tools``: custom tools ``{name, description, input_schema}``; ``cache_control``,
  ``defer_loading`` (deferred tools are offered like the others: there is no tool search) and
  ``type: "custom"`` are accepted. Anthropic-defined tools (a ``type`` such as
  ``web_search_20250305`` or ``bash_20250124``) are not offered to the policy and are noted
  (``ignored_tool:TYPE``).
* ``tool_choice``: ``auto`` / ``any`` (-> required) / ``tool`` (-> function) / ``none``;
  ``disable_parallel_tool_use`` keeps only the first call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from clawrl.chat.types import ChatMessage, ToolCall, ToolChoice, ToolSpec
from clawrl.errors import ClientInputError

BILLING_HEADER_PREFIX = "x-anthropic-billing-header:"
_MEDIA_BLOCKS = ("image", "document", "file", "container_upload")
_ROLES = ("user", "assistant", "system")


@dataclass
class AnthropicConversation:
    """A Messages request in neutral form.

    Attributes:
        messages: the neutral messages (the ``system`` field first, when present).
        tools: the tools offered to the policy.
        tool_choice: the neutral tool choice.
        parallel_tool_calls: ``False`` when ``disable_parallel_tool_use`` was set.
        notes: what was dropped or ignored and why (``dropped:billing_header``, ...).
    """

    messages: list[ChatMessage]
    tools: list[ToolSpec]
    tool_choice: ToolChoice
    parallel_tool_calls: bool = True
    notes: list[str] = field(default_factory=list)


def normalize_anthropic_request(
    system: Any, messages: Any, tools: Any = None, tool_choice: Any = None
) -> AnthropicConversation:
    """Normalise the conversation fields of a ``POST /v1/messages`` body.

    Args:
        system: the ``system`` field (string, list of text blocks, or ``None``).
        messages: the ``messages`` field.
        tools: the ``tools`` field (``None`` when absent).
        tool_choice: the ``tool_choice`` field (``None`` when absent).

    Returns:
        The neutral conversation.

    Raises:
        ClientInputError: (400) a malformed field; ``param`` names it (``messages[2].content[1]``);
            media blocks have code ``unsupported_content_type``.
    """
    notes: list[str] = []
    out: list[ChatMessage] = []
    system_text = _system_text(system, notes)
    if system_text is not None:
        out.append(ChatMessage(role="system", content=system_text))
    if not isinstance(messages, list) or not messages:
        raise ClientInputError("'messages' must be a non-empty array", param="messages")
    for i, m in enumerate(messages):
        out.extend(_message(i, m, out, notes))
    specs = _tools(tools, notes)
    choice, parallel = _tool_choice(tool_choice, specs)
    return AnthropicConversation(out, specs, choice, parallel, sorted(set(notes)))


def _system_text(system: Any, notes: list[str]) -> str | None:
    if system is None:
        return None
    if isinstance(system, str):
        return system or None
    if not isinstance(system, list):
        raise ClientInputError(
            "'system' must be a string or an array of text blocks", param="system"
        )
    texts = []
    for j, block in enumerate(system):
        text = _text_block(block, f"system[{j}]")
        if text.startswith(BILLING_HEADER_PREFIX):
            notes.append("dropped:billing_header")
            continue
        if text:
            texts.append(text)
    return "\n".join(texts) or None


def _text_block(block: Any, where: str) -> str:
    kind = block.get("type") if isinstance(block, dict) else None
    if kind in _MEDIA_BLOCKS:
        _media(kind, where)
    if kind != "text":
        raise ClientInputError(f"{where}: expected a 'text' block, got {kind!r}", param=where)
    text = block.get("text")
    if not isinstance(text, str):
        raise ClientInputError(f"{where}: 'text' must be a string", param=f"{where}.text")
    return text


def _media(kind: str, where: str) -> None:
    raise ClientInputError(
        f"{where}: '{kind}' blocks are not supported; this policy is text-only",
        param=where,
        code="unsupported_content_type",
    )


def _message(i: int, m: Any, earlier: list[ChatMessage], notes: list[str]) -> list[ChatMessage]:
    where = f"messages[{i}]"
    if not isinstance(m, dict):
        raise ClientInputError(f"message {i} must be an object", param=where)
    role = m.get("role")
    if role not in _ROLES:
        raise ClientInputError(
            f"message {i} has unsupported role {role!r}; expected 'user', 'assistant' or 'system'",
            param=f"{where}.role",
        )
    content = m.get("content")
    if isinstance(content, str):
        return [ChatMessage(role=role, content=content or None)]
    if not isinstance(content, list):
        raise ClientInputError(
            f"message {i}: content must be a string or an array of blocks",
            param=f"{where}.content",
        )
    if role == "assistant":
        return [_assistant(i, content, notes)]
    if role == "system":
        texts = [_text_block(b, f"{where}.content[{j}]") for j, b in enumerate(content)]
        return [ChatMessage(role="system", content="\n".join(t for t in texts if t) or None)]
    return _user(i, content, _last_calls(earlier))


def _last_calls(earlier: list[ChatMessage]) -> list[ToolCall]:
    for m in reversed(earlier):
        if m.role == "assistant":
            return list(m.tool_calls)
        if m.role == "user":
            return []
    return []


def _user(i: int, blocks: list[Any], calls: list[ToolCall]) -> list[ChatMessage]:
    out: list[ChatMessage] = []
    texts: list[str] = []
    by_id = {c.id: c.name for c in calls if c.id}
    n_results = 0

    def flush() -> None:
        if texts:
            out.append(ChatMessage(role="user", content="\n".join(texts)))
            texts.clear()

    for j, block in enumerate(blocks):
        where = f"messages[{i}].content[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "tool_result":
            flush()
            call_id = block.get("tool_use_id")
            if not isinstance(call_id, str):
                raise ClientInputError(
                    f"{where}: tool_use_id must be a string", param=f"{where}.tool_use_id"
                )
            name = by_id.get(call_id)
            if name is None and n_results < len(calls):
                name = calls[n_results].name  # a rewritten id: matched by position
            if name is None:  # as Anthropic's API: every result answers a tool_use
                raise ClientInputError(
                    f"{where}: tool_result for tool_use_id {call_id!r}, but the previous "
                    "assistant message has no tool_use block with that id"
                    + ("" if calls else " (it has no tool_use blocks at all)"),
                    param=f"{where}.tool_use_id",
                )
            n_results += 1
            out.append(
                ChatMessage(
                    role="tool",
                    content=_tool_result_text(block, where),
                    tool_call_id=call_id,
                    name=name,
                )
            )
        elif kind == "text":
            text = _text_block(block, where)
            if text:
                texts.append(text)
        elif kind in _MEDIA_BLOCKS:
            _media(kind, where)
        else:
            raise ClientInputError(
                f"message {i}, block {j}: unsupported block type {kind!r} in a user message",
                param=where,
            )
    flush()
    return out or [ChatMessage(role="user", content=None)]


def _tool_result_text(block: dict[str, Any], where: str) -> str | None:
    content = block.get("content")
    if content is None or isinstance(content, str):
        text = content or ""
    elif isinstance(content, list):
        text = "\n".join(
            t for j, b in enumerate(content) if (t := _text_block(b, f"{where}.content[{j}]"))
        )
    else:
        raise ClientInputError(
            f"{where}: tool_result content must be a string or an array of text blocks",
            param=f"{where}.content",
        )
    if block.get("is_error") is True:
        return f"Error: {text}" if text else "Error"
    return text or None


def _assistant(i: int, blocks: list[Any], notes: list[str]) -> ChatMessage:
    texts: list[str] = []
    thinking: list[str] = []
    calls: list[ToolCall] = []
    for j, block in enumerate(blocks):
        where = f"messages[{i}].content[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            if text := _text_block(block, where):
                texts.append(text)
        elif kind == "tool_use":
            calls.append(_tool_use(block, where))
        elif kind == "thinking":
            text = block.get("thinking")
            if not isinstance(text, str):
                raise ClientInputError(
                    f"{where}: 'thinking' must be a string", param=f"{where}.thinking"
                )
            if text:
                thinking.append(text)
        elif kind == "redacted_thinking":
            notes.append("dropped:redacted_thinking")
        elif kind in _MEDIA_BLOCKS:
            _media(kind, where)
        else:
            raise ClientInputError(
                f"message {i}, block {j}: unsupported block type {kind!r} in an assistant message",
                param=where,
            )
    return ChatMessage(
        role="assistant",
        content="\n".join(texts) or None,
        reasoning="\n".join(thinking) or None,
        tool_calls=calls,
    )


def _tool_use(block: dict[str, Any], where: str) -> ToolCall:
    name = block.get("name")
    if not isinstance(name, str) or not name:
        raise ClientInputError(
            f"{where}: tool_use name must be a non-empty string", param=f"{where}.name"
        )
    call_id = block.get("id")
    if call_id is not None and not isinstance(call_id, str):
        raise ClientInputError(f"{where}: tool_use id must be a string", param=f"{where}.id")
    args = block.get("input")
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise ClientInputError(f"{where}: tool_use input must be an object", param=f"{where}.input")
    return ToolCall(id=call_id or "", name=name, arguments=args)


def _tools(raw: Any, notes: list[str]) -> list[ToolSpec]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ClientInputError("'tools' must be an array", param="tools")
    specs: list[ToolSpec] = []
    seen: set[str] = set()
    for i, tool in enumerate(raw):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise ClientInputError(f"tool {i} must be an object", param=where)
        kind = tool.get("type")
        if kind not in (None, "custom"):
            notes.append(f"ignored_tool:{kind}")
            continue
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise ClientInputError(
                f"tool {i}: name must be a non-empty string", param=f"{where}.name"
            )
        if name in seen:
            raise ClientInputError(f"tool {i}: duplicate tool name {name!r}", param=where)
        seen.add(name)
        description = tool.get("description") or ""
        if not isinstance(description, str):
            raise ClientInputError(
                f"tool {i}: description must be a string", param=f"{where}.description"
            )
        schema = tool.get("input_schema")
        if schema is None:
            schema = {"type": "object", "properties": {}}
        if not isinstance(schema, dict):
            raise ClientInputError(
                f"tool {i}: input_schema must be a JSON schema object",
                param=f"{where}.input_schema",
            )
        specs.append(ToolSpec(name=name, description=description, parameters=schema))
    return specs


def _tool_choice(raw: Any, tools: list[ToolSpec]) -> tuple[ToolChoice, bool]:
    if raw is None:
        return ToolChoice(mode="auto" if tools else "none"), True
    if not isinstance(raw, dict):
        raise ClientInputError("tool_choice must be an object", param="tool_choice")
    parallel = raw.get("disable_parallel_tool_use") is not True
    kind = raw.get("type")
    if kind == "auto":
        return ToolChoice(mode="auto" if tools else "none"), parallel
    if kind == "none":
        return ToolChoice(mode="none"), parallel
    if kind in ("any", "tool") and not tools:
        raise ClientInputError(
            f"tool_choice {kind!r} requires the request to specify tools", param="tool_choice"
        )
    if kind == "any":
        return ToolChoice(mode="required"), parallel
    if kind == "tool":
        name = raw.get("name")
        if name not in {t.name for t in tools}:
            raise ClientInputError(
                f"tool_choice names tool {name!r}, which is not in tools",
                param="tool_choice.name",
            )
        return ToolChoice(mode="function", name=name), parallel
    raise ClientInputError(
        f"tool_choice type must be 'auto', 'any', 'tool' or 'none', not {kind!r}",
        param="tool_choice.type",
    )
