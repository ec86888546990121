"""Rich renderables for the CLI: ``clawrl sessions list`` and ``clawrl sessions show ID``."""

from __future__ import annotations

import datetime as dt
import os
from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from clawrl.store import RolloutResult, SessionSource, Store
from clawrl.trajectory.next_state import NextState, next_state
from clawrl.trajectory.tree import LinkKind, SessionTree, TreeNode, load_tree

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
        f" {kind} v{turn.policy_version}",
        f" user {turn.user_id}" if turn.user_id else "",
        f" adapter v{turn.adapter_version}" if turn.adapter_version is not None else "",
        f" {turn.status.value}",
        f" {turn.finish_reason or '-'}",
        f" p={len(turn.prompt_ids)} c={len(turn.completion_ids)} ",
    )
    if node.trainable:
        label.append("trainable", style="green")
    else:
        label.append(f"untrainable: {node.untrainable_reason}", style="red")
    if node.root_reason is not None and node.root_reason.value != "first":
        label.append(f" [{node.root_reason.value}]", style="yellow")
    if node.link == LinkKind.HISTORY_REWRITTEN:
        label.append(f" [history rewritten: {', '.join(node.changes)}]", style="yellow")
    if node.hint.value == "rejected":
        label.append(" [parent hint rejected]", style="yellow")
    if node.spawned_by is not None:
        label.append(f" [spawned by {node.spawned_by[:8]}]", style="yellow")
    confidence = turn.client.get("attribution_confidence")
    if confidence in ("medium", "low"):
        label.append(
            f" [{turn.client.get('attribution')}, {confidence} confidence]", style="yellow"
        )
    state = next_state(tree, node.id)
    role = "-" if state is None else state.role.value
    label.append(f"  → {role}: ", style="cyan")
    label.append(preview(state), style="dim")
    return label


def rollout_cell(result: RolloutResult | None) -> str:
    """A harness rollout in a few characters for the sessions table: status, reward, and
    ``timeout`` when the harness hit its time limit (``-``: no rollout)."""
    if result is None:
        return "-"
    parts = [result.rollout.status.value]
    if result.reward is not None:
        parts.append(f"{result.reward:.2f}")
    if result.rollout.timed_out:
        parts.append("timeout")
    return " ".join(parts)


def rollout_line(result: RolloutResult) -> Text:
    """A harness rollout in one line: task, harness, group, status, reward, timed out, wall
    seconds, and the reason when something went wrong."""
    r, g = result.rollout, result.group
    reward = "-" if result.reward is None else f"{result.reward:g}"
    step = "" if g.step is None else f" step {g.step}"
    decision = "" if g.decision is None else f", {g.decision.value}"
    line = Text.assemble(
        ("rollout ", "bold"),
        f"task={g.task_id} harness={g.harness} group={g.label} ({g.purpose.value}{step}"
        f"{decision}) status={r.status.value} reward={reward} "
        f"timed_out={'yes' if r.timed_out else 'no'} wall={r.wall_s:.1f}s "
        f"exit={'-' if r.harness_exit is None else r.harness_exit} isolation={r.isolation}",
    )
    if r.reason:
        line.append(f"  reason: {r.reason}", style="red")
    return line


