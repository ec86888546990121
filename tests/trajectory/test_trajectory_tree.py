"""Prefix-tree linking, next states and training rows, on synthetic token ids."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from clawrl.store import (
    FeedbackRecord,
    SessionSource,
    Store,
    TurnKind,
    TurnRecord,
    TurnStatus,
    UntrainableReason,
)
from clawrl.trajectory import (
    HintCheck,
    NextStateRole,
    RootReason,
    SessionTree,
    TrainingRow,
    build_tree,
    load_tree,
    next_state,
    training_rows,
)

# A toy chat template: every message is  <start> role-id text-ids <end>; the assistant header is
# <start> ASSISTANT; a completion ends with <end>.
START, END = 1, 2
SYSTEM, USER, ASSISTANT, TOOL = 10, 11, 12, 13


def msg(role: int, *text: int) -> list[int]:
    return [START, role, *text, END]


GEN = [START, ASSISTANT]
SYS_MAIN = msg(SYSTEM, 100, 101, 102, 103)
SYS_SUB = msg(SYSTEM, 200, 201)


def turn(
    prompt: list[int],
    completion: list[int],
    t: float,
    messages: list[dict] | None = None,
    **kw,
) -> TurnRecord:
    """A turn whose completion (``+ END``) has made-up log-probs; created at ``t``."""
    completion = [*completion, END] if completion else []
    return TurnRecord(
        session_id=kw.pop("session_id", "s"),
        prompt_ids=prompt,
        completion_ids=completion,
        sampling_logprobs=[-(t + k / 10) for k in range(len(completion))],
        request_messages=messages or [],
        created_at=t,
        **kw,
    )


def m(role: str, content: str = "") -> dict:
    return {"role": role, "content": content}


def check_rows(tree: SessionTree, rows: list[TrainingRow]) -> None:
    """Every sampled token of a trainable turn has mask 1 in exactly one row (with its id and
    log-prob), no other token has mask 1, and each row is its leaf's ids."""
    seen: Counter[tuple[str, int]] = Counter()
    for row in rows:
        n = len(row.input_ids)
        assert len(row.loss_mask) == len(row.sampling_logprobs) == len(row.token_turn) == n
        leaf = tree.node(row.leaf_turn_id).turn
        assert row.input_ids == leaf.prompt_ids + leaf.completion_ids
        for turn_id in row.turn_ids:
            t = tree.node(turn_id).turn
            assert row.input_ids[: len(t.seq_ids)] == t.seq_ids
        for pos in range(n):
            if row.loss_mask[pos] == 0:
                assert row.sampling_logprobs[pos] == 0.0
                continue
            t = tree.node(row.turn_ids[row.token_turn[pos]]).turn
            k = pos - len(t.prompt_ids)
            assert row.input_ids[pos] == t.completion_ids[k]
            assert row.sampling_logprobs[pos] == t.sampling_logprobs[k]
            seen[(t.id, k)] += 1
    expected = {
        (n.id, k)
        for n in tree.nodes.values()
        if n.trainable
        for k in range(len(n.turn.completion_ids))
    }
    assert set(seen) == expected
    assert all(c == 1 for c in seen.values())


