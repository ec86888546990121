"""``Store.forget_user`` / ``clawrl users forget``: every row of one user goes, other users' rows
stay readable (a turn stored as a delta of one of theirs is stored whole first), and no byte of
the user's id or text is left in the store's files (SQLite file, WAL and shared memory) or in the
output directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clawrl.cli import main
from clawrl.errors import StoreError
from clawrl.models import tiny_policy
from clawrl.store import (
    JudgmentRecord,
    PolicyVersionRecord,
    SessionSource,
    Store,
    TurnRecord,
    UserAdapterRecord,
    WeightsKind,
)
from clawrl.store.learning import SampleRecord, SampleStatus
from clawrl.store.memory import MemoryEntryRecord, MemorySource
from clawrl.trainer.users import user_digest

from ..engine.conftest import trained_adapter

USER = "alice-7f3a@example.com"
SECRET = "my zebra-kumquat passphrase"
SHARED = list(range(1000, 1300))  # a long system prompt both users' prompts start with


def _fill(store: Store) -> dict[str, str]:
    """Alice's two turns (the second a delta of the first), her judgment, sample, feedback and
    memory; bob's turn stored as a delta of her first (they share 300 leading ids)."""
    store.get_or_create_session("sess-alice", SessionSource.HEADER)
    store.get_or_create_session("sess-bob", SessionSource.HEADER)
    msg = [{"role": "user", "content": SECRET}]
    t1 = TurnRecord(session_id="sess-alice", prompt_ids=[*SHARED, 7, 7], completion_ids=[8, 9],
                    sampling_logprobs=[-0.1, -0.2], request_messages=msg, user_id=USER)  # fmt: skip
    store.record_turn(t1)
    t2 = TurnRecord(session_id="sess-alice", prompt_ids=[*SHARED, 7, 7, 8, 9, 5],
                    completion_ids=[4], sampling_logprobs=[-0.3], parent_turn_id=t1.id,
                    request_messages=[*msg, {"role": "user", "content": f"again: {SECRET}"}],
                    user_id=USER)  # fmt: skip
    store.record_turn(t2)
    bob = TurnRecord(session_id="sess-bob", prompt_ids=[*SHARED, 3], completion_ids=[2],
                     sampling_logprobs=[-0.4], parent_turn_id=t1.id, user_id="bob",
                     request_messages=[{"role": "user", "content": "bob here"}])  # fmt: skip
    store.record_turn(bob)
    store.record_judgment(JudgmentRecord(t1.id, "sess-alice", -1, "test", hint=f"say {SECRET}"))
    store.record_samples([SampleRecord(t1.id, SampleStatus.TRAINED, step=1, policy_version=1)])
    store.publish_policy_version(PolicyVersionRecord(1, WeightsKind.LORA, "/runs/v1", 1))
    store.add_feedback(-1.0, turn_id=t2.id, comment=f"I said {SECRET}")
    store.add_feedback(1.0, session_id="sess-alice", comment=f"session: {SECRET}")
    store.change_memory(add=[
        MemoryEntryRecord(f"remember {SECRET}", MemorySource.MANUAL, user_id=USER),
        MemoryEntryRecord(f"shared from {SECRET}", MemorySource.HINT, source_turn_id=t1.id),
        MemoryEntryRecord("bob likes tables", MemorySource.MANUAL, user_id="bob"),
        # an entry another turn started that took in her directive: its history names her turn
        MemoryEntryRecord("keep it short", MemorySource.HINT, source_turn_id=bob.id,
                          history=[{"at": 1.0, "event": "merged", "turn_id": t2.id,
                                    "text": f"short, {SECRET}"}]),
    ])  # fmt: skip
    # bob answered in her session: the judgment of his turn read her reply as its next state
    store.record_turn(
        TurnRecord(
            session_id="sess-alice",
            prompt_ids=[5],
            completion_ids=[6],
            sampling_logprobs=[-0.1],
            user_id="bob",
            id="bob-in-alice",
        )
    )
    store.record_judgment(JudgmentRecord("bob-in-alice", "sess-alice", 1, "test",
                                         hint=f"she said {SECRET}"))  # fmt: skip
    store.publish_user_adapter(UserAdapterRecord(USER, 1, "/nowhere/v1"))
    return {"t1": t1.id, "t2": t2.id, "bob": bob.id}


