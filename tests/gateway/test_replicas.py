"""Several gateway replicas on one PostgreSQL store behave as one gateway.

* two ``clawrl serve`` processes: a conversation whose calls alternate between them (no session
  id: inferred by prefix) is one trajectory, each prompt stored as a delta of the previous
  turn; then, under load on both, ``kill -9`` of one loses no acknowledged turn and the other
  keeps answering;
* two in-process replicas built by the composition root, one training (scripted judge): the
  trainer learns from turns either replica recorded, and the other replica serves each version
  it publishes (through the store's ``policy_versions``).
"""

from __future__ import annotations

import itertools
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from clawrl.store import Store, TurnStatus
from clawrl.testing.postgres import schema_url


async def scripted_judge(inp):
    """+1 when the user thanks, else -1 (the judge is not under test here)."""
    from clawrl.judge.types import BackendKind, Judgment, Score

    good = "thanks" in inp.next_state.text
    return Judgment(score=Score.GOOD if good else Score.BAD, backend=BackendKind.GENERATIVE,
                    model="scripted")  # fmt: skip


SERVE = [sys.executable, "-c", "import sys; from clawrl.cli import main; sys.exit(main())"]


@pytest.fixture(scope="module")
def tiny_dir(tiny, tmp_path_factory) -> Path:
    """The tiny model saved as a Hugging Face directory, so ``--model DIR`` serves it."""
    path = tmp_path_factory.mktemp("tiny-model")
    tiny.model.save_pretrained(path)
    tiny.tokenizer.save_pretrained(path)
    return path


