"""Linking a session's calls into a prefix tree by token ids, the next state of each turn, and
training rows with loss masks.

- :mod:`.tree`: parent rule, segments, trainability (:func:`build_tree`, :func:`load_tree`).
- :mod:`.history`: the message rule for answers the template re-rendered (:func:`continues`).
- :mod:`.next_state`: next-state rule (:func:`next_state`).
- :mod:`.rows`: rows flattened along ``prefix`` links, the shared-prefix mask rule
  (:func:`training_rows`).
- :mod:`.views`, :mod:`.export`: what the CLI prints and exports.
"""

from clawrl.trajectory.export import EXPORT_VERSION, export_jsonl, session_export
from clawrl.trajectory.history import HistoryChange, continues
from clawrl.trajectory.next_state import NextState, NextStateRole, message_role, next_state
from clawrl.trajectory.rows import TrainingRow, training_rows
from clawrl.trajectory.tree import (
    HintCheck,
    LinkKind,
    RootReason,
    SessionTree,
    TreeNode,
    build_tree,
    load_tree,
    untrainable_reason,
)
from clawrl.trajectory.views import format_session, list_sessions_table

__all__ = [
    "EXPORT_VERSION",
    "HintCheck",
    "HistoryChange",
    "LinkKind",
    "NextState",
    "NextStateRole",
    "RootReason",
    "SessionTree",
    "TrainingRow",
    "TreeNode",
    "build_tree",
    "continues",
    "export_jsonl",
    "format_session",
    "list_sessions_table",
    "load_tree",
    "message_role",
    "next_state",
    "session_export",
    "training_rows",
    "untrainable_reason",
]
