"""OpenAI chat-completions request parts (messages, tools, tool_choice) -> neutral chat types.

Accepted, as real harnesses send them (recorded in tests/fixtures/traffic/):

* ``content`` as a string, ``null``, missing, or a list of text parts
  (``{"type": "text", "text": ...}``; text parts are joined with ``"\\n"``). No text at all
  (``null``, missing, ``""``, ``[]``) normalises to ``content=None``. Image, audio and file parts
  are refused with a 400 naming the message and part index: the policy is text-only.
* role ``developer`` is treated as ``system``; any role other than
  ``system``/``developer``/``user``/``assistant``/``tool`` is a 400.
* assistant ``tool_calls`` as ``[]``, ``null`` or missing all give ``tool_calls=[]``.
* tool-call ``arguments`` as a JSON string of an object or as an already-parsed object give the
  same :class:`ToolCall`. ``""`` (or only whitespace), ``null`` and a missing ``arguments`` are
  normalised to ``{}`` (what a function without parameters means). A JSON list, a bare JSON
  string or number, or text that is not JSON is a 400 with ``param`` such as
  ``messages[3].tool_calls[0].function.arguments``.
* assistant ``reasoning_content`` (or ``reasoning``) strings become ``ChatMessage.reasoning``.
* unknown keys (``cache_control``, ``refusal``, ``annotations`` …) are ignored.
"""

from __future__ import annotations

import json
from typing import Any

from clawrl.chat.types import ChatMessage, Role, ToolCall, ToolChoice, ToolSpec
from clawrl.errors import ClientInputError

_ROLES: dict[str, Role] = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
}
_TEXT_PART_TYPES = ("text", "input_text", "output_text", "refusal")
_MEDIA_PART_TYPES = ("image_url", "input_image", "image", "input_audio", "file", "input_file")


def normalize_openai_messages(raw: Any) -> list[ChatMessage]:
    """Normalise the ``messages`` of a chat-completions request.

    Args:
        raw: the decoded JSON value of ``messages``.

    Returns:
        One :class:`ChatMessage` per input message, in order.

    Raises:
        ClientInputError: (400) ``messages`` is not a non-empty list of objects, a role is
            unknown, content has a non-text part, a tool call is malformed, or its arguments are
            not a JSON object. ``param`` names the offending field and the message says which
            message index it is.
    """
    if not isinstance(raw, list) or not raw:
        raise ClientInputError("'messages' must be a non-empty array", param="messages")
    return [_message(i, m) for i, m in enumerate(raw)]


def _message(i: int, m: Any) -> ChatMessage:
    where = f"messages[{i}]"
    if not isinstance(m, dict):
        raise ClientInputError(f"message {i} must be an object", param=where)
    raw_role = m.get("role")
    role = _ROLES.get(raw_role) if isinstance(raw_role, str) else None
    if role is None:
        raise ClientInputError(
            f"message {i} has unsupported role {raw_role!r}; expected one of "
            "'system', 'developer', 'user', 'assistant', 'tool'",
            param=f"{where}.role",
        )
    content = _content(i, m.get("content"))
    name = _optional_str(i, m, "name")
    if role == "assistant":
        return ChatMessage(
            role="assistant",
            content=content,
            reasoning=_reasoning(i, m),
            tool_calls=_tool_calls(i, m.get("tool_calls")),
            name=name,
        )
    if m.get("tool_calls"):
        raise ClientInputError(
            f"message {i}: only assistant messages may have tool_calls", param=f"{where}.tool_calls"
        )
    tool_call_id = _optional_str(i, m, "tool_call_id") if role == "tool" else None
    return ChatMessage(role=role, content=content, tool_call_id=tool_call_id, name=name)


def _optional_str(i: int, m: dict[str, Any], key: str) -> str | None:
    value = m.get(key)
    if value is not None and not isinstance(value, str):
        raise ClientInputError(
            f"message {i}: '{key}' must be a string", param=f"messages[{i}].{key}"
        )
    return value


