"""Resumable scanners for the tool calls of each native format (used by :mod:`clawrl.chat.parse`).

Every scanner reads the completion text up to an ``end`` it is given (more text may come later
unless ``final``), keeps its progress between calls, and never looks past ``end``: its answer for
a text is the same however the text arrived. The rules they implement are stated in
:mod:`clawrl.chat.parse`.

* :class:`HermesRegion` — ``<tool_call>{json}</tool_call>``;
* :class:`MistralRegion` — ``[TOOL_CALLS][{...}, ...]`` and ``[TOOL_CALLS]name[ARGS]{...}``;
* :class:`Llama3Body` — a whole body that is ``{"name": ..., "parameters": {...}}`` (``;``
  separated, optionally after ``<|python_tag|>``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from clawrl.chat.formats import LLAMA_PYTHON_TAG, MISTRAL_ARGS, MISTRAL_TOOL_CALLS, ToolCallFormat
from clawrl.chat.tool_format import TOOL_CALL_CLOSE, TOOL_CALL_OPEN
from clawrl.chat.types import ToolCall

NewId = Callable[[], str]
CallFields = tuple[str, dict[str, Any]]
"""A decoded call without its id: ``(name, arguments)``."""

_IN_STRING = re.compile(r'["\\\n]')
_HERMES_OUTSIDE = re.compile(r'["<]')
_JSON_OUTSIDE = re.compile(r'["{}\[\]]')
_NAME = re.compile(r"[A-Za-z0-9_.:\-]*")


@dataclass(frozen=True)
class Decided:
    """How a tool-call region ended.

    Attributes:
        stop: the region is the text ``[start, stop)``; parsing goes on at ``stop``.
        calls: its tool calls, or ``None``: the region's text stays content.
    """

    stop: int
    calls: list[ToolCall] | None


class Region(Protocol):
    """A tool-call region that opened at ``start`` (the index of its opening tag)."""

    start: int

    def advance(self, text: str, end: int, final: bool) -> Decided | None:
        """Scan up to ``end``; ``None`` while undecided (never when ``final``)."""
        ...


def opening_tag(fmt: ToolCallFormat) -> str | None:
    """The tag that opens a tool-call region in ``fmt`` (``None``: llama3_json has none)."""
    return {"hermes": TOOL_CALL_OPEN, "mistral": MISTRAL_TOOL_CALLS}.get(fmt)


def new_region(fmt: ToolCallFormat, start: int, new_id: NewId) -> Region:
    """The region scanner of ``fmt`` (hermes or mistral) for a region whose opening tag is at
    ``start``."""
    if fmt == "mistral":
        return MistralRegion(start, new_id)
    return HermesRegion(start, new_id)


def call_fields(obj: Any, *, require_arguments: bool = False) -> CallFields | None:
    """``(name, arguments)`` of a decoded call object, or ``None`` if it is not a well-formed one.

    Well formed: a dict with a non-empty string ``name`` and ``arguments`` (alias
    ``parameters``) that is an object, a JSON string of an object, or absent/``null``/``""``
    (``{}``; with ``require_arguments`` one of the two keys must be present).
    """
    if not isinstance(obj, dict):
        return None
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return None
    if require_arguments and "arguments" not in obj and "parameters" not in obj:
        return None
    arguments = _call_arguments(obj.get("arguments", obj.get("parameters")))
    return None if arguments is None else (name, arguments)


def _call_arguments(raw: Any) -> dict[str, Any] | None:
    if raw is None:
        return {}
    if isinstance(raw, str):
        if not raw.strip():
            return {}
        raw = _loads(raw)
    return raw if isinstance(raw, dict) else None


_INVALID = object()


def _loads(text: str) -> Any:
    """``json.loads``, or a sentinel that no check accepts when ``text`` is not JSON."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return _INVALID


def _skip_ws(text: str, i: int, end: int) -> int:
    while i < end and text[i].isspace():
        i += 1
    return i


def _could_start(tag: str, text: str, i: int, end: int) -> bool:
    """Whether ``text[i:end]`` is a proper prefix of ``tag`` (the tag may still come)."""
    return end - i < len(tag) and tag.startswith(text[i:end])


class _StringSkipper:
    """Resumable skipping of JSON strings: a quote opens one, an unescaped quote or a raw newline
    (never inside a valid JSON string) closes it."""

    def __init__(self) -> None:
        self._in_string = False
        self._escaped = False

    def _in_string_step(self, text: str, i: int, end: int) -> int:
        """Advance inside a string from ``i`` (at most to ``end``); return the next index."""
        if self._escaped:
            self._escaped = False
            self._in_string = text[i] != "\n"
            return i + 1
        m = _IN_STRING.search(text, i, end)
        if m is None:
            return end
        if m.group() == "\\":
            self._escaped = True
        else:
            self._in_string = False
        return m.end()


