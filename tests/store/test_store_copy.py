"""``clawrl store copy|migrate`` and the other commands' ``--store postgresql://...``."""

from __future__ import annotations

import json

import pytest

from clawrl.cli import main
from clawrl.errors import ConfigError, StoreError
from clawrl.store import (
    GroupDecision,
    JudgmentRecord,
    MemoryEntryRecord,
    MemorySource,
    PolicyVersionRecord,
    RolloutGroupRecord,
    RolloutPurpose,
    RolloutRecord,
    RolloutStatus,
    SessionSource,
    Store,
    TurnRecord,
    UserAdapterRecord,
    VerifierResultRecord,
    WeightsKind,
)
from clawrl.store.copy import copy_store, table_digest
from clawrl.store.memory import MemorySourceClaim
from clawrl.testing.postgres import schema_url


def _fill(target: str) -> list[TurnRecord]:
    with Store(target) as store:
        sid = store.new_session(client="claude-code", metadata={"harness": "x"}).id
        a = TurnRecord(sid, [1, 2, 3], [4, 5], [-0.1, -1e-300], output={"content": "é✓"},
                       request_messages=[{"role": "user", "content": "a"}])  # fmt: skip
        b = TurnRecord(sid, [1, 2, 3, 4, 5, 6], [7], [-2.5], parent_turn_id=a.id,
                       memory={"entries": ["m1"], "text": "- Lead.", "index": 0})  # fmt: skip
        store.record_turns([a, b])
        store.add_feedback(0.5, turn_id=b.id, comment="ok")
        store.record_judgment(JudgmentRecord(a.id, sid, 1, "head x5", votes=[{"score": 1}]))
        store.publish_policy_version(PolicyVersionRecord(1, WeightsKind.LORA, "/w/v1", 1))
        store.end_session(sid)
        _fill_rollouts(store)
        entry = MemoryEntryRecord("Lead with the number.", MemorySource.HINT, id="m1",
                                  source_turn_id=a.id, history=[{"event": "added"}])  # fmt: skip
        store.change_memory(add=[entry], source=MemorySourceClaim(f"hint:{a.id}", 1.0, "", "m1"))
        store.publish_user_adapter(UserAdapterRecord("alice", 1, "/runs/users/alice/v1", step=3))
        return [a, b]


def _fill_rollouts(store: Store) -> None:
    """Two harness rollouts of one group: one rewarded (sub-scores, 0.1 not exact in binary),
    one whose verifier failed after the harness timed out."""
    group = RolloutGroupRecord("g1", "run1", "t/ref/1", "t", "ref", RolloutPurpose.TRAIN, 1, 0, 2)
    store.record_rollout_groups([group])
    for rid, status in (("r1", RolloutStatus.OK), ("r2", RolloutStatus.VERIFIER_ERROR)):
        store.get_or_create_session(rid, SessionSource.HARNESS, client="harness:ref")
        ok = status is RolloutStatus.OK
        verdict = (VerifierResultRecord(rid, 0.1, scores={"file": 0.1}) if ok
                   else VerifierResultRecord(rid, None, error="no verdict"))  # fmt: skip
        store.record_rollout(
            RolloutRecord(rid, "g1", "bwrap", status, reason=None if ok else "no verdict",
                          harness_exit=0 if ok else -9, timed_out=not ok, wall_s=1.25,
                          harness_tail="é✓"),
            verdict,
        )  # fmt: skip
    store.decide_rollout_groups({"g1": (GroupDecision.TOO_SMALL, 0.1)})


