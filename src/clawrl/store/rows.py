"""Row codec: record dataclasses <-> database rows (columns named as in :mod:`.schema`).

Rows read back are ``sqlite3.Row`` or :class:`clawrl.store.db.Row` (both read by column name).
A turn's stored prompt may be a delta (:mod:`clawrl.store.chains`); :func:`row_to_turn` takes
the rebuilt full ids and messages."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import fields
from enum import StrEnum
from typing import Any, TypeVar

from clawrl.errors import StoreError
from clawrl.store.chains import FullTurn
from clawrl.store.codec import (
    decode_floats,
    decode_ids,
    encode_floats,
    encode_ids,
    output_hash,
    prefix_digests,
)
from clawrl.store.types import (
    ApiProtocol,
    FeedbackRecord,
    SessionRecord,
    SessionSource,
    TurnKind,
    TurnRecord,
    TurnStatus,
    UntrainableReason,
)
from clawrl.store.users import user_id_problem

TURN_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(TurnRecord))
SESSION_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(SessionRecord))
FEEDBACK_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(FeedbackRecord))


def dump_json(value: Any, what: str) -> str:
    """Compact UTF-8 JSON text; raises :class:`StoreError` for values JSON cannot hold."""
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise StoreError(f"{what} is not JSON-serializable: {exc}") from exc


def load_json(text: str | None) -> Any:
    """Inverse of :func:`dump_json`; ``None`` stays ``None``."""
    return None if text is None else json.loads(text)


_E = TypeVar("_E", bound=StrEnum)


def _enum(enum_cls: type[_E], value: Any, what: str) -> _E:
    try:
        return enum_cls(value)
    except ValueError as exc:
        allowed = ", ".join(e.value for e in enum_cls)
        raise StoreError(f"{what} must be one of {allowed}, got {value!r}") from exc


def _reason(value: str | None) -> str | None:
    if value is None:
        return None
    try:
        return UntrainableReason(value)
    except ValueError:
        return value


def _user_id(value: Any) -> str:
    problem = user_id_problem(value)
    if problem is not None:
        raise StoreError(f"turn.user_id {problem}")
    return str(value)


def turn_to_row(turn: TurnRecord) -> dict[str, Any]:
    """Columns for ``turn``, its prompt whole (derived columns included; ``output_hash`` filled
    from ``output``; the storage columns say "not a delta": :mod:`clawrl.store.chains`).

    Raises:
        StoreError: a field has the wrong type or an unknown enum value.
    """
    if not isinstance(turn.session_id, str) or not turn.session_id:
        raise StoreError("turn.session_id must be a non-empty string")
    if not isinstance(turn.id, str) or not turn.id:
        raise StoreError("turn.id must be a non-empty string")
    prompt = encode_ids(turn.prompt_ids)
    completion = encode_ids(turn.completion_ids)
    seq = [*turn.prompt_ids, *turn.completion_ids]
    hashes = prefix_digests(seq, [len(turn.prompt_ids), len(seq)])
    out = turn.output
    out_hash = turn.output_hash
    if out_hash is None and isinstance(out, dict):
        out_hash = output_hash(out.get("content"), out.get("tool_calls"))
    return {
        "id": turn.id,
        "session_id": turn.session_id,
        "created_at": float(turn.created_at),
        "parent_turn_id": turn.parent_turn_id,
        "segment": turn.segment,
        "kind": _enum(TurnKind, turn.kind, "turn.kind").value,
        "side_kind": None if turn.side_kind is None else str(turn.side_kind),
        "protocol": _enum(ApiProtocol, turn.protocol, "turn.protocol").value,
        "status": _enum(TurnStatus, turn.status, "turn.status").value,
        "finish_reason": None if turn.finish_reason is None else str(turn.finish_reason),
        "error_kind": turn.error_kind,
        "error_message": turn.error_message,
        "policy_version": int(turn.policy_version),
        "choice_index": int(turn.choice_index),
        "trainable": 1 if turn.trainable else 0,
        "untrainable_reason": (
            None if turn.untrainable_reason is None else str(turn.untrainable_reason)
        ),
        "session_source": (
            None
            if turn.session_source is None
            else _enum(SessionSource, turn.session_source, "turn.session_source").value
        ),
        "output_hash": out_hash,
        "latency_s": turn.latency_s,
        "ttft_s": turn.ttft_s,
        "prompt_len": len(turn.prompt_ids),
        "completion_len": len(turn.completion_ids),
        "seq_len": len(seq),
        "prompt_hash": hashes[len(turn.prompt_ids)],
        "seq_hash": hashes[len(seq)],
        "sampling_params": dump_json(turn.sampling_params, "turn.sampling_params"),
        "client": dump_json(turn.client, "turn.client"),
        "output": None if out is None else dump_json(out, "turn.output"),
        "tools": None if turn.tools is None else dump_json(turn.tools, "turn.tools"),
        "request_messages": dump_json(turn.request_messages, "turn.request_messages"),
        "prompt_ids": prompt,
        "completion_ids": completion,
        "sampling_logprobs": encode_floats(turn.sampling_logprobs),
        "prefix_turn_id": None,
        "prefix_len": 0,
        "messages_prefix_len": 0,
        "memory": None if turn.memory is None else dump_json(turn.memory, "turn.memory"),
        "user_id": _user_id(turn.user_id),
        "adapter_version": None if turn.adapter_version is None else int(turn.adapter_version),
    }


def row_to_turn(row: Mapping[str, Any], full: FullTurn) -> TurnRecord:
    """A :class:`TurnRecord` from a ``turns`` row and its rebuilt ids and messages (``full``)."""
    return TurnRecord(
        id=row["id"],
        session_id=row["session_id"],
        created_at=row["created_at"],
        parent_turn_id=row["parent_turn_id"],
        segment=row["segment"],
        kind=TurnKind(row["kind"]),
        side_kind=row["side_kind"],
        protocol=ApiProtocol(row["protocol"]),
        status=TurnStatus(row["status"]),
        finish_reason=row["finish_reason"],
        error_kind=row["error_kind"],
        error_message=row["error_message"],
        policy_version=row["policy_version"],
        choice_index=row["choice_index"],
        trainable=bool(row["trainable"]),
        untrainable_reason=_reason(row["untrainable_reason"]),
        session_source=(
            None if row["session_source"] is None else SessionSource(row["session_source"])
        ),
        output_hash=row["output_hash"],
        latency_s=row["latency_s"],
        ttft_s=row["ttft_s"],
        sampling_params=load_json(row["sampling_params"]),
        client=load_json(row["client"]),
        output=load_json(row["output"]),
        tools=load_json(row["tools"]),
        request_messages=list(full.messages),
        prompt_ids=decode_ids(full.prompt),
        completion_ids=decode_ids(full.completion),
        sampling_logprobs=decode_floats(row["sampling_logprobs"]),
        memory=load_json(row["memory"]) if "memory" in row.keys() else None,  # noqa: SIM118
        user_id=row["user_id"] if "user_id" in row.keys() else "",  # noqa: SIM118
        adapter_version=row["adapter_version"] if "adapter_version" in row.keys() else None,  # noqa: SIM118
    )


def session_to_row(session: SessionRecord) -> dict[str, Any]:
    """Columns for ``session``; raises :class:`StoreError` on a bad source or metadata."""
    if not isinstance(session.id, str) or not session.id:
        raise StoreError("session id must be a non-empty string")
    return {
        "id": session.id,
        "source": _enum(SessionSource, session.source, "session source").value,
        "created_at": float(session.created_at),
        "ended_at": session.ended_at,
        "client": session.client,
        "metadata": dump_json(session.metadata, "session metadata"),
    }


def row_to_session(row: Mapping[str, Any]) -> SessionRecord:
    """A :class:`SessionRecord` from a ``sessions`` row."""
    return SessionRecord(
        id=row["id"],
        source=SessionSource(row["source"]),
        created_at=row["created_at"],
        ended_at=row["ended_at"],
        client=row["client"],
        metadata=load_json(row["metadata"]),
    )


def feedback_to_row(fb: FeedbackRecord) -> dict[str, Any]:
    """Columns for ``fb``; raises :class:`StoreError` when the reward is outside [-1, 1]."""
    reward = float(fb.reward)
    if not -1.0 <= reward <= 1.0:
        raise StoreError(f"feedback reward must be in [-1, 1], got {fb.reward!r}")
    if fb.turn_id is None and fb.session_id is None:
        raise StoreError("feedback needs a turn_id or a session_id")
    return {
        "id": fb.id,
        "turn_id": fb.turn_id,
        "session_id": fb.session_id,
        "reward": reward,
        "comment": fb.comment,
        "created_at": float(fb.created_at),
    }


def row_to_feedback(row: Mapping[str, Any]) -> FeedbackRecord:
    """A :class:`FeedbackRecord` from a ``feedback`` row."""
    return FeedbackRecord(
        id=row["id"],
        turn_id=row["turn_id"],
        session_id=row["session_id"],
        reward=row["reward"],
        comment=row["comment"],
        created_at=row["created_at"],
    )


def insert_sql(table: str, columns: list[str] | tuple[str, ...], *, or_ignore: bool = False) -> str:
    """``INSERT INTO table (c1, ...) VALUES (:c1, ...) [ON CONFLICT DO NOTHING]`` (both
    dialects)."""
    names = ", ".join(columns)
    params = ", ".join(f":{c}" for c in columns)
    tail = " ON CONFLICT DO NOTHING" if or_ignore else ""
    return f"INSERT INTO {table} ({names}) VALUES ({params}){tail}"
