"""What a policy's completions look like, read off its tokenizer's chat template.

Two things the parser needs to know about the model it parses (:mod:`clawrl.chat.parse`):

* **The tool-call format** (:func:`detect_tool_call_format`, from the template's source, first
  rule that applies):

  1. the template does not mention ``tools`` (no native tool support): ``"hermes"``, the format
     of clawrl's own fallback text format (:mod:`clawrl.chat.tool_format`);
  2. it mentions ``[TOOL_CALLS]``: ``"mistral"``
     (``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`` or ``[TOOL_CALLS]name[ARGS]{...}``);
  3. it mentions ``<tool_call>``: ``"hermes"`` (Hermes / Qwen
     ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``);
  4. it mentions ``<|python_tag|>``, the ``ipython`` role or Llama's instruction
     ``{"name": function name, "parameters": ...}`` (Llama 3.1 / 3.2): ``"llama3_json"`` (the completion is a JSON object
     ``{"name": ..., "parameters": {...}}``, or several separated by ``;``);
  5. anything else (a native format clawrl does not parse, e.g. gpt-oss's harmony channels):
     ``"hermes"``; such calls stay content.

* **The stop markers** (:func:`template_stop_markers`): the texts that end an assistant turn,
  where a completion is cut when the engine leaves one in its text. They are the special tokens
  the template writes right after an assistant message, found by rendering probe conversations,
  plus the tokenizer's ``eos_token``.
"""

from __future__ import annotations

import contextlib
import re
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import jinja2

from clawrl.errors import ModelLoadError

DEFAULT_STOP_MARKERS: tuple[str, ...] = ("<|im_end|>", "<|endoftext|>")
"""The texts a completion is cut at when no tokenizer says otherwise (ChatML's)."""

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

ToolCallFormat = Literal["hermes", "llama3_json", "mistral"]
"""How a model writes tool calls (see :func:`detect_tool_call_format`)."""
TOOL_CALL_FORMATS: tuple[ToolCallFormat, ...] = ("hermes", "llama3_json", "mistral")

MISTRAL_TOOL_CALLS = "[TOOL_CALLS]"
MISTRAL_ARGS = "[ARGS]"
LLAMA_PYTHON_TAG = "<|python_tag|>"

# Llama 3.1/3.2's instruction: 'Respond in the format {"name": function name, "parameters": ...'
_LLAMA_INSTRUCTION = re.compile(r'\{"name": function name, "parameters":')

_PROBE_CONTENT = "clawrlprobecontent"
_PROBE_USER = "clawrlprobeuser"
_PROBE_ARG = "clawrlprobeargument"
_PROBE_TOOL = "clawrl_probe"
_PROBE_CALL_ID = "call00000"  # 9 alphanumeric characters, which Mistral's templates demand

# Text shaped like a special token: <|x|>, <|x>, <x|>, <｜x｜> (DeepSeek's full-width bars) or a
# bare <word> (Gemma's <end_of_turn>); never a closing tag such as </tool_call>.
_MARKER_SHAPE = re.compile(
    r"<\|[^\s<>|]{1,64}\|>|<\|[^\s<>|]{1,64}>|<[^\s<>|/]{1,64}\|>"
    r"|<｜[^\s<>]{1,64}?｜>|<[A-Za-z_][A-Za-z0-9_]{0,63}>"
)


def chat_template_source(tokenizer: PreTrainedTokenizerBase) -> str:
    """The source of the tokenizer's chat template (the one used with tools).

    Raises:
        ModelLoadError: the tokenizer has no chat template.
    """
    if tokenizer.chat_template is None:
        raise ModelLoadError("the policy's tokenizer has no chat template")
    return tokenizer.get_chat_template(None, tools=[])


def detect_tool_call_format(template: str) -> ToolCallFormat:
    """The tool-call format of a chat template's source (rules in the module docstring)."""
    if "tools" not in template:
        return "hermes"
    if MISTRAL_TOOL_CALLS in template:
        return "mistral"
    if "<tool_call>" in template:
        return "hermes"
    if LLAMA_PYTHON_TAG in template or "ipython" in template or _LLAMA_INSTRUCTION.search(template):
        return "llama3_json"
    return "hermes"


