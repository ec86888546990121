"""From a chat request to the exact prompt ids the engine receives, and the call's place in the
store: normalise, render, splice recorded ids, prefill forced tool calls, attribute the session
(and, for a call linked by its messages to a turn whose answer the template re-rendered, how
its prompt differs from that turn's sampled ids).

Everything here blocks (tokenizer, store reads); routes run :func:`prepare_call` in a worker
thread. Preparing writes nothing: a new session is created with the call's first turn.

Forced tool calls: constrained decoding is not implemented, so with the fallback tool format
(templates without native tools) ``tool_choice="required"`` prefills the assistant turn with
``<tool_call>`` and a named function with ``<tool_call>{"name": "NAME", "arguments": `` — the
exact text :func:`clawrl.chat.tool_call_text` renders for that call. The prefilled ids are part
of the prompt the engine receives (never trained: clawrl did not sample them); the turn records
their count as ``sampling_params["prefill_tokens"]`` so the next call can splice them back
(:mod:`clawrl.gateway.splice`). With a native-tools template only the template's instruction
applies.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from clawrl.chat import (
    ChatMessage,
    ToolChoice,
    ToolSpec,
    control_ids,
    normalize_openai_messages,
    normalize_openai_tools,
    normalize_tool_choice,
    render_prompt,
    supports_native_tools,
)
from clawrl.chat.tool_format import TOOL_CALL_OPEN
from clawrl.gateway.attribution import (
    CallSignals,
    ExplicitSession,
    Link,
    harness_session,
    link_call,
)
from clawrl.gateway.ephemeral import drop_ephemeral
from clawrl.gateway.seeding import session_seed
from clawrl.gateway.side_calls import side_kind_from_messages
from clawrl.gateway.splice import (
    describe_rewrite,
    generation_prompt_ids,
    message_output_hash,
    splice_history,
)
from clawrl.memory.prompt import MemoryOptions, apply_memory
from clawrl.store import SessionRecord, SessionSource, Store, TurnRecord, new_id


@dataclass
class PreparedCall:
    """A request rendered to ids and placed in a session.

    Attributes:
        messages: the normalised messages.
        tools: the normalised tools (``[]`` when none).
        tool_choice: the normalised choice.
        tools_enabled: whether tools were offered (tool-call markup is parsed).
        prompt_ids: exactly what the engine receives (spliced history + prefill), shape ``[p]``.
        prefill_text: text forced at the start of the assistant turn (``""``: none).
        prefill_tokens: how many trailing ``prompt_ids`` are the prefill.
        session_id: the session the call is recorded in (created if new).
        session_source: how it was attributed.
        attribution: where exactly (``header:x-session-id``, ``inferred:prefix``, ...).
        parent_turn_id: the hint of the turn this call continues.
        spliced: ``(message index, turn id)`` of history messages whose ids were replaced.
        side_kind: ``None`` for a main call, else the side-call kind
            (:mod:`clawrl.gateway.side_calls`); the turn is recorded with kind ``side``.
        link: how :func:`clawrl.gateway.attribution.link_call` placed it (rule, confidence,
            evidence).
        dropped: notes on client messages left out of the prompt
            (:mod:`clawrl.gateway.ephemeral`); ``messages`` is without them.
        new_session: the session to create with the call's first recorded turn (one commit
            for both; ``None``: the session exists). Nothing is written while preparing.
        history_link: when the call continues a turn by its messages because the template
            re-rendered that turn's answer to other ids (link rule ``history``), ``{"turn_id",
            "changes", "next_state_at"}`` (:func:`clawrl.gateway.splice.describe_rewrite`),
            recorded as the turn's ``client.history_link``; else ``None``.
        sampling_seed: the seed the call's session asks for (:mod:`clawrl.gateway.seeding`;
            sessions the call names: path, header or body, never inferred ones).
        sampling_attempt: with a seed, how many of the session's turns were sampled from
            ``prompt_ids`` before.
        memory: what the user's memory added to the system message
            (:func:`clawrl.memory.prompt.with_memory`; ``messages`` and ``prompt_ids`` hold it);
            ``None``: nothing (memory off, a side call, or no entries).
    """

    messages: list[ChatMessage]
    tools: list[ToolSpec]
    tool_choice: ToolChoice
    tools_enabled: bool
    prompt_ids: list[int]
    prefill_text: str
    prefill_tokens: int
    session_id: str
    session_source: SessionSource
    attribution: str
    parent_turn_id: str | None
    spliced: list[tuple[int, str]] = field(default_factory=list)
    side_kind: str | None = None
    dropped: list[str] = field(default_factory=list)
    link: Link | None = None
    new_session: SessionRecord | None = None
    history_link: dict[str, Any] | None = None
    sampling_seed: int | None = None
    sampling_attempt: int = 0
    memory: dict[str, Any] | None = None


EXACT_LINKS = frozenset({"prefix", "retry", "history"})
"""Link rules that prove a call continues a recorded turn by its ids or messages
(:func:`clawrl.gateway.attribution.link_call`); ``echo`` and ``dropped_answer`` do not look at
the system message, so they cannot tell which memory block a conversation had."""

_MAX_ATTEMPTS = 1000
"""Earlier turns with the same prompt counted for a seeded call's attempt number."""


