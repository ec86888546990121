"""Typed records the store takes and returns, and the enums for their states and reasons.

Every field of :class:`TurnRecord`, :class:`SessionRecord` and :class:`FeedbackRecord` is one
column of its table (see :mod:`clawrl.store.schema`); a test fails when the two drift.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


def new_id() -> str:
    """A fresh random id (32 hex characters, uuid4)."""
    return uuid.uuid4().hex


class SessionSource(StrEnum):
    """How the gateway attributed a call to its session."""

    URL = "url"  # the session id was in the request path (e.g. /s/{id}/v1/...)
    HEADER = "header"  # a header such as x-claude-code-session-id, session-id, x-session-id
    BODY = "body"  # a body field such as metadata.user_id or prompt_cache_key
    INFERRED = "inferred"  # history-prefix matching (find_extendable_turns) or a fresh session
    HARNESS = "harness"  # clawrl's harness runner created it for one rollout


class ApiProtocol(StrEnum):
    """The client-facing API a call came in through."""

    OPENAI_CHAT = "openai.chat"
    ANTHROPIC_MESSAGES = "anthropic.messages"
    OPENAI_RESPONSES = "openai.responses"


class TurnKind(StrEnum):
    """Main trajectory call, or a side call (title, compaction, memory, ...)."""

    MAIN = "main"
    SIDE = "side"


class SideKind(StrEnum):
    """Known side-call kinds (``TurnRecord.side_kind`` also accepts any other string)."""

    TITLE = "title"
    COMPACTION = "compaction"
    MEMORY = "memory"
    COMMIT_MESSAGE = "commit_message"
    OTHER = "other"


class TurnStatus(StrEnum):
    """Outcome of one model call."""

    OK = "ok"  # the completion finished (stop or length) and was returned to the client
    INCOMPLETE = "incomplete"  # cut short: client disconnected mid-stream, aborted
    ERROR = "error"  # the call failed (engine error, client input error after rendering)
    PENDING = "pending"  # recorded before generation finished; still pending after a crash


class UntrainableReason(StrEnum):
    """Why a turn's sampled tokens get loss mask 0 (counted as ``untrainable/<value>``)."""

    INCOMPLETE = "incomplete"  # status incomplete
    ERROR = "error"  # status error
    PENDING = "pending"  # status pending (generation never finished, e.g. the server crashed)
    STOP_STRING_MISMATCH = "stop_string_mismatch"  # text cut at a stop string mid-token
    NO_TOKEN_IDS = "no_token_ids"  # ids could not be had (e.g. an external engine gave text)
    NO_COMPLETION = "no_completion"  # zero sampled tokens
    LOGPROBS_MISMATCH = "logprobs_mismatch"  # len(sampling_logprobs) != len(completion_ids)
    MARKED_UNTRAINABLE = "marked_untrainable"  # trainable=0 was recorded without a reason
    EVAL = "eval"  # an evaluation request (header X-Clawrl-Eval: 1): measured, never trained
    TRUNCATED_SAMPLING = "truncated_sampling"  # top_k / top_p: log-probs of a truncated
    # distribution, while the trainer and the OPD teacher score the full vocabulary
    UNCLOSED_REASONING = "unclosed_reasoning"  # stopped inside <think>: a tool call or answer
    # written after it was swallowed into reasoning
    SIDE_CALL = "side_call"  # a side call (title, compaction, memory, commit message, ...):
    # recorded as data, never trained, never a next state (see clawrl.gateway.side_calls)
    USER_ADAPTER = "user_adapter"  # sampled with a user's own adapter on top of the policy
    # (clawrl serve --per-user-adapters): its log-probs are not the shared policy's
    ABANDONED_RETRY = "abandoned_retry"  # a dead leaf: a later call of the same agent sent the
    # same prompt again (a retry), so nothing went on from this answer (the prefix tree decides
    # it, clawrl.trajectory.tree; the stored turn stays trainable)


