"""OpenAI Responses request parts (instructions, input items, tools, tool_choice) -> neutral types.

Accepted, as Codex and the ``openai`` SDK send them (recorded in tests/fixtures/traffic/):

* ``instructions`` (a string) becomes the first neutral ``system`` message.
* ``input`` as a string (one user message) or a list of items:

  - messages ``{"type": "message"?, "role", "content"}`` with roles ``system``/``developer``
    (-> ``system``), ``user`` and ``assistant``; ``content`` a string or a list of
    ``input_text`` / ``output_text`` / ``text`` / ``refusal`` parts joined with ``"\\n"``;
    ``input_image`` / ``input_file`` / ``input_audio`` parts are a 400 with code
    ``unsupported_content_type`` (the policy is text-only);
  - ``reasoning`` items: their readable text (``content`` ``reasoning_text`` parts, else the
    ``summary`` texts) becomes the reasoning of the assistant turn they belong to;
    ``encrypted_content`` is ignored (noted as ``ignored:encrypted_reasoning``);
  - ``function_call`` items (``call_id``, ``name``, ``arguments`` as a JSON string; an optional
    ``namespace``) and ``custom_tool_call`` items (``input`` string -> arguments
    ``{"input": ...}``) become tool calls;
  - ``function_call_output`` / ``custom_tool_call_output`` items (``output`` a string or a list
    of text parts) become neutral ``tool`` messages.

  Consecutive assistant-side items (assistant messages, reasoning, calls) form ONE neutral
  assistant message, so a response the gateway gave (reasoning, text, then calls) comes back as
  the message the policy generated. A tool output's ``name`` is the name of the call with the
  same ``call_id``, else of the call at the same position in the previous assistant turn (ids
  are never rendered; clients that rewrite them change nothing).
* ``tools``: ``function`` tools (flat ``{"type": "function", "name", "parameters"}``);
  ``namespace`` tools ``{"type": "namespace", "name": NS, "tools": [function...]}`` are flattened
  into their functions (a call to one is answered with ``namespace: NS``); ``custom`` tools (a
  free-form string input) are offered as a function with one string parameter ``input``;
  built-in tools (``web_search``, ``file_search``, ``code_interpreter``, ``local_shell``, ...)
  are not offered to the policy and are noted (``ignored_tool:TYPE``).
* ``tool_choice``: ``auto`` / ``none`` / ``required`` / ``{"type": "function", "name"}``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from clawrl.chat.openai_messages import parse_arguments
from clawrl.chat.types import ChatMessage, Role, ToolCall, ToolChoice, ToolSpec
from clawrl.errors import ClientInputError

_TEXT_PARTS = ("input_text", "output_text", "text", "summary_text", "reasoning_text")
_MEDIA_PARTS = ("input_image", "input_file", "input_audio", "image_url", "image")
_ROLES: dict[str, Role] = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
}
_ASSISTANT_ITEMS = ("reasoning", "function_call", "custom_tool_call")
_OUTPUT_ITEMS = ("function_call_output", "custom_tool_call_output")
CUSTOM_INPUT = "input"
"""The one argument of a ``custom`` (free-form) tool offered as a function."""


@dataclass(frozen=True)
class ToolOrigin:
    """How a tool the policy sees maps back to the client's declaration.

    Attributes:
        kind: ``function`` or ``custom``.
        namespace: the ``namespace`` tool it came from, if any.
    """

    kind: str = "function"
    namespace: str | None = None


@dataclass
class ResponsesConversation:
    """A Responses request in neutral form.

    Attributes:
        messages: the neutral messages (``instructions`` first, when present).
        tools: the tools offered to the policy (namespaces flattened).
        tool_choice: the neutral tool choice.
        origins: tool name -> :class:`ToolOrigin` (how to answer a call to it).
        notes: what was ignored (``ignored_tool:web_search``, ...).
    """

    messages: list[ChatMessage]
    tools: list[ToolSpec]
    tool_choice: ToolChoice
    origins: dict[str, ToolOrigin] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def normalize_responses_request(
    instructions: Any, input_: Any, tools: Any = None, tool_choice: Any = None
) -> ResponsesConversation:
    """Normalise the conversation fields of a ``POST /v1/responses`` body.

    Raises:
        ClientInputError: (400) a malformed field; ``param`` names it (``input[3].output``);
            media parts have code ``unsupported_content_type``.
    """
    notes: list[str] = []
    messages: list[ChatMessage] = []
    if instructions is not None:
        if not isinstance(instructions, str):
            raise ClientInputError("'instructions' must be a string", param="instructions")
        if instructions:
            messages.append(ChatMessage(role="system", content=instructions))
    messages.extend(_items(input_, notes))
    if not messages:
        raise ClientInputError("'input' must not be empty", param="input")
    specs, origins = _tools(tools, notes)
    choice = _tool_choice(tool_choice, specs)
    return ResponsesConversation(messages, specs, choice, origins, sorted(set(notes)))


def _items(raw: Any, notes: list[str]) -> list[ChatMessage]:
    if isinstance(raw, str):
        return [ChatMessage(role="user", content=raw or None)]
    if not isinstance(raw, list):
        raise ClientInputError("'input' must be a string or an array of items", param="input")
    out: list[ChatMessage] = []
    turn: _AssistantTurn | None = None
    for i, item in enumerate(raw):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise ClientInputError(f"input item {i} must be an object", param=where)
        kind = item.get("type", "message")
        is_assistant = kind in _ASSISTANT_ITEMS or (
            kind == "message" and item.get("role") == "assistant"
        )
        if is_assistant:
            turn = turn or _AssistantTurn()
            turn.add(i, item, notes)
            continue
        if turn is not None:
            out.append(turn.message())
            turn = None
        if kind == "message":
            out.append(_message(i, item))
        elif kind in _OUTPUT_ITEMS:
            out.append(_output(i, item, out))
        else:
            raise ClientInputError(
                f"input item {i}: unsupported item type {kind!r}", param=f"{where}.type"
            )
    if turn is not None:
        out.append(turn.message())
    return out


class _AssistantTurn:
    """Accumulates consecutive assistant-side items into one neutral message."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.reasoning: list[str] = []
        self.calls: list[ToolCall] = []

    def add(self, i: int, item: dict[str, Any], notes: list[str]) -> None:
        kind = item.get("type", "message")
        where = f"input[{i}]"
        if kind == "message":
            if text := _content(i, item.get("content")):
                self.texts.append(text)
        elif kind == "reasoning":
            if item.get("encrypted_content"):
                notes.append("ignored:encrypted_reasoning")
            parts = item.get("content") or item.get("summary") or []
            if not isinstance(parts, list):
                raise ClientInputError(
                    f"input item {i}: reasoning content must be an array", param=where
                )
            if text := "\n".join(_part(i, j, p) for j, p in enumerate(parts)):
                self.reasoning.append(text)
        elif kind == "function_call":
            name = _name(i, item)
            args = parse_arguments(
                item.get("arguments"), param=f"{where}.arguments", where=f"input item {i}"
            )
            self.calls.append(ToolCall(id=_call_id(i, item), name=name, arguments=args))
        else:  # custom_tool_call
            text = item.get("input")
            if not isinstance(text, str):
                raise ClientInputError(
                    f"input item {i}: 'input' must be a string", param=f"{where}.input"
                )
            self.calls.append(
                ToolCall(id=_call_id(i, item), name=_name(i, item), arguments={CUSTOM_INPUT: text})
            )

    def message(self) -> ChatMessage:
        return ChatMessage(
            role="assistant",
            content="\n".join(self.texts) or None,
            reasoning="\n".join(self.reasoning) or None,
            tool_calls=self.calls,
        )