def test_copy_sqlite_to_postgresql_and_back_is_exact(pg_cluster, tmp_path, capsys) -> None:
    src, pg, back = str(tmp_path / "src.db"), schema_url(pg_cluster), str(tmp_path / "back.db")
    turns = _fill(src)
    assert main(["store", "copy", src, pg]) == 0
    out = capsys.readouterr().out
    assert "turns                   2" in out and out.count("verified") == 12
    report = copy_store(pg, back)
    assert {c.table: c.rows for c in report} == {
        "sessions": 3, "turns": 2, "feedback": 1, "judgments": 1, "samples": 0,
        "policy_versions": 1, "rollout_groups": 1, "rollouts": 2, "verifier_results": 2,
        "memory_entries": 1, "memory_sources": 1, "user_adapters": 1,
    }  # fmt: skip
    for a, b in ((src, pg), (src, back)):
        with Store(a, read_only=True) as x, Store(b, read_only=True) as y:
            with x._read() as cx, y._read() as cy:
                for table in ("sessions", "turns", "feedback", "judgments", "policy_versions",
                              "rollout_groups", "rollouts", "verifier_results",
                              "memory_entries", "memory_sources", "user_adapters"):  # fmt: skip
                    assert table_digest(cx, table) == table_digest(cy, table)
            assert [y.get_turn(t.id) for t in turns] == turns  # deltas rebuild on the copy
            assert y.rollout_results(run_id="run1") == x.rollout_results(run_id="run1")
            assert [r.reward for r in y.rollout_results(run_id="run1")] == [0.1, None]
    with pytest.raises(StoreError, match="not empty"):
        copy_store(src, pg)
    assert main(["store", "copy", src, back]) == 1
    assert "not empty" in capsys.readouterr().err


def test_commands_take_a_postgresql_url(pg_cluster, tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "250")
    url = schema_url(pg_cluster)
    assert main(["sessions", "list", "--store", url]) == 1
    err = capsys.readouterr().err
    assert "no trajectory store at postgresql://" in err and "--store URL" in err
    assert main(["store", "migrate", "--store", url]) == 0
    assert "created schema version" in capsys.readouterr().out
    assert main(["store", "migrate", "--store", url]) == 0
    assert "already at" in capsys.readouterr().out
    turns = _fill(url)
    assert main(["sessions", "list", "--store", url]) == 0
    assert turns[0].session_id in capsys.readouterr().out
    assert main(["sessions", "show", turns[0].session_id[:8], "--store", url]) == 0
    assert turns[1].id[:8] in capsys.readouterr().out
    out = tmp_path / "t.jsonl"
    assert main(["export", "--store", url, "--out", str(out)]) == 0
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["session_id"] for x in lines] == [turns[0].session_id, "r1", "r2"]
    assert lines[0]["rollout"] is None and lines[1]["rollout"]["reward"] == 0.1
    monkeypatch.chdir(tmp_path)
    assert main(["sessions", "list", "--store", "mysql://u@h/db"]) == 1
    assert "postgresql://" in capsys.readouterr().err
    assert not list(tmp_path.glob("mysql*"))


def test_dashboard_opens_a_postgresql_store_read_only(pg_cluster) -> None:
    import argparse

    from clawrl.cli.dashboard import _paths

    url = schema_url(pg_cluster)
    args = argparse.Namespace(demo=None, run=None, store=url, output_dir=None)
    with pytest.raises(ConfigError, match="no store at postgresql://"):
        _paths(args)
    _fill(url)
    store, out, results, title = _paths(args)
    assert store == url and out is None and results is None and title.startswith("store postgresql")


def test_demo_runs_get_a_schema_each(pg_cluster, tmp_path) -> None:
    from clawrl.demo.runner import DemoSettings, run_store

    run_dir = tmp_path / "runs" / "combine-seed0"
    run_dir.mkdir(parents=True)
    assert run_store(DemoSettings(), run_dir) == str(run_dir / "store.db")
    with pytest.raises(ConfigError, match="postgresql://"):
        run_store(DemoSettings(store=str(tmp_path / "x.db")), run_dir)
    url = run_store(DemoSettings(store=pg_cluster), run_dir)
    assert "clawrl_demo_combine_seed0" in url
    assert (run_dir / "store.url").read_text().strip() == url
    _fill(url)
    again = run_store(DemoSettings(store=pg_cluster), run_dir)  # a rerun starts empty
    assert again == url and not Store.exists(url)


def test_the_copy_takes_every_table_with_data() -> None:
    """A table added to the schema is copied (or this test names why not)."""
    from clawrl.store.copy import TABLES
    from clawrl.store.schema import SCHEMA

    created = {s.split("CREATE TABLE ")[1].split()[0] for s in SCHEMA if "CREATE TABLE " in s}
    assert set(TABLES) == created - {"leases"}  # leases belong to the source's processes