@dataclass
class TurnRecord:
    """One model call, token-exact.

    Only ``session_id`` and ``prompt_ids`` are required; ``id`` and ``created_at`` default to a
    fresh uuid4 hex and the current time, so the gateway knows the id before recording.

    Attributes:
        session_id: the session this call belongs to (must exist: ``Store.get_or_create_session``).
        prompt_ids: token ids the engine received, shape ``[p]``.
        completion_ids: token ids the engine sampled, shape ``[c]`` (stop token included).
        sampling_logprobs: log-prob (nats) of each sampled id under the distribution actually
            sampled from, shape ``[c]``; stored as float64, so round-trips exactly.
        id: turn id (uuid4 hex unless given).
        parent_turn_id: the gateway's hint of the turn this one extends (e.g. found by
            ``find_turns_by_output_hash``); :func:`clawrl.trajectory.build_tree` verifies it by ids.
        segment: the gateway's hint of the segment; the trajectory tree recomputes segments.
        kind: main or side call.
        side_kind: for side calls, what kind (:class:`SideKind` or any string).
        protocol: the client API of the call.
        request_messages: the neutral chat messages as the client gave them (JSON list), with
            the memory block in the system message when ``memory`` says so.
        tools: the tool declarations as given (JSON list), or ``None``.
        sampling_params: the sampling parameters used (JSON object).
        policy_version: the version of the weights that sampled every token.
        finish_reason: ``stop`` | ``length`` | ``aborted`` | ``tool_calls`` | ... (engine/gateway).
        status: see :class:`TurnStatus`.
        error_kind: for errors, the error class name or a short code.
        error_message: for errors, the message.
        output: the parsed completion: ``{"content", "reasoning", "tool_calls"}`` (JSON object).
        output_hash: :func:`clawrl.store.output_hash` of the output; computed by
            ``record_turn`` from ``output`` when left ``None``.
        latency_s: seconds from admission to the last token.
        ttft_s: seconds from admission to the first token.
        client: request facts (user-agent, remote addr, api-key fingerprint, request id,
            retry count; JSON object).
        session_source: how the session was attributed for this call.
        trainable: False when the turn must not be trained on (``untrainable_reason`` says why).
        untrainable_reason: a :class:`UntrainableReason` value (or another string).
        created_at: seconds since the epoch when the request arrived.
        choice_index: which choice for ``n > 1`` requests (0 otherwise).
        memory: what the gateway added to the prompt from the user's memory
            (:func:`clawrl.memory.prompt.with_memory`: ``{"entries", "text", "index", "mode"}``);
            ``prompt_ids`` and ``request_messages`` hold it (what the policy saw;
            :func:`clawrl.memory.prompt.without_memory` gives the client's messages back);
            ``None``: nothing.
        user_id: whose request this turn answered (:mod:`clawrl.gateway.users`: a header, the
            body's end-user field or the API key, as ``server.user_from`` says); ``""``: no
            user (the served policy's, as in :class:`clawrl.store.memory.MemoryEntryRecord`).
        adapter_version: the version of the user's own adapter that sampled the turn on top of
            ``policy_version`` (``clawrl serve --per-user-adapters``); ``None``: the policy alone.
    """

    session_id: str
    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    sampling_logprobs: list[float] = field(default_factory=list)
    id: str = field(default_factory=new_id)
    parent_turn_id: str | None = None
    segment: int | None = None
    kind: TurnKind = TurnKind.MAIN
    side_kind: str | None = None
    protocol: ApiProtocol = ApiProtocol.OPENAI_CHAT
    request_messages: list[dict[str, Any]] = field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    sampling_params: dict[str, Any] = field(default_factory=dict)
    policy_version: int = 0
    finish_reason: str | None = None
    status: TurnStatus = TurnStatus.OK
    error_kind: str | None = None
    error_message: str | None = None
    output: dict[str, Any] | None = None
    output_hash: str | None = None
    latency_s: float | None = None
    ttft_s: float | None = None
    client: dict[str, Any] = field(default_factory=dict)
    session_source: SessionSource | None = None
    trainable: bool = True
    untrainable_reason: str | None = None
    created_at: float = field(default_factory=time.time)
    choice_index: int = 0
    memory: dict[str, Any] | None = None
    user_id: str = ""
    adapter_version: int | None = None

    @property
    def seq_ids(self) -> list[int]:
        """``prompt_ids + completion_ids``, shape ``[p + c]``."""
        return [*self.prompt_ids, *self.completion_ids]


@dataclass
class SessionRecord:
    """One session (a conversation, an agent run, a harness rollout).

    Attributes:
        id: session id (the client's own id when it sent one, else uuid4 hex).
        source: how it was attributed (:class:`SessionSource`).
        created_at: seconds since the epoch.
        ended_at: when it was ended (``Store.end_session``), else ``None`` (open).
        client: the client or harness name, e.g. ``claude-code`` (free text).
        metadata: anything else (JSON object).
    """

    id: str
    source: SessionSource
    created_at: float
    ended_at: float | None = None
    client: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class SessionSummary:
    """A session with counts, as listed by ``Store.list_sessions``.

    ``trainable_turns`` counts turns stored with ``trainable=1`` and status ok; the trajectory
    tree may still exclude some (e.g. logprobs misaligned), with a reason.
    """

    session: SessionRecord
    turns: int
    trainable_turns: int
    side_turns: int
    failed_turns: int  # status other than ok
    feedback: int
    prompt_tokens: int  # summed over turns
    completion_tokens: int  # summed over turns
    last_turn_at: float | None
    user_ids: tuple[str, ...] = ()  # whose turns it holds (sorted; turns without a user left out)


@dataclass
class FeedbackRecord:
    """Explicit feedback on a turn or a whole session (a next-state signal).

    Attributes:
        reward: in [-1, 1].
        turn_id: the turn it is about, or ``None`` for session-level feedback.
        session_id: the session (filled from the turn when only ``turn_id`` is given).
        comment: free text (e.g. what should have been done).
        id: uuid4 hex.
        created_at: seconds since the epoch.
    """

    reward: float
    turn_id: str | None = None
    session_id: str | None = None
    comment: str | None = None
    id: str = field(default_factory=new_id)
    created_at: float = field(default_factory=time.time)
