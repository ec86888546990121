"""Which session a call belongs to, and which earlier turn it continues.

Explicit attribution, first match wins (recorded as the turn's ``session_source``):

1. the URL prefix ``/s/{session_id}/v1/...`` (``url``);
2. a session header, any letter case: ``X-Session-Id`` (opencode and clawrl's own clients), then
   ``X-Claude-Code-Session-Id`` and ``Session-Id`` (Codex) (``header``);
3. body fields ``session_id``, ``metadata.session_id``, ``metadata.user_id`` when it is a JSON
   string holding a ``session_id`` (Claude Code), ``user``, then ``prompt_cache_key`` (Codex; the
   Responses route passes it) (``body``).

Otherwise the call is linked by its prompt ids (``inferred``): a call whose prompt extends an
open session's recorded ``prompt + completion`` joins that session, with the longest such turn
as its parent (:meth:`clawrl.store.Store.find_extendable_turns`); a call whose prompt equals an
earlier call's prompt (a retry, or another choice) joins that call's session as its sibling;
anything else opens a new session. No call is ever discarded for lack of a session.

Within an explicitly named session the parent hint is found the same way, among that session's
turns only. Parents are hints: :func:`clawrl.trajectory.build_tree` re-derives the tree by ids.

Subagents (Claude Code sends ``X-Claude-Code-Agent-Id`` and ``X-Claude-Code-Parent-Agent-Id``
with the parent's session id): a subagent's calls stay in the parent's session, where their own
system prompt makes them a branch of their own (a new root, linked by ids among themselves);
:func:`agent_facts` records both ids on each turn, and :func:`parent_agent_turn` the parent
agent's latest turn when the subagent called (``client.parent_agent_turn_id``), which links the
branch to the call that spawned it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from clawrl.errors import ClientInputError
from clawrl.store import SessionSource, Store, TurnRecord

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
        parent_turn_id: the turn whose ``prompt + completion`` its prompt extends, if any.
        detail: how it was found (``prefix``, ``retry``, ``new``).
    """

    session_id: str | None
    parent_turn_id: str | None
    detail: str


def _check_id(value: Any, where: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        raise ClientInputError(f"{where} must be a string", param=where)
    value = value.strip()
    if not value:
        return None
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise ClientInputError(f"{where} must not contain control characters", param=where)
    if len(value) > MAX_SESSION_ID_LEN:
        raise ClientInputError(
            f"{where} is longer than {MAX_SESSION_ID_LEN} characters", param=where
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
    except ValueError:
        return None
    return obj.get("session_id") if isinstance(obj, dict) else None


def agent_facts(headers: Mapping[str, str]) -> dict[str, str]:
    """Subagent ids from the request headers (:data:`AGENT_HEADERS`), for a turn's ``client``
    facts; ``{}`` for a call of the main agent or a client without them."""
    out = {}
    for key, name in AGENT_HEADERS.items():
        value = (headers.get(name) or "").strip()
        if value and len(value) <= MAX_SESSION_ID_LEN and value.isprintable():
            out[key] = value
    return out


def parent_agent_turn(store: Store, session_id: str, parent_agent_id: str) -> str | None:
    """The latest turn of agent ``parent_agent_id`` in the session (blocking store read): the
    call that was waiting on the subagent. A turn without an ``agent_id`` is the main agent's,
    which is what a parent id that no turn carries refers to.

    Returns:
        Its turn id, or ``None`` when the session has no turn yet.
    """
    turns = store.session_turns(session_id)
    own = [t for t in turns if (t.client or {}).get("agent_id") == parent_agent_id]
    main = [t for t in turns if not (t.client or {}).get("agent_id")]
    pick = own or main
    return max(pick, key=lambda t: t.created_at).id if pick else None


def link_by_prompt(store: Store, prompt_ids: Sequence[int], session_id: str | None) -> Link:
    """Find the session and parent turn of a call from its prompt ids (blocking store reads).

    Args:
        store: the trajectory store.
        prompt_ids: the exact ids the engine will receive.
        session_id: restrict to this session (explicit attribution), or ``None`` to search
            every open session.

    Returns:
        The link; ``session_id`` is ``None`` when a new session must be opened.
    """
    prompt = list(prompt_ids)
    for turn in store.find_extendable_turns(prompt, since_s=INFER_WINDOW_S, limit=50):
        if session_id is not None and turn.session_id != session_id:
            continue
        if not turn.completion_ids:
            if turn.prompt_ids != prompt:
                continue  # a failed call has no output to continue from
            return Link(turn.session_id, turn.parent_turn_id, "retry")
        return Link(turn.session_id, turn.id, "prefix")
    same: list[TurnRecord] = store.find_turns_by_prompt(
        prompt, session_id=session_id, since_s=INFER_WINDOW_S, limit=1
    )
    if same:
        return Link(same[0].session_id, same[0].parent_turn_id, "retry")
    return Link(session_id, None, "new")