def template_stop_markers(tokenizer: PreTrainedTokenizerBase) -> tuple[str, ...]:
    """The texts that end an assistant turn of this tokenizer's chat template, in order found.

    Found by rendering probe conversations (without a generation prompt) and reading what the
    template writes after the assistant's part:

    1. ``[user, assistant "PROBE"]``: the run of special tokens right after the probe text
       (whitespace before the first allowed), e.g. ``<|im_end|>`` (ChatML, Qwen),
       ``<|eot_id|>`` (Llama 3), ``<end_of_turn>`` (Gemma), ``<|end|>`` (Phi-3),
       ``<|return|>`` (gpt-oss), ``<｜end▁of▁sentence｜>`` (DeepSeek);
    2. when the template renders tools natively, ``[user, assistant with one tool call]`` (with
       the probe tool offered), and again with ``builtin_tools=[]`` (Llama 3.1's ipython mode):
       the special token that ends the render, e.g. ``<|call|>`` (gpt-oss), ``<|eom_id|>``
       (Llama 3.1);
    3. the tokenizer's ``eos_token``.

    A special token is one of the tokenizer's special or added-special tokens, or text shaped
    like one (``<|x|>``, ``<|x>``, ``<x|>``, ``<｜x｜>``, ``<word>``; never a closing tag like
    ``</tool_call>``), so templates attached to another model's tokenizer are read the same way.
    A probe the template rejects contributes nothing. The result is what the engine should stop
    at and what :class:`~clawrl.chat.StreamingParser` cuts completions at.

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template.

    Returns:
        The markers, without duplicates; at least the ``eos_token`` when the tokenizer has one.

    Raises:
        ModelLoadError: the tokenizer has no chat template.
    """
    source = chat_template_source(tokenizer)
    specials = _special_texts(tokenizer)
    found: list[str] = []
    plain = _render(tokenizer, [_user(), {"role": "assistant", "content": _PROBE_CONTENT}])
    if plain is not None and (at := plain.rfind(_PROBE_CONTENT)) >= 0:
        found += _marker_run(plain, at + len(_PROBE_CONTENT), specials)
    if "tools" in source:
        extras: tuple[dict[str, Any], ...] = ({}, {"builtin_tools": []})
        for extra in extras:
            rendered = _render(tokenizer, [_user(), _probe_call()], tools=[_probe_tool()], **extra)
            if rendered is not None and (at := rendered.rfind(_PROBE_ARG)) >= 0:
                found += _final_marker(rendered[at + len(_PROBE_ARG) :], specials)
    eos = getattr(tokenizer, "eos_token", None)
    if isinstance(eos, str) and eos:
        found.append(eos)
    return tuple(dict.fromkeys(found))


@dataclass(frozen=True)
class CompletionFormat:
    """How to parse a policy's completions.

    Attributes:
        tool_call_format: the model's native tool-call format (:func:`detect_tool_call_format`).
        stop_markers: the texts a completion is cut at: :func:`template_stop_markers`, then
            :data:`DEFAULT_STOP_MARKERS` this tokenizer has as special tokens (SmolLM2's
            ``<|endoftext|>``, which its template never writes but the parser always cut at).
        end_of_turn_ids: the ids of the template's markers (:func:`template_stop_markers`) that
            are one token each: what ends an assistant turn, for the engine's stop ids.
        control_ids: the tokenizer's special ids, plus the single-token ids of control-token
            texts the template writes (``<start_of_turn>``, ``<end_of_turn>``): a tokenizer
            converted from GGUF may not mark those special, and the gateway finds turn
            boundaries in recorded ids by them.
    """

    tool_call_format: ToolCallFormat
    stop_markers: tuple[str, ...]
    end_of_turn_ids: tuple[int, ...] = ()
    control_ids: frozenset[int] = frozenset()


_FORMATS: weakref.WeakKeyDictionary[Any, tuple[tuple[str, str | None], CompletionFormat]] = (
    weakref.WeakKeyDictionary()
)


def completion_format(tokenizer: PreTrainedTokenizerBase) -> CompletionFormat:
    """The :class:`CompletionFormat` of a tokenizer, computed once per tokenizer object (again if
    its chat template or ``eos_token`` changes).

    Raises:
        ModelLoadError: the tokenizer has no chat template.
    """
    key = (chat_template_source(tokenizer), getattr(tokenizer, "eos_token", None))
    cached = _FORMATS.get(tokenizer)
    if cached is not None and cached[0] == key:
        return cached[1]
    markers = template_stop_markers(tokenizer)
    specials = _special_texts(tokenizer)
    cut = tuple(dict.fromkeys([*markers, *(m for m in DEFAULT_STOP_MARKERS if m in specials)]))
    fmt = CompletionFormat(
        detect_tool_call_format(key[0]), cut, _single_ids(tokenizer, markers),
        _control_ids(tokenizer, key[0]),
    )  # fmt: skip
    with contextlib.suppress(TypeError):  # not weak-referenceable: computed each time
        _FORMATS[tokenizer] = (key, fmt)
    return fmt


