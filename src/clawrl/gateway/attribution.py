"""Which session a call belongs to, and which earlier turn it continues.

Explicit attribution, first match wins (recorded as the turn's ``session_source``):

1. the URL prefix ``/s/{session_id}/v1/...`` (``url``);
2. a session header, any letter case: ``X-Session-Id`` (opencode and clawrl's own clients), then
   ``X-Claude-Code-Session-Id`` and ``Session-Id`` (Codex) (``header``);
3. body fields ``session_id``, ``metadata.session_id``, ``metadata.user_id`` when it is a JSON
   string holding a ``session_id`` (Claude Code), ``user``, then ``prompt_cache_key`` (Codex; the
   Responses route passes it) (``body``);
4. a session id the harness writes into its prompt: OpenClaw's ``Runtime: ... sessionId=ID``
   line (:func:`harness_session`, ``body:openclaw_runtime``).

Otherwise the call is inferred (``inferred:RULE``) by :func:`link_call`: an exact prefix of a
recorded ``prompt + completion``, a retry (of a failed call, or marked a retry by the client),
a history that repeats a recorded turn's messages and answer (the template re-rendered the
answer to other ids), a history that echoes recorded answers, a prompt that repeats an earlier
one with its answer dropped, a side call joining its client's latest session, else a new
session. Each rule records a confidence (``exact``, ``medium``, ``low``) and its evidence on the
turn (``client.attribution_confidence``, ``client.attribution_evidence``). No call is ever
discarded for lack of a session; an identical first prompt from a second client is never taken
for a retry of the first one's successful call.

Within an explicitly named session the parent hint is found by the exact rules, then the
message rule, among that session's turns only. Parents are hints:
:func:`clawrl.trajectory.build_tree` re-derives the tree by ids (by messages where a template
re-rendered an answer).

Subagents (Claude Code sends ``X-Claude-Code-Agent-Id``, and ``X-Claude-Code-Parent-Agent-Id``
for nested ones, with the parent's session id): a subagent's calls stay in the parent's session,
as a branch of their own (the tree links a turn only to turns of the same agent);
:func:`agent_facts` records the ids on each turn, and :func:`spawning_turn` links the agent's
first call to the parent-agent turn whose tool call launched it (``client.parent_agent_turn_id``
and ``client.spawn_link``).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from clawrl.chat import ChatMessage
from clawrl.errors import ClientInputError
from clawrl.store import SessionSource, Store, TurnRecord, TurnStatus, encode_ids, output_hash
from clawrl.trajectory.history import continues

SESSION_HEADERS = ("x-session-id", "x-claude-code-session-id", "session-id")
"""Headers that name a session, in priority order (compared in lower case)."""
AGENT_HEADERS = {
    "agent_id": "x-claude-code-agent-id",
    "parent_agent_id": "x-claude-code-parent-agent-id",
}
"""Subagent headers, by the key they are recorded under in a turn's ``client`` facts."""

MAX_SESSION_ID_LEN = 256
INFER_WINDOW_S = 6 * 3600.0
"""Only turns this recent are candidates for prefix inference (seconds)."""


@dataclass(frozen=True)
class ExplicitSession:
    """A session named by the client.

    Attributes:
        session_id: the id as given.
        source: url, header or body.
        detail: where exactly (``url``, ``header:x-session-id``, ``body:metadata.session_id``).
    """

    session_id: str
    source: SessionSource
    detail: str


@dataclass(frozen=True)
class Link:
    """Where a call goes in the store.

    Attributes:
        session_id: its session (``None``: open a new one).
        parent_turn_id: the turn whose ``prompt + completion`` its prompt extends, if any (a
            hint: the tree re-derives parents by ids).
        detail: which rule of :func:`link_call` found it (``prefix``, ``retry``, ``history``,
            ``echo``, ``dropped_answer``, ``side_recent``, ``new``).
        confidence: ``exact`` (ids or an explicit id), ``medium`` or ``low``.
        extra: the evidence, recorded with the turn (e.g. ``echoed_tokens``).
        history_turn: for ``history``, the turn whose messages and answer the call repeats
            (the gateway describes how the template re-rendered it).
    """

    session_id: str | None
    parent_turn_id: str | None
    detail: str
    confidence: str = "exact"
    extra: Mapping[str, Any] = field(default_factory=dict)
    history_turn: TurnRecord | None = None


