"""Linking a session's turns into a prefix tree by token ids (by messages where the template
re-rendered an earlier answer to other ids).

Parent rule, in two steps; each link records its kind (:class:`LinkKind`):

1. ``prefix``: the earlier turn (in ``created_at`` order) with a non-empty completion whose
   ``prompt_ids + completion_ids`` is the *longest* prefix of this turn's ``prompt_ids``; among
   equally long matches, the gateway's ``parent_turn_id`` hint wins if it is one of them, else
   the most recent. Verified id by id (digests only find candidates).
2. ``history_rewritten``: when the template re-rendered an earlier answer to other ids (trimmed
   whitespace, dropped reasoning, re-serialised tool calls), the earlier turn whose messages and
   answer this turn's messages repeat, with something after them, by the message rule of
   :mod:`clawrl.trajectory.history` (the most messages; then the hint, else the most recent).
   It is the parent when step 1 finds none, or finds one that saw fewer messages (a deeper
   answer was rewritten). Verified message by message. The node's ``changes`` are what the
   gateway recorded about the rewrite (``client.history_link``; ``unknown`` otherwise).

A turn with neither (first call, history edited, compaction, a subagent with its own system
prompt, a side call) is a *root*. A retry with the same prompt as an earlier turn gets the same
parent, i.e. becomes its *sibling*. Ids are never re-tokenized or spliced here: a
``history_rewritten`` child does not contain its parent's ids, so training rows end at such a
link (:mod:`clawrl.trajectory.rows`) and each side keeps its own sampled ids.

Agents: a turn's parent must be a turn of the same agent (``client.agent_id``; the main agent
has none), so two subagents whose calls happen to be identical never link into each other's
branch. A subagent's first call is a root with reason ``subagent``; ``spawned_by`` names the
parent-agent turn that launched it (the gateway's ``client.parent_agent_turn_id``, see
:func:`clawrl.gateway.attribution.spawning_turn`) when that turn is in the session.

Segments: roots in creation order get segment numbers 0, 1, ...; a root whose prompt equals an
earlier root's prompt *of the same agent* (a retry of a first call) is that root's sibling and
shares its segment. Every other node has its root's segment.

Side calls (kind ``side``) are never trained (reason ``side_call``) and never a next state.

Dead retry leaves: a main turn with no child whose exact prompt a *later* call of the same agent
sent again was retried by its client (the answer was lost, or came too late), and nothing went on
from it: it is not trained (reason ``abandoned_retry``), so its tokens get no credit for an
outcome they never led to. The retry that went on, or the last one, keeps its credit; a failed
attempt keeps its own reason (``error``, ``incomplete``). Choices of one ``n > 1`` call share
its arrival time and are never each other's retries.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from clawrl.errors import StoreError
from clawrl.store import (
    FeedbackRecord,
    Store,
    TurnKind,
    TurnRecord,
    TurnStatus,
    UntrainableReason,
    encode_ids,
    ids_digest,
    prefix_digests,
)
from clawrl.trajectory.history import (
    HISTORY_LINK_FACT,
    HistoryChange,
    answer_keys,
    key_digests,
    message_key,
)


class RootReason(StrEnum):
    """Why a turn is a root of the tree."""

    FIRST = "first"  # no earlier turn in the session (a title call before it aside)
    RETRY = "retry_of_root"  # same prompt as an earlier root: its sibling, same segment
    SUBAGENT = "subagent"  # a subagent's first call (its own system prompt): a branch of its own
    NO_PREFIX_MATCH = "no_prefix_match"  # earlier turns exist, none is a prefix: new segment


class LinkKind(StrEnum):
    """How a turn was linked to its parent (module docstring, parent rule)."""

    PREFIX = "prefix"  # its prompt extends the parent's prompt + completion ids
    HISTORY_REWRITTEN = "history_rewritten"  # its messages repeat the parent's messages and
    # answer, which the template rendered to other ids than were sampled


class HintCheck(StrEnum):
    """How the gateway's ``parent_turn_id`` hint compares with the verified parent."""

    NONE = "none"  # no hint
    CONFIRMED = "confirmed"  # the hint is the parent
    REJECTED = "rejected"  # the ids say otherwise (or the hint is not in the session)


_STATUS_REASONS = {
    TurnStatus.INCOMPLETE: UntrainableReason.INCOMPLETE,
    TurnStatus.ERROR: UntrainableReason.ERROR,
    TurnStatus.PENDING: UntrainableReason.PENDING,
}


