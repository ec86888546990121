"""What the CLI shows and exports: session table, session tree, JSONL export."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from clawrl.errors import StoreError
from clawrl.store import SessionSource, Store, TurnRecord, TurnStatus
from clawrl.trajectory import EXPORT_VERSION, export_jsonl, format_session, list_sessions_table


def _render(renderable) -> str:
    console = Console(record=True, width=220, color_system=None)
    console.print(renderable)
    return console.export_text()


@pytest.fixture
def store(tmp_path: Path):
    with Store(tmp_path / "clawrl.db") as s:
        s.get_or_create_session("sess-1", SessionSource.HEADER, "claude-code")
        p = [1, 2, 3]
        t1 = TurnRecord(
            "sess-1",
            p,
            [4, 5],
            [-0.5, -0.25],
            id="turn-aaa1",
            finish_reason="stop",
            request_messages=[{"role": "user", "content": "hi"}],
            created_at=1.0,
        )
        err = TurnRecord(
            "sess-1", [*t1.seq_ids, 6], id="turn-err1", status=TurnStatus.ERROR, created_at=2.0
        )
        t2 = TurnRecord(
            "sess-1",
            [*t1.seq_ids, 6],
            [7],
            [-1.0],
            id="turn-bbb2",
            policy_version=2,
            request_messages=[
                {"role": "user", "content": "hi"},
                {"role": "assistant"},
                {"role": "tool", "content": "file listing\nwith lines"},
            ],
            created_at=3.0,
        )
        for t in (t1, err, t2):
            s.record_turn(t)
        s.add_feedback(1.0, session_id="sess-1", comment="solved")
        s.new_session(SessionSource.INFERRED, session_id="sess-2", client=None)
        yield s


def test_list_sessions_table(store: Store) -> None:
    text = _render(list_sessions_table(store))
    assert "sess-1" in text and "sess-2" in text and "claude-code" in text
    line = next(x for x in text.splitlines() if "sess-1" in x)
    assert " 3 " in line and " 2 " in line and "15/3" in line  # turns, trainable, tokens


def test_format_session(store: Store) -> None:
    text = _render(format_session(store, "sess-1"))
    assert "session sess-1" in text and "3 turns, 2 trainable, 1 segment(s)" in text
    assert "untrainable: error=1" in text and "1 feedback" in text
    assert "turn-aaa main v0 ok stop p=3 c=2 trainable  → tool: file listing with lines" in text
    assert "turn-err" in text and "untrainable: error" in text
    assert "turn-bbb" in text and "v2" in text and "→ feedback: +1 solved" in text
    with pytest.raises(StoreError, match="unknown session"):
        format_session(store, "missing")


def test_export_jsonl(store: Store, tmp_path: Path) -> None:
    out = tmp_path / "export.jsonl"
    assert export_jsonl(store, out) == 2
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["session_id"] for x in lines] == ["sess-1", "sess-2"]
    first = lines[0]
    assert first["format"] == "clawrl.trajectory" and first["version"] == EXPORT_VERSION
    assert first["untrainable"] == {"untrainable/error": 1}
    rows = first["rows"]
    assert [r["turn_ids"] for r in rows] == [["turn-aaa1", "turn-bbb2"], ["turn-aaa1", "turn-err1"]]
    assert rows[0]["input_ids"] == [1, 2, 3, 4, 5, 6, 7]
    assert rows[0]["loss_mask"] == [0, 0, 0, 1, 1, 0, 1]
    assert rows[0]["sampling_logprobs"] == [0.0, 0.0, 0.0, -0.5, -0.25, 0.0, -1.0]
    assert rows[0]["token_turn"] == [-1, -1, -1, 0, 0, -1, 1]
    assert rows[1]["loss_mask"] == [0] * 6 and rows[1]["untrained"] == {"turn-err1": "error"}
    turns = {t["id"]: t for t in first["turns"]}
    ns = turns["turn-aaa1"]["next_state"]
    assert ns["role"] == "tool" and ns["ids"] == [6] and ns["child_turn_id"] == "turn-bbb2"
    assert ns["other_child_ids"] == ["turn-err1"]
    assert turns["turn-bbb2"]["next_state"]["role"] == "feedback"
    assert turns["turn-err1"]["trainable"] is False
    assert lines[1]["rows"] == [] and lines[1]["turns"] == []

    stream = io.StringIO()
    assert export_jsonl(store, stream, session_ids=["sess-2"]) == 1
    assert json.loads(stream.getvalue())["session_id"] == "sess-2"
    with pytest.raises(StoreError, match="unknown session"):
        export_jsonl(store, io.StringIO(), session_ids=["missing"])


def test_session_ids_resolve_by_unique_prefix_and_are_never_cut(store: Store) -> None:
    from clawrl.cli.sessions import resolve_session_id
    from clawrl.errors import StoreError

    assert resolve_session_id(store, "sess-1") == "sess-1"
    store.new_session(SessionSource.INFERRED, session_id="3f2a9c0d11e4", client=None)
    assert resolve_session_id(store, "3f2a") == "3f2a9c0d11e4"
    with pytest.raises(StoreError, match="2 sessions start with 'sess'"):
        resolve_session_id(store, "sess")
    with pytest.raises(StoreError, match="no session id starts with 'zz'"):
        resolve_session_id(store, "zz")
    narrow = Console(record=True, width=60, color_system=None)
    narrow.print(list_sessions_table(store))
    assert "sess-1" in narrow.export_text()  # the id column does not wrap at 60 columns


def test_sessions_table_fits_80_columns(store: Store) -> None:
    """At 80 columns the secondary columns go, ids are shortened to a unique prefix (which
    `sessions show` takes), and nothing left is cut or wrapped."""
    store.new_session(
        SessionSource.INFERRED,
        session_id="0f1e2d3c4b5a69788796a5b4c3d2e1f0",
        client="openai-python",
    )
    console = Console(record=True, width=80, color_system=None)
    console.print(list_sessions_table(store, width=80))
    text = console.export_text()
    assert all(len(line) <= 80 for line in text.splitlines())
    assert "…" not in text  # no cell or header cut
    assert "0f1e2d3c4b5a " in text and "openai-python" in text  # the id's unique 12-char prefix
    assert "train" in text and "tokens p/c" in text and "source" not in text
    # the demo's long ids and a long client string: ids stay whole, the client gives way
    for i in range(3):
        store.new_session(
            SessionSource.HEADER,
            session_id=f"sim-combine-student-1a2b3c4d-{i}-gsm8k-test-{i}",
            client="claude-cli/1.0.83 (external, cli)",
        )
    console = Console(record=True, width=80, color_system=None)
    console.print(list_sessions_table(store, width=80))
    text = console.export_text()
    assert all(len(line) <= 80 for line in text.splitlines())
    assert "…" not in text and "train" in text and "fail" in text
    assert "gsm8k" not in text  # shortened to the unique prefixes ...
    for i in range(3):
        assert f"sim-combine-student-1a2b3c4d-{i} " in text  # ... which stay whole
    assert "created" in text and "tokens p/c" in text
    assert "15/3" in text and "client" not in text  # long ids: the client column went
    assert "source" in _render(list_sessions_table(store))  # full table without a width


def test_short_ids_stay_unique() -> None:
    from clawrl.trajectory.views import _short_ids

    a, b = "abcdef0123456789", "abcdef0123459999"
    assert _short_ids([a, b, "x"], [a, b, "x"]) == ["abcdef0123456", "abcdef0123459", "x"]
    # unique against every stored id, not only the ids on this page
    assert _short_ids([a], [a, b, "x"]) == ["abcdef0123456"]
    assert _short_ids([a], [a]) == ["abcdef012345"]


def test_ids_and_clients_are_never_read_as_markup(store: Store) -> None:
    """A session id or client name with rich markup in it (``[/oops]``) is printed as given."""
    store.get_or_create_session("X-Session-Id: [/oops]", SessionSource.HEADER, client="[bold]c")
    store.record_turn(TurnRecord("X-Session-Id: [/oops]", [1, 2], [3], [-0.1]))
    out = io.StringIO()
    Console(file=out, width=200).print(list_sessions_table(store))
    assert "X-Session-Id: [/oops]" in out.getvalue() and "[bold]c" in out.getvalue()
    Console(file=io.StringIO(), width=200).print(format_session(store, "X-Session-Id: [/oops]"))


def _harness_rollout(store: Store) -> None:
    """A harness session whose harness hit its time limit; the verifier still scored 0.25."""
    from clawrl.store import (
        GroupDecision,
        RolloutGroupRecord,
        RolloutPurpose,
        RolloutRecord,
        RolloutStatus,
        VerifierResultRecord,
    )

    store.get_or_create_session("roll-1", SessionSource.HARNESS, "harness:reference")
    store.record_turn(TurnRecord("roll-1", [1, 2], [3], [-0.5], id="turn-r1"))
    group = RolloutGroupRecord(
        "grp-1", "run-1", "fix-bug/reference/3", "fix-bug", "reference", RolloutPurpose.TRAIN,
        step=3, policy_version=2, size=4,
    )  # fmt: skip
    store.record_rollout_groups([group])
    store.record_rollout(
        RolloutRecord("roll-1", "grp-1", "bwrap", RolloutStatus.OK,
                      reason="harness killed: time limit (60 s)", harness_exit=-9,
                      timed_out=True, wall_s=61.5),
        VerifierResultRecord("roll-1", 0.25, scores={"tests": 0.25}),
    )  # fmt: skip
    store.decide_rollout_groups({"grp-1": (GroupDecision.KEPT, 0.5)})


def test_a_harness_session_shows_and_exports_its_rollout(store: Store) -> None:
    _harness_rollout(store)
    table = _render(list_sessions_table(store))
    line = next(x for x in table.splitlines() if "roll-1" in x)
    assert "ok 0.25 timeout" in line
    assert " - " in next(x for x in table.splitlines() if "sess-1" in x)  # no rollout
    shown = _render(format_session(store, "roll-1"))
    assert (
        "rollout task=fix-bug harness=reference group=fix-bug/reference/3 (train step 3, kept) "
        "status=ok reward=0.25 timed_out=yes wall=61.5s exit=-9 isolation=bwrap" in shown
    )
    assert "reason: harness killed: time limit (60 s)" in shown
    assert "rollout task=" not in _render(format_session(store, "sess-1"))

    stream = io.StringIO()
    export_jsonl(store, stream, session_ids=["roll-1", "sess-1"])
    harness, plain = (json.loads(x) for x in stream.getvalue().splitlines())
    assert plain["rollout"] is None
    rollout = harness["rollout"]
    assert rollout["reward"] == 0.25 and rollout["status"] == "ok" and rollout["timed_out"]
    assert rollout["task_id"] == "fix-bug" and rollout["harness"] == "reference"
    assert rollout["reason"] == "harness killed: time limit (60 s)"
    assert rollout["verifier"] == {"reward": 0.25, "error": None, "scores": {"tests": 0.25}}
    assert rollout["group"]["label"] == "fix-bug/reference/3"
    assert rollout["group"]["decision"] == "kept" and rollout["group"]["step"] == 3
    assert harness["rows"][0]["loss_mask"] == [0, 0, 1]
