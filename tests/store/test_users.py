"""Users in the store: each turn's ``user_id``, per-user summaries, the session filter (both
backends)."""

from __future__ import annotations

import pytest

from clawrl.errors import StoreError
from clawrl.store import SessionSource, Store, TurnRecord
from clawrl.store.learning import JudgmentRecord, SampleRecord, SampleStatus
from clawrl.store.users import user_id_problem


@pytest.fixture
def store(store_target):
    with Store(store_target()) as s:
        yield s


def _turn(store: Store, session: str, user: str, at: float) -> TurnRecord:
    store.get_or_create_session(session, SessionSource.HEADER)
    turn = TurnRecord(session_id=session, prompt_ids=[1, 2], completion_ids=[3],
                      sampling_logprobs=[-0.5], user_id=user, created_at=at)  # fmt: skip
    store.record_turn(turn)
    return turn


def test_a_turn_keeps_its_user_and_the_user_cannot_be_changed(store):
    turn = _turn(store, "s1", "alice@example.com", 1.0)
    assert store.get_turn(turn.id).user_id == "alice@example.com"
    with pytest.raises(StoreError, match="user_id"):
        store.update_turn(turn.id, user_id="bob")
    assert store.get_turn(turn.id).user_id == "alice@example.com"


@pytest.mark.parametrize("bad", ["a\nb", " alice", "x" * 257, 5, "\x00"])
def test_an_id_that_cannot_be_a_user_is_refused_and_nothing_is_written(store, bad):
    store.get_or_create_session("s1", SessionSource.HEADER)
    turn = TurnRecord(session_id="s1", prompt_ids=[1], user_id=bad)
    with pytest.raises(StoreError, match=r"turn\.user_id"):
        store.record_turn(turn)
    assert store.session_turns("s1") == []
    assert user_id_problem(bad) is not None
    assert user_id_problem("x" * 256) is None and user_id_problem("") is None


def test_users_counts_turns_judgments_and_trained_samples_per_user(store):
    a1 = _turn(store, "s1", "alice", 1.0)
    a2 = _turn(store, "s1", "alice", 2.0)
    b1 = _turn(store, "s2", "bob", 5.0)
    _turn(store, "s3", "", 3.0)
    store.record_judgment(JudgmentRecord(a1.id, "s1", 1, "test"))
    store.record_judgment(JudgmentRecord(b1.id, "s2", -1, "test"))
    store.record_samples([
        SampleRecord(a1.id, SampleStatus.TRAINED, step=4, policy_version=5),
        SampleRecord(a2.id, SampleStatus.DROPPED, reason="no_judgment"),
    ])  # fmt: skip
    users = {u.user_id: u for u in store.users()}
    assert [u.user_id for u in store.users()] == ["bob", "", "alice"]  # latest seen first
    assert (users["alice"].sessions, users["alice"].turns, users["alice"].judged) == (1, 2, 1)
    assert (users["alice"].trained, users["alice"].last_step, users["alice"].last_seen) == (
        1, 4, 2.0)  # fmt: skip
    assert (users["bob"].turns, users["bob"].judged, users["bob"].trained) == (1, 1, 0)
    assert users["bob"].last_step is None and users[""].turns == 1


def test_sessions_filter_by_user_and_list_their_users(store):
    _turn(store, "s1", "alice", 1.0)
    _turn(store, "s2", "bob", 2.0)
    _turn(store, "s3", "", 3.0)
    _turn(store, "s4", "alice", 4.0)
    _turn(store, "s4", "bob", 5.0)  # one session, two users (a shared conversation)
    assert [s.session.id for s in store.list_sessions(user="alice")] == ["s4", "s1"]
    assert store.count_sessions(user="alice") == 2 and store.count_sessions(user="carol") == 0
    assert [s.session.id for s in store.list_sessions(user="")] == ["s3"]
    assert [s.session.id for s in store.list_sessions(query="s", user="bob")] == ["s4", "s2"]
    assert store.count_sessions(query="s1", user="bob") == 0
    listed = {s.session.id: s.user_ids for s in store.list_sessions()}
    assert listed == {"s4": ("alice", "bob"), "s3": (), "s2": ("bob",), "s1": ("alice",)}


def test_a_users_adapter_versions_only_increase_and_turns_keep_theirs(store):
    from clawrl.store import UserAdapterRecord

    assert store.latest_user_adapters() == {}
    store.publish_user_adapter(UserAdapterRecord("alice", 1, "/runs/u/alice/v1", step=1))
    store.publish_user_adapter(UserAdapterRecord("alice", 1, "/runs/u/alice/v1", step=1))  # again
    store.publish_user_adapter(UserAdapterRecord("bob", 1, "/runs/u/bob/v1"))
    store.publish_user_adapter(UserAdapterRecord("alice", 2, "/runs/u/alice/v2", step=2))
    with pytest.raises(StoreError, match="not newer"):
        store.publish_user_adapter(UserAdapterRecord("alice", 2, "/elsewhere"))
    with pytest.raises(StoreError, match="start at 1"):
        store.publish_user_adapter(UserAdapterRecord("carol", 0, "/x"))
    with pytest.raises(StoreError, match="must not be empty"):
        store.publish_user_adapter(UserAdapterRecord("", 1, "/x"))
    latest = store.latest_user_adapters()
    assert {u: (r.version, r.weights) for u, r in latest.items()} == {
        "alice": (2, "/runs/u/alice/v2"), "bob": (1, "/runs/u/bob/v1")}  # fmt: skip
    assert [r.version for r in store.user_adapter_versions("alice")] == [1, 2]
    store.get_or_create_session("s1", SessionSource.HEADER)
    turn = TurnRecord(session_id="s1", prompt_ids=[1], completion_ids=[2],
                      sampling_logprobs=[-1.0], user_id="alice", adapter_version=2)  # fmt: skip
    store.record_turn(turn)
    assert store.get_turn(turn.id).adapter_version == 2
    (alice,) = [u for u in store.users() if u.user_id == "alice"]
    assert alice.adapter_version == 2


def test_a_user_with_an_adapter_and_no_turn_yet_is_listed(store):
    from clawrl.store import UserAdapterRecord

    _turn(store, "s1", "alice", 1.0)
    store.publish_user_adapter(UserAdapterRecord("zed", 1, "/a/zed/v1", created_at=7.0))
    users = {u.user_id: u for u in store.users()}
    assert (users["zed"].turns, users["zed"].adapter_version, users["zed"].last_seen) == (0, 1, 7.0)
    assert users["alice"].adapter_version is None
