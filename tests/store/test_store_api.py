"""Store API: round-trips, sessions, feedback, lookups by output hash, prompt and prefix."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest

from clawrl.errors import StoreError
from clawrl.store import (
    ApiProtocol,
    SessionSource,
    Store,
    StoreConflict,
    TurnKind,
    TurnRecord,
    TurnStatus,
    UntrainableReason,
    decode_floats,
    decode_ids,
    encode_floats,
    encode_ids,
    ids_digest,
    output_hash,
    prefix_digests,
)


@pytest.fixture
def store(store_target):
    with Store(store_target()) as s:
        yield s


def _full_turn(session_id: str) -> TurnRecord:
    return TurnRecord(
        session_id=session_id,
        prompt_ids=[0, 1, 2**31 - 1, -(2**31), 151643],
        completion_ids=[7, 8, 9],
        sampling_logprobs=[-0.1, -1e-300, -123.456789012345678],
        parent_turn_id="p",
        segment=2,
        kind=TurnKind.SIDE,
        side_kind="title",
        protocol=ApiProtocol.ANTHROPIC_MESSAGES,
        request_messages=[{"role": "user", "content": "héllo ✓"}],
        tools=[{"name": "bash", "input_schema": {"type": "object"}}],
        sampling_params={"temperature": 0.7, "max_tokens": 5},
        policy_version=3,
        finish_reason="stop",
        status=TurnStatus.OK,
        output={"content": "hi", "reasoning": "r", "tool_calls": []},
        latency_s=1.5,
        ttft_s=0.25,
        client={"user_agent": "x", "retry_count": 1},
        session_source=SessionSource.HEADER,
        trainable=False,
        untrainable_reason=UntrainableReason.STOP_STRING_MISMATCH,
        choice_index=1,
    )


def test_codec_round_trips_exactly() -> None:
    ids = [0, 1, -1, 2**31 - 1, -(2**31), 42]
    assert decode_ids(encode_ids(ids)) == ids
    assert len(encode_ids(ids)) == 4 * len(ids)
    floats = [0.0, -0.1, -1e-320, -math.inf, 1 / 3, -745.1332191019411]
    assert decode_floats(encode_floats(floats)) == floats
    assert decode_ids(None) == [] and decode_floats(b"") == []
    with pytest.raises(StoreError):
        encode_ids([2**31])
    with pytest.raises(StoreError):
        encode_ids([1.5])  # type: ignore[list-item]
    with pytest.raises(StoreError, match="corrupt"):
        decode_ids(b"abc")
    assert prefix_digests(ids, [0, 3, 6, 99]) == {
        0: ids_digest([]),
        3: ids_digest(ids[:3]),
        6: ids_digest(ids),
    }


def test_output_hash_is_canonical() -> None:
    call = {"id": "call_1", "name": "bash", "arguments": '{"cmd": "ls",  "n": 1}'}
    echoed = {
        "id": "call1",
        "type": "function",
        "function": {"name": "bash", "arguments": '{"n":1,"cmd":"ls"}'},
    }
    anthropic = {
        "type": "tool_use",
        "id": "toolu_1",
        "name": "bash",
        "input": {"cmd": "ls", "n": 1},
    }
    assert output_hash(None, [call]) == output_hash("", [echoed]) == output_hash(" ", [anthropic])
    assert output_hash("hi\n") == output_hash([{"type": "text", "text": "hi"}])
    assert output_hash("hi") != output_hash("ho")
    assert output_hash("hi", [call]) != output_hash("hi")


def test_turn_round_trip_survives_reopen(store_target) -> None:
    path = store_target()
    with Store(path) as store:
        session = store.new_session(SessionSource.HEADER, client="claude-code", metadata={"a": 1})
        turn = _full_turn(session.id)
        assert store.record_turn(turn) == turn.id
        assert turn.output_hash == output_hash("hi", [])
    with Store(path) as store:
        got = store.get_turn(turn.id)
        assert got == turn
        assert got.sampling_logprobs[2] == -123.456789012345678  # float64 exact
        assert isinstance(got.status, TurnStatus) and isinstance(got.kind, TurnKind)
        assert got.untrainable_reason is UntrainableReason.STOP_STRING_MISMATCH
        assert store.get_session(session.id) == session
        assert store.get_turn("nope") is None


def test_invalid_turns_are_refused(store: Store) -> None:
    session = store.new_session()
    with pytest.raises(StoreConflict, match=r"(?i)foreign key"):
        store.record_turn(TurnRecord("no-such-session", [1]))
    with pytest.raises(StoreError, match=r"turn\.status"):
        store.record_turn(TurnRecord(session.id, [1], status="weird"))  # type: ignore[arg-type]
    with pytest.raises(StoreError, match="JSON"):
        store.record_turn(TurnRecord(session.id, [1], client={"x": object()}))
    turn = TurnRecord(session.id, [1])
    store.record_turn(turn)
    with pytest.raises(StoreConflict):
        store.record_turn(turn)
    assert len(store.session_turns(session.id)) == 1


def test_update_turn(store: Store) -> None:
    session = store.new_session()
    turn = TurnRecord(session.id, [1, 2], status=TurnStatus.PENDING)
    store.record_turn(turn)
    updated = store.update_turn(
        turn.id,
        status=TurnStatus.INCOMPLETE,
        completion_ids=[3, 4],
        sampling_logprobs=[-1.0, -2.0],
        output={"content": "part"},
        finish_reason="aborted",
    )
    assert store.get_turn(turn.id) == updated
    assert updated.output_hash == output_hash("part")
    assert store.find_extendable_turns([1, 2, 3, 4, 5])[0].id == turn.id  # derived cols moved
    with pytest.raises(StoreError, match="cannot update"):
        store.update_turn(turn.id, session_id="other")
    with pytest.raises(StoreError, match="cannot update"):
        store.update_turn(turn.id, bogus=1)
    with pytest.raises(StoreError, match="unknown turn"):
        store.update_turn("missing", status=TurnStatus.OK)


def test_sessions(store: Store) -> None:
    a = store.get_or_create_session("sess-a", SessionSource.HEADER, "claude-code")
    again = store.get_or_create_session("sess-a", SessionSource.INFERRED, "other")
    assert again == a and again.source is SessionSource.HEADER
    b = store.new_session(SessionSource.HARNESS, created_at=a.created_at + 1)
    with pytest.raises(StoreError):
        store.new_session(session_id="sess-a")
    store.record_turn(TurnRecord(a.id, [1, 2], [3], [-0.1]))
    store.record_turn(TurnRecord(a.id, [1, 2, 3, 4], [5, 6], [-0.1, -0.2], kind=TurnKind.SIDE))
    store.record_turn(TurnRecord(a.id, [9], status=TurnStatus.ERROR, error_kind="EngineError"))
    store.add_feedback(1.0, session_id=a.id)
    summaries = store.list_sessions()
    assert [s.session.id for s in summaries] == [b.id, a.id]
    sa = summaries[1]
    assert (sa.turns, sa.trainable_turns, sa.side_turns, sa.failed_turns, sa.feedback) == (
        3,
        2,
        1,
        1,
        1,
    )
    assert (sa.prompt_tokens, sa.completion_tokens) == (7, 3)
    assert summaries[0].turns == 0 and summaries[0].last_turn_at is None
    assert [s.session.id for s in store.list_sessions(limit=1, offset=1)] == [a.id]
    store.end_session(a.id, ended_at=123.0)
    store.end_session(a.id, ended_at=456.0)
    assert store.get_session(a.id).ended_at == 123.0
    with pytest.raises(StoreError, match="unknown session"):
        store.end_session("missing")
    assert store.session_ids() == [a.id, b.id]


def test_session_turns_are_ordered_by_creation(store: Store) -> None:
    session = store.new_session()
    late = TurnRecord(session.id, [1], created_at=20.0)
    early = TurnRecord(session.id, [2], created_at=10.0)
    tie_a, tie_b = (
        TurnRecord(session.id, [3], created_at=30.0),
        TurnRecord(session.id, [4], created_at=30.0),
    )
    for t in (late, early, tie_a, tie_b):
        store.record_turn(t)
    assert [t.id for t in store.session_turns(session.id)] == [
        early.id,
        late.id,
        tie_a.id,
        tie_b.id,
    ]


def test_feedback(store: Store) -> None:
    session = store.new_session()
    turn = TurnRecord(session.id, [1], [2], [-0.5])
    store.record_turn(turn)
    fb = store.add_feedback(-1.0, turn_id=turn.id, comment="wrong file")
    assert fb.session_id == session.id
    store.add_feedback(0.5, session_id=session.id)
    assert store.feedback_for(turn_id=turn.id) == [fb]
    assert [f.reward for f in store.feedback_for(session_id=session.id)] == [-1.0, 0.5]
    for bad in (1.5, -1.01, math.nan):
        with pytest.raises(StoreError, match="reward"):
            store.add_feedback(bad, session_id=session.id)
    with pytest.raises(StoreError, match="needs"):
        store.add_feedback(0.0)
    with pytest.raises(StoreError, match="unknown turn"):
        store.add_feedback(0.0, turn_id="missing")
    other = store.new_session()
    with pytest.raises(StoreError, match="not in session"):
        store.add_feedback(0.0, turn_id=turn.id, session_id=other.id)
    with pytest.raises(StoreConflict, match=r"(?i)foreign key"):
        store.add_feedback(0.0, session_id="missing")
    with pytest.raises(StoreError, match="exactly one"):
        store.feedback_for()


def test_find_turns_by_output_hash_and_prompt(store: Store) -> None:
    s1, s2 = store.new_session(), store.new_session()
    t1 = TurnRecord(s1.id, [1, 2], [3], [-0.1], output={"content": "same"}, created_at=1.0)
    t2 = TurnRecord(s2.id, [1, 2], [4], [-0.1], output={"content": "same"}, created_at=2.0)
    t3 = TurnRecord(s1.id, [1, 2, 3], [5], [-0.1], output={"content": "other"}, created_at=3.0)
    for t in (t1, t2, t3):
        store.record_turn(t)
    h = output_hash("same")
    assert [t.id for t in store.find_turns_by_output_hash(h)] == [t2.id, t1.id]
    assert [t.id for t in store.find_turns_by_output_hash(h, session_id=s1.id)] == [t1.id]
    assert [t.id for t in store.find_turns_by_output_hash(h, limit=1)] == [t2.id]
    assert store.find_turns_by_output_hash(output_hash("none")) == []
    assert [t.id for t in store.find_turns_by_prompt([1, 2])] == [t2.id, t1.id]
    assert [t.id for t in store.find_turns_by_prompt([1, 2], session_id=s1.id)] == [t1.id]
    assert store.find_turns_by_prompt([1]) == []
    assert store.find_turns_by_prompt([1, 2], since_s=10.0, now=11.5) == [t2]
    other, none = output_hash("other"), output_hash("none")
    many = store.find_turns_by_output_hashes([h, other, none, h])
    assert {k: [t.id for t in v] for k, v in many.items()} == {
        h: [t2.id, t1.id], other: [t3.id], none: [],
    }  # fmt: skip
    assert [t.id for t in store.find_turns_by_output_hashes([h], limit=1)[h]] == [t2.id]
    scoped = store.find_turns_by_output_hashes([h, other], session_id=s1.id)
    assert [t.id for t in scoped[h]] == [t1.id] and [t.id for t in scoped[other]] == [t3.id]


def test_find_extendable_turns(store: Store) -> None:
    now = time.time()
    s1 = store.new_session()
    sys_p = list(range(100, 140))
    t1 = TurnRecord(s1.id, [*sys_p, 1, 2], [3, 4], [-0.1, -0.2], created_at=now - 30)
    t2 = TurnRecord(s1.id, [*t1.seq_ids, 5, 6], [7], [-0.3], created_at=now - 20)
    retry_src = TurnRecord(s1.id, [*sys_p, 9], status=TurnStatus.ERROR, created_at=now - 10)
    s2 = store.new_session()  # same system prompt, other conversation
    u1 = TurnRecord(s2.id, [*sys_p, 1, 2], [3, 99], [-0.1, -0.2], created_at=now - 5)
    for t in (t1, t2, retry_src, u1):
        store.record_turn(t)

    query = [*t2.seq_ids, 8, 8]
    assert [t.id for t in store.find_extendable_turns(query)] == [t2.id, t1.id]
    assert [t.id for t in store.find_extendable_turns(query, limit=1)] == [t2.id]
    # equal length counts: the prompt is exactly t1's prompt + completion
    assert [t.id for t in store.find_extendable_turns(t1.seq_ids)] == [t1.id]
    # a prefix of t1's sequence that does not extend it: nothing
    assert store.find_extendable_turns(t1.prompt_ids) == []
    assert store.find_extendable_turns(t1.seq_ids[:-1]) == []
    # unrelated prompt, empty prompt
    assert store.find_extendable_turns([7, 7, 7, 7]) == []
    assert store.find_extendable_turns([]) == []
    # a retry of a failed call (no completion) matches the failed call
    assert [t.id for t in store.find_extendable_turns([*sys_p, 9])] == [retry_src.id]
    # the other session's turn diverges at its last token
    assert [t.id for t in store.find_extendable_turns([*u1.seq_ids, 0])] == [u1.id]
    # time window
    assert [t.id for t in store.find_extendable_turns(query, since_s=25, now=now)] == [t2.id]
    assert [t.id for t in store.find_extendable_turns(query, since_s=None)] == [t2.id, t1.id]
    # ended sessions are ignored
    store.end_session(s1.id)
    assert store.find_extendable_turns(query) == []


def test_find_extendable_turns_verifies_ids_not_just_digests(store: Store) -> None:
    session = store.new_session()
    real = TurnRecord(session.id, [1, 2], [3], [-0.1])
    fake = TurnRecord(session.id, [4, 5], [6], [-0.1])
    store.record_turn(real)
    store.record_turn(fake)
    # Simulate a digest collision: give the unrelated turn the digest of the real prefix.
    with store._write() as conn:
        conn.execute("UPDATE turns SET seq_hash = ? WHERE id = ?", (ids_digest([1, 2, 3]), fake.id))
    assert [t.id for t in store.find_extendable_turns([1, 2, 3, 4])] == [real.id]


def test_recent_turns_filters(store: Store) -> None:
    now = time.time()
    inferred = store.new_session()
    named = store.get_or_create_session("named", SessionSource.HEADER)
    bob = {"user_agent": "bob/1", "api_key_fingerprint": "fb"}
    old = TurnRecord(inferred.id, [1, 2, 3], [4], [-0.1], created_at=now - 7200, client=bob)
    a = TurnRecord(inferred.id, [1, 2, 3, 5], [4], [-0.1], created_at=now - 20, client=bob)
    b = TurnRecord(inferred.id, [9], [4], [-0.1], created_at=now - 10, kind=TurnKind.SIDE)
    c = TurnRecord("named", [1, 2, 3], [4], [-0.1], created_at=now - 5, client=bob)
    for t in (old, a, b, c):
        store.record_turn(t)
    assert [t.id for t in store.recent_turns(3600, now=now)] == [c.id, b.id, a.id]
    assert [t.id for t in store.recent_turns(3600, inferred_only=True, now=now)] == [b.id, a.id]
    assert [t.id for t in store.recent_turns(3600, main_only=True, now=now)] == [c.id, a.id]
    assert [t.id for t in store.recent_turns(3600, client_match=bob, now=now)] == [c.id, a.id]
    alice = {"user_agent": "alice/1", "api_key_fingerprint": None}
    assert store.recent_turns(3600, client_match=alice, now=now) == []
    store.end_session(named.id)
    assert [t.id for t in store.recent_turns(3600, client_match=bob, now=now)] == [a.id]
    with pytest.raises(StoreError):
        store.recent_turns(client_match={"x') OR 1=1 --": 1})


def test_find_dropped_answer_turns(store: Store) -> None:
    gen = [77, 78]
    context = list(range(100, 140))
    session = store.new_session()
    dropped = TurnRecord(session.id, [*context, *gen], [5, 6], [-0.1, -0.1])
    short = TurnRecord(session.id, [1, 2, *gen], [5], [-0.1])  # context under the minimum
    store.record_turn(dropped)
    store.record_turn(short)
    follow = [*context, 90, 91]  # the answer dropped, a new user message appended
    assert [t.id for t in store.find_dropped_answer_turns(follow, gen)] == [dropped.id]
    assert store.find_dropped_answer_turns([*context, *gen], gen) == []  # the same call again
    assert store.find_dropped_answer_turns([*context, *gen, 5, 6, 1], gen) == []  # extends it
    assert store.find_dropped_answer_turns([*context[:-1], 3, 90], gen) == []  # differs inside
    assert [t.id for t in store.find_dropped_answer_turns([1, 2, 90], gen, min_context=2)] == [
        short.id
    ]
    other = {"user_agent": "someone-else"}
    assert store.find_dropped_answer_turns(follow, gen, client_match=other) == []


def test_memory_path_refused_and_closed_store(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="file path"):
        Store(":memory:")
    store = Store(tmp_path / "s.db")
    store.close()
    store.close()
    with pytest.raises(StoreError, match="closed"):
        store.list_sessions()


def test_not_a_database(tmp_path: Path) -> None:
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError):
        Store(bad)


@pytest.mark.parametrize(
    "url", ["sqlite://x.db", "mysql://u@h/db", "file://x.db", "postgresql:/db", "postgres:u@h/db"]
)
def test_a_url_of_another_database_is_refused_not_made_a_directory(tmp_path, monkeypatch, url):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StoreError, match="postgresql://"):
        Store(url)
    assert list(tmp_path.iterdir()) == []


def test_an_unreachable_postgresql_url_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StoreError, match=r"cannot connect to the store postgresql://u:\*\*\*@"):
        Store("postgresql://u:secret@127.0.0.1:1/db", timeout_s=2)
    assert list(tmp_path.iterdir()) == []