class HermesRegion(_StringSkipper):
    """``<tool_call>`` … the first ``</tool_call>`` outside JSON strings.

    A raw newline ends a JSON string that was never closed; a ``<tool_call>`` outside strings
    abandons the region (its text up to there is content); a region still open at the end is
    content.
    """

    def __init__(self, start: int, new_id: NewId) -> None:
        super().__init__()
        self.start = start
        self._new_id = new_id
        self._i = start + len(TOOL_CALL_OPEN)

    def advance(self, text: str, end: int, final: bool) -> Decided | None:
        found = self._scan(text, end, final)
        if found is None:
            return Decided(end, None) if final else None
        kind, at = found
        if kind == "reopen":
            return Decided(at, None)
        fields = call_fields(_loads(text[self.start + len(TOOL_CALL_OPEN) : at]))
        if fields is None:
            return Decided(at + len(TOOL_CALL_CLOSE), None)
        call = ToolCall(id=self._new_id(), name=fields[0], arguments=fields[1])
        return Decided(at + len(TOOL_CALL_CLOSE), [call])

    def _scan(self, text: str, end: int, final: bool) -> tuple[str, int] | None:
        """``("close", i)`` at a ``</tool_call>`` outside strings, ``("reopen", i)`` at a
        ``<tool_call>``, or ``None`` (undecided; progress kept)."""
        i = self._i
        while i < end:
            if self._in_string:
                i = self._in_string_step(text, i, end)
                continue
            m = _HERMES_OUTSIDE.search(text, i, end)
            if m is None:
                i = end
                break
            j = m.start()
            if m.group() == '"':
                self._in_string = True
                i = j + 1
                continue
            for tag, kind in ((TOOL_CALL_CLOSE, "close"), (TOOL_CALL_OPEN, "reopen")):
                if text.startswith(tag, j, end):
                    self._i = j
                    return kind, j
            tags = (TOOL_CALL_CLOSE, TOOL_CALL_OPEN)
            if not final and any(_could_start(t, text, j, end) for t in tags):
                self._i = j
                return None
            i = j + 1
        self._i = i
        return None


class JsonExtent(_StringSkipper):
    """Where a JSON object or array that starts at ``start`` (a ``{`` or ``[``) ends: its
    brackets counted outside strings (a raw newline ends a string never closed). The text is not
    validated here, only delimited."""

    def __init__(self, start: int) -> None:
        super().__init__()
        self.start = start
        self._i = start
        self._depth = 0

    def scan(self, text: str, end: int, tag: str | None, final: bool) -> tuple[str, int] | None:
        """``("end", k)``: the value is ``text[start:k]``; ``("tag", j)``: ``tag`` occurs at ``j``
        outside strings first; ``None``: more text is needed (progress kept)."""
        i = self._i
        while i < end:
            if self._in_string:
                i = self._in_string_step(text, i, end)
                continue
            m = _JSON_OUTSIDE.search(text, i, end)
            if m is None:
                i = end
                break
            j, c = m.start(), m.group()
            i = j + 1
            if c == '"':
                self._in_string = True
                continue
            if c == "[" and tag is not None:
                if text.startswith(tag, j, end):
                    self._i = j
                    return "tag", j
                if not final and _could_start(tag, text, j, end):
                    self._i = j
                    return None
            self._depth += 1 if c in "{[" else -1
            if self._depth <= 0:
                self._i = i
                return "end", i
        self._i = i
        return None