def test_forgetting_a_user_removes_their_rows_and_keeps_everyone_elses(store_target):
    with Store(store_target()) as store:
        ids = _fill(store)
        bob_before = store.get_turn(ids["bob"])
        with pytest.raises(StoreError, match="no user to forget"):
            store.forget_user("")
        gone = store.forget_user(USER)
        assert (gone.turns, gone.sessions, gone.memory_entries) == (2, 0, 3)
        assert (gone.rewritten, gone.trained_shared, gone.compacted) == (1, 1, True)
        assert gone.adapter_dirs == ["/nowhere/v1"]
        assert store.get_turn(ids["t1"]) is None and store.get_turn(ids["t2"]) is None
        assert store.get_judgment("bob-in-alice") is None  # it held her words
        assert [t.id for t in store.session_turns("sess-alice")] == ["bob-in-alice"]
        bob = store.get_turn(ids["bob"])  # stored whole now, the same ids and messages
        assert (bob.prompt_ids, bob.request_messages) == (
            bob_before.prompt_ids, bob_before.request_messages)  # fmt: skip
        assert {u.user_id for u in store.users()} == {"bob"}
        assert store.latest_user_adapters() == {}
        assert [e.text for e in store.memory_entries(user_id="bob")] == ["bob likes tables"]
        assert store.memory_entries() == []
        assert store.sample_counts() == {}
        again = store.forget_user(USER)  # nothing left: a no-op
        assert (again.turns, again.sessions, again.memory_entries) == (0, 0, 0)


def _traces(paths: list[Path]) -> list[str]:
    found = []
    for root in paths:
        for f in [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file()]:
            data = f.read_bytes()
            for needle in (USER, SECRET, "zebra-kumquat"):
                if needle.encode() in data or needle.encode("utf-16-le") in data:
                    found.append(f"{f}: {needle}")
    return found


def test_clawrl_users_forget_leaves_no_trace_in_the_store_files_or_on_disk(tmp_path, capsys):
    db = tmp_path / "s.db"
    out = tmp_path / "runs"
    adapter = tmp_path / "given"
    tiny = tiny_policy(seed=1).model
    tiny.config.save_pretrained(str(tmp_path / "tiny"))  # the served model (its config)
    trained_adapter(tiny, adapter, 3, rank=2)
    with Store(db) as store:
        _fill(store)
    trainer_dir = out / "users" / user_digest(USER)
    (trainer_dir / "checkpoints").mkdir(parents=True)
    (trainer_dir / "checkpoints" / "meta.json").write_text(json.dumps({"step": 1}))
    assert main(["users", "adapter", USER, str(adapter), "--model", str(tmp_path / "tiny"), "--store", str(db),
                 "--into", str(out / "user-adapters")]) == 0  # fmt: skip
    assert (out / "user-adapters" / user_digest(USER) / "v2").is_dir()
    before = _traces([db, Path(f"{db}-wal")])
    assert before, "the test data must be findable before"
    capsys.readouterr()
    assert main(["users", "forget", USER, "--store", str(db), "--output-dir", str(out)]) == 0
    assert "would remove 2 turns in 1 sessions, 2 adapter versions" in capsys.readouterr().out
    with Store(db) as store:  # a preview deletes nothing
        assert sorted(u.user_id for u in store.users()) == sorted([USER, "bob"])
    assert main(["users", "forget", USER, "--yes", "--store", str(db),
                 "--output-dir", str(out)]) == 0  # fmt: skip
    said = capsys.readouterr().out
    assert "removed 2 turns, 0 sessions, 3 memory entries, 2 adapter versions" in said
    assert "shared policy had trained on 1 of their turns" in said
    assert not trainer_dir.exists() and not (out / "user-adapters" / user_digest(USER)).exists()
    files = [p for p in tmp_path.glob("s.db*")]
    assert _traces([*files, out]) == []
    with Store(db) as store:
        assert [u.user_id for u in store.users()] == ["bob"]
