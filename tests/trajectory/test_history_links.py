"""The message rule (:mod:`clawrl.trajectory.history`): a turn whose answer the template
re-rendered to other ids keeps its next state, each turn keeps its own sampled ids as its
training row, and a changed answer or another conversation is never linked."""

from __future__ import annotations

from typing import Any

from clawrl.store import TurnRecord
from clawrl.trajectory import (
    HistoryChange,
    LinkKind,
    RootReason,
    build_tree,
    continues,
    next_state,
    training_rows,
)
from clawrl.trajectory.history import HISTORY_LINK_FACT, message_key

SYSTEM = {"role": "system", "content": "Be brief."}
HELLO = {"role": "user", "content": "Hello there"}
QUESTION = {"role": "user", "content": "What is 2+2?"}


def _out(content: str | None, reasoning: str | None = None, calls: Any = ()) -> dict[str, Any]:
    return {"content": content, "reasoning": reasoning, "tool_calls": list(calls)}


def _turn(
    messages: list[dict[str, Any]],
    prompt: list[int],
    completion: list[int],
    output: dict[str, Any] | None,
    t: float,
    **kw: Any,
) -> TurnRecord:
    return TurnRecord(
        "s",
        prompt,
        completion,
        [-0.1] * len(completion),
        request_messages=messages,
        output=output,
        created_at=t,
        **kw,
    )