def _check_id(value: Any, where: str) -> str | None:
    # the body's ``user`` names the user too (clawrl.gateway.users): the same code either way
    code = "invalid_user" if where == "user" else None
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        raise ClientInputError(f"{where} must be a string", param=where, code=code)
    value = value.strip()
    if not value:
        return None
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise ClientInputError(
            f"{where} must not contain control characters", param=where, code=code
        )
    if len(value) > MAX_SESSION_ID_LEN:
        raise ClientInputError(
            f"{where} is longer than {MAX_SESSION_ID_LEN} characters", param=where, code=code
        )
    return value


def explicit_session(
    path_session: str | None,
    headers: Mapping[str, str],
    body_session_id: Any = None,
    metadata: Mapping[str, Any] | None = None,
    user: Any = None,
    prompt_cache_key: Any = None,
) -> ExplicitSession | None:
    """The session the client names, in the order of the module docstring, or ``None``.

    Args:
        path_session: the ``{session_id}`` of a ``/s/{session_id}/...`` URL.
        headers: request headers (case-insensitive mapping, e.g. Starlette's ``Headers``).
        body_session_id: the body's ``session_id``.
        metadata: the body's ``metadata`` object.
        user: the body's ``user``.
        prompt_cache_key: the body's ``prompt_cache_key`` (Responses; Codex sets its session id).

    Raises:
        ClientInputError: (400) a session id that is not a string or is too long.
    """
    if (sid := _check_id(path_session, "session id in the URL")) is not None:
        return ExplicitSession(sid, SessionSource.URL, "url")
    for name in SESSION_HEADERS:
        if (sid := _check_id(headers.get(name), f"header {name}")) is not None:
            return ExplicitSession(sid, SessionSource.HEADER, f"header:{name}")
    if (sid := _check_id(body_session_id, "session_id")) is not None:
        return ExplicitSession(sid, SessionSource.BODY, "body:session_id")
    if metadata:
        sid = _check_id(metadata.get("session_id"), "metadata.session_id")
        if sid is not None:
            return ExplicitSession(sid, SessionSource.BODY, "body:metadata.session_id")
        sid = _check_id(_json_session_id(metadata.get("user_id")), "metadata.user_id.session_id")
        if sid is not None:
            return ExplicitSession(sid, SessionSource.BODY, "body:metadata.user_id")
    if (sid := _check_id(user, "user")) is not None:
        return ExplicitSession(sid, SessionSource.BODY, "body:user")
    if (sid := _check_id(prompt_cache_key, "prompt_cache_key")) is not None:
        return ExplicitSession(sid, SessionSource.BODY, "body:prompt_cache_key")
    return None


def _json_session_id(value: Any) -> Any:
    """The ``session_id`` inside a JSON-object string (Claude Code's ``metadata.user_id``), or
    ``None`` for anything else (a plain user id string is not a session)."""
    if not isinstance(value, str) or not value.lstrip().startswith("{"):
        return None
    try:
        obj = json.loads(value)
    except (ValueError, RecursionError):  # not JSON, or nested too deep to parse
        return None
    return obj.get("session_id") if isinstance(obj, dict) else None


_RETRY_COUNT = re.compile(r"[0-9]{1,9}")


def retry_count(headers: Mapping[str, str]) -> int | None:
    """The client's retry count (``x-stainless-retry-count``: 0 for a first attempt), or ``None``
    when the header is absent or not 1-9 ASCII digits (``"²"``, ``"-1"``, 5000 digits)."""
    raw = (headers.get("x-stainless-retry-count") or "").strip()
    return int(raw) if _RETRY_COUNT.fullmatch(raw) else None


