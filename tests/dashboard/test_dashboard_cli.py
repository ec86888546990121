"""``clawrl dashboard`` in a subprocess over a demo report laid out as ``clawrl demo`` writes it."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time

import httpx
import pytest

from clawrl.cli import main

CLI = [sys.executable, "-c", "import sys; from clawrl.cli import main; sys.exit(main())"]


def _evaluation(score: float) -> dict:
    return {"step": 0, "version": 0, "score": score, "ci": [score - 0.1, score + 0.1],
            "scores": [score, score], "check_rates": {"short": score},
            "checks": [{"short": True}, {"short": False}], "guards": {},
            "answers": ["a", "b"]}  # fmt: skip


@pytest.fixture
def report(live, tmp_path):
    """runs/{combine,rl}-seed0 with a copy of the live store; results.json lists combine first,
    while its run directories sort rl second: the run shown and its evaluations must agree."""
    root = tmp_path / "demo-report"
    for name in ("combine-seed0", "rl-seed0"):
        run = root / "runs" / name
        (run / "trainer").mkdir(parents=True)
        src = sqlite3.connect(live.runtime.store.target)
        dst = sqlite3.connect(run / "store.db")
        src.backup(dst)
        src.close()
        dst.close()
        shutil.copy(live.runtime.dashboard.output_dir / "metrics.jsonl", run / "trainer")
    results = [
        {"method": m, "seed": 0, "evaluations": {"0": _evaluation(s), "2": _evaluation(s + 0.3)},
         "questions": ["q1", "q2"], "agreement": {"compared": 4, "agreed": 3, "rate": 0.75,
                                                   "sign_errors": 1, "sign_error_rate": 0.25,
                                                   "judge_neutral": 0, "missing": 0}}
        for m, s in (("combine", 0.2), ("rl", 0.4))
    ]  # fmt: skip
    (root / "results.json").write_text(json.dumps(results))
    return root


def _start(*args: str) -> tuple[subprocess.Popen, str]:
    env = {**os.environ}
    env.pop("CLAWRL_API_KEY", None)
    proc = subprocess.Popen([*CLI, "dashboard", "--port", "0", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)  # fmt: skip
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        m = re.search(r"(http://127\.0\.0\.1:\d+/dashboard)", line)
        if m:
            return proc, m.group(1)
    proc.kill()
    raise AssertionError(f"clawrl dashboard did not start: {proc.stdout.read()}")


def test_a_finished_demo_run_is_served_read_only(report):
    for run, method, score in (("rl-seed0", "rl", 0.4), (None, "combine", 0.2)):
        proc, url = _start("--demo", str(report), *(["--run", run] if run else []))
        try:
            overview = httpx.get(f"{url}/api/overview").json()
            assert overview["read_only"] is True and overview["live"] is False
            assert overview["step"] >= 1 and overview["sessions"] >= 2
            assert (run or "combine-seed0") in overview["title"]
            demo = httpx.get(f"{url}/api/training").json()["demo"]
            assert demo["method"] == method and demo["evaluations"][0]["score"] == score
            assert demo["evaluations"][0]["checks"]["short"]["ci"]  # per-check interval
            judge = httpx.get(f"{url}/api/judge").json()
            assert judge["agreement"]["rate"] == 0.75
            assert httpx.get(f"{url}/session?id=dash-one").status_code == 200
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(30)


def test_bad_paths_and_flag_mixes_are_clear_errors(report, tmp_path, capsys):
    cases = [
        (["--demo", str(tmp_path / "empty")], "no runs/*/store.db"),
        (["--demo", str(report), "--run", "opd-seed9"], "has no run 'opd-seed9'"),
        (["--run", "rl-seed0"], "pass --demo too"),
        (["--demo", str(report), "--store", "x.db"], "leave out"),
        (["--store", str(tmp_path / "missing.db")], "no store at"),
        (["--store", str(report / "runs" / "rl-seed0" / "store.db"), "--output-dir",
          str(tmp_path / "nope")], "no trainer output directory"),
    ]  # fmt: skip
    (tmp_path / "empty").mkdir()
    for args, message in cases:
        assert main(["dashboard", "--port", "0", *args]) == 1, args
        assert message in capsys.readouterr().err, args
    junk = tmp_path / "junk.db"
    junk.write_text("not a database")
    assert main(["dashboard", "--port", "0", "--store", str(junk)]) == 1
    assert "not a clawrl store" in capsys.readouterr().err
