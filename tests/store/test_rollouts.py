"""Harness rollouts in the store: groups, rollouts and verifier results, on both backends."""

from __future__ import annotations

from dataclasses import replace

import pytest

from clawrl.errors import StoreError
from clawrl.store import (
    GroupDecision,
    RolloutGroupRecord,
    RolloutPurpose,
    RolloutRecord,
    RolloutStatus,
    SessionSource,
    Store,
    VerifierResultRecord,
)


def _group(gid: str, run: str = "run-a", step: int | None = 1, size: int = 2):
    purpose = RolloutPurpose.TRAIN if step is not None else RolloutPurpose.EVAL
    return RolloutGroupRecord(gid, run, f"task/ref/{step}", "task", "ref", purpose, step, 0, size)


def _session(store: Store, rid: str) -> None:
    store.get_or_create_session(rid, SessionSource.HARNESS, client="harness:ref")


@pytest.fixture
def store(store_target):
    with Store(store_target()) as s:
        yield s


def test_every_ending_is_recorded_with_its_status_reason_and_verdict(store: Store) -> None:
    store.record_rollout_groups([_group("g1", size=4)])
    endings = {
        "ok": (RolloutRecord("ok", "g1", "bwrap", RolloutStatus.OK, harness_exit=0, wall_s=2.5),
               VerifierResultRecord("ok", 1.0, scores={"file": 1.0})),
        "late": (RolloutRecord("late", "g1", "bwrap", RolloutStatus.OK,
                               reason="harness killed: time limit (5 s)", harness_exit=-9,
                               timed_out=True, wall_s=5.1),
                 VerifierResultRecord("late", 0.0)),
        "verr": (RolloutRecord("verr", "g1", "bwrap", RolloutStatus.VERIFIER_ERROR,
                               reason="verify printed no reward", harness_exit=0),
                 VerifierResultRecord("verr", None, error="verify printed no reward")),
        "herr": (RolloutRecord("herr", "g1", "bwrap", RolloutStatus.HARNESS_ERROR,
                               reason="claude is not installed"), None),
    }  # fmt: skip
    for rid, (rollout, verdict) in endings.items():
        _session(store, rid)
        store.record_rollout(rollout, verdict)
    got = {r.rollout.id: r for r in store.rollout_results(run_id="run-a")}
    assert list(got) == list(endings)  # oldest first
    for rid, (rollout, verdict) in endings.items():
        assert got[rid].rollout == rollout and got[rid].verifier == verdict
        assert replace(got[rid].group, created_at=0) == replace(_group("g1", size=4), created_at=0)
    assert {rid: r.reward for rid, r in got.items()} == {
        "ok": 1.0,
        "late": 0.0,
        "verr": None,
        "herr": None,
    }
    assert got["late"].rollout.timed_out and got["late"].task_id == "task"
    assert store.get_rollout("herr") == got["herr"] and store.get_rollout("nope") is None


def test_filters_and_decisions(store: Store) -> None:
    store.record_rollout_groups([_group("g1"), _group("g2", step=2)])
    store.record_rollout_groups([_group("e1", run="run-b", step=None)])
    for rid, gid in (("a", "g1"), ("b", "g2"), ("c", "e1")):
        _session(store, rid)
        store.record_rollout(RolloutRecord(rid, gid, "fallback", RolloutStatus.OK),
                             VerifierResultRecord(rid, 0.5))  # fmt: skip
    assert [r.rollout.id for r in store.rollout_results(run_id="run-a")] == ["a", "b"]
    assert [r.rollout.id for r in store.rollout_results(group_ids=["e1"])] == ["c"]
    assert [r.rollout.id for r in store.rollout_results(run_id="run-a", group_ids=["e1"])] == []
    assert [r.rollout.id for r in store.rollout_results(rollout_ids=["c", "a", "x"])] == ["a", "c"]
    assert store.rollout_results(group_ids=[]) == []
    with pytest.raises(StoreError, match="not both"):
        store.rollout_results(group_ids=["g1"], rollout_ids=["a"])
    store.decide_rollout_groups({"g1": (GroupDecision.KEPT, 0.5), "g2": (GroupDecision.TOO_SMALL,
                                                                         None)})  # fmt: skip
    groups = {g.id: g for g in store.rollout_groups("run-a")}
    assert groups["g1"].decision is GroupDecision.KEPT and groups["g1"].reward_mean == 0.5
    assert groups["g2"].decision is GroupDecision.TOO_SMALL and groups["g2"].reward_mean is None
    assert [g.id for g in store.rollout_groups("run-b")] == ["e1"]
    assert store.rollout_groups("run-b")[0].purpose is RolloutPurpose.EVAL
    with pytest.raises(StoreError, match="unknown rollout group 'zz'"):
        store.decide_rollout_groups({"g1": (GroupDecision.ZERO_VARIANCE, 0.5), "zz": (
            GroupDecision.KEPT, 1.0)})  # fmt: skip
    assert store.rollout_groups("run-a")[0].decision is GroupDecision.KEPT  # rolled back


def test_bad_rollouts_are_refused_and_leave_nothing(store: Store) -> None:
    store.record_rollout_groups([_group("g1")])
    with pytest.raises(StoreError, match="recorded already"):
        store.record_rollout_groups([_group("g9"), _group("g1")])
    assert [g.id for g in store.rollout_groups("run-a")] == ["g1"]  # all or none
    with pytest.raises(StoreError, match="at least one"):
        store.record_rollout_groups([_group("g2", size=0)])
    ok = RolloutRecord("r", "g1", "bwrap", RolloutStatus.OK)
    with pytest.raises(StoreError, match="no such session"):
        store.record_rollout(ok, None)  # no session r
    _session(store, "r")
    with pytest.raises(StoreError, match="no such session or group"):
        store.record_rollout(RolloutRecord("r", "nogroup", "bwrap", RolloutStatus.OK), None)
    with pytest.raises(StoreError, match="no reward and no error"):
        store.record_rollout(ok, VerifierResultRecord("r", None))
    with pytest.raises(StoreError, match="given with rollout r"):
        store.record_rollout(ok, VerifierResultRecord("other", 1.0))
    assert store.get_rollout("r") is None
    store.record_rollout(ok, VerifierResultRecord("r", 1.0))
    with pytest.raises(StoreError, match="recorded already"):
        store.record_rollout(ok, VerifierResultRecord("r", 0.0))
    assert store.get_rollout("r").reward == 1.0  # the first record stays