def test_retry_branch_and_subagent_scenario(tmp_path: Path) -> None:
    """A and its retry A' share prompt P; B continues A'; subagent C has its own system prompt."""
    p = [*SYS_MAIN, *msg(USER, 20, 21), *GEN]
    p_msgs = [m("system", "sys"), m("user", "fix it")]
    a = turn(p, [30, 31], 1.0, p_msgs)
    a2 = turn(p, [32, 33, 34], 2.0, p_msgs, client={"retry_count": 1})
    c = turn([*SYS_SUB, *msg(USER, 40), *GEN], [41], 3.0, [m("system", "sub"), m("user", "x")])
    b_msgs = [*p_msgs, m("assistant", "call ls"), m("tool", "a.py b.py")]
    b = turn([*a2.seq_ids, *msg(TOOL, 50, 51), *GEN], [60, 61], 4.0, b_msgs)
    path = tmp_path / "clawrl.db"
    with Store(path) as store:
        store.get_or_create_session("s", SessionSource.HEADER, "claude-code")
        for t in (a, a2, c, b):
            store.record_turn(t)
    with Store(path) as store:  # all four survive reopening, token-exact
        assert store.session_turns("s") == [a, a2, c, b]
        tree = load_tree(store, "s")

    assert tree.node(b.id).parent_id == a2.id
    assert tree.node(a.id).parent_id is None and tree.node(a2.id).parent_id is None
    assert tree.node(a2.id).root_reason is RootReason.RETRY
    assert tree.node(a.id).segment == tree.node(a2.id).segment == tree.node(b.id).segment == 0
    assert tree.node(c.id).root_reason is RootReason.NO_PREFIX_MATCH
    assert tree.node(c.id).segment == 1
    assert tree.roots == [a.id, a2.id, c.id]
    assert tree.segments() == {0: [a.id, a2.id], 1: [c.id]}

    state = next_state(tree, a2.id)
    assert state is not None and state.child_turn_id == b.id
    assert state.ids == [*msg(TOOL, 50, 51), *GEN]
    assert state.messages == [m("tool", "a.py b.py")] and state.role is NextStateRole.TOOL
    assert next_state(tree, a.id) is None and next_state(tree, c.id) is None

    rows = training_rows(tree)
    assert [r.turn_ids for r in rows] == [[a.id], [a2.id, b.id], [c.id]]
    check_rows(tree, rows)


def test_shared_prefix_is_trained_once_on_the_next_state_path() -> None:
    p = [*SYS_MAIN, *msg(USER, 20), *GEN]
    t1 = turn(p, [30], 1.0, [m("user")])
    env = [*msg(TOOL, 40), *GEN]
    failed = turn([*t1.seq_ids, *env], [], 2.0, status=TurnStatus.ERROR)
    retry = turn([*t1.seq_ids, *env], [41, 42], 3.0)
    other = turn([*t1.seq_ids, *msg(USER, 99), *GEN], [43], 4.0)  # a branch (edited last msg)
    tree = build_tree([other, retry, failed, t1])  # input order does not matter
    assert tree.node(t1.id).children == [failed.id, retry.id, other.id]
    assert tree.node(failed.id).parent_id == t1.id  # a retry is a sibling of the failed call
    assert tree.next_child(t1.id) == retry.id
    state = next_state(tree, t1.id)
    assert state is not None and state.child_turn_id == retry.id
    assert state.other_child_ids == [failed.id, other.id] and state.note
    rows = training_rows(tree)
    assert [r.leaf_turn_id for r in rows] == [retry.id, failed.id, other.id]
    assert rows[0].trained_turn_ids == [t1.id, retry.id]  # shared turn: on the next-state path
    assert rows[1].trained_turn_ids == [] and rows[1].untrained == {failed.id: "error"}
    assert rows[2].trained_turn_ids == [other.id]
    assert rows[2].token_turn[len(p)] == 0  # the context copy keeps its turn index...
    assert rows[2].loss_mask[len(p)] == 0  # ...with mask 0
    check_rows(tree, rows)


def test_five_growing_calls_make_one_path() -> None:
    prompt, turns, messages = [*SYS_MAIN, *msg(USER, 20), *GEN], [], [m("system"), m("user")]
    for i in range(5):
        t = turn(list(prompt), [30 + i, 31 + i], float(i), list(messages))
        turns.append(t)
        role, text = ("tool", "out") if i % 2 == 0 else ("user", "more")
        prompt = [*t.seq_ids, *msg(TOOL if role == "tool" else USER, 50 + i), *GEN]
        messages = [*messages, m("assistant"), m(role, text)]
    tree = build_tree(turns)
    assert tree.roots == [turns[0].id]
    assert [tree.node(t.id).depth for t in turns] == [0, 1, 2, 3, 4]
    assert {n.segment for n in tree.nodes.values()} == {0}
    rows = training_rows(tree)
    assert len(rows) == 1 and rows[0].turn_ids == [t.id for t in turns]
    assert rows[0].num_trained_tokens == sum(len(t.completion_ids) for t in turns)
    check_rows(tree, rows)
    roles = [next_state(tree, t.id).role for t in turns[:4]]  # type: ignore[union-attr]
    assert roles == [NextStateRole.TOOL, NextStateRole.USER, NextStateRole.TOOL, NextStateRole.USER]
    assert next_state(tree, turns[1].id).ids == [*msg(USER, 51), *GEN]  # type: ignore[union-attr]
    assert next_state(tree, turns[4].id) is None