def special_ids(tokenizer: Any) -> frozenset[int]:
    """The tokenizer's control ids: its special ids and the template's control tokens
    (:func:`clawrl.chat.control_ids`; cached with the template)."""
    return control_ids(tokenizer)


@dataclass
class _Attempt:
    """One way of rendering a call (with one memory option) and where it links."""

    option: dict[str, Any] | None
    messages: list[ChatMessage]
    rendered: Any
    spliced: Any
    prompt_ids: list[int]
    link: Link


def _turn_finder(
    store: Store, echo_hashes: tuple[str, ...], scope: str | None
) -> Callable[[str], list[TurnRecord]]:
    """Recorded turns by output hash: in the named session first, then anywhere (one query
    each for the call's assistant messages, more on demand)."""
    by_hash = store.find_turns_by_output_hashes(echo_hashes) if echo_hashes else {}
    in_scope = (
        store.find_turns_by_output_hashes(echo_hashes, session_id=scope)
        if scope and echo_hashes
        else {}
    )

    def find_turns(h: str) -> list[TurnRecord]:
        if in_scope.get(h):
            return in_scope[h]
        if h not in by_hash:
            by_hash[h] = store.find_turns_by_output_hash(h, limit=20)
        return by_hash[h]

    return find_turns


def prefill_for(choice: ToolChoice, native: bool) -> str:
    """The text forced at the start of the assistant turn for a tool choice (``""``: none)."""
    if native or choice.mode not in ("required", "function"):
        return ""
    if choice.mode == "required":
        return TOOL_CALL_OPEN
    name = json.dumps(choice.name, ensure_ascii=False)
    return f'{TOOL_CALL_OPEN}{{"name": {name}, "arguments": '


def prepare_call(
    tokenizer: Any,
    store: Store,
    raw_messages: Any,
    raw_tools: Any,
    raw_tool_choice: Any,
    explicit: ExplicitSession | None,
    *,
    client_name: str | None = None,
) -> PreparedCall:
    """Normalise, render, splice, prefill and attribute one call (blocking).

    Raises:
        ClientInputError: (400) bad messages, tools or tool choice, or a template that rejects
            the conversation; ``param`` names the field.
        StoreError: the store could not be read or the session not created.
    """
    messages = normalize_openai_messages(raw_messages)
    tools = normalize_openai_tools(raw_tools)
    choice = normalize_tool_choice(raw_tool_choice, tools)
    return prepare_messages(
        tokenizer, store, messages, tools, choice, explicit, client_name=client_name
    )