class MistralRegion:
    """``[TOOL_CALLS]`` followed (whitespace allowed) by either a JSON array of call objects
    (through its matching ``]``) or ``NAME[ARGS]`` and a JSON object (through its matching
    ``}``).

    The array is calls when every element is a well-formed call object (:func:`call_fields`),
    the ``[ARGS]`` form when ``NAME`` (letters, digits, ``_.:-``) is followed by ``[ARGS]`` and
    the JSON is an object; otherwise the region stays content. A region is abandoned, its text up
    to there content, where it stops being possible: the name meets another character, ``[ARGS]``
    is followed by something other than ``{``, or a ``[TOOL_CALLS]`` occurs outside JSON strings.
    A region still open at the end is content.
    """

    def __init__(self, start: int, new_id: NewId) -> None:
        self.start = start
        self._new_id = new_id
        self._i = start + len(MISTRAL_TOOL_CALLS)
        self._stage = "head"
        self._name_start = 0
        self._name = ""
        self._json: JsonExtent | None = None

    def advance(self, text: str, end: int, final: bool) -> Decided | None:
        while self._json is None:
            i = self._i if self._stage == "name" else _skip_ws(text, self._i, end)
            self._i = i
            if i >= end:
                return Decided(end, None) if final else None
            done, outcome = self._step(text, i, end, final)
            if done:
                return outcome
        found = self._json.scan(text, end, MISTRAL_TOOL_CALLS, final)
        if found is None:
            return Decided(end, None) if final else None
        kind, k = found
        if kind == "tag":
            return Decided(k, None)
        return Decided(k, self._decode(text[self._json.start : k]))

    def _step(self, text: str, i: int, end: int, final: bool) -> tuple[bool, Decided | None]:
        """One stage before the JSON: ``(True, outcome)`` when the region is decided or must
        wait (``None``), ``(False, None)`` to go on."""
        if self._stage == "head":
            if text.startswith(MISTRAL_TOOL_CALLS, i, end):
                return True, Decided(i, None)
            if text[i] == "[":
                if not final and _could_start(MISTRAL_TOOL_CALLS, text, i, end):
                    return True, None
                self._json = JsonExtent(i)
                return False, None
            self._stage, self._name_start = "name", i
            return False, None
        if self._stage == "name":
            m = _NAME.match(text, i, end)
            j = m.end() if m else i
            self._i = j
            if j >= end:
                return True, Decided(end, None) if final else None
            if j > self._name_start and text.startswith(MISTRAL_ARGS, j, end):
                self._name = text[self._name_start : j]
                self._i, self._stage = j + len(MISTRAL_ARGS), "args"
                return False, None
            tags = (MISTRAL_ARGS, MISTRAL_TOOL_CALLS)
            if not final and any(_could_start(t, text, j, end) for t in tags):
                return True, None
            return True, Decided(j, None)
        if text[i] != "{":  # after [ARGS]
            return True, Decided(i, None)
        self._json = JsonExtent(i)
        return False, None

    def _decode(self, value: str) -> list[ToolCall] | None:
        obj = _loads(value)
        if self._name:
            fields: list[CallFields] = [(self._name, obj)] if isinstance(obj, dict) else []
        elif isinstance(obj, list):
            decoded = [call_fields(o) for o in obj]
            fields = [f for f in decoded if f is not None] if None not in decoded else []
        else:
            fields = []
        if not fields:
            return None
        return [ToolCall(id=self._new_id(), name=n, arguments=a) for n, a in fields]


class Llama3Body:
    """Decides whether a whole completion body (from ``start``) is Llama 3 JSON tool calls.

    It is when, after whitespace and an optional ``<|python_tag|>``, it is one or more JSON
    objects separated by ``;`` (whitespace around them and one trailing ``;`` allowed), each a
    well-formed call that has a ``parameters`` (alias ``arguments``) key
    (:func:`call_fields`). Otherwise the whole body is content. The calls are only certain at
    the end (more text could still follow); content is certain as soon as the text stops fitting.
    """

    def __init__(self, start: int) -> None:
        self._i = start
        self._stage = "head"
        self._tagged = False
        self._json: JsonExtent | None = None
        self._calls: list[CallFields] = []

    def advance(
        self, text: str, end: int, final: bool
    ) -> list[CallFields] | Literal["content"] | None:
        """The calls (only when ``final``), ``"content"``, or ``None`` while undecided."""
        while True:
            if self._json is not None:
                found = self._json.scan(text, end, None, final)
                if found is None:
                    return "content" if final else None
                value = _loads(text[self._json.start : found[1]])
                fields = call_fields(value, require_arguments=True)
                if fields is None:
                    return "content"
                self._calls.append(fields)
                self._i, self._stage, self._json = found[1], "after", None
                continue
            i = _skip_ws(text, self._i, end)
            self._i = i
            if i >= end:
                if not final:
                    return None
                return list(self._calls) if self._calls else "content"
            if self._stage == "head" and not self._tagged:
                if text.startswith(LLAMA_PYTHON_TAG, i, end):
                    self._i, self._tagged = i + len(LLAMA_PYTHON_TAG), True
                    continue
                if not final and _could_start(LLAMA_PYTHON_TAG, text, i, end):
                    return None
            if self._stage == "after":
                if text[i] != ";":
                    return "content"
                self._i, self._stage = i + 1, "sep"
                continue
            if text[i] != "{":
                return "content"
            self._json = JsonExtent(i)
