"""Parsing policy completions into content, reasoning and tool calls, whole or streamed.

Rules (tolerant: a completion never makes the parser raise):

1. **Stop markers.** The text is cut at the first stop marker if the engine left one in: the
   model's own end-of-turn texts (:func:`clawrl.chat.template_stop_markers`, which the gateway
   passes), ``<|im_end|>`` and ``<|endoftext|>`` (:data:`DEFAULT_STOP_MARKERS`) by default.
2. **Reasoning.** If the completion starts (after whitespace) with ``<think>``, the text up to the
   first ``</think>`` is the reasoning. An unclosed ``<think>`` (a truncated completion) makes the
   whole rest reasoning and the content ``None``. ``<think>`` anywhere else is plain content. The
   rest of the completion is its *body*.
3. **Tool calls** (only when tools are enabled; otherwise everything stays content), in the
   model's native format (``tool_format``, :func:`clawrl.chat.detect_tool_call_format`). A
   well-formed call becomes a :class:`ToolCall` (id ``call_`` + random hex); anything malformed
   stays content, verbatim. A call object is well formed when it is a JSON object with a
   non-empty string ``name`` and ``arguments`` (alias ``parameters``) that is an object, a JSON
   string of an object, or absent/``""`` (``{}``). In every format, JSON strings are skipped
   when looking for the end of a call (a raw newline, which JSON forbids in strings, ends a
   string that was never closed), and a call still open at the end (truncated) is content.

   * ``"hermes"`` (Hermes/Qwen, and clawrl's fallback format): a ``<tool_call>`` region ends at
     the first ``</tool_call>`` outside JSON strings (so ``"</tool_call>"`` inside an argument
     does not end it); its inside must be one call object, else the region stays content, tags
     included. A ``<tool_call>`` followed by another ``<tool_call>`` before any closing tag is
     abandoned: the text up to the second tag is content. Newlines inside the tags are fine.
   * ``"mistral"``: ``[TOOL_CALLS]`` then either a JSON array of call objects (the region ends at
     its matching ``]``; calls when every element is a call object) or ``NAME[ARGS]`` and a JSON
     object (ends at its matching ``}``); otherwise the region stays content. A region is
     abandoned (its text so far content) where it stops being possible: a name character other
     than letters, digits and ``_.:-``, no ``{`` after ``[ARGS]``, or another ``[TOOL_CALLS]``
     outside JSON strings. Several regions may follow each other.
   * ``"llama3_json"``: the body is calls only when it is *entirely* (after whitespace and an
     optional ``<|python_tag|>``) one or more call objects separated by ``;`` (one trailing
     ``;`` allowed), each with a ``parameters`` (or ``arguments``) key; otherwise the whole body
     is content, so an answer that merely contains JSON stays content.

   Text before, between and after hermes and mistral regions is content.
4. **Whitespace.** Content and reasoning are stripped of leading and trailing whitespace, with
   the pieces of content around tool calls concatenated first; empty means ``None``.

:class:`StreamingParser` applies the same rules incrementally and gives the same result as
:func:`parse_completion` for any split of the text into deltas.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from clawrl.chat.formats import DEFAULT_STOP_MARKERS, TOOL_CALL_FORMATS, ToolCallFormat
from clawrl.chat.tool_format import THINK_CLOSE, THINK_OPEN
from clawrl.chat.tool_scan import Llama3Body, Region, new_region, opening_tag
from clawrl.chat.types import ChatMessage, ToolCall

"""SmolLM2's (ChatML) markers: the default when the caller does not pass the model's own."""


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
    tool_format: ToolCallFormat = "hermes",
) -> ParsedCompletion:
    """Parse a whole completion (rules in the module docstring).

    Args:
        text: the decoded completion.
        tools_enabled: whether tool-call markup is parsed (tools were offered).
        stop_markers: texts at which the completion is cut.
        new_id: makes the id of each tool call.
        tool_format: the model's tool-call format.

    Returns:
        The content, reasoning and tool calls. Never raises on any text.
    """
    parser = StreamingParser(
        tools_enabled=tools_enabled, stop_markers=stop_markers, new_id=new_id,
        tool_format=tool_format,
    )  # fmt: skip
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


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for k in range(min(len(text), len(tag) - 1), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


class StreamingParser:
    """Incremental :func:`parse_completion`.

    Feed text deltas; each call returns the events that are certain so far. Content is released
    immediately except text that may still be the start of a tag (the format's opening tag,
    ``<think>``, ``</think>``, a stop marker) and trailing whitespace (which is dropped if
    nothing follows). A hermes or mistral tool-call region is held until it is decided: a
    :class:`ToolCallEvent` per call when well formed, otherwise its text as content. With
    ``llama3_json`` the body is held while it could still be calls (it is, after whitespace, an
    optional ``<|python_tag|>`` and ``{``, as long as every object so far is a call followed by
    nothing but whitespace and ``;``), so a call's JSON is never sent as content; it is released
    as content as soon as it cannot be calls, and its calls are only known at :meth:`finish`.

    After :meth:`finish`, :attr:`result` equals ``parse_completion`` of the concatenated deltas
    (with the same ``new_id``), and the content and reasoning deltas concatenate to
    ``result.content`` and ``result.reasoning``.

    Args:
        tools_enabled: whether tool-call markup is parsed.
        stop_markers: texts at which the completion is cut.
        new_id: makes the id of each tool call.
        tool_format: the model's tool-call format (:data:`clawrl.chat.ToolCallFormat`).

    Raises:
        ValueError: an unknown ``tool_format``.
    """

    def __init__(
        self,
        *,
        tools_enabled: bool,
        stop_markers: Sequence[str] = DEFAULT_STOP_MARKERS,
        new_id: Callable[[], str] = new_tool_call_id,
        tool_format: ToolCallFormat = "hermes",
    ) -> None:
        if tool_format not in TOOL_CALL_FORMATS:
            raise ValueError(f"unknown tool-call format {tool_format!r}")
        self._tools_enabled = tools_enabled
        self._format = tool_format
        self._markers = tuple(m for m in stop_markers if m)
        self._new_id = new_id
        self._raw = ""
        self._stopped = False
        self._searched = 0
        self._pos = 0
        # start -> think -> body (tags parsed) | plain (no tags) | json (llama3_json deciding)
        self._phase = "start"
        self._region: Region | None = None
        self._json: Llama3Body | None = None
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

    def _body_phase(self) -> str:
        if not self._tools_enabled:
            return "plain"
        return "json" if self._format == "llama3_json" else "body"

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
            self._phase = self._body_phase()
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
            self._phase = self._body_phase()
            return True
        if self._phase == "json":
            return self._step_json(end, final, events)
        if self._region is not None:
            return self._step_region(end, final, events)
        opening = opening_tag(self._format) if self._phase == "body" else None
        at = raw.find(opening, pos, end) if opening else -1
        stop = at if at >= 0 else end
        if opening and at < 0 and not final:
            stop -= _partial_suffix(raw[pos:end], opening)
        self._emit(events, raw[pos:stop], reasoning=False)
        self._pos = stop
        if at < 0:
            return False
        assert self._format != "llama3_json"
        self._region = new_region(self._format, at, self._new_id)
        return True

    def _step_region(self, end: int, final: bool, events: list[StreamEvent]) -> bool:
        region = self._region
        assert region is not None
        decided = region.advance(self._raw, end, final)
        if decided is None:
            return False
        self._region = None
        if decided.calls is None:
            self._emit(events, self._raw[region.start : decided.stop], reasoning=False)
        else:
            self._add_calls(events, decided.calls)
        self._pos = decided.stop
        return True

    def _step_json(self, end: int, final: bool, events: list[StreamEvent]) -> bool:
        if self._json is None:
            self._json = Llama3Body(self._pos)
        outcome = self._json.advance(self._raw, end, final)
        if outcome is None:
            return False
        self._json = None
        if isinstance(outcome, str):  # "content": the body is plain text
            self._phase = "plain"
            return True
        calls = [ToolCall(id=self._new_id(), name=n, arguments=a) for n, a in outcome]
        self._add_calls(events, calls)
        self._pos, self._phase = end, "plain"
        return False

    def _add_calls(self, events: list[StreamEvent], calls: list[ToolCall]) -> None:
        self._tool_calls.extend(calls)
        events.extend(ToolCallEvent(c) for c in calls)

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
