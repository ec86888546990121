"""``clawrl serve --method combine`` in a subprocess: kill -9 between steps, then resume.

Tiny model; the judge is the real calibrated choice backend on the tiny model's base weights
(random verdicts are fine: only the bookkeeping is under test).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from clawrl.store import Store

SERVE = [sys.executable, "-c", "import sys; from clawrl.cli import main; sys.exit(main())"]


@pytest.fixture(scope="module")
def tiny_dir(tiny, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tiny-online")
    tiny.model.save_pretrained(path)
    tiny.tokenizer.save_pretrained(path)
    return path


def _start(tiny_dir: Path, tmp: Path) -> tuple[subprocess.Popen, str, str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    cmd = [*SERVE, "serve", "--model", str(tiny_dir), "--port", "0", "--store",
           str(tmp / "s.db"), "--method", "combine", "--batch-size", "2", "--judge-votes", "1",
           "--output-dir", str(tmp / "out"), "--lr", "1e-3", "--judge", "choice"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env)  # fmt: skip
    seen = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        m = re.search(r"at (http://127\.0\.0\.1:\d+)/v1", line)
        if m:
            return proc, m.group(1), "".join(seen)
    proc.kill()
    raise AssertionError("clawrl serve did not start:\n" + "".join(seen))


def _converse(url: str, sid: str, turns: int = 3) -> None:
    messages = [{"role": "user", "content": f"what is 2 + {sid[-1]}?"}]
    with httpx.Client(base_url=url, timeout=60) as c:
        for t in range(turns):
            r = c.post("/v1/chat/completions", headers={"X-Session-Id": sid},
                       json={"model": "m", "messages": messages, "max_tokens": 6})  # fmt: skip
            assert r.status_code == 200, r.text
            answer = r.json()["choices"][0]["message"]["content"] or ""
            reply = "thanks, perfect!" if t % 2 else "no, that's wrong. redo it without the list"
            messages += [{"role": "assistant", "content": answer},
                         {"role": "user", "content": reply}]  # fmt: skip


def _steps(out: Path) -> list[dict]:
    p = out / "metrics.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines()] if p.is_file() else []


@pytest.mark.timeout(600)
def test_kill_9_between_steps_then_resume(tiny_dir, tmp_path):
    proc, url, banner = _start(tiny_dir, tmp_path)
    assert "policy version 0" in banner
    try:
        n = 0
        deadline = time.monotonic() + 240
        while not _steps(tmp_path / "out") and time.monotonic() < deadline:
            _converse(url, f"a{n}")
            n += 1
        assert _steps(tmp_path / "out"), "no training step happened"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    steps_before = _steps(tmp_path / "out")
    version_before = int(steps_before[-1]["policy/version"])
    with Store(tmp_path / "s.db") as store:
        trained_before = store.sample_counts().get("trained", 0)
    assert trained_before >= 2 * len(steps_before) - 2  # a crash may cut the last step's rows

    proc, url, banner = _start(tiny_dir, tmp_path)
    try:
        m = re.search(r"policy version (\d+)", banner)
        assert m and int(m.group(1)) >= version_before  # resumed, never went back
        health = httpx.get(url + "/healthz").json()
        assert health["policy_version"] == int(m.group(1))
        deadline = time.monotonic() + 240
        n = 0
        while len(_steps(tmp_path / "out")) <= len(steps_before) and time.monotonic() < deadline:
            _converse(url, f"b{n}")
            n += 1
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    steps_after = _steps(tmp_path / "out")
    assert len(steps_after) > len(steps_before)
    assert [s["step"] for s in steps_after] == sorted({s["step"] for s in steps_after})
    assert steps_after[-1]["policy/version"] > version_before
    with Store(tmp_path / "s.db") as store:
        counts = store.sample_counts()
    assert counts["trained"] >= 2 * len(steps_after) - 2