def _user() -> dict[str, Any]:
    return {"role": "user", "content": _PROBE_USER}


def _probe_tool() -> dict[str, Any]:
    properties = {"q": {"type": "string", "description": "a probe"}}
    return {
        "type": "function",
        "function": {
            "name": _PROBE_TOOL,
            "description": "A probe.",
            "parameters": {"type": "object", "properties": properties, "required": ["q"]},
        },
    }


def _probe_call() -> dict[str, Any]:
    function = {"name": _PROBE_TOOL, "arguments": {"q": _PROBE_ARG}}
    call = {"id": _PROBE_CALL_ID, "type": "function", "function": function}
    return {"role": "assistant", "content": "", "tool_calls": [call]}


def _single_ids(tokenizer: PreTrainedTokenizerBase, texts: Sequence[str]) -> tuple[int, ...]:
    """The id of each text that is one token of ``tokenizer``, in order, without repeats."""
    out: list[int] = []
    for text in texts:
        ids = tokenizer.encode(text, add_special_tokens=False)
        if len(ids) == 1 and int(ids[0]) not in out:
            out.append(int(ids[0]))
    return tuple(out)


def _control_ids(tokenizer: PreTrainedTokenizerBase, source: str) -> frozenset[int]:
    special = {int(i) for i in getattr(tokenizer, "all_special_ids", ()) or ()}
    shaped = dict.fromkeys(m.group() for m in _MARKER_SHAPE.finditer(source))
    return frozenset(special | set(_single_ids(tokenizer, list(shaped))))


def end_of_turn_ids(tokenizer: PreTrainedTokenizerBase) -> tuple[int, ...]:
    """:attr:`CompletionFormat.end_of_turn_ids` of ``tokenizer`` (``()`` without a template)."""
    try:
        return completion_format(tokenizer).end_of_turn_ids
    except ModelLoadError:
        return ()


def control_ids(tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    """:attr:`CompletionFormat.control_ids` of ``tokenizer`` (its special ids without a
    template)."""
    try:
        return completion_format(tokenizer).control_ids
    except ModelLoadError:
        return frozenset(int(i) for i in getattr(tokenizer, "all_special_ids", ()) or ())


def _render(
    tokenizer: PreTrainedTokenizerBase, conv: list[dict[str, Any]], **kwargs: Any
) -> str | None:
    """The probe conversation rendered, or ``None`` if the template rejects it (raises, or
    breaks on it: a ``TypeError``/``ValueError`` from inside the template)."""
    try:
        text = tokenizer.apply_chat_template(
            conv, tokenize=False, add_generation_prompt=False, **kwargs
        )
    except (jinja2.TemplateError, TypeError, ValueError, KeyError, IndexError, AttributeError):
        return None
    return text if isinstance(text, str) else None


def _special_texts(tokenizer: PreTrainedTokenizerBase) -> list[str]:
    """The tokenizer's special tokens, longest first."""
    texts = {str(t) for t in getattr(tokenizer, "all_special_tokens", ()) or ()}
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    texts.update(t.content for t in decoder.values() if getattr(t, "special", False))
    return sorted((t for t in texts if t), key=len, reverse=True)


def _marker_at(text: str, i: int, specials: list[str]) -> str | None:
    for s in specials:
        if text.startswith(s, i):
            return s
    m = _MARKER_SHAPE.match(text, i)
    return m.group() if m else None


def _marker_run(text: str, i: int, specials: list[str]) -> list[str]:
    """The special tokens that follow position ``i`` back to back (whitespace allowed before the
    first)."""
    while i < len(text) and text[i].isspace():
        i += 1
    run: list[str] = []
    while (marker := _marker_at(text, i, specials)) is not None:
        run.append(marker)
        i += len(marker)
    return run


def _final_marker(tail: str, specials: list[str]) -> list[str]:
    """The special token that ``tail`` ends with (trailing whitespace ignored), if any."""
    tail = tail.rstrip()
    for s in specials:
        if tail.endswith(s):
            return [s]
    at = tail.rfind("<")
    while at >= 0:
        if _MARKER_SHAPE.fullmatch(tail, at):
            return [tail[at:]]
        at = tail.rfind("<", 0, at)
    return []
