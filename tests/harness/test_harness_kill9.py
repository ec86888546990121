"""``clawrl harness train`` in a subprocess, killed with SIGKILL mid-run, then run again: it
resumes at the next step and the store records each version once.

Tiny model, two tasks whose verifier gives a random reward in [0, 1] (every group has variance,
so every step trains and publishes: only the bookkeeping is under test) and holds step 2's
rollouts until the test has killed the run.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from clawrl.store import Store

CLI = [sys.executable, "-c", "import sys; from clawrl.cli import main; sys.exit(main())"]
VERIFY = """#!/usr/bin/env python3
import fcntl, json, os, random, time
gate = {gate!r}
# step 1's two rollouts pass; later ones wait while the gate file exists (the test kills the
# run there, so step 2 never ends in the first process)
with open(gate + ".count", "a+") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    f.seek(0)
    n = len(f.read())
    f.write("x")
if n >= 2:
    while os.path.exists(gate):
        time.sleep(0.05)
print(json.dumps({{"reward": {reward}}}))
"""


def _suite(root: Path, gate: Path, reward: str = "random.random()") -> Path:
    for i in range(2):
        task = root / f"noise-{i}"
        task.mkdir(parents=True)
        (task / "task.toml").write_text(
            f'id = "noise-{i}"\ninstruction = "Say anything."\ntime_limit_s = 60\n'
            'split = "train"\n\n[harness]\nmax_steps = 1\n'
        )
        (task / "verify").write_text(VERIFY.format(gate=str(gate), reward=reward))
        (task / "verify").chmod(0o755)
    return root


def _cmd(tasks: Path, out: Path) -> list[str]:
    return [*CLI, "harness", "train", "--model", "tiny", "--tasks", str(tasks), "--steps", "3",
            "--tasks-per-step", "1", "--group-size", "2", "--isolation", "fallback",
            "--lr", "1e-3", "--kl-beta", "0", "--out", str(out)]  # fmt: skip


@pytest.mark.timeout(600)
def test_sigkill_mid_run_then_the_same_command_resumes_at_the_next_step(tmp_path):
    gate = tmp_path / "gate"
    gate.touch()
    tasks, out = _suite(tmp_path / "tasks", gate), tmp_path / "run"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    proc = subprocess.Popen(_cmd(tasks, out), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env)  # fmt: skip
    seen = []
    assert proc.stdout is not None
    for line in proc.stdout:
        seen.append(line)
        if line.startswith("step 1/3"):
            proc.send_signal(signal.SIGKILL)  # step 2's rollouts are running
            break
    proc.wait(timeout=60)
    gate.unlink()  # step 2's orphaned verifiers end; the rerun's pass
    assert proc.returncode == -signal.SIGKILL, "".join(seen)
    with Store(out / "store.db", read_only=True) as store:
        assert [v.version for v in store.policy_versions()] == [1]

    again = subprocess.run(_cmd(tasks, out), capture_output=True, text=True, env=env, timeout=500)
    assert again.returncode == 0, again.stdout + again.stderr
    lines = again.stdout.splitlines()
    assert any(line.startswith("resuming") and "after step 1 (policy v1)" in line for line in lines)
    assert [line.split(":")[0] for line in lines if line.startswith("step ")] == [
        "step 2/3", "step 3/3"
    ]  # fmt: skip
    with Store(out / "store.db", read_only=True) as store:
        assert [v.version for v in store.policy_versions()] == [1, 2, 3]
    db = sqlite3.connect(out / "store.db")
    # each step's groups were decided in exactly one run: the killed step 2's rollouts were
    # never trained, its rerun's were
    decided = [r[0] for r in db.execute(
        "SELECT step FROM rollout_groups WHERE decision IS NOT NULL ORDER BY step")]  # fmt: skip
    assert decided == [1, 2, 3]
    trained = list(db.execute("SELECT turn_id, policy_version FROM samples "
                              "WHERE status = 'trained'"))  # fmt: skip
    db.close()
    assert len({t for t, _ in trained}) == len(trained) > 0
    assert sorted({v for _, v in trained}) == [1, 2, 3]
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert sorted(int(r["step"]) for r in rows) == [1, 2, 3]


@pytest.mark.timeout(600)
def test_steps_without_signal_are_not_run_again_after_a_kill(tmp_path):
    # every reward 0: no step trains, publishes or checkpoints; the progress record still
    # says which steps ended, so the rerun goes on at step 2 (and checks its settings)
    gate = tmp_path / "gate"
    gate.touch()
    tasks, out = _suite(tmp_path / "tasks", gate, reward="0.0"), tmp_path / "run"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    proc = subprocess.Popen(_cmd(tasks, out), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env)  # fmt: skip
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("step 1/3"):
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait(timeout=60)
    gate.unlink()
    again = subprocess.run(_cmd(tasks, out), capture_output=True, text=True, env=env, timeout=500)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "resuming" in again.stdout and "after step 1 (policy v0)" in again.stdout
    steps = [x.split(":")[0] for x in again.stdout.splitlines() if x.startswith("step ")]
    assert steps == ["step 2/3", "step 3/3"]
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert sorted(int(r["step"]) for r in rows) == [1, 2, 3]
    # run again: nothing left to do; with other settings: refused, the run is kept
    done = subprocess.run(_cmd(tasks, out), capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0 and "all 3 steps are done" in done.stdout, done.stdout
    other = [*_cmd(tasks, out), "--group-size", "3"]
    refused = subprocess.run(other, capture_output=True, text=True, env=env, timeout=300)
    assert refused.returncode != 0 and "group_size (--group-size): 2 -> 3" in refused.stderr, (
        refused.stderr
    )