def _content(i: int, content: Any) -> str | None:
    if content is None:
        return None
    if isinstance(content, str):
        return content or None
    if not isinstance(content, list):
        raise ClientInputError(
            f"message {i}: content must be a string, null or an array of text parts",
            param=f"messages[{i}].content",
        )
    texts = [_text_part(i, j, part) for j, part in enumerate(content)]
    return "\n".join(texts) or None


def _text_part(i: int, j: int, part: Any) -> str:
    where = f"messages[{i}].content[{j}]"
    kind = part.get("type") if isinstance(part, dict) else None
    if kind in _MEDIA_PART_TYPES:
        raise ClientInputError(
            f"message {i}, content part {j}: '{kind}' parts are not supported; "
            "this policy is text-only",
            param=where,
            code="unsupported_content_type",
        )
    if kind not in _TEXT_PART_TYPES or not isinstance(part, dict):
        raise ClientInputError(
            f"message {i}, content part {j}: unsupported part type {kind!r} (expected 'text')",
            param=where,
        )
    text = part.get(kind if kind == "refusal" else "text")
    if not isinstance(text, str):
        raise ClientInputError(
            f"message {i}, content part {j}: text must be a string", param=f"{where}.text"
        )
    return text


def _reasoning(i: int, m: dict[str, Any]) -> str | None:
    for key in ("reasoning_content", "reasoning"):
        value = m.get(key)
        if value is None:
            continue
        if not isinstance(value, str):
            raise ClientInputError(
                f"message {i}: '{key}' must be a string", param=f"messages[{i}].{key}"
            )
        return value or None
    return None


def _tool_calls(i: int, raw: Any) -> list[ToolCall]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ClientInputError(
            f"message {i}: tool_calls must be an array", param=f"messages[{i}].tool_calls"
        )
    return [_tool_call(i, j, call) for j, call in enumerate(raw)]


def _tool_call(i: int, j: int, call: Any) -> ToolCall:
    where = f"messages[{i}].tool_calls[{j}]"
    if not isinstance(call, dict):
        raise ClientInputError(f"message {i}, tool call {j} must be an object", param=where)
    kind = call.get("type", "function")
    if kind != "function":
        raise ClientInputError(
            f"message {i}, tool call {j}: unsupported type {kind!r} (expected 'function')",
            param=f"{where}.type",
        )
    fn = call.get("function")
    if not isinstance(fn, dict):
        raise ClientInputError(
            f"message {i}, tool call {j}: 'function' must be an object", param=f"{where}.function"
        )
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        raise ClientInputError(
            f"message {i}, tool call {j}: function.name must be a non-empty string",
            param=f"{where}.function.name",
        )
    call_id = call.get("id")
    if call_id is not None and not isinstance(call_id, str):
        raise ClientInputError(
            f"message {i}, tool call {j}: id must be a string", param=f"{where}.id"
        )
    arguments = parse_arguments(
        fn.get("arguments"), param=f"{where}.function.arguments", where=f"message {i}"
    )
    return ToolCall(id=call_id or "", name=name, arguments=arguments)


def parse_arguments(raw: Any, *, param: str, where: str) -> dict[str, Any]:
    """Turn tool-call arguments (a JSON string or an object) into a dict.

    Args:
        raw: the ``arguments`` value as the client sent it.
        param: the request field to name in an error.
        where: a human description of the location for the message (``"message 3"``).

    Returns:
        The arguments object. ``None``, ``""`` and whitespace-only strings give ``{}``.

    Raises:
        ClientInputError: (400) the value is not an object nor a JSON string of an object.
    """
    if raw is None:
        return {}
    if isinstance(raw, dict):
        return raw
    if not isinstance(raw, str):
        raise ClientInputError(
            f"{where}: tool call arguments must be a JSON object or a string holding one, "
            f"not {type(raw).__name__}",
            param=param,
        )
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise ClientInputError(
            f"{where}: tool call arguments are not valid JSON ({e})", param=param
        ) from e
    if not isinstance(value, dict):
        raise ClientInputError(
            f"{where}: tool call arguments must be a JSON object, not {type(value).__name__}",
            param=param,
        )
    return value