def _name(i: int, item: dict[str, Any]) -> str:
    name = item.get("name")
    if not isinstance(name, str) or not name:
        raise ClientInputError(
            f"input item {i}: 'name' must be a non-empty string", param=f"input[{i}].name"
        )
    return name


def _call_id(i: int, item: dict[str, Any]) -> str:
    call_id = item.get("call_id", item.get("id"))
    if call_id is not None and not isinstance(call_id, str):
        raise ClientInputError(
            f"input item {i}: 'call_id' must be a string", param=f"input[{i}].call_id"
        )
    return call_id or ""


def _message(i: int, item: dict[str, Any]) -> ChatMessage:
    raw_role = item.get("role")
    role = _ROLES.get(raw_role) if isinstance(raw_role, str) else None
    if role is None:
        raise ClientInputError(
            f"input item {i}: unsupported role {item.get('role')!r}; expected 'system', "
            "'developer', 'user' or 'assistant'",
            param=f"input[{i}].role",
        )
    return ChatMessage(role=role, content=_content(i, item.get("content")))


def _content(i: int, content: Any) -> str | None:
    if content is None or isinstance(content, str):
        return content or None
    if not isinstance(content, list):
        raise ClientInputError(
            f"input item {i}: content must be a string or an array of parts",
            param=f"input[{i}].content",
        )
    return "\n".join(t for j, p in enumerate(content) if (t := _part(i, j, p))) or None


def _part(i: int, j: int, part: Any) -> str:
    where = f"input[{i}].content[{j}]"
    kind = part.get("type") if isinstance(part, dict) else None
    if kind in _MEDIA_PARTS:
        raise ClientInputError(
            f"input item {i}, part {j}: '{kind}' parts are not supported; this policy is text-only",
            param=where,
            code="unsupported_content_type",
        )
    if kind == "refusal" and isinstance(part, dict):
        text = part.get("refusal")
    elif kind in _TEXT_PARTS and isinstance(part, dict):
        text = part.get("text")
    else:
        raise ClientInputError(
            f"input item {i}, part {j}: unsupported part type {kind!r}", param=where
        )
    if not isinstance(text, str):
        raise ClientInputError(
            f"input item {i}, part {j}: text must be a string", param=f"{where}.text"
        )
    return text