def untrainable_reason(turn: TurnRecord) -> str | None:
    """Why ``turn``'s sampled tokens must not be trained on, or ``None`` when they may be.

    In order: a non-ok status; a side call (``side_call``, also for turns recorded before
    side calls were stored untrainable); ``trainable=False`` (its recorded reason, else
    ``marked_untrainable``); no completion ids; log-probs not aligned with the ids.
    """
    if turn.status in _STATUS_REASONS:
        return _STATUS_REASONS[TurnStatus(turn.status)]
    if turn.kind == TurnKind.SIDE:
        return UntrainableReason.SIDE_CALL
    if not turn.trainable:
        return turn.untrainable_reason or UntrainableReason.MARKED_UNTRAINABLE
    if not turn.completion_ids:
        return UntrainableReason.NO_COMPLETION
    if len(turn.sampling_logprobs) != len(turn.completion_ids):
        return UntrainableReason.LOGPROBS_MISMATCH
    return None


@dataclass
class TreeNode:
    """One turn in the tree.

    Attributes:
        turn: the stored turn.
        parent_id: the id-verified parent, ``None`` for a root.
        children: child turn ids in creation order.
        segment: the segment (root group) it belongs to.
        depth: 0 for roots.
        untrainable_reason: see :func:`untrainable_reason` (``None``: trainable).
        root_reason: for roots, why (``None`` for other nodes).
        hint: how the gateway's ``parent_turn_id`` compared.
        spawned_by: for a subagent's first call, the parent-agent turn that launched it.
        link: how it is linked to its parent (``None`` for a root).
        changes: for a ``history_rewritten`` link, how its prompt differs from the parent's
            sampled ids (:class:`~clawrl.trajectory.history.HistoryChange` values).
    """

    turn: TurnRecord
    parent_id: str | None
    segment: int
    depth: int
    untrainable_reason: str | None
    root_reason: RootReason | None = None
    hint: HintCheck = HintCheck.NONE
    children: list[str] = field(default_factory=list)
    spawned_by: str | None = None
    link: LinkKind | None = None
    changes: tuple[str, ...] = ()

    @property
    def id(self) -> str:
        return self.turn.id

    @property
    def trainable(self) -> bool:
        return self.untrainable_reason is None


@dataclass
class SessionTree:
    """A session's turns as a forest of prefix trees, plus the session's feedback.

    Attributes:
        session_id: the session (``None`` when built from turns without a common session).
        nodes: every node by turn id, in creation order.
        roots: root turn ids in creation order.
        feedback: the session's feedback rows (turn-level and session-level), oldest first.
    """

    session_id: str | None
    nodes: dict[str, TreeNode]
    roots: list[str]
    feedback: list[FeedbackRecord] = field(default_factory=list)

    def node(self, turn_id: str) -> TreeNode:
        """The node of ``turn_id``; raises ``KeyError`` when it is not in the tree."""
        return self.nodes[turn_id]

    def path(self, turn_id: str) -> list[str]:
        """Turn ids from the root down to ``turn_id`` (inclusive)."""
        out = [turn_id]
        while (parent := self.nodes[out[-1]].parent_id) is not None:
            out.append(parent)
        return out[::-1]

    def next_child(self, turn_id: str) -> str | None:
        """The child whose prompt is ``turn_id``'s next state: the first (by creation) main
        child with status ok, else the first main child; never a side call (a compaction or
        title request is not what the environment answered), so ``None`` when there is no main
        child."""
        children = [
            self.nodes[c].turn
            for c in self.nodes[turn_id].children
            if self.nodes[c].turn.kind == TurnKind.MAIN
        ]
        for child in children:
            if child.status == TurnStatus.OK:
                return child.id
        return children[0].id if children else None

    def row_path(self, turn_id: str) -> list[str]:
        """Turn ids from the start of ``turn_id``'s training row down to ``turn_id``: up its
        ``prefix`` links only (a ``history_rewritten`` child does not contain its parent's ids,
        so a row starts there)."""
        node = self.nodes[turn_id]
        out = [turn_id]
        while node.link == LinkKind.PREFIX and node.parent_id is not None:
            out.append(node.parent_id)
            node = self.nodes[node.parent_id]
        return out[::-1]

    def row_ends(self) -> list[str]:
        """Turns that end a training row (no child linked by ``prefix``), in depth-first order
        over every link: roots by creation, :meth:`ordered_children`."""
        out: list[str] = []
        stack = list(reversed(self.roots))
        while stack:
            turn_id = stack.pop()
            children = self.ordered_children(turn_id)
            if not any(self.nodes[c].link == LinkKind.PREFIX for c in children):
                out.append(turn_id)
            stack.extend(reversed(children))
        return out

    def ordered_children(self, turn_id: str) -> list[str]:
        """Children with :meth:`next_child` first, then the others in creation order."""
        children = self.nodes[turn_id].children
        first = self.next_child(turn_id)
        if first is None:
            return list(children)
        return [first, *(c for c in children if c != first)]

    def leaves(self) -> list[str]:
        """Leaf turn ids in depth-first order: roots by creation, :meth:`ordered_children`."""
        out: list[str] = []
        stack = list(reversed(self.roots))
        while stack:
            turn_id = stack.pop()
            children = self.ordered_children(turn_id)
            if not children:
                out.append(turn_id)
            stack.extend(reversed(children))
        return out

    def segments(self) -> dict[int, list[str]]:
        """Root turn ids by segment number."""
        out: dict[int, list[str]] = {}
        for root in self.roots:
            out.setdefault(self.nodes[root].segment, []).append(root)
        return out

    def turn_feedback(self, turn_id: str) -> list[FeedbackRecord]:
        """Feedback rows about ``turn_id``."""
        return [f for f in self.feedback if f.turn_id == turn_id]

    def session_feedback(self) -> list[FeedbackRecord]:
        """Session-level feedback rows (no turn)."""
        return [f for f in self.feedback if f.turn_id is None]

    def reason_counts(self) -> dict[str, int]:
        """Untrainable turns counted by reason, keyed ``untrainable/<reason>``."""
        counts = Counter(
            f"untrainable/{n.untrainable_reason}"
            for n in self.nodes.values()
            if n.untrainable_reason is not None
        )
        return dict(sorted(counts.items()))