def test_edited_history_starts_a_new_segment() -> None:
    t1 = turn([*SYS_MAIN, *msg(USER, 20), *GEN], [30], 1.0)
    t2 = turn([*t1.seq_ids, *msg(USER, 21), *GEN], [31], 2.0)
    # The client edited t1's answer (e.g. reasoning stripped): ids differ inside the history.
    edited = [*t1.prompt_ids, 39, END, *msg(USER, 21), *msg(USER, 22), *GEN]
    t3 = turn(edited, [32], 3.0)
    t4 = turn([*t3.seq_ids, *msg(USER, 23), *GEN], [33], 4.0)
    tree = build_tree([t1, t2, t3, t4])
    assert tree.node(t2.id).parent_id == t1.id
    assert tree.node(t3.id).parent_id is None
    assert tree.node(t3.id).root_reason is RootReason.NO_PREFIX_MATCH
    assert tree.node(t3.id).segment == 1 and tree.node(t4.id).segment == 1
    assert tree.node(t4.id).parent_id == t3.id
    rows = training_rows(tree)
    assert [r.turn_ids for r in rows] == [[t1.id, t2.id], [t3.id, t4.id]]
    check_rows(tree, rows)


def test_untrainable_turns_are_never_trained() -> None:
    t1 = turn([*SYS_MAIN, *msg(USER, 20), *GEN], [30, 31], 1.0)
    cut = turn([*t1.seq_ids, *msg(USER, 21), *GEN], [40, 41], 2.0, status=TurnStatus.INCOMPLETE)
    # a later call that extends the incomplete turn (the client kept the partial answer)
    after = turn([*cut.seq_ids, *msg(USER, 22), *GEN], [50], 3.0)
    stop = turn(
        [*after.seq_ids, *msg(USER, 23), *GEN],
        [60],
        4.0,
        trainable=False,
        untrainable_reason=UntrainableReason.STOP_STRING_MISMATCH,
    )
    bad_lp = turn([*stop.seq_ids, *msg(USER, 24), *GEN], [70], 5.0)
    bad_lp.sampling_logprobs = bad_lp.sampling_logprobs[:-1]
    marked = turn([*bad_lp.seq_ids, *msg(USER, 25), *GEN], [80], 6.0, trainable=False)
    pending = turn([*marked.seq_ids, *msg(USER, 26), *GEN], [], 7.0, status=TurnStatus.PENDING)
    tree = build_tree([t1, cut, after, stop, bad_lp, marked, pending])
    assert tree.node(after.id).parent_id == cut.id
    assert tree.node(pending.id).parent_id == marked.id
    rows = training_rows(tree)
    assert len(rows) == 1
    row = rows[0]
    assert row.trained_turn_ids == [t1.id, after.id]
    assert row.untrained == {
        cut.id: "incomplete",
        stop.id: "stop_string_mismatch",
        bad_lp.id: "logprobs_mismatch",
        marked.id: "marked_untrainable",
        pending.id: "pending",
    }
    start = len(cut.prompt_ids)
    assert row.loss_mask[start : start + len(cut.completion_ids)] == [0, 0, 0]
    assert tree.reason_counts() == {
        "untrainable/incomplete": 1,
        "untrainable/logprobs_mismatch": 1,
        "untrainable/marked_untrainable": 1,
        "untrainable/pending": 1,
        "untrainable/stop_string_mismatch": 1,
    }
    check_rows(tree, rows)