def prepare_messages(
    tokenizer: Any,
    store: Store,
    messages: list[ChatMessage],
    tools: list[ToolSpec],
    choice: ToolChoice,
    explicit: ExplicitSession | None,
    *,
    client_name: str | None = None,
    side_kind: str | None = None,
    retry_count: int | None = None,
    client: dict[str, Any] | None = None,
    memory: MemoryOptions | None = None,
    session_prefix: str = "",
) -> PreparedCall:
    """Render, splice, prefill and attribute already-normalised messages (blocking); every
    protocol (chat completions, Anthropic Messages, Responses) ends up here. Ephemeral harness
    messages are left out first (:func:`clawrl.gateway.ephemeral.drop_ephemeral`).

    Args:
        side_kind: a side-call kind the route already knows (e.g. from a header); otherwise it
            is recognised from the messages
            (:func:`clawrl.gateway.side_calls.side_kind_from_messages`).
        retry_count: the client's own retry count (``x-stainless-retry-count``; ``None``: not
            sent).
        client: who called (``{"user_agent", "api_key_fingerprint"}``, as the turn records
            them), for the rules that must follow one client
            (:class:`clawrl.gateway.attribution.CallSignals`).
        memory: the user's memory (``None``: off): a main call's messages get its entries in
            the system message. A call that continues a recorded turn keeps the memory that turn
            had (the conversation's prefix stays the one the policy saw); a new conversation
            gets the memory as it is now (:class:`clawrl.memory.MemoryOptions`).
        session_prefix: a user's namespace (``"USER:"``, a request with a user's API key):
            every session the call names is stored under it, a new session's id starts with
            it, and a call is never linked into a session outside it (it opens its own).

    Raises:
        ClientInputError: (400) a template that rejects the conversation.
        StoreError: the store could not be read.
    """
    messages, dropped = drop_ephemeral(messages)
    if explicit is None:
        explicit = harness_session(messages)
    if (
        explicit is not None
        and session_prefix
        and not explicit.session_id.startswith(session_prefix)
    ):
        explicit = replace(explicit, session_id=session_prefix + explicit.session_id)
    scope = explicit.session_id if explicit else None
    side_kind = side_kind or side_kind_from_messages(messages)
    native = supports_native_tools(tokenizer)
    prefill = prefill_for(choice, native)
    prefill_ids = tokenizer.encode(prefill, add_special_tokens=False) if prefill else []
    gen = generation_prompt_ids(tokenizer) or []

    def attempt(option: dict[str, Any] | None) -> _Attempt:
        msgs = apply_memory(client_messages, option)
        rendered = render_prompt(tokenizer, msgs, tools, choice)
        # every assistant message's recorded turns, in one query (and one in the named
        # session): the splice and the echo rule both read them
        echo_hashes = tuple(
            message_output_hash(m)
            for m in msgs
            if m.role == "assistant" and (m.content or m.tool_calls)
        )
        find_turns = _turn_finder(store, echo_hashes, scope)
        spliced = splice_history(tokenizer, msgs, rendered, find_turns)
        prompt_ids = [*spliced.token_ids, *prefill_ids]
        signals = CallSignals(
            retry_count=retry_count,
            side=side_kind is not None,
            client=client,
            find_by_output=find_turns,
            end_ids=special_ids(tokenizer),
            echo_hashes=echo_hashes,
            messages=tuple(msgs),
        )
        link = link_call(store, prompt_ids, scope, signals, gen)
        return _Attempt(option, msgs, rendered, spliced, prompt_ids, link)

    client_messages = messages
    options: list[dict[str, Any] | None] = [None]
    if memory is not None and side_kind is None:
        # the blocks of the recorded turns that gave the call's last answer come first
        last = next((m for m in reversed(client_messages)
                     if m.role == "assistant" and (m.content or m.tool_calls)), None)  # fmt: skip
        recorded: list[dict[str, Any] | None] = []
        if last is not None:
            h = message_output_hash(last)
            recorded = [t.memory for t in _turn_finder(store, (h,), scope)(h)]
        options = memory.options(store, scope, client_messages, recorded)
    # a conversation that began with another memory keeps it: the first option under which
    # the call continues a recorded turn exactly, else the first it continues at all
    first = attempt(options[0])
    chosen = first if first.link.detail in EXACT_LINKS else None
    loose = first if first.link.parent_turn_id is not None else None
    for option in options[1:] if chosen is None else ():
        tried = attempt(option)
        if tried.link.detail in EXACT_LINKS and tried.link.parent_turn_id is not None:
            chosen = tried
            break
        if loose is None and tried.link.parent_turn_id is not None:
            loose = tried
    chosen = chosen or loose or first
    option, messages, rendered, spliced = (
        chosen.option,
        chosen.messages,
        chosen.rendered,
        chosen.spliced,
    )
    prompt_ids, link = chosen.prompt_ids, chosen.link
    if session_prefix and not (link.session_id or "").startswith(session_prefix):
        link = Link(None, None, "new")  # another user's conversation is never joined or named
    history_link = None
    if link.history_turn is not None:
        rewrite = describe_rewrite(
            tokenizer, link.history_turn, messages, rendered, spliced, prompt_ids
        )
        history_link = {
            "turn_id": link.history_turn.id,
            "changes": rewrite.changes,
            "next_state_at": rewrite.next_state_at,
        }
    new_session: SessionRecord | None = None  # written with the call's first turn
    sampling_seed, sampling_attempt = None, 0
    if explicit is not None:
        known = store.get_session(explicit.session_id)  # a read, not a write, when known
        if known is not None:
            sampling_seed = session_seed(known.metadata)
            if sampling_seed is not None:
                earlier = store.find_turns_by_prompt(
                    prompt_ids, session_id=known.id, limit=_MAX_ATTEMPTS
                )
                sampling_attempt = len(earlier)
        else:
            new_session = SessionRecord(explicit.session_id, explicit.source, time.time(),
                                        client=client_name)  # fmt: skip
        session_id, source, attribution = explicit.session_id, explicit.source, explicit.detail
    elif link.session_id is not None:
        session_id, source = link.session_id, SessionSource.INFERRED
        attribution = f"inferred:{link.detail}"
    else:
        new_session = SessionRecord(session_prefix + new_id(), SessionSource.INFERRED,
                                    time.time(), client=client_name)  # fmt: skip
        session_id, source, attribution = new_session.id, SessionSource.INFERRED, "inferred:new"
    return PreparedCall(
        messages=messages,
        tools=tools,
        tool_choice=choice,
        tools_enabled=bool(tools) and choice.mode != "none",
        prompt_ids=prompt_ids,
        prefill_text=prefill,
        prefill_tokens=len(prefill_ids),
        session_id=session_id,
        session_source=source,
        attribution=attribution,
        parent_turn_id=link.parent_turn_id,
        spliced=spliced.spliced,
        side_kind=side_kind,
        dropped=dropped,
        link=link,
        new_session=new_session,
        history_link=history_link,
        sampling_seed=sampling_seed,
        sampling_attempt=sampling_attempt,
        memory=option,
    )