def _start(tiny_dir: Path, store: str) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    env.pop("CLAWRL_API_KEY", None)
    proc = subprocess.Popen(
        [*SERVE, "serve", "--model", str(tiny_dir), "--port", "0", "--store", store, "--quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    return proc


def _url(proc: subprocess.Popen) -> str:
    deadline = time.monotonic() + 120
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            proc.kill()
            raise AssertionError(
                f"clawrl serve exited: {proc.stderr.read() if proc.stderr else ''}"
            )
        m = re.search(r"at (http://127\.0\.0\.1:\d+/v1)", line)
        if m:
            threading.Thread(target=proc.stdout.read, daemon=True).start()  # drain the pipe
            return m.group(1)
    proc.kill()
    raise AssertionError("clawrl serve did not print its URL in time")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=30)


@pytest.mark.timeout(480)
def test_two_serve_replicas_one_trajectory_and_kill_9_under_load(tiny_dir, pg_cluster):
    store_url = schema_url(pg_cluster)
    procs = [_start(tiny_dir, store_url) for _ in range(2)]
    try:
        bases = [_url(p) for p in procs]
        for base in bases:
            deadline = time.monotonic() + 60
            while httpx.get(base.removesuffix("/v1") + "/healthz").status_code != 200:
                assert time.monotonic() < deadline
                time.sleep(0.2)
        clients = [openai.OpenAI(base_url=b, api_key="x", max_retries=0) for b in bases]

        # one conversation, calls alternating between the replicas, no session id anywhere
        messages = [{"role": "user", "content": "Count with me: one"}]
        turn_ids, sessions = [], set()
        for k in range(6):
            raw = clients[k % 2].chat.completions.with_raw_response.create(
                model="tiny", messages=messages, max_tokens=5, temperature=1.0, seed=k
            )
            answer = raw.parse().choices[0].message.content or "..."
            turn_ids.append(raw.headers["x-clawrl-turn-ids"])
            sessions.add(raw.headers["x-clawrl-session-id"])
            messages += [{"role": "assistant", "content": answer},
                         {"role": "user", "content": f"and {k + 2}?"}]  # fmt: skip
        assert len(sessions) == 1, "the alternating conversation split into several sessions"
        with Store(store_url) as store:
            (sid,) = sessions
            turns = store.session_turns(sid)
            assert [t.id for t in turns] == turn_ids
            for prev, turn in itertools.pairwise(turns):
                assert turn.parent_turn_id == prev.id
                assert turn.client["attribution"] == "inferred:prefix"
                assert turn.prompt_ids[: len(prev.seq_ids)] == prev.seq_ids
            with store._read() as conn:
                stored = conn.execute(
                    "SELECT prefix_turn_id, prefix_len, length(prompt_ids) / 4 FROM turns "
                    "WHERE session_id = ? ORDER BY created_at", (sid,),
                ).fetchall()  # fmt: skip
            assert stored[0][0] is None
            for (base, k, tail), prev, turn in zip(stored[1:], turns[:-1], turns[1:], strict=True):
                assert base == prev.id and k == len(prev.seq_ids)  # a delta of the previous turn
                assert tail == len(turn.prompt_ids) - k

        # load on both replicas; kill -9 replica 0 midway
        acknowledged: list[str] = []
        failures: list[str] = []
        lock = threading.Lock()
        stop = threading.Event()

        def load(i: int) -> None:
            client = clients[i % 2]
            n = 0
            while not stop.is_set():
                n += 1
                try:
                    raw = client.chat.completions.with_raw_response.create(
                        model="tiny", max_tokens=4, temperature=1.0,
                        messages=[{"role": "user", "content": f"load {i} call {n}"}],
                    )  # fmt: skip
                except (openai.APIConnectionError, openai.APIStatusError) as exc:
                    with lock:
                        failures.append(f"{i % 2}: {type(exc).__name__}")
                    if i % 2 == 0:
                        return  # replica 0 is gone
                    continue
                with lock:
                    acknowledged.extend(raw.headers["x-clawrl-turn-ids"].split(","))

        threads = [threading.Thread(target=load, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while len(acknowledged) < 12 and time.monotonic() < deadline:
            time.sleep(0.05)
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait(timeout=30)
        before = len(acknowledged)
        deadline = time.monotonic() + 60
        while len(acknowledged) < before + 6 and time.monotonic() < deadline:
            time.sleep(0.05)
        stop.set()
        for t in threads:
            t.join(timeout=60)
        assert procs[0].returncode == -signal.SIGKILL
        assert len(acknowledged) >= before + 6, "replica 1 stopped answering after the kill"
        assert not [f for f in failures if f.startswith("1:")], failures
        with Store(store_url) as store:
            for turn_id in acknowledged:
                turn = store.get_turn(turn_id)
                assert turn is not None, f"acknowledged turn {turn_id} lost"
                assert turn.status == TurnStatus.OK
    finally:
        for p in procs:
            _stop(p)


@pytest.mark.timeout(400)
def test_a_trainer_replica_learns_from_both_and_the_other_serves_its_versions(pg_cluster, tmp_path):
    from clawrl.config import load_config
    from clawrl.models import tiny_policy
    from clawrl.runtime import JudgeBundle, build_runtime

    store_url = schema_url(pg_cluster)
    trains = load_config(None, [
        'trainer.method="rl"', "trainer.batch_size=3", "trainer.poll_interval_s=0.1",
        "trainer.lr=1e-3", f'trainer.output_dir="{tmp_path / "out"}"',
    ])  # fmt: skip
    follows = load_config(None, ["server.version_poll_s=0.2"])
    a = build_runtime(trains, policy=tiny_policy(seed=7, max_context=1024), store=store_url,
                      judge=JudgeBundle(scripted_judge), model_name="tiny")  # fmt: skip
    b = build_runtime(follows, policy=tiny_policy(seed=7, max_context=1024), store=store_url,
                      model_name="tiny")  # fmt: skip
    assert a.service is not None and b.service is None and b.follows_versions
    assert b.follower is not None
    followed: list[int] = []
    b.follower.listeners.append(lambda r: followed.append(r.version))  # serve prints a line
    servers = [a.serve(), b.serve()]
    try:
        clients = [openai.OpenAI(base_url=s.base_url, api_key="x", max_retries=0) for s in servers]
        recorded_by_b: set[str] = set()
        for s in range(4):
            sid = f"conv-{s}"
            messages = [{"role": "user", "content": f"what is {s} + {s}?"}]
            for t in range(3):
                k = (s + t) % 2
                raw = clients[k].chat.completions.with_raw_response.create(
                    model="tiny", messages=messages, max_tokens=5, temperature=1.0,
                    extra_headers={"X-Session-Id": sid},
                )  # fmt: skip
                if k == 1:
                    recorded_by_b.add(raw.headers["x-clawrl-turn-ids"])
                answer = raw.parse().choices[0].message.content or "..."
                reply = "thanks!" if t % 2 else "no, that is wrong, redo it"
                messages += [{"role": "assistant", "content": answer},
                              {"role": "user", "content": reply}]  # fmt: skip
            clients[s % 2].post(f"/sessions/{sid}/end", cast_to=object, body={})
        deadline = time.monotonic() + 240

        def trained_from_b() -> set[str]:
            return {tid for tid in recorded_by_b if (s := a.store.get_sample(tid)) is not None
                    and s.status == "trained"}  # fmt: skip

        # the first step may hold only replica a's turns (which samples are ready first depends
        # on timing, and on a loaded machine it did); a later step takes b's
        while (b.engine.policy_version < 1 or not trained_from_b()) and time.monotonic() < deadline:
            time.sleep(0.2)
        a.service.step_limit = a.service.trainer.step  # fewer versions in flight from here
        while not followed and time.monotonic() < deadline:
            time.sleep(0.2)  # b's listener runs after its engine swapped
        latest = max(v.version for v in a.store.policy_versions())
        assert a.service.trainer.step >= 1, a.service.status()
        assert b.engine.policy_version >= 1, "replica b never served a published version"
        # a step in flight may still publish: b's listener lags its engine, never leads it
        assert followed and 1 <= followed[-1] <= b.engine.policy_version
        assert set(followed) <= {v.version for v in a.store.policy_versions()}
        assert latest >= 1
        published = a.store.policy_versions()
        assert published[0].version == 1 and Path(published[0].weights or "").is_dir()
        assert trained_from_b(), "the trainer never trained on a turn the other replica recorded"
        after = clients[1].chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
        served = int(after.system_fingerprint.rsplit("-v", 1)[1])
        assert served >= 1 and served in {v.version for v in a.store.policy_versions()}
    finally:
        for s in servers:
            s.stop()
        a.close()
        b.close()
