"""Judgments and sample bookkeeping in the store (schema v2)."""

from __future__ import annotations

import pytest

from clawrl.errors import StoreError
from clawrl.store import (
    JudgmentRecord,
    SampleRecord,
    SampleStatus,
    Store,
    TurnRecord,
)


def _turns(store, n=3):
    s = store.new_session()
    ids = [store.record_turn(TurnRecord(s.id, [1, 2, i], [5, 6], [-0.1, -0.2])) for i in range(n)]
    return s.id, ids


def test_judgment_roundtrip_and_unjudged_sessions(store_target):
    with Store(store_target("s")) as store:
        sid, ids = _turns(store)
        assert store.sessions_with_unjudged_turns() == [sid]
        for t in ids:
            store.record_judgment(
                JudgmentRecord(
                    t, sid, 1, "stub", votes=[{"score": 1}], hint="be brief", next_state_role="user"
                )
            )
        assert store.sessions_with_unjudged_turns() == []
        j = store.get_judgment(ids[0])
        assert j.score == 1 and j.hint == "be brief" and j.votes == [{"score": 1}]
        assert [x.turn_id for x in store.judgments_for_session(sid)] == ids
        with pytest.raises(StoreError, match="score"):
            store.record_judgment(JudgmentRecord(ids[0], sid, 2, "stub"))


def test_samples_are_decided_once(store_target):
    with Store(store_target("s")) as store:
        sid, ids = _turns(store)
        for t in ids:
            store.record_judgment(JudgmentRecord(t, sid, None, "stub", reason="all abstained"))
        assert store.judged_untrained_turns() == ids
        store.record_samples(
            [
                SampleRecord(ids[0], SampleStatus.TRAINED, step=1, policy_version=1),
                SampleRecord(ids[1], SampleStatus.DROPPED, reason="no_judgment"),
            ]
        )
        assert store.judged_untrained_turns() == [ids[2]]
        assert store.sample_counts() == {"trained": 1, "drop/no_judgment": 1}
        with pytest.raises(StoreError, match="already"):
            store.record_samples(
                [
                    SampleRecord(ids[2], SampleStatus.TRAINED),
                    SampleRecord(ids[0], SampleStatus.TRAINED),
                ]
            )
        # all-or-nothing: ids[2] was not recorded either
        assert store.get_sample(ids[2]) is None
        assert store.get_sample(ids[0]).policy_version == 1
