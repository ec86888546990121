"""The text format clawrl uses for tools, tool calls, tool results and reasoning.

Used where the policy's chat template has no tool support (e.g. SmolLM2's plain ChatML). It is
the Hermes/Qwen convention, which many open models were trained on:

* tools are listed in the system message, one OpenAI-format JSON object per line inside
  ``<tools>…</tools>``, with an instruction to answer with
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``;
* an assistant tool call is rendered as exactly
  ``<tool_call>{"name": NAME, "arguments": ARGS}</tool_call>`` with the JSON written by
  ``json.dumps(..., ensure_ascii=False)`` (keys in the client's order), so arguments sent as a
  JSON string or as an object give identical text;
* assistant reasoning is rendered as ``<think>\\nREASONING\\n</think>`` before the content (in
  every assistant message of the history, so a turn's rendering is what the policy generated);
* tool results are rendered as one ``user`` turn holding each result as
  ``<tool_response>\\nRESULT\\n</tool_response>``, consecutive results joined by ``"\\n"``.

Tool-call and tool-result ids are never rendered.
"""

from __future__ import annotations

import json

from clawrl.chat.types import ChatMessage, ToolCall, ToolChoice, ToolSpec

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
TOOL_RESPONSE_OPEN = "<tool_response>"
TOOL_RESPONSE_CLOSE = "</tool_response>"

_TOOLS_HEADER = (
    "# Tools\n\n"
    "You may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
)
_TOOLS_FOOTER = (
    "\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n"
    '<tool_call>{"name": <function-name>, "arguments": <args-json-object>}</tool_call>'
)


def tool_call_text(call: ToolCall) -> str:
    """Return ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` for one call.

    Args:
        call: the tool call (its id is not rendered).

    Returns:
        The canonical text of the call, JSON by ``json.dumps(..., ensure_ascii=False)``.
    """
    body = json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)
    return f"{TOOL_CALL_OPEN}{body}{TOOL_CALL_CLOSE}"


def reasoning_text(reasoning: str) -> str:
    """Return the rendering of assistant reasoning: ``<think>\\nREASONING\\n</think>``."""
    return f"{THINK_OPEN}\n{reasoning}\n{THINK_CLOSE}"


def assistant_message_text(msg: ChatMessage) -> str:
    """Return the exact text an assistant message renders to inside its turn (fallback format).

    The parts present, in this order, joined by ``"\\n"``: the reasoning block
    (:func:`reasoning_text`), the content, then one :func:`tool_call_text` per call. Empty or
    ``None`` reasoning/content contribute nothing. The template adds the turn framing around it
    (for ChatML ``<|im_start|>assistant\\n`` … ``<|im_end|>\\n``).

    Args:
        msg: an assistant message.

    Returns:
        The turn's text; ``""`` for an assistant message with nothing in it.

    Raises:
        ValueError: ``msg`` is not an assistant message.
    """
    if msg.role != "assistant":
        raise ValueError(f"assistant_message_text needs an assistant message, not {msg.role}")
    parts = []
    if msg.reasoning:
        parts.append(reasoning_text(msg.reasoning))
    if msg.content:
        parts.append(msg.content)
    parts.extend(tool_call_text(call) for call in msg.tool_calls)
    return "\n".join(parts)


def tool_results_text(results: list[ChatMessage]) -> str:
    """Return the content of the ``user`` turn that carries consecutive tool results.

    Args:
        results: one or more ``tool`` messages, in order.

    Returns:
        ``<tool_response>\\nRESULT\\n</tool_response>`` per result, joined by ``"\\n"``.
    """
    return "\n".join(
        f"{TOOL_RESPONSE_OPEN}\n{m.content or ''}\n{TOOL_RESPONSE_CLOSE}" for m in results
    )


def tools_system_text(tools: list[ToolSpec]) -> str:
    """Return the tool section appended to the system message in the fallback format.

    Args:
        tools: the tools offered to the policy (non-empty).

    Returns:
        The ``# Tools`` section: the ``<tools>`` list and the ``<tool_call>`` instruction.
    """
    lines = "\n".join(json.dumps(t.openai_format(), ensure_ascii=False) for t in tools)
    return f"{_TOOLS_HEADER}{lines}{_TOOLS_FOOTER}"


def tool_choice_text(choice: ToolChoice) -> str | None:
    """Return the instruction line for ``required``/named tool choices, else ``None``.

    Enforcement is by this instruction plus the gateway's parse of the completion: constrained
    decoding is not implemented, so the policy may still answer without the call.
    """
    if choice.mode == "required":
        return "You must call at least one function in this turn."
    if choice.mode == "function":
        return f'You must call the function "{choice.name}" in this turn.'
    return None
