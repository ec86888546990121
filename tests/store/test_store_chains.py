"""Prompts stored as deltas of their prefix turn, rebuilt exactly on read (both backends)."""

from __future__ import annotations

import pytest

from clawrl.errors import StoreError
from clawrl.store import Store, TurnRecord
from clawrl.store.chains import MIN_SHARED_IDS


def _row(store: Store, turn_id: str):
    with store._read() as conn:
        return conn.execute(
            "SELECT prefix_turn_id, prefix_len, messages_prefix_len, length(prompt_ids), "
            "request_messages FROM turns WHERE id = ?",
            (turn_id,),
        ).fetchone()


def test_a_continuation_is_stored_as_a_delta_and_read_whole(store_target) -> None:
    target = store_target()
    m1 = [{"role": "user", "content": "hi"}]
    m2 = [*m1, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}]
    with Store(target) as store:
        sid = store.new_session().id
        a = TurnRecord(sid, [1, 2, 3], [4, 5], [-1.0, -2.0], request_messages=m1)
        store.record_turn(a)
        b = TurnRecord(sid, [1, 2, 3, 4, 5, 6, 7], [8], [-0.5], parent_turn_id=a.id,
                       request_messages=m2)  # fmt: skip
        store.record_turn(b)
        c = TurnRecord(sid, [1, 2, 9], [10], [-0.5], parent_turn_id=b.id, request_messages=m1)
        store.record_turn(c)  # does not extend b, shares 2 ids only: stored whole
        assert _row(store, a.id)[0] is None
        base, k, shared, stored, messages = _row(store, b.id)
        assert (base, k, shared, stored) == (a.id, 5, 1, 8)
        assert (
            messages == '[{"role":"assistant","content":"hello"},{"role":"user","content":"more"}]'
        )
        assert _row(store, c.id)[:4] == (None, 0, 0, 12)
    with Store(target) as fresh:  # nothing remembered: the chain is read from the database
        got = fresh.get_turn(b.id)
        assert got is not None and got.prompt_ids == b.prompt_ids
        assert got.request_messages == m2 and got == b
        assert [t.id for t in fresh.find_extendable_turns([1, 2, 3, 4, 5, 6, 7, 8, 9])] == [
            b.id, a.id,
        ]  # fmt: skip
        assert [t.id for t in fresh.find_turns_by_prompt(b.prompt_ids)] == [b.id]


def test_a_rewritten_history_shares_its_long_start(store_target) -> None:
    with Store(store_target()) as store:
        sid = store.new_session().id
        head = list(range(MIN_SHARED_IDS + 10))
        a = TurnRecord(sid, [*head, 7, 7], [8], [-1.0])
        store.record_turn(a)
        b = TurnRecord(sid, [*head, 9, 9, 9], [1], [-1.0], parent_turn_id=a.id)
        store.record_turn(b)
        assert _row(store, b.id)[:4] == (a.id, len(head), 0, 12)
        short = TurnRecord(sid, [*head[:10], 5], [1], [-1.0], parent_turn_id=a.id)
        store.record_turn(short)
        assert _row(store, short.id)[:2] == (None, 0)
    with Store(store_target()) as fresh:
        assert fresh.get_turn(b.id) == b and fresh.get_turn(short.id) == short


def test_a_long_chain_rebuilds_without_recursion_limits(store_target) -> None:
    target = store_target()
    with Store(target) as store:
        sid = store.new_session().id
        prompt: list[int] = [1]
        parent = None
        for k in range(1200):
            turn = TurnRecord(sid, list(prompt), [k % 1000 + 2], [-0.1], parent_turn_id=parent)
            store.record_turn(turn)
            parent, prompt = turn.id, [*prompt, k % 1000 + 2, 3]
    with Store(target) as fresh:
        last = fresh.get_turn(parent)
        assert last is not None and len(last.prompt_ids) == 1 + 2 * 1199
        assert [len(t.prompt_ids) for t in fresh.session_turns(sid)][-3:] == [2395, 2397, 2399]
        with fresh._read() as conn:
            stored = conn.execute(
                "SELECT SUM(length(prompt_ids)) FROM turns WHERE session_id = ?", (sid,)
            ).fetchone()[0]
        assert int(stored) == 4 * 1200  # each turn stored only the one id it adds


def test_ids_a_later_turn_builds_on_never_change(store_target) -> None:
    with Store(store_target()) as store:
        sid = store.new_session().id
        a = TurnRecord(sid, [1, 2], [3], [-1.0])
        store.record_turn(a)
        with pytest.raises(StoreError, match="cannot update"):
            store.update_turn(a.id, prompt_ids=[5])
        with pytest.raises(StoreError, match="cannot update"):
            store.update_turn(a.id, request_messages=[])
        store.update_turn(a.id, completion_ids=[3, 4], sampling_logprobs=[-1.0, -1.0])
        b = TurnRecord(sid, [1, 2, 3, 4, 5], [6], [-1.0], parent_turn_id=a.id)
        store.record_turn(b)
        with pytest.raises(StoreError, match="continuation"):
            store.update_turn(a.id, completion_ids=[9], sampling_logprobs=[-1.0])
        store.update_turn(a.id, status="incomplete", trainable=False)  # other fields may
        assert store.get_turn(b.id) == b


def test_a_base_changed_by_another_process_is_not_trusted(store_target) -> None:
    target = store_target()
    with Store(target) as writer, Store(target) as other:
        sid = writer.new_session().id
        a = TurnRecord(sid, [1, 2], [3], [-1.0])
        writer.record_turn(a)  # the writer now remembers a = [1, 2] + [3]
        other.update_turn(a.id, completion_ids=[4], sampling_logprobs=[-1.0])
        b = TurnRecord(sid, [1, 2, 3, 5], [6], [-1.0], parent_turn_id=a.id)
        writer.record_turn(b)  # extends the remembered a, not the stored one: stored whole
        assert _row(writer, b.id)[:2] == (None, 0)
        c = TurnRecord(sid, [1, 2, 4, 5], [6], [-1.0], parent_turn_id=a.id)
        other.record_turn(c)
        assert _row(other, c.id)[:2] == (a.id, 3)
        assert writer.get_turn(c.id) == c  # a stale memory of a is noticed and re-read
        assert writer.get_turn(b.id) == b