def test_longest_prefix_wins_and_equal_ones_prefer_recent_or_hint() -> None:
    p = [*SYS_MAIN, *msg(USER, 20), *GEN]
    greedy1 = turn(p, [30], 1.0)
    greedy2 = turn(p, [30], 2.0)  # identical retry, identical completion
    child = turn([*greedy1.seq_ids, *msg(USER, 21), *GEN], [31], 3.0)
    tree = build_tree([greedy1, greedy2, child])
    assert tree.node(child.id).parent_id == greedy2.id  # most recent among equals
    hinted = turn(child.prompt_ids, [32], 4.0, parent_turn_id=greedy1.id)
    wrong = turn(child.prompt_ids, [33], 5.0, parent_turn_id=child.id)
    tree = build_tree([greedy1, greedy2, child, hinted, wrong])
    assert tree.node(hinted.id).parent_id == greedy1.id
    assert tree.node(hinted.id).hint is HintCheck.CONFIRMED
    assert tree.node(wrong.id).parent_id == greedy2.id
    assert tree.node(wrong.id).hint is HintCheck.REJECTED
    assert tree.node(child.id).hint is HintCheck.NONE
    # a deeper ancestor is preferred to a shallower one
    grand = turn([*child.seq_ids, *msg(USER, 22), *GEN], [34], 6.0)
    tree = build_tree([greedy1, greedy2, child, grand])
    assert tree.path(grand.id) == [greedy2.id, child.id, grand.id]
    check_rows(tree, training_rows(tree))


def test_side_calls_do_not_take_the_next_state() -> None:
    t1 = turn([*SYS_MAIN, *msg(USER, 20), *GEN], [30], 1.0, [m("user", "go")])
    compaction = turn(
        [*t1.seq_ids, *msg(USER, 90, 91), *GEN],
        [92],
        2.0,
        [m("user", "go"), m("assistant"), m("user", "summarise")],
        kind=TurnKind.SIDE,
        side_kind="compaction",
    )
    title = turn([*msg(SYSTEM, 300), *msg(USER, 20), *GEN], [301], 2.5, kind=TurnKind.SIDE)
    main = turn(
        [*t1.seq_ids, *msg(TOOL, 40), *GEN], [31], 3.0, [m("user", "go"), m("assistant"), m("tool")]
    )
    tree = build_tree([t1, compaction, title, main])
    assert tree.node(t1.id).children == [compaction.id, main.id]
    state = next_state(tree, t1.id)
    assert state is not None and state.child_turn_id == main.id
    assert state.role is NextStateRole.TOOL and state.other_child_ids == [compaction.id]
    assert tree.node(title.id).parent_id is None
    check_rows(tree, training_rows(tree))


def test_next_state_messages_fallback_and_anthropic_tool_results() -> None:
    t1 = turn([*SYS_MAIN, *msg(USER, 20), *GEN], [30], 1.0, [m("user", "a"), m("user", "b")])
    # The client merged the two user messages: counting no longer lines up.
    result = {"role": "user", "content": [{"type": "tool_result", "content": "ok"}]}
    t2 = turn(
        [*t1.seq_ids, *msg(TOOL, 40), *GEN], [31], 2.0, [m("user", "a b"), m("assistant"), result]
    )
    tree = build_tree([t1, t2])
    state = next_state(tree, t1.id)
    assert state is not None and state.messages == [result]
    assert state.role is NextStateRole.TOOL and "line up" in (state.note or "")
    # ids without messages: environment
    t3_msgs = [m("user", "a b"), m("assistant"), result, m("assistant")]
    t3 = turn([*t2.seq_ids, *GEN], [32], 3.0, t3_msgs)
    tree = build_tree([t1, t2, t3])
    state = next_state(tree, t2.id)
    assert state is not None and state.role is NextStateRole.ENVIRONMENT and state.ids == GEN


