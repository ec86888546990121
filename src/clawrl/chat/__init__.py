"""Chat protocols <-> tokens: neutral types, OpenAI message normalisation, rendering, parsing.

Flow: a client request is normalised to neutral :class:`ChatMessage`/:class:`ToolSpec`/
:class:`ToolChoice` (:mod:`~clawrl.chat.openai_messages` for chat completions), rendered to token
ids with the policy's chat template (:func:`render_prompt`), and the engine's completion text is
parsed back into content, reasoning and tool calls (:func:`parse_completion`,
:class:`StreamingParser`). This package never imports the engine.

**Tool format when the chat template has no tool support** (SmolLM2's plain ChatML; Hermes/Qwen
convention):

* the tools, one OpenAI-format JSON object per line inside ``<tools>…</tools>``, plus an
  instruction to answer with ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, are
  appended to the first system message (a system message is created when there is none, starting
  with the template's default system prompt, e.g. SmolLM2's "You are a helpful AI assistant named
  SmolLM, trained by Hugging Face");
* an assistant tool call renders as exactly
  ``<tool_call>{"name": NAME, "arguments": ARGS}</tool_call>`` (no whitespace inside the tags),
  the JSON by ``json.dumps(..., ensure_ascii=False)`` with the client's key order, so arguments
  sent as a string or an object give identical ids; the parts of an assistant turn (reasoning
  block, content, calls) are joined by ``"\\n"`` (:func:`assistant_message_text`);
* consecutive tool results render as ONE ``user`` turn of
  ``<tool_response>\\nRESULT\\n</tool_response>`` blocks joined by ``"\\n"``;
* ids of calls and results are never rendered;
* ``tool_choice="none"`` offers no tools; ``required`` / a named function add an instruction line
  (enforced only by that instruction and the gateway's parse: no constrained decoding).

Templates whose source mentions ``tools`` get the tools, calls and results natively instead
(with canonical call ids, :func:`canonical_call_id`).

**The model's own format when parsing** (:mod:`~clawrl.chat.formats`): the tool-call format is
read off the template (:func:`detect_tool_call_format`: ``hermes`` ``<tool_call>{...}
</tool_call>``, ``llama3_json`` ``{"name": ..., "parameters": {...}}``, ``mistral``
``[TOOL_CALLS]...``; the fallback format is ``hermes``), and completions are cut at the
template's end-of-turn markers (:func:`template_stop_markers`); :func:`completion_format` gives
both for a tokenizer.

**Reasoning rule.** Assistant reasoning in the history is kept, rendered as
``<think>\\nREASONING\\n</think>`` before the content of its message (both paths), so a turn's
rendering is what the policy generated and earlier prompts stay prefixes of later ones. When
parsing, a leading ``<think>…</think>`` is the reasoning; an unclosed ``<think>`` makes the rest
reasoning. Clients that do not echo reasoning back get a history without it (the gateway's
matching against recorded completions handles that).

**Arguments.** Tool-call arguments ``""`` (or whitespace, ``null``, missing) normalise to ``{}``;
a JSON list, bare string or number, or broken JSON is a 400 naming
``messages[i].tool_calls[j].function.arguments``.
"""

from clawrl.chat.formats import (
    TOOL_CALL_FORMATS,
    CompletionFormat,
    ToolCallFormat,
    completion_format,
    control_ids,
    detect_tool_call_format,
    end_of_turn_ids,
    template_stop_markers,
)
from clawrl.chat.openai_messages import (
    normalize_openai_messages,
    normalize_openai_tools,
    normalize_tool_choice,
    parse_arguments,
)
from clawrl.chat.parse import (
    DEFAULT_STOP_MARKERS,
    ContentDelta,
    ParsedCompletion,
    ReasoningDelta,
    StreamEvent,
    StreamingParser,
    ToolCallEvent,
    new_tool_call_id,
    parse_completion,
)
from clawrl.chat.render import (
    RenderedPrompt,
    canonical_call_id,
    render_prompt,
    supports_native_tools,
)
from clawrl.chat.tool_format import assistant_message_text, tool_call_text
from clawrl.chat.types import ChatMessage, Role, ToolCall, ToolChoice, ToolSpec

__all__ = [
    "DEFAULT_STOP_MARKERS",
    "TOOL_CALL_FORMATS",
    "ChatMessage",
    "CompletionFormat",
    "ContentDelta",
    "ParsedCompletion",
    "ReasoningDelta",
    "RenderedPrompt",
    "Role",
    "StreamEvent",
    "StreamingParser",
    "ToolCall",
    "ToolCallEvent",
    "ToolCallFormat",
    "ToolChoice",
    "ToolSpec",
    "assistant_message_text",
    "canonical_call_id",
    "completion_format",
    "control_ids",
    "detect_tool_call_format",
    "end_of_turn_ids",
    "new_tool_call_id",
    "normalize_openai_messages",
    "normalize_openai_tools",
    "normalize_tool_choice",
    "parse_arguments",
    "parse_completion",
    "render_prompt",
    "supports_native_tools",
    "template_stop_markers",
    "tool_call_text",
]