def agent_facts(headers: Mapping[str, str]) -> dict[str, str]:
    """Subagent ids from the request headers (:data:`AGENT_HEADERS`), for a turn's ``client``
    facts; ``{}`` for a call of the main agent or a client without them (a blank header counts
    as absent).

    Raises:
        ClientInputError: (400) an id with control characters or longer than
            :data:`MAX_SESSION_ID_LEN`, as for session ids: a subagent whose id were dropped
            would be taken for the main agent.
    """
    out = {}
    for key, name in AGENT_HEADERS.items():
        value = _check_id(headers.get(name), f"header {name}")
        if value is not None:
            out[key] = value
    return out


MIN_ECHO_TOKENS = 16
"""History echo needs at least this many recorded completion tokens, in messages that match one
session only, before it joins a session (a short ``"OK."`` is said in many sessions)."""
MIN_CONTEXT_TOKENS = 32
"""A dropped-answer continuation must repeat at least this many tokens of an earlier prompt."""
DROPPED_WINDOW_S = 600.0
"""A dropped-answer continuation follows the dropped call within this many seconds."""
SIDE_RECENT_S = 300.0
"""A side call without any other link joins the session of the same client's latest main turn
within this many seconds."""

_RUNTIME_SESSION = re.compile(
    r"^Runtime:[^\n]*?\bsessionId=([A-Za-z0-9._:-]{4,128})(?=[\s|]|$)", re.MULTILINE
)


def harness_session(messages: Sequence[ChatMessage]) -> ExplicitSession | None:
    """A session id a harness writes into its prompt instead of a header (``None``: none).

    OpenClaw (2026.9.x) sends no session header, but every call's first user message carries a
    ``Runtime: agent=main | session=... | sessionId=ID | host=...`` line, unchanged across its
    retries (which rewrite the message text) and turns (``body:openclaw_runtime``). Only the
    first user message is read, and only a line that starts with ``Runtime:`` (a tool output
    quoting such a line later in the conversation does not count).
    """
    found = _RUNTIME_SESSION.search(first_user_text(messages))
    if found:
        return ExplicitSession(found.group(1), SessionSource.BODY, "body:openclaw_runtime")
    return None


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def first_user_text(messages: Sequence[ChatMessage]) -> str:
    """The text of the first user message (``""`` when there is none)."""
    return next((m.content or "" for m in messages if m.role == "user"), "")


def spawning_turn(
    store: Store, session_id: str, agent_id: str, parent_agent_id: str | None, first_user: str
) -> tuple[str | None, str] | None:
    """The turn that spawned subagent ``agent_id`` (blocking store read), and how it was found;
    ``None`` when the agent already has a turn in the session (only its first call is linked).

    Rule, on the turns of the parent agent (``parent_agent_id``'s when given and present, else
    the main agent's: turns without an agent id), newest first:

    1. ``tool_call_prompt``: the latest turn with a tool call one of whose string arguments (at
       least 8 characters) occurs in the subagent's first user message: Claude Code's
       ``Agent`` / ``Task`` tool passes the subagent its ``prompt`` argument verbatim;
    2. ``latest_parent_turn``: else the latest such turn (the call that was waiting on it).

    Returns:
        ``(turn id, rule)``, or ``(None, "none")`` when the session has no such turn.
    """
    if store.has_agent_turn(session_id, agent_id):
        return None
    rows = store.session_outputs(session_id)
    main = [r for r in rows if not r[2].get("agent_id")]
    turns = main
    if parent_agent_id is not None:
        turns = [r for r in rows if r[2].get("agent_id") == parent_agent_id] or main
    turns.sort(key=lambda r: r[1], reverse=True)
    for turn_id, _, _, output in turns:
        for c in (output or {}).get("tool_calls") or []:
            if any(len(s) >= 8 and s in first_user for s in _strings(c.get("arguments"))):
                return turn_id, "tool_call_prompt"
    return (turns[0][0], "latest_parent_turn") if turns else (None, "none")


