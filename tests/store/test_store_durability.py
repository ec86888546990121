"""Durability under kill -9 and correctness under concurrent writer threads."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from clawrl.store import SessionSource, Store, TurnRecord

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("store_writer_proc", HERE / "store_writer_proc.py")
assert _spec is not None and _spec.loader is not None
_writer = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_writer)
expected_turn = _writer.expected_turn

ACKS_BEFORE_KILL = 40


def test_acked_turns_survive_kill_9(store_target) -> None:
    db = store_target()
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "store_writer_proc.py"), str(db), "sess"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    acked: list[str] = []
    try:
        assert proc.stdout is not None
        while len(acked) < ACKS_BEFORE_KILL:
            line = proc.stdout.readline()
            if not line:
                pytest.fail(f"writer exited early: {proc.stderr.read() if proc.stderr else ''}")
            acked.append(line.strip())
        os.kill(proc.pid, signal.SIGKILL)  # mid-way: the writer is busy recording the next turn
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    acked += [line.strip() for line in proc.stdout.read().splitlines() if line.strip()]

    with Store(db) as store:
        if store.dialect == "sqlite":
            with store._read() as conn:
                assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        stored = {t.id: t for t in store.session_turns("sess")}
        for i, turn_id in enumerate(acked):
            assert turn_id == f"turn-{i:06d}"
            want = expected_turn("sess", i)
            want.output_hash = stored[turn_id].output_hash
            assert stored[turn_id] == want
        # Nothing half-written: every stored turn is complete (acked or not).
        for turn_id, turn in stored.items():
            want = expected_turn("sess", int(turn_id.split("-")[1]))
            want.output_hash = turn.output_hash
            assert turn == want


def test_concurrent_writer_threads(store_target) -> None:
    n_threads, per_thread = 8, 25
    with Store(store_target()) as store:
        shared = "shared-session"

        def work(k: int) -> list[str]:
            own = store.new_session(SessionSource.INFERRED, client=f"t{k}")
            store.get_or_create_session(shared, SessionSource.HEADER)
            ids = []
            for i in range(per_thread):
                session = own.id if i % 2 else shared
                turn = TurnRecord(
                    session, [k, i, *range(50)], [i, k], [-0.25 * i, -0.5 * k], created_at=i
                )
                ids.append(store.record_turn(turn))
                assert store.get_turn(turn.id) is not None  # read your own write
                store.list_sessions(limit=5)
            return ids

        with ThreadPoolExecutor(max_workers=n_threads) as pool:
            results = list(pool.map(work, range(n_threads)))
        all_ids = [i for ids in results for i in ids]
        assert len(set(all_ids)) == n_threads * per_thread
        summaries = store.list_sessions(limit=100)
        assert len(summaries) == n_threads + 1
        assert sum(s.turns for s in summaries) == n_threads * per_thread
        for k, ids in enumerate(results):
            for i, turn_id in enumerate(ids):
                turn = store.get_turn(turn_id)
                assert turn is not None
                assert turn.prompt_ids[:2] == [k, i] and turn.completion_ids == [i, k]
                assert turn.sampling_logprobs == [-0.25 * i, -0.5 * k]


def test_connections_of_finished_threads_are_closed(tmp_path: Path) -> None:
    with Store(tmp_path / "clawrl.db") as store:
        for _ in range(5):
            t = threading.Thread(target=store.new_session)
            t.start()
            t.join()
        store.new_session()
        assert len(store._db._conns) <= 2  # type: ignore[attr-defined]
