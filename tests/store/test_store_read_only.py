"""``Store(read_only=True)`` (what ``clawrl dashboard`` opens) and the dashboard's store queries."""

from __future__ import annotations

import time

import pytest

from clawrl.errors import StoreError
from clawrl.store import JudgmentRecord, SessionSource, Store, TurnRecord
from clawrl.store.db import open_database
from clawrl.store.migrations import MIGRATIONS, applied_version, migrate


def _fill(path):
    with Store(path) as store:
        for sid, client in (("a_1", "claude-code"), ("b%2", "codex"), ("c-3", None)):
            store.get_or_create_session(sid, source=SessionSource.HEADER, client=client)
            store.record_turn(TurnRecord(session_id=sid, prompt_ids=[1, 2], completion_ids=[3],
                                         sampling_logprobs=[-0.5]))  # fmt: skip
        for tid in "xyzwv":  # turns the judgments below are about
            store.record_turn(TurnRecord(id=tid, session_id="a_1", prompt_ids=[1]))
        store.record_judgment(JudgmentRecord("x", "a_1", 1, "test", hint=""))
    return path


def test_read_only_reads_and_refuses_every_write(tmp_path, store_target):
    path = _fill(store_target("s"))
    before = sorted(p.name for p in tmp_path.iterdir())
    with Store(path, read_only=True) as store:
        assert store.count_sessions() == 3 and len(store.list_sessions()) == 3
        with pytest.raises(StoreError, match="read-only"):
            store.end_session("a_1")
        with pytest.raises(StoreError):
            store.record_turn(TurnRecord(session_id="a_1", prompt_ids=[1]))
    with Store(path) as store:
        assert store.get_session("a_1").ended_at is None  # nothing was written
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_read_only_never_creates_or_migrates(tmp_path):
    with pytest.raises(StoreError, match="no store at"):
        Store(tmp_path / "nope" / "s.db", read_only=True)
    assert not (tmp_path / "nope").exists()
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError, match="not a clawrl store"):
        Store(junk, read_only=True)


def test_read_only_refuses_an_old_or_missing_store(store_target):
    old = store_target("v1")  # a store of the first schema: no judgments table
    db = open_database(old)
    try:
        with db.read() as conn:  # nothing there yet: not a store
            assert applied_version(conn) == 0
        if db.dialect == "postgresql":
            with pytest.raises(StoreError, match="no trajectory store"):
                Store(old, read_only=True)
        migrate(db, migrations=MIGRATIONS, target=1)
    finally:
        db.close()
    with pytest.raises(StoreError, match="schema version 1"):
        Store(old, read_only=True)
    assert Store.exists(old)
    db = open_database(old)
    try:
        with db.read() as conn:
            assert applied_version(conn) == 1  # nothing was migrated
    finally:
        db.close()


def test_session_search_counts_and_escapes_wildcards(store_target):
    with Store(_fill(store_target("s"))) as store:
        assert [s.session.id for s in store.list_sessions(query="CLAUDE")] == ["a_1"]
        assert store.count_sessions("a_") == 1  # '_' is a literal underscore
        assert store.count_sessions("%") == 1  # only b%2 has a percent sign
        assert store.count_sessions("header") == 3  # the attribution (source)
        assert store.count_sessions("zzz") == 0
        assert [s.session.id for s in store.list_sessions(limit=1, offset=1)] == ["b%2"]
        assert [s.session.id for s in store.list_sessions(limit=5, offset=2)] == ["a_1"]


def test_activity_counts_calls_not_choices(store_target):
    with Store(store_target("s")) as store:
        store.get_or_create_session("s", source=SessionSource.HEADER)
        now = time.time()
        for i in range(2):  # one call with n=2
            store.record_turn(TurnRecord(session_id="s", prompt_ids=[1, 2, 3], completion_ids=[4, 5],
                                         sampling_logprobs=[-1.0, -1.0], choice_index=i,
                                         created_at=now))  # fmt: skip
        store.record_turn(TurnRecord(session_id="s", prompt_ids=[1], created_at=now - 3600))
        act = store.activity(now - 60)
        assert act["requests"] == 1 and act["completion_tokens"] == 4
        assert act["prompt_tokens"] == 6 and act["turns_total"] == 3


def test_judgment_counts_separate_skipped_turns_from_abstentions(store_target):
    with Store(_fill(store_target("s"))) as store:
        store.record_judgment(JudgmentRecord("y", "a_1", None, "worker", reason="no_next_state"))
        store.record_judgment(JudgmentRecord("z", "a_1", None, "worker", reason="timeout"))
        store.record_judgment(JudgmentRecord("w", "a_1", None, "head", reason="all_abstained"))
        store.record_judgment(JudgmentRecord("v", "a_1", -1, "head", hint="be brief"))
        counts = store.judgment_counts()
        assert counts == {"+1": 1, "-1": 1, "skipped/no_next_state": 1, "none/timeout": 1,
                          "none/all_abstained": 1, "hinted": 1}  # fmt: skip
        assert store.judgment_scores() == {"x": 1, "y": None, "z": None, "w": None, "v": -1}
        assert [j.turn_id for j in store.recent_judgments(2)] == ["v", "w"]
