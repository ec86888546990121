"""``clawrl export --format jsonl``: one session (trajectory) per line.

Line format (``format: "clawrl.trajectory"``, ``version`` :data:`EXPORT_VERSION`)::

    {"format", "version", "session_id", "source", "client", "created_at", "ended_at",
     "metadata",
     "rows": [{"turn_ids", "input_ids", "loss_mask", "sampling_logprobs", "token_turn",
               "policy_versions", "trained_turn_ids", "untrained"}],      # see TrainingRow
     "turns": [{"id", "parent_id", "link", "history_changes", "segment", "depth",
                "root_reason", "kind", "side_kind",
                "agent_id", "spawned_by", "attribution", "attribution_confidence",
                "status", "finish_reason", "policy_version", "user_id", "adapter_version",
                "prompt_len", "completion_len",
                "trainable", "untrainable_reason", "memory",
                "next_state": null | {"role", "ids", "messages", "child_turn_id",
                                      "other_child_ids", "feedback", "note", "changes"}}],
     "feedback": [{"id", "turn_id", "reward", "comment", "created_at"}],
     "untrainable": {"untrainable/<reason>": count},
     "rollout": null | {"id", "task_id", "harness", "status", "reason", "timed_out",
                        "harness_exit", "wall_s", "isolation", "reward",
                        "group": {"id", "run_id", "label", "purpose", "step",
                                  "policy_version", "size", "decision", "reward_mean"},
                        "verifier": null | {"reward", "error", "scores"}}}

``rollout`` (version 2) is a harness rollout's record (:mod:`clawrl.store.rollouts`): ``reward``
is the verifier's reward when the rollout is ``ok``, else null; ``verifier`` is null when the
verifier never ran. Sessions that are no rollout have ``"rollout": null``.

``link`` (version 3) is how a turn is linked to its parent (``prefix``, ``history_rewritten``;
null for a root), ``history_changes`` how its prompt differs from a ``history_rewritten``
parent's sampled ids (``[]`` otherwise), and a next state's ``changes`` the same for the child it
was taken from (:mod:`clawrl.trajectory.history`).

``memory`` (version 4) is what the preference memory added to the turn's prompt
(``TurnRecord.memory``: the entry ids and the block in the system message, which the row's
``input_ids`` hold), null when nothing.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path
from typing import IO, Any

from clawrl.store import FeedbackRecord, RolloutResult, Store
from clawrl.trajectory.next_state import next_state
from clawrl.trajectory.rows import training_rows
from clawrl.trajectory.tree import load_tree

EXPORT_VERSION = 4


def _feedback(f: FeedbackRecord) -> dict[str, Any]:
    return {
        "id": f.id,
        "turn_id": f.turn_id,
        "reward": f.reward,
        "comment": f.comment,
        "created_at": f.created_at,
    }


def rollout_export(result: RolloutResult) -> dict[str, Any]:
    """The ``rollout`` object of an export line (module docstring)."""
    r, g, v = result.rollout, result.group, result.verifier
    return {
        "id": r.id, "task_id": g.task_id, "harness": g.harness, "status": r.status.value,
        "reason": r.reason, "timed_out": r.timed_out, "harness_exit": r.harness_exit,
        "wall_s": r.wall_s, "isolation": r.isolation, "reward": result.reward,
        "group": {
            "id": g.id, "run_id": g.run_id, "label": g.label, "purpose": g.purpose.value,
            "step": g.step, "policy_version": g.policy_version, "size": g.size,
            "decision": None if g.decision is None else g.decision.value,
            "reward_mean": g.reward_mean,
        },
        "verifier": None if v is None else {"reward": v.reward, "error": v.error,
                                            "scores": v.scores},
    }  # fmt: skip


def session_export(store: Store, session_id: str) -> dict[str, Any]:
    """One export line's object for ``session_id`` (see the module docstring).

    Raises:
        StoreError: unknown session.
    """
    tree = load_tree(store, session_id)
    session = store.get_session(session_id)
    assert session is not None  # load_tree raised otherwise
    rollout = store.get_rollout(session_id)
    turns = []
    for node in tree.nodes.values():
        turn = node.turn
        state = next_state(tree, node.id)
        turns.append(
            {
                "id": turn.id,
                "parent_id": node.parent_id,
                "link": None if node.link is None else node.link.value,
                "history_changes": list(node.changes),
                "segment": node.segment,
                "depth": node.depth,
                "root_reason": None if node.root_reason is None else node.root_reason.value,
                "kind": turn.kind.value,
                "side_kind": turn.side_kind,
                "agent_id": turn.client.get("agent_id"),
                "spawned_by": node.spawned_by,
                "attribution": turn.client.get("attribution"),
                "attribution_confidence": turn.client.get("attribution_confidence"),
                "status": turn.status.value,
                "finish_reason": turn.finish_reason,
                "policy_version": turn.policy_version,
                "user_id": turn.user_id,
                "adapter_version": turn.adapter_version,
                "prompt_len": len(turn.prompt_ids),
                "completion_len": len(turn.completion_ids),
                "trainable": node.trainable,
                "untrainable_reason": (
                    None if node.untrainable_reason is None else str(node.untrainable_reason)
                ),
                "memory": turn.memory,
                "next_state": None
                if state is None
                else {
                    "role": state.role.value,
                    "ids": state.ids,
                    "messages": state.messages,
                    "child_turn_id": state.child_turn_id,
                    "other_child_ids": state.other_child_ids,
                    "feedback": [_feedback(f) for f in state.feedback],
                    "note": state.note,
                    "changes": state.changes,
                },
            }
        )
    rows = []
    for row in training_rows(tree):
        data = asdict(row)
        data.pop("session_id")
        rows.append(data)
    return {
        "format": "clawrl.trajectory",
        "version": EXPORT_VERSION,
        "session_id": session.id,
        "source": session.source.value,
        "client": session.client,
        "created_at": session.created_at,
        "ended_at": session.ended_at,
        "metadata": session.metadata,
        "rows": rows,
        "turns": turns,
        "feedback": [_feedback(f) for f in tree.feedback],
        "untrainable": tree.reason_counts(),
        "rollout": None if rollout is None else rollout_export(rollout),
    }


def export_jsonl(
    store: Store,
    out: str | os.PathLike[str] | IO[str],
    session_ids: Iterable[str] | None = None,
) -> int:
    """Write one JSON line per session to ``out`` (a path, overwritten, or a text stream).

    Args:
        session_ids: the sessions to export, in this order; ``None``: all, oldest first.

    Returns:
        The number of lines written.

    Raises:
        StoreError: an unknown session id.
    """
    ids = store.session_ids() if session_ids is None else list(session_ids)
    if isinstance(out, (str, os.PathLike)):
        with Path(out).open("w", encoding="utf-8") as stream:
            return _write(store, stream, ids)
    return _write(store, out, ids)


def _write(store: Store, stream: IO[str], ids: list[str]) -> int:
    for session_id in ids:
        line = json.dumps(session_export(store, session_id), ensure_ascii=False)
        stream.write(line + "\n")
    return len(ids)