def build_tree(
    turns: Sequence[TurnRecord],
    feedback: Iterable[FeedbackRecord] = (),
    session_id: str | None = None,
) -> SessionTree:
    """Link ``turns`` (one session's) into a :class:`SessionTree`; see the module docstring.

    Turns are ordered by ``created_at`` (stable for ties). Cost: one sha256 pass per prompt
    plus one digest per distinct earlier sequence length, and one byte comparison per
    candidate.
    """
    order = sorted(turns, key=lambda t: t.created_at)
    if session_id is None and order and all(t.session_id == order[0].session_id for t in order):
        session_id = order[0].session_id
    nodes: dict[str, TreeNode] = {}
    roots: list[str] = []
    root_segments: dict[tuple[str, str], int] = {}  # (agent, prompt digest) of a root -> segment
    by_seq: dict[str, list[TurnRecord]] = {}  # seq digest -> earlier turns, creation order
    agent_roots: set[str] = set()  # agents that already have a root
    lengths: set[int] = set()
    encoded: dict[str, bytes] = {}
    by_messages = _MessageIndex()
    next_segment = 0
    for turn in order:
        prompt_bytes = encode_ids(turn.prompt_ids)
        parent = _find_parent(turn, prompt_bytes, by_seq, lengths, encoded)
        link = None if parent is None else LinkKind.PREFIX
        seen = -1 if parent is None else len(nodes[parent].turn.request_messages)
        rewritten = by_messages.find(turn, deeper_than=seen)
        if rewritten is not None:
            parent, link = rewritten, LinkKind.HISTORY_REWRITTEN
        reason = untrainable_reason(turn)
        hint = HintCheck.NONE
        if turn.parent_turn_id is not None:
            hint = HintCheck.CONFIRMED if parent == turn.parent_turn_id else HintCheck.REJECTED
        if parent is None:
            agent = _agent(turn)
            key = (agent, ids_digest(turn.prompt_ids))
            if key in root_segments:
                segment, root_reason = root_segments[key], RootReason.RETRY
            else:
                segment, next_segment = next_segment, next_segment + 1
                root_segments[key] = segment
                if agent and agent not in agent_roots:
                    root_reason = RootReason.SUBAGENT
                else:
                    main_before = any(n.turn.kind == TurnKind.MAIN for n in nodes.values())
                    first = not nodes or (turn.kind == TurnKind.MAIN and not main_before)
                    root_reason = RootReason.FIRST if first else RootReason.NO_PREFIX_MATCH
            agent_roots.add(agent)
            node = TreeNode(turn, None, segment, 0, reason, root_reason, hint)
            spawner = turn.client.get("parent_agent_turn_id")
            if agent and isinstance(spawner, str) and spawner in nodes:
                node.spawned_by = spawner
            roots.append(turn.id)
        else:
            up = nodes[parent]
            node = TreeNode(turn, parent, up.segment, up.depth + 1, reason, None, hint, link=link)
            if link == LinkKind.HISTORY_REWRITTEN:
                node.changes = _recorded_changes(turn, parent)
            up.children.append(turn.id)
        nodes[turn.id] = node
        if turn.completion_ids:
            seq_bytes = prompt_bytes + encode_ids(turn.completion_ids)
            encoded[turn.id] = seq_bytes
            seq = [*turn.prompt_ids, *turn.completion_ids]
            by_seq.setdefault(ids_digest(seq), []).append(turn)
            lengths.add(len(seq))
            by_messages.add(turn)
    _drop_abandoned_retries(nodes)
    return SessionTree(session_id, nodes, roots, list(feedback))