def test_message_rule_tolerates_what_templates_and_clients_rewrite():
    call = {"id": "call_1", "name": "add", "arguments": {"a": 2, "b": 2}}
    sampled = _out("Sure.", reasoning="Let me think.", calls=[call])
    echoed = {
        "role": "assistant",
        "content": "  Sure. \n",  # whitespace trimmed / kept differently
        "tool_calls": [  # another id, arguments as a JSON string with other spacing and order
            {"id": "x", "type": "function",
             "function": {"name": "add", "arguments": '{"b":2,"a":2}'}},
        ],
    }  # fmt: skip
    nxt = {"role": "tool", "tool_call_id": "x", "content": "4"}
    assert continues([SYSTEM, HELLO, echoed, nxt], [SYSTEM, HELLO], sampled)
    # nothing after the answer: no next state to take
    assert not continues([SYSTEM, HELLO, echoed], [SYSTEM, HELLO], sampled)
    # the client changed what the answer says, or what it called
    words = {**echoed, "content": "Sure, in French."}
    assert not continues([SYSTEM, HELLO, words, nxt], [SYSTEM, HELLO], sampled)
    args = {**echoed, "tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}}]}
    assert not continues([SYSTEM, HELLO, args, nxt], [SYSTEM, HELLO], sampled)
    # another conversation that happens to hold the same answer
    assert not continues([SYSTEM, QUESTION, echoed, nxt], [SYSTEM, HELLO], sampled)
    # a turn that said nothing cannot be continued
    assert not continues([SYSTEM, HELLO, echoed, nxt], [SYSTEM, HELLO], _out(None, "thinking"))
    assert message_key({"role": "user", "content": "a  b\n"}) == message_key(
        {"role": "user", "content": [{"type": "text", "text": "a b"}]}
    )


def _rewritten_pair(fact: bool = True) -> tuple[TurnRecord, TurnRecord]:
    """T0 sampled ``Sure.\\n\\n``; the template renders ``Sure.`` in T1's prompt, so T1's
    prompt does not extend T0's prompt + completion."""
    t0 = _turn([SYSTEM, HELLO], [1, 2, 3], [40, 41, 99], _out("Sure."), 1.0)
    messages = [SYSTEM, HELLO, {"role": "assistant", "content": "Sure."}, QUESTION]
    client = {}
    if fact:
        client = {HISTORY_LINK_FACT: {"turn_id": t0.id, "changes": ["whitespace"],
                                      "next_state_at": 6}}  # fmt: skip
    t1 = _turn(messages, [1, 2, 3, 40, 98, 99, 7, 8, 3], [50, 99], _out("4."), 2.0, client=client)
    return t0, t1


def test_a_rewritten_answer_keeps_its_next_state_and_each_turn_its_own_ids():
    t0, t1 = _rewritten_pair()
    tree = build_tree([t0, t1])
    node = tree.node(t1.id)
    assert node.parent_id == t0.id and node.link == LinkKind.HISTORY_REWRITTEN
    assert node.changes == (HistoryChange.WHITESPACE.value,)
    assert tree.node(t0.id).link is None and tree.node(t0.id).root_reason == RootReason.FIRST
    assert node.segment == tree.node(t0.id).segment and node.depth == 1
    state = next_state(tree, t0.id)
    assert state is not None and state.child_turn_id == t1.id
    assert state.messages == [QUESTION] and state.role.value == "user"
    assert state.ids == [7, 8, 3] and state.changes == ["whitespace"]
    # the link is never crossed by a training row: each turn's row is its own sampled ids
    rows = training_rows(tree)
    assert [row.turn_ids for row in rows] == [[t0.id], [t1.id]]
    assert [row.input_ids for row in rows] == [t0.seq_ids, t1.seq_ids]
    assert [row.trained_turn_ids for row in rows] == [[t0.id], [t1.id]]
    assert rows[0].loss_mask == [0, 0, 0, 1, 1, 1]
    assert rows[0].sampling_logprobs[3:] == t0.sampling_logprobs


def test_without_the_gateways_record_the_changes_are_unknown():
    t0, t1 = _rewritten_pair(fact=False)
    tree = build_tree([t0, t1])
    assert tree.node(t1.id).changes == (HistoryChange.UNKNOWN.value,)
    state = next_state(tree, t0.id)
    assert state is not None and state.messages == [QUESTION] and state.ids == []
    assert state.note is not None and "not recorded" in state.note


def test_a_deeper_rewritten_answer_wins_over_a_shallower_id_parent():
    """T1 extends T0 by ids; T1's answer was re-rendered, and T2's prompt happens to extend
    T0's ids (T0's answer rendered as sampled): T2 continues T1, not T0."""
    t0 = _turn([SYSTEM, HELLO], [1, 2], [10, 99], _out("Hi."), 1.0)
    m1 = [SYSTEM, HELLO, {"role": "assistant", "content": "Hi."}, QUESTION]
    t1 = _turn(m1, [1, 2, 10, 99, 5], [20, 21, 99], _out("Four."), 2.0)
    m2 = [*m1, {"role": "assistant", "content": "Four."}, {"role": "user", "content": "Thanks"}]
    t2 = _turn(m2, [1, 2, 10, 99, 5, 20, 99, 6], [30, 99], _out("Bye."), 3.0)
    tree = build_tree([t0, t1, t2])
    assert tree.node(t1.id).parent_id == t0.id and tree.node(t1.id).link == LinkKind.PREFIX
    assert tree.node(t2.id).parent_id == t1.id
    assert tree.node(t2.id).link == LinkKind.HISTORY_REWRITTEN
    assert next_state(tree, t0.id).child_turn_id == t1.id  # type: ignore[union-attr]
    assert next_state(tree, t1.id).messages == [m2[-1]]  # type: ignore[union-attr]
    rows = training_rows(tree)
    assert [row.turn_ids for row in rows] == [[t0.id, t1.id], [t2.id]]
    assert sorted(t for row in rows for t in row.trained_turn_ids) == sorted([t0.id, t1.id, t2.id])


def test_an_edited_answer_or_another_conversation_is_not_linked():
    t0 = _turn([SYSTEM, HELLO], [1, 2], [10, 99], _out("Sure."), 1.0)
    edited = [SYSTEM, HELLO, {"role": "assistant", "content": "No."}, QUESTION]
    other = [SYSTEM, QUESTION, {"role": "assistant", "content": "Sure."}, HELLO]
    t1 = _turn(edited, [1, 2, 11, 99, 5], [20, 99], _out("4."), 2.0)
    t2 = _turn(other, [1, 3, 10, 99, 6], [21, 99], _out("Hi."), 3.0, parent_turn_id=t0.id)
    tree = build_tree([t0, t1, t2])
    for turn in (t1, t2):
        assert tree.node(turn.id).parent_id is None
        assert tree.node(turn.id).root_reason == RootReason.NO_PREFIX_MATCH
    assert tree.node(t2.id).hint.value == "rejected"
    assert next_state(tree, t0.id) is None


def test_the_hint_picks_among_equal_answers_and_agents_stay_apart():
    """A retry that gave the same answer: both turns match; the gateway's hint decides, else
    the newest. A subagent repeating the main agent's conversation is not its child."""
    a = _turn([SYSTEM, HELLO], [1, 2], [10, 99], _out("Sure."), 1.0)
    b = _turn([SYSTEM, HELLO], [1, 2], [10, 98, 99], _out("Sure."), 2.0)
    m = [SYSTEM, HELLO, {"role": "assistant", "content": "Sure."}, QUESTION]
    hinted = _turn(m, [1, 2, 10, 97, 5], [20, 99], _out("4."), 3.0, parent_turn_id=a.id)
    plain = _turn(m, [1, 2, 10, 97, 5], [21, 99], _out("4!"), 4.0)
    sub = _turn(m, [1, 2, 10, 97, 5], [22, 99], _out("4?"), 5.0, client={"agent_id": "sub"})
    tree = build_tree([a, b, hinted, plain, sub])
    assert tree.node(hinted.id).parent_id == a.id
    assert tree.node(plain.id).parent_id == b.id
    assert tree.node(sub.id).parent_id is None
    assert tree.node(sub.id).root_reason == RootReason.SUBAGENT


def test_malformed_stored_rows_are_never_an_error():
    """Rows written by other tools (or old versions) may hold anything: no link, no exception."""
    odd = ["hello", {"role": "assistant", "tool_calls": [{"function": "x"}, None]}, 7, QUESTION]
    a = _turn(odd[:2], [1, 2], [3, 99], {"content": "ok", "tool_calls": "not a list"}, 1.0)
    b = _turn(odd, [1, 4], [5, 99], ["not", "an", "object"], 2.0)  # type: ignore[arg-type]
    c = _turn([*odd, {"role": "assistant", "content": "ok"}, HELLO], [1, 6], [7], None, 3.0)
    tree = build_tree([a, b, c])
    assert tree.node(c.id).parent_id is None  # a said "ok" after two messages, not four
    assert not continues(odd, odd[:2], {"content": None, "tool_calls": 3})