def _answered_turn(out: list[ChatMessage]) -> tuple[list[ToolCall], int]:
    """The calls of the assistant turn that tool outputs now answer, and how many outputs
    already follow it."""
    for answered, m in enumerate(reversed(out)):
        if m.role == "assistant":
            return list(m.tool_calls), answered
        if m.role != "tool":
            break
    return [], 0


def _output(i: int, item: dict[str, Any], out: list[ChatMessage]) -> ChatMessage:
    call_id = _call_id(i, item)
    output = item.get("output")
    if output is None or isinstance(output, str):
        text = output or None
    elif isinstance(output, list):
        text = "\n".join(t for j, p in enumerate(output) if (t := _part(i, j, p))) or None
    else:
        raise ClientInputError(
            f"input item {i}: 'output' must be a string or an array of parts",
            param=f"input[{i}].output",
        )
    calls, answered = _answered_turn(out)
    name = {c.id: c.name for c in calls if c.id}.get(call_id)
    if name is None and answered < len(calls):
        name = calls[answered].name
    return ChatMessage(role="tool", content=text, tool_call_id=call_id, name=name)


def _function(i: int, tool: dict[str, Any], where: str) -> ToolSpec:
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise ClientInputError(f"tool {i}: name must be a non-empty string", param=f"{where}.name")
    description = tool.get("description") or ""
    if not isinstance(description, str):
        raise ClientInputError(
            f"tool {i}: description must be a string", param=f"{where}.description"
        )
    parameters = tool.get("parameters")
    if parameters is None:
        parameters = {"type": "object", "properties": {}}
    if not isinstance(parameters, dict):
        raise ClientInputError(
            f"tool {i}: parameters must be a JSON schema object", param=f"{where}.parameters"
        )
    return ToolSpec(name=name, description=description, parameters=parameters)


def _custom(i: int, tool: dict[str, Any], where: str) -> ToolSpec:
    base = _function(i, {**tool, "parameters": None}, where)
    schema = {
        "type": "object",
        "properties": {CUSTOM_INPUT: {"type": "string", "description": "The free-form input."}},
        "required": [CUSTOM_INPUT],
    }
    return base.model_copy(update={"parameters": schema})


def _tools(raw: Any, notes: list[str]) -> tuple[list[ToolSpec], dict[str, ToolOrigin]]:
    if raw is None:
        return [], {}
    if not isinstance(raw, list):
        raise ClientInputError("'tools' must be an array", param="tools")
    specs: list[ToolSpec] = []
    origins: dict[str, ToolOrigin] = {}

    def add(spec: ToolSpec, origin: ToolOrigin, where: str) -> None:
        if spec.name in origins:
            raise ClientInputError(f"duplicate tool name {spec.name!r}", param=where)
        specs.append(spec)
        origins[spec.name] = origin

    for i, tool in enumerate(raw):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise ClientInputError(f"tool {i} must be an object", param=where)
        kind = tool.get("type")
        if kind == "function":
            add(_function(i, tool, where), ToolOrigin(), where)
        elif kind == "custom":
            add(_custom(i, tool, where), ToolOrigin(kind="custom"), where)
        elif kind == "namespace":
            ns = tool.get("name")
            inner = tool.get("tools")
            if not isinstance(ns, str) or not isinstance(inner, list):
                raise ClientInputError(
                    f"tool {i}: a namespace needs a 'name' and a 'tools' array", param=where
                )
            for j, sub in enumerate(inner):
                sub_where = f"{where}.tools[{j}]"
                if not isinstance(sub, dict) or sub.get("type", "function") != "function":
                    notes.append(f"ignored_tool:{ns}/{(sub or {}).get('type')}")
                    continue
                add(_function(j, sub, sub_where), ToolOrigin(namespace=ns), sub_where)
        else:
            notes.append(f"ignored_tool:{kind}")
    return specs, origins


def _tool_choice(raw: Any, tools: list[ToolSpec]) -> ToolChoice:
    if raw is None or raw == "auto":
        return ToolChoice(mode="auto" if tools else "none")
    if raw == "none":
        return ToolChoice(mode="none")
    if raw == "required" or (isinstance(raw, dict) and raw.get("type") == "function"):
        if not tools:
            raise ClientInputError(
                "tool_choice requires the request to specify tools", param="tool_choice"
            )
        if raw == "required":
            return ToolChoice(mode="required")
        name = raw.get("name")  # type: ignore[union-attr]
        if name not in {t.name for t in tools}:
            raise ClientInputError(
                f"tool_choice names function {name!r}, which is not in tools",
                param="tool_choice.name",
            )
        return ToolChoice(mode="function", name=name)
    if isinstance(raw, dict) and raw.get("type") in ("allowed_tools", "web_search", "custom"):
        return ToolChoice(mode="auto" if tools else "none")
    raise ClientInputError(
        f"tool_choice must be 'auto', 'none', 'required' or a function choice, not {raw!r}",
        param="tool_choice",
    )