def normalize_openai_tools(raw: Any) -> list[ToolSpec]:
    """Normalise the ``tools`` of a chat-completions request.

    Accepts ``{"type": "function", "function": {"name", "description", "parameters"}}`` and the
    flat form ``{"type": "function", "name": ..., "parameters": ...}``.

    Args:
        raw: the decoded JSON value of ``tools`` (``None`` when absent).

    Returns:
        The tools, in order; ``[]`` for ``None``.

    Raises:
        ClientInputError: (400) not a list, a tool of another type, a missing/empty or
            duplicated name, or parameters that are not an object.
    """
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ClientInputError("'tools' must be an array", param="tools")
    specs = [_tool_spec(i, t) for i, t in enumerate(raw)]
    seen: set[str] = set()
    for i, spec in enumerate(specs):
        if spec.name in seen:
            raise ClientInputError(
                f"tool {i}: duplicate function name {spec.name!r}", param=f"tools[{i}]"
            )
        seen.add(spec.name)
    return specs


def _tool_spec(i: int, tool: Any) -> ToolSpec:
    where = f"tools[{i}]"
    if not isinstance(tool, dict):
        raise ClientInputError(f"tool {i} must be an object", param=where)
    kind = tool.get("type", "function")
    if kind != "function":
        raise ClientInputError(
            f"tool {i}: unsupported tool type {kind!r} (expected 'function')", param=f"{where}.type"
        )
    fn = tool.get("function", tool)
    if not isinstance(fn, dict):
        raise ClientInputError(f"tool {i}: 'function' must be an object", param=f"{where}.function")
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        raise ClientInputError(
            f"tool {i}: function name must be a non-empty string", param=f"{where}.function.name"
        )
    description = fn.get("description")
    if description is not None and not isinstance(description, str):
        raise ClientInputError(
            f"tool {i}: description must be a string", param=f"{where}.function.description"
        )
    parameters = fn.get("parameters")
    if parameters is None:
        return ToolSpec(name=name, description=description or "")
    if not isinstance(parameters, dict):
        raise ClientInputError(
            f"tool {i}: parameters must be a JSON schema object",
            param=f"{where}.function.parameters",
        )
    return ToolSpec(name=name, description=description or "", parameters=parameters)


def normalize_tool_choice(raw: Any, tools: list[ToolSpec] | None = None) -> ToolChoice:
    """Normalise ``tool_choice`` and check it against the request's tools.

    Args:
        raw: ``None`` (absent), ``"auto"``, ``"none"``, ``"required"``, or
            ``{"type": "function", "function": {"name": NAME}}`` (the flat
            ``{"type": "function", "name": NAME}`` is accepted too).
        tools: the request's normalised tools; ``None`` or ``[]`` when it has none.

    Returns:
        The choice. Absent means ``auto`` when there are tools and ``none`` otherwise (OpenAI's
        default).

    Raises:
        ClientInputError: (400) an unknown value, ``required``/a named function without tools,
            or a named function that is not among ``tools``.
    """
    tools = tools or []
    if raw is None:
        return ToolChoice(mode="auto" if tools else "none")
    if raw in ("auto", "none", "required"):
        choice = ToolChoice(mode=raw)
    elif isinstance(raw, dict) and raw.get("type") == "function":
        fn = raw.get("function", raw)
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str) or not name:
            raise ClientInputError(
                "tool_choice: function.name must be a non-empty string",
                param="tool_choice.function.name",
            )
        choice = ToolChoice(mode="function", name=name)
    else:
        raise ClientInputError(
            f"tool_choice must be 'auto', 'none', 'required' or a function choice, not {raw!r}",
            param="tool_choice",
        )
    if choice.mode in ("required", "function") and not tools:
        raise ClientInputError(
            "tool_choice requires the request to specify tools", param="tool_choice"
        )
    if choice.mode == "function" and choice.name not in {t.name for t in tools}:
        raise ClientInputError(
            f"tool_choice names function {choice.name!r}, which is not in tools",
            param="tool_choice.function.name",
        )
    return choice