@dataclass(frozen=True)
class CallSignals:
    """What a call says about itself beyond its prompt, for :func:`link_call`.

    Attributes:
        retry_count: the client's own retry count (:func:`retry_count`; 0: a first attempt,
            ``None``: the client does not say).
        side: the call is a recognised side call (title, memory, ...).
        client: who called: ``{"user_agent", "api_key_fingerprint"}`` as the turn's client
            facts record them (``None``: unknown, every client matches).
        echo_hashes: the :func:`clawrl.store.output_hash` of each assistant message in the
            call's history, in order.
        find_by_output: ``output hash -> turns`` (newest first; those of the named session
            when it has some, else of any session), the lookup the splice step already made;
            ``None``: query the store.
        end_ids: the tokenizer's special ids: a recorded call's ``prompt + completion`` can
            only end next to one of them inside a later prompt (:func:`turn_ends`); ``None``:
            look for every length recorded recently (a scan that grows with traffic).
        messages: the call's messages (after ephemeral ones were left out), for the message
            rule (``()``: the rule does not run).
    """

    retry_count: int | None = None
    side: bool = False
    client: Mapping[str, Any] | None = None
    echo_hashes: tuple[str, ...] = ()
    find_by_output: Callable[[str], list[TurnRecord]] | None = None
    end_ids: frozenset[int] | None = None
    messages: tuple[ChatMessage, ...] = ()

    @property
    def client_key(self) -> str | None:
        return None if self.client is None else client_key(self.client)


