"""Parsing policy completions into content, reasoning and tool calls, whole or streamed.

Rules (tolerant: a completion never makes the parser raise):

1. **Stop markers.** The text is cut at the first stop marker (``<|im_end|>``,
   ``<|endoftext|>`` by default) if the engine left one in.
2. **Reasoning.** If the completion starts (after whitespace) with ``<think>``, the text up to the
   first ``</think>`` is the reasoning. An unclosed ``<think>`` (a truncated completion) makes the
   whole rest reasoning and the content ``None``. ``<think>`` anywhere else is plain content.
3. **Tool calls** (only when tools are enabled; otherwise the tags stay content). A
   ``<tool_call>`` region ends at the first ``</tool_call>`` that is not inside a JSON string
   (so ``"</tool_call>"`` inside an argument does not end it; a raw newline, which JSON forbids
   in strings, ends a string that was never closed). It becomes a :class:`ToolCall`
   (id ``call_`` + random hex) when its inside is a JSON object with a non-empty string
   ``name`` and ``arguments`` (alias ``parameters``) that is an object, a JSON string of an
   object, or absent/``""`` (``{}``). Otherwise — malformed JSON, no name, non-object
   arguments — the region stays plain content, tags included. A ``<tool_call>`` that is
   followed by another ``<tool_call>`` before any closing tag is abandoned: the text up to the
   second tag is content. A region still open at the end (truncated) is content. Text before,
   between and after calls is content; the Hermes/Qwen format with newlines inside the tags is
   accepted.
4. **Whitespace.** Content and reasoning are stripped of leading and trailing whitespace, with
   the pieces of content around tool calls concatenated first; empty means ``None``.

:class:`StreamingParser` applies the same rules incrementally and gives the same result as
:func:`parse_completion` for any split of the text into deltas.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from clawrl.chat.tool_format import THINK_CLOSE, THINK_OPEN, TOOL_CALL_CLOSE, TOOL_CALL_OPEN
from clawrl.chat.types import ChatMessage, ToolCall

DEFAULT_STOP_MARKERS: tuple[str, ...] = ("<|im_end|>", "<|endoftext|>")
_IN_STRING = re.compile(r'["\\\n]')
_OUTSIDE_STRING = re.compile(r'["<]')


def new_tool_call_id() -> str:
    """Return a fresh tool-call id: ``call_`` followed by 24 random hex digits."""
    return "call_" + secrets.token_hex(12)


class ParsedCompletion(BaseModel):
    """What a completion says.

    Attributes:
        content: the text for the user, stripped; ``None`` when empty.
        reasoning: the ``<think>`` text, stripped; ``None`` when absent or empty.
        tool_calls: the well-formed tool calls, in order.
        reasoning_open: the completion ended inside ``<think>`` (never closed): anything after
            it, a tool call included, was read as reasoning.
    """

    model_config = ConfigDict(frozen=True)

    content: str | None = None
    reasoning: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    reasoning_open: bool = False

    def to_message(self) -> ChatMessage:
        """Return the completion as an assistant :class:`ChatMessage`."""
        return ChatMessage(
            role="assistant",
            content=self.content,
            reasoning=self.reasoning,
            tool_calls=self.tool_calls,
        )


@dataclass(frozen=True)
class ContentDelta:
    """A piece of content, to send to the client as soon as it is known."""

    text: str


@dataclass(frozen=True)
class ReasoningDelta:
    """A piece of reasoning."""

    text: str


@dataclass(frozen=True)
class ToolCallEvent:
    """A complete, well-formed tool call."""

    call: ToolCall


StreamEvent = ContentDelta | ReasoningDelta | ToolCallEvent


def parse_completion(
    text: str,
    *,
    tools_enabled: bool,
    stop_markers: Sequence[str] = DEFAULT_STOP_MARKERS,
    new_id: Callable[[], str] = new_tool_call_id,
) -> ParsedCompletion:
    """Parse a whole completion (rules in the module docstring).

    Args:
        text: the decoded completion.
        tools_enabled: whether ``<tool_call>`` markup is parsed (tools were offered).
        stop_markers: texts at which the completion is cut.
        new_id: makes the id of each tool call.

    Returns:
        The content, reasoning and tool calls. Never raises on any text.
    """
    parser = StreamingParser(tools_enabled=tools_enabled, stop_markers=stop_markers, new_id=new_id)
    parser.feed(text)
    parser.finish()
    return parser.result


class _Stripper:
    """Emits text as it comes while dropping leading and trailing whitespace of the whole."""

    def __init__(self) -> None:
        self.started = False
        self.pending = ""
        self.emitted: list[str] = []

    def push(self, piece: str) -> str:
        if not self.started:
            piece = piece.lstrip()
            if not piece:
                return ""
            self.started = True
        joined = self.pending + piece
        out = joined.rstrip()
        self.pending = joined[len(out) :]
        if out:
            self.emitted.append(out)
        return out

    def value(self) -> str | None:
        return "".join(self.emitted) or None


@dataclass
class _CallScan:
    """Progress through one ``<tool_call>`` region, resumable across deltas."""

    start: int
    i: int
    in_string: bool = False
    escaped: bool = False


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for k in range(min(len(text), len(tag) - 1), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


class StreamingParser:
    """Incremental :func:`parse_completion`.

    Feed text deltas; each call returns the events that are certain so far. Content is released
    immediately except text that may still be the start of a tag (``<tool_call>``, ``<think>``,
    ``</think>``, a stop marker) and trailing whitespace (which is dropped if nothing follows).
    A tool-call region is held until it is decided: a :class:`ToolCallEvent` when well formed,
    otherwise its text as content. After :meth:`finish`, :attr:`result` equals
    ``parse_completion`` of the concatenated deltas (with the same ``new_id``), and the content
    and reasoning deltas concatenate to ``result.content`` and ``result.reasoning``.

    Args:
        tools_enabled: whether ``<tool_call>`` markup is parsed.
        stop_markers: texts at which the completion is cut.
        new_id: makes the id of each tool call.
    """

    def __init__(
        self,
        *,
        tools_enabled: bool,
        stop_markers: Sequence[str] = DEFAULT_STOP_MARKERS,
        new_id: Callable[[], str] = new_tool_call_id,
    ) -> None:
        self._tools_enabled = tools_enabled
        self._markers = tuple(m for m in stop_markers if m)
        self._new_id = new_id
        self._raw = ""
        self._stopped = False
        self._searched = 0
        self._pos = 0
        self._phase = "start"
        self._call: _CallScan | None = None
        self._content = _Stripper()
        self._reasoning = _Stripper()
        self._tool_calls: list[ToolCall] = []
        self._finished = False

    def feed(self, delta: str) -> list[StreamEvent]:
        """Add a text delta and return the events it completes.

        Raises:
            RuntimeError: called after :meth:`finish`.
        """
        if self._finished:
            raise RuntimeError("StreamingParser.feed after finish")
        if not self._stopped:
            self._raw += delta
            self._cut_at_stop_marker()
        end = len(self._raw)
        if not self._stopped:
            end -= max((_partial_suffix(self._raw, m) for m in self._markers), default=0)
        return self._process(end, final=False)

    def finish(self) -> list[StreamEvent]:
        """Mark the end of the completion and return the remaining events."""
        if self._finished:
            return []
        self._finished = True
        return self._process(len(self._raw), final=True)

    @property
    def result(self) -> ParsedCompletion:
        """The parse of everything fed so far (complete after :meth:`finish`)."""
        return ParsedCompletion(
            content=self._content.value(),
            reasoning=self._reasoning.value(),
            tool_calls=list(self._tool_calls),
            reasoning_open=self._finished and self._phase == "think",
        )

    def _cut_at_stop_marker(self) -> None:
        longest = max((len(m) for m in self._markers), default=1)
        start = max(0, self._searched - longest + 1)
        hits = [i for i in (self._raw.find(m, start) for m in self._markers) if i >= 0]
        if hits:
            self._raw = self._raw[: min(hits)]
            self._stopped = True
        self._searched = len(self._raw)

    def _process(self, end: int, final: bool) -> list[StreamEvent]:
        events: list[StreamEvent] = []
        while self._step(end, final, events):
            pass
        return events

    def _step(self, end: int, final: bool, events: list[StreamEvent]) -> bool:
        """Advance once; return whether to continue."""
        raw, pos = self._raw, self._pos
        if self._phase == "start":
            rest = raw[pos:end]
            stripped = rest.lstrip()
            if stripped.startswith(THINK_OPEN):
                self._pos += len(rest) - len(stripped) + len(THINK_OPEN)
                self._phase = "think"
                return True
            if not final and THINK_OPEN.startswith(stripped):
                return False
            self._phase = "body"
            return True
        if self._phase == "think":
            close = raw.find(THINK_CLOSE, pos, end)
            stop = close if close >= 0 else end
            if close < 0 and not final:
                stop -= _partial_suffix(raw[pos:end], THINK_CLOSE)
            self._emit(events, raw[pos:stop], reasoning=True)
            self._pos = stop
            if close < 0:
                return False
            self._pos = close + len(THINK_CLOSE)
            self._phase = "body"
            return True
        if self._call is not None:
            return self._step_call(end, final, events)
        opening = raw.find(TOOL_CALL_OPEN, pos, end) if self._tools_enabled else -1
        stop = opening if opening >= 0 else end
        if opening < 0 and not final and self._tools_enabled:
            stop -= _partial_suffix(raw[pos:end], TOOL_CALL_OPEN)
        self._emit(events, raw[pos:stop], reasoning=False)
        self._pos = stop
        if opening < 0:
            return False
        self._call = _CallScan(start=opening, i=opening + len(TOOL_CALL_OPEN))
        return True

    def _step_call(self, end: int, final: bool, events: list[StreamEvent]) -> bool:
        scan = self._call
        assert scan is not None
        decided = _advance_call(scan, self._raw, end, final)
        if decided is None:
            if final:
                self._emit(events, self._raw[scan.start : end], reasoning=False)
                self._pos = end
                self._call = None
            return False
        kind, at = decided
        self._call = None
        if kind == "reopen":
            self._emit(events, self._raw[scan.start : at], reasoning=False)
            self._pos = at
            return True
        region_end = at + len(TOOL_CALL_CLOSE)
        call = _decode_call(self._raw[scan.start + len(TOOL_CALL_OPEN) : at], self._new_id)
        if call is None:
            self._emit(events, self._raw[scan.start : region_end], reasoning=False)
        else:
            self._tool_calls.append(call)
            events.append(ToolCallEvent(call))
        self._pos = region_end
        return True

    def _emit(self, events: list[StreamEvent], piece: str, *, reasoning: bool) -> None:
        if not piece:
            return
        if reasoning:
            out = self._reasoning.push(piece)
            if out:
                events.append(ReasoningDelta(out))
        else:
            out = self._content.push(piece)
            if out:
                events.append(ContentDelta(out))


def _advance_call(scan: _CallScan, text: str, end: int, final: bool) -> tuple[str, int] | None:
    """Scan a tool-call region up to ``end``.

    Returns ``("close", i)`` at a ``</tool_call>`` outside JSON strings, ``("reopen", i)`` at a
    ``<tool_call>`` outside JSON strings, or ``None`` (undecided; ``scan`` keeps its progress).
    """
    i = scan.i
    while i < end:
        if scan.in_string:
            if scan.escaped:
                scan.escaped = False
                scan.in_string = text[i] != "\n"
                i += 1
                continue
            m = _IN_STRING.search(text, i, end)
            if m is None:
                i = end
                break
            i = m.end()
            if m.group() == "\\":
                scan.escaped = True
            else:  # a closing quote, or a raw newline (never inside a valid JSON string)
                scan.in_string = False
            continue
        m = _OUTSIDE_STRING.search(text, i, end)
        if m is None:
            i = end
            break
        j = m.start()
        if m.group() == '"':
            scan.in_string = True
            i = j + 1
            continue
        for tag, kind in ((TOOL_CALL_CLOSE, "close"), (TOOL_CALL_OPEN, "reopen")):
            if text.startswith(tag, j, end):
                scan.i = j
                return kind, j
        if not final and any(
            tag.startswith(text[j:end]) for tag in (TOOL_CALL_CLOSE, TOOL_CALL_OPEN)
        ):
            scan.i = j
            return None
        i = j + 1
    scan.i = i
    return None


def _decode_call(inner: str, new_id: Callable[[], str]) -> ToolCall | None:
    """The tool call a region's inside describes, or ``None`` if it is not a well-formed one."""
    try:
        obj = json.loads(inner)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict):
        return None
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return None
    arguments = _call_arguments(obj.get("arguments", obj.get("parameters")))
    if arguments is None:
        return None
    return ToolCall(id=new_id(), name=name, arguments=arguments)


def _call_arguments(raw: Any) -> dict[str, Any] | None:
    if raw is None:
        return {}
    if isinstance(raw, str):
        if not raw.strip():
            return {}
        try:
            raw = json.loads(raw)
        except (ValueError, RecursionError):
            return None
    return raw if isinstance(raw, dict) else None
