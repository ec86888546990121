"""Rendering neutral chat messages (+ tools) to the policy's token ids with its chat template.

Two paths, picked per tokenizer by :func:`supports_native_tools`:

* **native** — the template source mentions ``tools``: tools go to the template in OpenAI function
  format, assistant tool calls as OpenAI ``tool_calls`` (arguments as objects) and tool results as
  ``tool`` messages; the template decides their text. The ids the template sees are canonical,
  never the client's: the k-th call of the conversation is :func:`canonical_call_id` ``(k)``
  (``call00000``, ``call00001``, …: nine alphanumeric characters, which Mistral's templates
  demand), and a tool result gets the canonical id of the call whose client id it names (the
  most recent one), else of the first unanswered call of the latest assistant message, else a
  fresh one; so ids a client picks or rewrites never change the prompt. With a ``llama3_json``
  template (Llama 3.1/3.2, which reject an assistant message with several calls) a message with
  several calls is rendered as consecutive assistant messages of one call each.
* **fallback** — the template has no tool support (SmolLM2's plain ChatML): the text format of
  :mod:`clawrl.chat.tool_format` is used. The tool section is appended to the first system message
  (one is created when the conversation has none, starting with the template's own default system
  prompt, if it has one); assistant turns are rendered by
  :func:`~clawrl.chat.tool_format.assistant_message_text`; each run of consecutive tool results
  becomes ONE ``user`` turn of ``<tool_response>`` blocks (so OpenAI's consecutive ``tool``
  messages and Anthropic's several ``tool_result`` blocks in one message give identical ids).

In both paths assistant reasoning is rendered as ``<think>\\nREASONING\\n</think>`` before the
content, in every assistant message (it is what the policy generated; keeping it keeps a turn's
prompt a prefix of the next turn's). No ``None`` content ever reaches a template (it becomes
``""``). ``tool_choice``: ``none`` renders no tools (tool calls and results in the history are
still rendered); ``required`` and a named function add one instruction line to the system
message. That instruction plus the gateway's parse is the only enforcement: constrained decoding
is not implemented.

The text is rendered once and tokenized once, whole; :attr:`RenderedPrompt.message_spans` are
token boundaries of that tokenization (see :func:`render_prompt`).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import jinja2

from clawrl.chat.formats import chat_template_source, detect_tool_call_format
from clawrl.chat.prefix_cache import (
    context_key,
    encode_segments,
    prefix_renders,
    text_prefix_digests,
    tokenizer_key,
)
from clawrl.chat.tool_format import (
    assistant_message_text,
    reasoning_text,
    tool_choice_text,
    tool_results_text,
    tools_system_text,
)
from clawrl.chat.types import ChatMessage, ToolCall, ToolChoice, ToolSpec
from clawrl.errors import ClientInputError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

TEMPLATE_ERRORS: tuple[type[Exception], ...] = (
    jinja2.TemplateError, TypeError, ValueError, KeyError, IndexError, AttributeError,
)  # fmt: skip
"""What a chat template raises on a conversation it cannot render: its own
``raise_exception`` (a TemplateError), and Python errors of templates that index or concatenate
the client's data (deepseekv3 adds dict arguments to a string: TypeError). A client's
conversation that fails so is a 400, never a 500."""
_PROBE_SYSTEM = "\x1fclawrl-probe-system\x1f"
_PROBE_USER = "\x1fclawrl-probe-user\x1f"
_default_system_cache: dict[tuple[str, str | None], str | None] = {}


@dataclass(frozen=True)
class RenderedPrompt:
    """A rendered prompt.

    Attributes:
        token_ids: the ids of ``text``, tokenized whole (no special tokens added beyond the
            template's own).
        text: the rendered template text.
        message_spans: ``message_spans[i] = (start, end)``, the token range ``[start, end)`` of
            ``messages[i]`` (including its turn framing). Spans are contiguous and cover
            ``token_ids`` up to the generation prompt; the first starts at 0 and so includes
            whatever the template or renderer puts before the first message (BOS, a default or
            created system prompt). Messages that cannot be separated on a token boundary share
            one span (see :func:`render_prompt`).
        spans_fn: computes ``message_spans``.
    """

    token_ids: list[int]
    text: str
    spans_fn: Callable[[], list[tuple[int, int]]] = field(repr=False, compare=False)

    @functools.cached_property
    def message_spans(self) -> list[tuple[int, int]]:
        """Computed on first use (it renders every message prefix; a call whose history holds
        no recorded answer never needs it)."""
        return self.spans_fn()


def supports_native_tools(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether the tokenizer's chat template renders tools itself (its source mentions ``tools``).

    Raises:
        ModelLoadError: the tokenizer has no chat template.
    """
    return "tools" in _template_source(tokenizer)


def _valid_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _surrogate_param(messages: Sequence[ChatMessage], tools: Sequence[ToolSpec]) -> str:
    """Where the first invalid string is (``messages[i]``, ``tools``), for the error's param."""
    for i, m in enumerate(messages):
        if not _valid_unicode(str(m.model_dump())):
            return f"messages[{i}]"
    return "tools" if tools else "messages"


def render_prompt(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[ChatMessage],
    tools: Sequence[ToolSpec] | None = None,
    tool_choice: ToolChoice | None = None,
    add_generation_prompt: bool = True,
) -> RenderedPrompt:
    """Render a conversation to token ids with the tokenizer's chat template.

    Spans: the growing prefixes ``messages[:k]`` (k = 1..n) are rendered without the generation
    prompt. Prefix k closes a span when its text is a prefix of the full text and its tokens are a
    token prefix of the full ids: the text between the previous boundary and this one, tokenized on
    its own, equals the corresponding slice of the full ids (and the text after the last boundary
    tokenizes on its own to the remaining ids). A message whose end fails this (a template that
    merges turns, e.g. consecutive tool results in the fallback, or one that rewrites earlier
    turns) shares its span with the following message(s); in the worst case the last span runs to
    the end of ``token_ids``. Spans are therefore always exact token boundaries, never guessed.

    The generation prompt of a conversation is a token prefix of the same conversation followed
    by an assistant message as long as that message's text does not start with whitespace that the
    tokenizer merges with the generation prompt's trailing newline (e.g. content ``"\\n\\nHi"``).

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template.
        messages: the conversation.
        tools: the tools offered to the policy.
        tool_choice: ``None`` means ``auto``.
        add_generation_prompt: append the template's assistant-turn opener.

    Returns:
        The text, its token ids and one span per message.

    Raises:
        ClientInputError: (400) the template rejected the conversation (e.g. it demands
            alternating roles).
        ModelLoadError: the tokenizer has no chat template.
    """
    choice = tool_choice or ToolChoice()
    offered = list(tools or []) if choice.mode != "none" else []
    native = supports_native_tools(tokenizer)
    one_call = native and detect_tool_call_format(_template_source(tokenizer)) == "llama3_json"
    payload: list[dict[str, Any]] | None = None
    if native and offered:
        payload = [t.openai_format() for t in offered]
    extra = _system_extra(offered, choice, native)
    default_system = _default_system_prompt(tokenizer) if extra else None

    def render(msgs: Sequence[ChatMessage], generation_prompt: bool) -> str:
        conv = _template_messages(msgs, native=native, extra=extra, default_system=default_system,
                                  one_call_per_message=one_call)  # fmt: skip
        return _apply_template(tokenizer, conv, payload, generation_prompt)

    try:
        text = render(messages, add_generation_prompt)
    except TEMPLATE_ERRORS as e:
        raise ClientInputError(
            f"the policy's chat template rejected the conversation: {e}", param="messages"
        ) from e
    if not _valid_unicode(text):  # a JSON "\\ud800" decodes to a lone surrogate: no UTF-8
        raise ClientInputError(
            "the conversation contains invalid Unicode (a lone surrogate such as \\ud800); "
            "send valid UTF-8 text",
            param=_surrogate_param(messages, offered),
            code="invalid_unicode",
        )

    encode_many = batch_encoder(tokenizer)
    ids = encode_many([text])[0]

    def spans() -> list[tuple[int, int]]:
        context = context_key(
            _template_source(tokenizer), tokenizer.special_tokens_map, payload, extra, native,
            default_system,
        )  # fmt: skip
        candidates = _span_candidates(lambda m: render(m, False), messages, text, context)
        # every segment between candidate boundaries (and the tail after the last) in one
        # tokenizer call, only those not tokenized on an earlier call: the common case, where
        # every candidate is accepted
        cuts = [0, *(char for _, char in candidates)]
        segments = [text[a:b] for a, b in itertools.pairwise(cuts)]
        encoded = encode_segments([*segments, text[cuts[-1] :]], encode_many,
                                  tokenizer_key(tokenizer))  # fmt: skip
        return _message_spans(messages, text, ids, candidates, encoded,
                              lambda s: encode_many([s])[0])  # fmt: skip

    return RenderedPrompt(token_ids=ids, text=text, spans_fn=spans)


_BACKEND_OK: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def batch_encoder(tokenizer: PreTrainedTokenizerBase) -> Callable[[list[str]], list[list[int]]]:
    """``texts -> ids per text``, without special tokens added: one call into a fast
    tokenizer's Rust backend for all texts (the Python wrapper around ``tokenizer.encode`` cost
    more than the tokenization itself); other tokenizers, or a backend that disagrees with
    ``tokenizer.encode`` on a probe with special tokens, encode text by text."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    ok = _BACKEND_OK.get(tokenizer) if backend is not None else False
    if ok is None and backend is not None:
        probe = "".join(str(t) for t in getattr(tokenizer, "all_special_tokens", ())[:4])
        probe += " Hello  world\n\n\tx = 1 <x>é✓ "
        ok = backend.encode(probe, add_special_tokens=False).ids == (
            tokenizer.encode(probe, add_special_tokens=False)
        )
        with contextlib.suppress(TypeError):  # not weak-referenceable: probed each time
            _BACKEND_OK[tokenizer] = ok
    if backend is not None and ok:
        return lambda texts: [e.ids for e in backend.encode_batch(texts, add_special_tokens=False)]
    return lambda texts: [tokenizer.encode(t, add_special_tokens=False) for t in texts]


def _span_candidates(
    render: Callable[[Sequence[ChatMessage]], str],
    messages: Sequence[ChatMessage],
    text: str,
    context: bytes,
) -> list[tuple[int, int]]:
    """Candidate boundaries: (number of messages, char offset) where the prefix's text is a
    prefix of ``text`` (compared by sha1; prefix renders remembered across calls:
    :mod:`clawrl.chat.prefix_cache`)."""
    renders = prefix_renders(render, messages, context, TEMPLATE_ERRORS)
    digests = text_prefix_digests(text, [n for n, _ in renders])
    candidates: list[tuple[int, int]] = []
    last_char = 0
    for k, (n, digest) in enumerate(renders, start=1):
        if n >= last_char and digests.get(n) == digest:
            candidates.append((k, n))
            last_char = n
    return candidates


def _message_spans(
    messages: Sequence[ChatMessage],
    text: str,
    ids: list[int],
    candidates: list[tuple[int, int]],
    pre_encoded: list[list[int]],
    encode: Callable[[str], list[int]],
) -> list[tuple[int, int]]:
    """One span per message from the candidate boundaries; ``pre_encoded`` holds the segments
    between consecutive candidates and the tail after the last (used while every candidate so
    far was accepted; after a rejected one, segments are encoded afresh)."""
    # Accepted boundaries: (number of messages, char offset, token offset).
    accepted = [(0, 0, 0)]
    for j, (k, char) in enumerate(candidates):
        _, start_char, start_tok = accepted[-1]
        all_so_far = len(accepted) == j + 1
        segment = pre_encoded[j] if all_so_far else encode(text[start_char:char])
        if ids[start_tok : start_tok + len(segment)] == segment:
            accepted.append((k, char, start_tok + len(segment)))
    tail = pre_encoded[-1] if len(accepted) == len(candidates) + 1 else None
    while len(accepted) > 1:
        rest = tail if tail is not None else encode(text[accepted[-1][1] :])
        if rest == ids[accepted[-1][2] :]:
            break
        accepted.pop()
        tail = None
    spans = []
    for i in range(len(messages)):
        start = max(tok for k, _, tok in accepted if k <= i)
        end = min((tok for k, _, tok in accepted if k >= i + 1), default=len(ids))
        spans.append((start, end))
    return spans


def _system_extra(tools: list[ToolSpec], choice: ToolChoice, native: bool) -> str | None:
    if not tools:
        return None
    parts = [] if native else [tools_system_text(tools)]
    line = tool_choice_text(choice)
    if line:
        parts.append(line)
    return "\n\n".join(parts) or None


def _join(head: str | None, tail: str) -> str:
    return f"{head}\n\n{tail}" if head else tail


def _template_messages(
    messages: Sequence[ChatMessage],
    *,
    native: bool,
    extra: str | None,
    default_system: str | None,
    one_call_per_message: bool = False,
) -> list[dict[str, Any]]:
    out = (
        _native_messages(messages, one_call_per_message) if native else _fallback_messages(messages)
    )
    if extra:
        if messages and messages[0].role == "system":
            out[0]["content"] = _join(out[0]["content"], extra)
        else:
            out.insert(0, {"role": "system", "content": _join(default_system, extra)})
    return out


def _fallback_messages(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    i = 0
    while i < len(messages):
        m = messages[i]
        if m.role == "tool":
            j = i
            while j < len(messages) and messages[j].role == "tool":
                j += 1
            out.append({"role": "user", "content": tool_results_text(list(messages[i:j]))})
            i = j
            continue
        if m.role == "assistant":
            out.append({"role": "assistant", "content": assistant_message_text(m)})
        else:
            out.append({"role": m.role, "content": m.content or ""})
        i += 1
    return out


def canonical_call_id(k: int) -> str:
    """The id the native path gives the template for the ``k``-th tool call of a conversation
    (0-based): ``call`` + ``k`` in at least 5 digits, e.g. ``call00000`` (9 alphanumeric
    characters, the form Mistral's templates demand)."""
    return f"call{k:05d}"


class _CanonicalIds:
    """Canonical call ids for one conversation, assigned in order (see :func:`render_prompt`)."""

    def __init__(self) -> None:
        self._count = 0
        self._by_client: dict[str, str] = {}
        self._pending: list[str] = []

    def _fresh(self) -> str:
        self._count += 1
        return canonical_call_id(self._count - 1)

    def calls(self, calls: Sequence[ToolCall]) -> list[str]:
        ids = [self._fresh() for _ in calls]
        for call, cid in zip(calls, ids, strict=True):
            if call.id:
                self._by_client[call.id] = cid
        self._pending = list(ids)
        return ids

    def result(self, client_id: str | None) -> str:
        cid = self._by_client.get(client_id) if client_id else None
        if cid is None:
            cid = self._pending[0] if self._pending else self._fresh()
        if cid in self._pending:
            self._pending.remove(cid)
        return cid


def _native_messages(
    messages: Sequence[ChatMessage], one_call_per_message: bool
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    ids = _CanonicalIds()
    for m in messages:
        if m.role == "assistant":
            parts = [reasoning_text(m.reasoning)] if m.reasoning else []
            if m.content:
                parts.append(m.content)
            d: dict[str, Any] = {"role": "assistant", "content": "\n".join(parts)}
            calls = [
                {"id": cid, "type": "function",
                 "function": {"name": c.name, "arguments": c.arguments}}
                for c, cid in zip(m.tool_calls, ids.calls(m.tool_calls), strict=True)
            ]  # fmt: skip
            if len(calls) > 1 and one_call_per_message:
                out.append({**d, "tool_calls": calls[:1]})
                out.extend({"role": "assistant", "content": "", "tool_calls": [c]}
                           for c in calls[1:])  # fmt: skip
                continue
            if calls:
                d["tool_calls"] = calls
            out.append(d)
            continue
        d = {"role": m.role, "content": m.content or ""}
        if m.role == "tool":
            d["tool_call_id"] = ids.result(m.tool_call_id)
            if m.name is not None:
                d["name"] = m.name
        out.append(d)
    return out


def _apply_template(
    tokenizer: PreTrainedTokenizerBase,
    conv: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    add_generation_prompt: bool,
) -> str:
    text = tokenizer.apply_chat_template(
        conv,
        tools=tools,  # type: ignore[arg-type]  # transformers types it as list[dict | Callable]
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
    )
    assert isinstance(text, str)
    return text


def _template_source(tokenizer: PreTrainedTokenizerBase) -> str:
    return chat_template_source(tokenizer)


def _default_system_prompt(tokenizer: PreTrainedTokenizerBase) -> str | None:
    """The system prompt the template inserts when a conversation has none, found by probing."""
    key = (_template_source(tokenizer), tokenizer.bos_token)
    if key not in _default_system_cache:
        _default_system_cache[key] = _probe_default_system(tokenizer)
    return _default_system_cache[key]


def _probe_default_system(tokenizer: PreTrainedTokenizerBase) -> str | None:
    user = {"role": "user", "content": _PROBE_USER}
    try:
        alone = _apply_template(tokenizer, [user], None, False)
        with_system = _apply_template(
            tokenizer, [{"role": "system", "content": _PROBE_SYSTEM}, user], None, False
        )
    except TEMPLATE_ERRORS:
        return None
    at = with_system.find(_PROBE_SYSTEM)
    if at < 0:
        return None
    head, tail = with_system[:at], with_system[at + len(_PROBE_SYSTEM) :]
    if len(alone) < len(head) + len(tail) or not (alone.startswith(head) and alone.endswith(tail)):
        return None
    return alone[len(head) : len(alone) - len(tail)] or None