def turn_ends(prompt_ids: Sequence[int], end_ids: frozenset[int]) -> list[int]:
    """Where a recorded call's ``prompt + completion`` can end inside ``prompt_ids``: right
    before or after each special token (a completion ends with the end-of-turn token, or is
    cut and followed by the one the template adds; a retry's prompt is the whole prompt), and
    at the end. Found with ``bytes.find`` on the int32 encoding, not a Python loop."""
    data = encode_ids(prompt_ids)
    out = {len(prompt_ids)}
    for special in end_ids:
        needle = encode_ids([special])
        at = data.find(needle)
        while at >= 0:
            if at % 4 == 0:
                out.update((at // 4, at // 4 + 1))
            at = data.find(needle, at + 1)
    return sorted(out)


def link_call(
    store: Store,
    prompt_ids: Sequence[int],
    session_id: str | None,
    signals: CallSignals = CallSignals(),
    generation_ids: Sequence[int] = (),
) -> Link:
    """Find the session and parent turn of a call (blocking store reads); module docstring.

    Within a named session (``session_id``) only the exact rules run (a parent hint). For a
    call that names none, first match wins:

    1. ``prefix``: it extends a recorded ``prompt + completion`` (longest, newest): confidence
       ``exact``;
    2. ``retry``: its prompt equals an earlier call's *from the same client* (user agent and API
       key, :func:`client_key`), and the client counts this call a retry
       (``x-stainless-retry-count`` >= 1), or says nothing and the earlier call failed: that
       call's sibling, ``exact``. A retry count of 0, an identical prompt after a successful
       call without a count, one from another client, or matches in several sessions (parallel
       rollouts) join nothing (``new``, with ``same_prompt_as``);
    3. ``history``: its messages repeat a recorded turn's messages and answer, with more after
       them (the message rule of :mod:`clawrl.trajectory.history`: whitespace, reasoning,
       tool-call JSON spacing and ids aside), the turn found by the output hash of one of the
       call's assistant messages, the deepest such answer first, from the same client, within
       :data:`INFER_WINDOW_S`: the template re-rendered that answer to other ids (Gemma 3 trims
       it, Qwen3 drops its reasoning): that turn's session, parent hint that turn, ``medium``
       (``exact`` within a named session: only the parent hint comes from it; evidence
       ``history_turn``); when turns of several sessions qualify at that depth, none is joined;
       turns of ended sessions are never continued;
    4. ``echo``: its history repeats answers the gateway recorded for the same client (assistant
       messages matched by output hash), at least :data:`MIN_ECHO_TOKENS` tokens of them, counted
       per session, in messages recorded in one session only; exactly one session must have
       that much: that session, parent hint the turn of its last echoed message, ``medium`` (a
       harness that re-renders an earlier message, a side call carrying the conversation);
    5. ``dropped_answer``: its prompt starts with an earlier main call's prompt minus the
       generation prompt (at least :data:`MIN_CONTEXT_TOKENS` tokens) and goes on differently,
       the earlier call from the same client within :data:`DROPPED_WINDOW_S`: the client
       dropped that answer and went on (mini-swe-agent after a format error): that call's
       session, ``medium``; when calls of several sessions qualify, none is joined;
    6. ``side_recent``: a recognised side call joins the session of the same client's latest
       main turn within :data:`SIDE_RECENT_S`, ``low`` (side calls are never trained, so a
       wrong guess costs no training signal);
    7. ``new``.

    Within a named session, rule 3 runs after rules 1-2 on that session's turns (of any
    source), for the parent hint. Only sessions that were themselves inferred are joined by
    rules 3-6, and only turns of the last :data:`INFER_WINDOW_S` seconds are candidates.

    Limits (documented in docs/harnesses.md): two clients that send byte-identical histories
    cannot be told apart by content; rule 2 keeps their first calls apart, but a later call of
    either that extends an answer both received identically joins the newer session (rule 1).
    """
    prompt = list(prompt_ids)
    ends = None if signals.end_ids is None else turn_ends(prompt, signals.end_ids)
    extendable = store.find_extendable_turns(
        prompt, since_s=INFER_WINDOW_S, limit=16, lengths=ends, session_id=session_id
    )  # longest first: the first with a completion is the one (older ones are its ancestors)
    for turn in extendable:
        if not turn.completion_ids:
            if turn.prompt_ids != prompt or session_id is None:
                continue  # no output to continue from; an inferred retry is rule 2's
            return Link(turn.session_id, turn.parent_turn_id, "retry")
        return Link(turn.session_id, turn.id, "prefix")
    same: list[TurnRecord] = store.find_turns_by_prompt(
        prompt, session_id=session_id, since_s=INFER_WINDOW_S, limit=20
    )
    if session_id is not None:
        if same:
            return Link(same[0].session_id, same[0].parent_turn_id, "retry")
        return _history_link(store, session_id, signals) or Link(session_id, None, "new")
    note: dict[str, Any] = {"same_prompt_as": same[0].id} if same else {}
    if signals.retry_count != 0:  # 0: the client's own count says first attempt
        mine = [t for t in same if _same_client(t, signals)]
        if signals.retry_count is None:
            mine = [t for t in mine if t.status != TurnStatus.OK]  # unmarked: only of a failure
        candidates = {t.session_id for t in mine}
        if len(candidates) == 1:
            return Link(mine[0].session_id, mine[0].parent_turn_id, "retry")
        if len(candidates) > 1:
            note["ambiguous_retry_sessions"] = len(candidates)  # parallel rollouts: join none
    history = _history_link(store, None, signals)
    if history is not None:
        return history
    echo = _echo_link(store, signals)
    if echo is not None:
        return echo
    dropped = _dropped_answer_link(store, prompt, generation_ids, signals)
    if dropped is not None:
        return dropped
    if signals.side and signals.client is not None:
        latest = store.recent_turns(
            SIDE_RECENT_S, limit=1, inferred_only=True, main_only=True, client_match=signals.client
        )
        if latest:
            return Link(latest[0].session_id, None, "side_recent", "low")
    return Link(None, None, "new", "exact", extra=note)


def client_key(client: Mapping[str, Any]) -> str:
    """Who called, for side-call attribution: user agent and API key fingerprint."""
    return f"{client.get('user_agent') or ''}|{client.get('api_key_fingerprint') or ''}"


def _same_client(turn: TurnRecord, signals: CallSignals) -> bool:
    """Whether ``turn`` came from the caller (same user agent and API key); ``True`` when the
    caller is unknown."""
    return signals.client_key is None or client_key(turn.client) == signals.client_key


def _history_link(store: Store, session_id: str | None, signals: CallSignals) -> Link | None:
    """Rule 3 of :func:`link_call` (``history``), within ``session_id`` when given."""
    messages = signals.messages
    lookup = signals.find_by_output
    dumped: list[dict[str, Any]] | None = None
    now = time.time()
    for j in range(len(messages) - 2, -1, -1):  # deepest answer first; a message must follow
        msg = messages[j]
        if msg.role != "assistant" or not (msg.content or msg.tool_calls):
            continue
        calls = [{"name": c.name, "arguments": c.arguments} for c in msg.tool_calls]
        h = output_hash(msg.content, calls)
        found = (
            lookup(h)
            if lookup is not None
            else store.find_turns_by_output_hash(h, session_id=session_id, limit=20)
        )
        turns = [
            t
            for t in found
            if t.completion_ids
            and len(t.request_messages) == j
            and (t.session_id == session_id if session_id is not None else _joinable(t, signals))
        ]
        if not turns:
            continue
        if dumped is None:
            dumped = [m.model_dump(mode="json") for m in messages]
        turns = [t for t in turns if continues(dumped, t.request_messages, t.output)]
        if len({t.session_id for t in turns}) > 1:
            # the same conversation in several sessions (ended or old ones included): never guess
            return None
        turns = [t for t in turns if now - t.created_at <= INFER_WINDOW_S]
        turns = [
            t for t in turns if t.session_id in _open_sessions(store, {t.session_id for t in turns})
        ]
        if not turns:
            continue
        turn = turns[0]  # newest
        confidence = "exact" if session_id is not None else "medium"  # named: only the parent
        extra = {"history_turn": turn.id}
        return Link(turn.session_id, turn.id, "history", confidence, extra, history_turn=turn)
    return None


def _open_sessions(store: Store, session_ids: set[str]) -> set[str]:
    """Those of ``session_ids`` that exist and were not ended (an ended session is never
    continued)."""
    sessions = (store.get_session(sid) for sid in sorted(session_ids))
    return {s.id for s in sessions if s is not None and s.ended_at is None}


def _joinable(turn: TurnRecord, signals: CallSignals) -> bool:
    """Whether an inferred call may join ``turn``'s session by content: the session was itself
    inferred, and ``turn`` came from the caller."""
    return turn.session_source == SessionSource.INFERRED and _same_client(turn, signals)


def _echo_link(store: Store, signals: CallSignals) -> Link | None:
    tokens: dict[str, int] = {}
    last: dict[str, TurnRecord] = {}
    now = time.time()
    for h in dict.fromkeys(signals.echo_hashes):  # each distinct answer once
        lookup = signals.find_by_output
        turns = lookup(h) if lookup is not None else store.find_turns_by_output_hash(h, limit=20)
        found = [t for t in turns if t.completion_ids]
        if len({t.session_id for t in found}) != 1:
            continue  # not recorded, or said in several sessions: no evidence
        turn = found[0]
        if turn.session_source != SessionSource.INFERRED or now - turn.created_at > INFER_WINDOW_S:
            continue
        if not _same_client(turn, signals):
            continue  # another client quoting that answer is no evidence
        tokens[turn.session_id] = tokens.get(turn.session_id, 0) + len(turn.completion_ids)
        last[turn.session_id] = turn
    enough = [sid for sid, n in tokens.items() if n >= MIN_ECHO_TOKENS]
    if len(enough) != 1:
        return None  # no session has enough evidence, or two have: ambiguous
    (sid,) = enough
    return Link(sid, last[sid].id, "echo", "medium", extra={"echoed_tokens": tokens[sid]})


def _dropped_answer_link(
    store: Store, prompt: list[int], generation_ids: Sequence[int], signals: CallSignals
) -> Link | None:
    if not generation_ids or len(prompt) <= MIN_CONTEXT_TOKENS:
        return None
    contexts = None
    if signals.end_ids is not None:  # a context ends at most 2 ids after an end-of-turn token
        ends = turn_ends(prompt, signals.end_ids)
        contexts = sorted({e + d for e in ends for d in (0, 1, 2) if e + d < len(prompt)})
    hits = store.find_dropped_answer_turns(
        prompt,
        generation_ids,
        since_s=DROPPED_WINDOW_S,
        min_context=MIN_CONTEXT_TOKENS,
        client_match=signals.client,
        context_lengths=contexts,
    )
    sessions = {t.session_id for t in hits}
    if len(sessions) != 1:
        return None  # none, or several sessions of this client qualify: never guess
    best = max(hits, key=lambda t: (len(t.prompt_ids), t.created_at))
    extra = {"dropped_turn": best.id}
    return Link(best.session_id, best.parent_turn_id, "dropped_answer", "medium", extra=extra)