def test_feedback_is_a_next_state() -> None:
    t1 = turn([*SYS_MAIN, *msg(USER, 20), *GEN], [30], 1.0, [m("user", "a")])
    t2_msgs = [m("user", "a"), m("assistant"), m("user", "b")]
    t2 = turn([*t1.seq_ids, *msg(USER, 21), *GEN], [31], 2.0, t2_msgs)
    side = turn([*msg(SYSTEM, 300), *GEN], [301], 3.0, kind=TurnKind.SIDE)
    on_t1 = FeedbackRecord(-1.0, turn_id=t1.id, session_id="s", comment="wrong")
    on_session = FeedbackRecord(1.0, session_id="s", comment="tests pass")
    tree = build_tree([t1, t2, side], [on_t1, on_session])
    s1 = next_state(tree, t1.id)
    assert s1 is not None and s1.role is NextStateRole.USER and s1.feedback == [on_t1]
    s2 = next_state(tree, t2.id)
    assert s2 is not None and s2.role is NextStateRole.FEEDBACK and s2.feedback == [on_session]
    assert s2.ids == [] and s2.child_turn_id is None
    assert next_state(tree, side.id) is None  # session verdicts are not a side call's state
    on_t2 = FeedbackRecord(0.5, turn_id=t2.id, session_id="s")
    s2 = next_state(build_tree([t1, t2], [on_t2, on_session]), t2.id)
    assert s2 is not None and s2.feedback == [on_t2]


def test_empty_and_single() -> None:
    tree = build_tree([])
    assert tree.roots == [] and training_rows(tree) == [] and tree.session_id is None
    only = turn([1, 2, 3], [4], 1.0)
    tree = build_tree([only])
    assert tree.session_id == "s" and tree.node(only.id).root_reason is RootReason.FIRST
    check_rows(tree, training_rows(tree))


def test_dead_retry_leaves_are_dropped_and_the_live_attempt_keeps_its_credit():
    p = [1, 2, 3]
    lost = TurnRecord("s", p, [4], [-0.1], id="lost", created_at=1.0)  # answered, sent again
    live = TurnRecord("s", p, [4], [-0.1], id="live", created_at=2.0)
    nxt = TurnRecord("s", [*p, 4, 5], [6], [-0.2], id="next", created_at=3.0)
    last_a = TurnRecord("s", [*p, 4, 5, 6, 7], [8], [-0.3], id="last-a", created_at=4.0)
    last_b = TurnRecord("s", [*p, 4, 5, 6, 7], [9], [-0.3], id="last-b", created_at=5.0)
    # n = 2 choices of one call (one arrival time), and a subagent sending the same prompt
    choice0 = TurnRecord("s", [7, 7], [1], [-0.1], id="choice0", created_at=6.0)
    choice1 = TurnRecord("s", [7, 7], [2], [-0.1], id="choice1", created_at=6.0, choice_index=1)
    sub = TurnRecord("s", p, [4], [-0.1], id="sub", created_at=7.0, client={"agent_id": "a1"})
    tree = build_tree([lost, live, nxt, last_a, last_b, choice0, choice1, sub])
    reasons = {i: n.untrainable_reason for i, n in tree.nodes.items()}
    assert reasons == {
        "lost": UntrainableReason.ABANDONED_RETRY, "live": None, "next": None,
        "last-a": UntrainableReason.ABANDONED_RETRY, "last-b": None,  # the last answer retried
        "choice0": None, "choice1": None, "sub": None,
    }  # fmt: skip
    assert tree.node("live").children == ["next"] and not tree.node("lost").children
    rows = training_rows(tree)
    trained = [t for r in rows for t in r.trained_turn_ids]
    assert sorted(trained) == ["choice0", "choice1", "last-b", "live", "next", "sub"]
    assert {t: r for row in rows for t, r in row.untrained.items()} == {
        "lost": "abandoned_retry", "last-a": "abandoned_retry"
    }  # fmt: skip