def _recorded_changes(turn: TurnRecord, parent_id: str) -> tuple[str, ...]:
    """How ``turn``'s prompt differs from ``parent_id``'s sampled ids, as the gateway recorded it
    (``client.history_link`` naming that parent), else ``("unknown",)``."""
    fact = (turn.client or {}).get(HISTORY_LINK_FACT)
    if isinstance(fact, dict) and fact.get("turn_id") == parent_id:
        changes = fact.get("changes")
        if isinstance(changes, list) and all(isinstance(c, str) for c in changes):
            return tuple(changes)
    return (HistoryChange.UNKNOWN.value,)


class _MessageIndex:
    """Earlier turns with an answer, by the digest of their messages + answer (step 2 of the
    parent rule, :mod:`clawrl.trajectory.history`). Built lazily: a session whose turns all
    extend their latest answer by ids never computes a message key."""

    def __init__(self) -> None:
        self._pending: list[TurnRecord] = []
        self._by_digest: dict[str, list[tuple[TurnRecord, list[str]]]] = {}
        self._lengths: set[int] = set()

    def add(self, turn: TurnRecord) -> None:
        """Index ``turn`` (one with completion ids) for the turns after it."""
        self._pending.append(turn)

    def _index_pending(self) -> None:
        for turn in self._pending:
            keys = answer_keys(turn.request_messages, turn.output)
            if keys is None:
                continue  # nothing a client could echo
            self._by_digest.setdefault(key_digests(keys)[-1], []).append((turn, keys))
            self._lengths.add(len(keys))
        self._pending.clear()

    def find(self, turn: TurnRecord, deeper_than: int) -> str | None:
        """The turn ``turn`` continues by the message rule that saw more than ``deeper_than``
        messages (the id parent's count; -1: there is none), or ``None``."""
        messages = turn.request_messages
        later = messages[deeper_than + 1 : -1]
        if not any(isinstance(m, dict) and m.get("role") == "assistant" for m in later):
            return None  # no answer deeper than the id parent's with a message after it
        self._index_pending()
        usable = sorted((k for k in self._lengths if deeper_than + 1 < k < len(messages)),
                        reverse=True)  # fmt: skip
        if not usable:
            return None
        keys = [message_key(m) for m in messages[: usable[0]]]
        digests = key_digests(keys)
        agent = _agent(turn)
        for k in usable:
            verified = [
                t.id
                for t, expected in self._by_digest.get(digests[k], ())
                if expected == keys[:k] and _agent(t) == agent
            ]
            if verified:
                return turn.parent_turn_id if turn.parent_turn_id in verified else verified[-1]
        return None


def _drop_abandoned_retries(nodes: dict[str, TreeNode]) -> None:
    """Mark dead retry leaves untrainable (``abandoned_retry``; module docstring): leaves of the
    main kind, trainable so far, whose agent sent the same prompt again later."""
    latest: dict[tuple[str, str], float] = {}  # (agent, prompt digest) -> latest arrival
    for node in nodes.values():
        if node.turn.kind == TurnKind.MAIN:
            key = (_agent(node.turn), ids_digest(node.turn.prompt_ids))
            latest[key] = max(latest.get(key, node.turn.created_at), node.turn.created_at)
    for node in nodes.values():
        turn = node.turn
        if node.children or node.untrainable_reason is not None or turn.kind != TurnKind.MAIN:
            continue
        if latest[(_agent(turn), ids_digest(turn.prompt_ids))] > turn.created_at:
            node.untrainable_reason = UntrainableReason.ABANDONED_RETRY


def _agent(turn: TurnRecord) -> str:
    """The agent a turn belongs to (``""``: the main agent)."""
    value = (turn.client or {}).get("agent_id")
    return value if isinstance(value, str) else ""


def _find_parent(
    turn: TurnRecord,
    prompt_bytes: bytes,
    by_seq: dict[str, list[TurnRecord]],
    lengths: set[int],
    encoded: dict[str, bytes],
) -> str | None:
    usable = [m for m in lengths if m <= len(turn.prompt_ids)]
    if not usable:
        return None
    digests = prefix_digests(turn.prompt_ids, usable)
    agent = _agent(turn)
    for m in sorted(usable, reverse=True):
        verified = [
            t.id
            for t in by_seq.get(digests[m], ())
            if prompt_bytes[: 4 * m] == encoded[t.id]  # exact ids, not just digests
            and _agent(t) == agent
        ]
        if verified:
            if turn.parent_turn_id in verified:
                return turn.parent_turn_id
            return verified[-1]  # most recent
    return None


def load_tree(store: Store, session_id: str) -> SessionTree:
    """:func:`build_tree` over a stored session's turns and feedback.

    Raises:
        StoreError: the session does not exist.
    """
    if store.get_session(session_id) is None:
        raise StoreError(f"unknown session {session_id!r}")
    return build_tree(
        store.session_turns(session_id), store.feedback_for(session_id=session_id), session_id
    )