def format_session(store: Store, session_id: str) -> RenderableType:
    """The session's prefix tree, one line per turn: id, kind, policy version, status, finish
    reason, prompt/completion tokens, trainable or why not, next-state role and preview; a
    harness rollout's session starts with its rollout (:func:`rollout_line`).

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
    rollout = store.get_rollout(session_id)
    lines = [header] if rollout is None else [header, rollout_line(rollout)]
    forest = Tree("turns", guide_style="dim")
    for segment, roots in tree.segments().items():
        branch = forest.add(Text(f"segment {segment}", style="bold magenta"))
        stack = [(branch, r) for r in reversed(roots)]
        while stack:
            parent_branch, turn_id = stack.pop()
            node = tree.node(turn_id)
            here = parent_branch.add(_label(tree, node))
            stack.extend((here, c) for c in reversed(tree.ordered_children(turn_id)))
    return Group(*lines, summary, forest)


SHORT_ID = 12
"""Characters of a session id shown by the compact table (as ``git log --oneline`` shortens)."""

COMPACT_BELOW = 120
"""Terminal width (columns) under which :func:`list_sessions_table` drops its secondary columns."""


_COMPACT_FIXED = 49
"""Columns of the compact table other than id and client: created (11), turns (5), train (5),
fail (4), tokens (10), plus 2 columns of padding each and for the id column."""


def _short_ids(ids: list[str], all_ids: list[str]) -> list[str]:
    """Each id cut to :data:`SHORT_ID` characters, or longer until no other id in ``all_ids``
    (every session in the store, not only this page) starts with it."""
    ordered = sorted(set(all_ids) | set(ids))
    index = {sid: i for i, sid in enumerate(ordered)}

    out = []
    for sid in ids:
        i = index[sid]
        neighbours = ordered[max(0, i - 1) : i] + ordered[i + 1 : i + 2]
        # character-wise common prefix is what an id prefix needs
        shared = [len(os.path.commonprefix([sid, o])) for o in neighbours]  # noqa: RUF071
        need = max((n + 1 for n in shared), default=0)
        out.append(sid[: max(SHORT_ID, need)])
    return out


def list_sessions_table(
    store: Store,
    limit: int = 50,
    offset: int = 0,
    *,
    width: int | None = None,
    user: str | None = None,
) -> Table:
    """A table of sessions, newest first: id, source, client, created, ended, turns, trainable,
    side, failed, tokens (prompt/completion), feedback, and a harness session's rollout
    (:func:`rollout_cell`).

    Args:
        width: the terminal's width in columns; under :data:`COMPACT_BELOW` the table keeps only
            the id's first :data:`SHORT_ID` characters (longer where needed to tell the listed
            ids apart; ``sessions show`` takes any unique prefix), client, created (without the
            year), turns, trainable, failed and tokens, so that nothing is cut at 80 columns.
            ``None``: the full table.
        user: only sessions with this user's turns (``""``: turns that named no user).
    """
    compact = width is not None and width < COMPACT_BELOW
    table = Table(
        title="sessions",
        box=box.SIMPLE_HEAD if compact else box.HEAVY_HEAD,
        pad_edge=not compact,
        collapse_padding=compact,
    )
    short_header = {"trainable": "train", "failed": "fail"}
    columns = [
        ("session", "left", True),
        ("source", "left", False),
        ("client", "left", True),
        ("user", "left", False),
        ("created", "left", True),
        ("ended", "left", False),
        ("turns", "right", True),
        ("trainable", "right", True),
        ("side", "right", False),
        ("failed", "right", True),
        ("tokens p/c", "right", True),
        ("feedback", "right", False),
        ("rollout", "left", False),
    ]
    shown = [name for name, _, essential in columns if essential or not compact]
    rows = store.list_sessions(limit=limit, offset=offset, user=user)
    harness_ids = [r.session.id for r in rows if r.session.source == SessionSource.HARNESS]
    rollouts = {x.rollout.id: x for x in store.rollout_results(rollout_ids=harness_ids)}
    ids = _short_ids([r.session.id for r in rows], store.session_ids()) if compact else None
    id_width = max((len(x) for x in (ids or [r.session.id for r in rows])), default=7)
    if compact and width is not None and id_width + _COMPACT_FIXED + 18 > width:
        shown.remove("client")  # long ids: the client column goes rather than cut anything
    for name, justify, _ in columns:
        if name in shown:
            # ids (or their unique prefixes) are what `sessions show` takes: never cut; in the
            # compact table the client column gives way first
            table.add_column(
                short_header.get(name, name) if compact else name,
                justify=justify,  # type: ignore[arg-type]
                no_wrap=name == "session" or (compact and name != "client"),
                max_width=16 if compact and name == "client" else None,
                min_width=id_width if name == "session" else None,
                overflow="ellipsis" if name == "client" else "fold",
            )
    for i, s in enumerate(rows):
        created = _when(s.session.created_at)
        cells = {
            "session": ids[i] if ids else s.session.id,
            "source": s.session.source.value,
            "client": s.session.client or "-",
            "user": ", ".join(s.user_ids) or "-",
            "created": created[5:16] if compact and created != "-" else created,
            "ended": _when(s.session.ended_at),
            "turns": str(s.turns),
            "trainable": str(s.trainable_turns),
            "side": str(s.side_turns),
            "failed": str(s.failed_turns),
            "tokens p/c": f"{s.prompt_tokens}/{s.completion_tokens}",
            "feedback": str(s.feedback),
            "rollout": rollout_cell(rollouts.get(s.session.id)),
        }
        # Text cells: a session id or client name is data, never rich markup
        table.add_row(*(Text(cells[name]) for name in shown))
    return table
