"""Rich renderables for the CLI: ``clawrl sessions list`` and ``clawrl sessions show ID``."""

from __future__ import annotations

import datetime as dt
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from clawrl.store import Store
from clawrl.trajectory.next_state import NextState, next_state
from clawrl.trajectory.tree import SessionTree, TreeNode, load_tree

PREVIEW_CHARS = 60


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def _text_of(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict):
                value = part.get("text", part.get("content", part.get("output", "")))
                parts.append(value if isinstance(value, str) else str(value))
        return " ".join(parts)
    return ""


def preview(state: NextState | None, chars: int = PREVIEW_CHARS) -> str:
    """A one-line preview of a next state (``-`` when there is none)."""
    if state is None:
        return "-"
    if state.messages:
        text = " | ".join(_text_of(m) for m in state.messages)
    elif state.feedback:
        text = " | ".join(f"{f.reward:+g} {f.comment or ''}".strip() for f in state.feedback)
    else:
        text = f"{len(state.ids)} ids"
    text = " ".join(text.split())
    return text if len(text) <= chars else text[: chars - 1] + "…"


def _label(tree: SessionTree, node: TreeNode) -> Text:
    turn = node.turn
    kind = turn.kind.value if turn.side_kind is None else f"{turn.kind.value}/{turn.side_kind}"
    label = Text.assemble(
        (turn.id[:8], "bold"),
        f" {kind} v{turn.policy_version} {turn.status.value}",
        f" {turn.finish_reason or '-'}",
        f" p={len(turn.prompt_ids)} c={len(turn.completion_ids)} ",
    )
    if node.trainable:
        label.append("trainable", style="green")
    else:
        label.append(f"untrainable: {node.untrainable_reason}", style="red")
    if node.root_reason is not None and node.root_reason.value != "first":
        label.append(f" [{node.root_reason.value}]", style="yellow")
    if node.hint.value == "rejected":
        label.append(" [parent hint rejected]", style="yellow")
    state = next_state(tree, node.id)
    role = "-" if state is None else state.role.value
    label.append(f"  → {role}: ", style="cyan")
    label.append(preview(state), style="dim")
    return label


def format_session(store: Store, session_id: str) -> RenderableType:
    """The session's prefix tree, one line per turn: id, kind, policy version, status, finish
    reason, prompt/completion tokens, trainable or why not, next-state role and preview.

    Raises:
        StoreError: unknown session.
    """
    session = store.get_session(session_id)
    tree = load_tree(store, session_id)
    assert session is not None  # load_tree raised otherwise
    header = Text.assemble(
        ("session ", "bold"),
        (session.id, "bold"),
        f"  source={session.source.value} client={session.client or '-'}",
        f"  created {_when(session.created_at)}",
        f"  ended {_when(session.ended_at)}",
    )
    trainable = sum(1 for n in tree.nodes.values() if n.trainable)
    counts = ", ".join(f"{k.split('/', 1)[1]}={v}" for k, v in tree.reason_counts().items())
    summary = Text(
        f"{len(tree.nodes)} turns, {trainable} trainable, {len(tree.segments())} segment(s)"
        + (f"; untrainable: {counts}" if counts else "")
        + (f"; {len(tree.feedback)} feedback" if tree.feedback else "")
    )
    forest = Tree("turns", guide_style="dim")
    for segment, roots in tree.segments().items():
        branch = forest.add(Text(f"segment {segment}", style="bold magenta"))
        stack = [(branch, r) for r in reversed(roots)]
        while stack:
            parent_branch, turn_id = stack.pop()
            node = tree.node(turn_id)
            here = parent_branch.add(_label(tree, node))
            stack.extend((here, c) for c in reversed(tree.ordered_children(turn_id)))
    return Group(header, summary, forest)


def list_sessions_table(store: Store, limit: int = 50, offset: int = 0) -> Table:
    """A table of sessions, newest first: id, source, client, created, ended, turns, trainable,
    side, failed, tokens, feedback."""
    table = Table(title="sessions")
    for name, justify in [
        ("session", "left"),
        ("source", "left"),
        ("client", "left"),
        ("created", "left"),
        ("ended", "left"),
        ("turns", "right"),
        ("trainable", "right"),
        ("side", "right"),
        ("failed", "right"),
        ("tokens p/c", "right"),
        ("feedback", "right"),
    ]:
        # ids are what `sessions show` takes: never wrapped or cut
        table.add_column(name, justify=justify, no_wrap=name == "session")  # type: ignore[arg-type]
    for s in store.list_sessions(limit=limit, offset=offset):
        table.add_row(
            s.session.id,
            s.session.source.value,
            s.session.client or "-",
            _when(s.session.created_at),
            _when(s.session.ended_at),
            str(s.turns),
            str(s.trainable_turns),
            str(s.side_turns),
            str(s.failed_turns),
            f"{s.prompt_tokens}/{s.completion_tokens}",
            str(s.feedback),
        )
    return table
