"""``clawrl serve`` in a subprocess on the tiny model: acknowledged turns survive ``kill -9``;
Ctrl-C shuts down gracefully; the printed curl example streams; the sessions CLI reads it back.
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

import openai
import pytest

from clawrl.cli import main
from clawrl.store import Store, TurnStatus

SERVE = [sys.executable, "-c", "import sys; from clawrl.cli import main; sys.exit(main())"]


@pytest.fixture(scope="module")
def tiny_dir(tiny, tmp_path_factory) -> Path:
    """The tiny model saved as a Hugging Face directory, so ``--model DIR`` serves it."""
    path = tmp_path_factory.mktemp("tiny-model")
    tiny.model.save_pretrained(path)
    tiny.tokenizer.save_pretrained(path)
    return path


def _start(tiny_dir: Path, db: Path, *extra: str) -> tuple[subprocess.Popen, str, list[str]]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    env.pop("CLAWRL_API_KEY", None)
    proc = subprocess.Popen(
        [*SERVE, "serve", "--model", str(tiny_dir), "--port", "0", "--store", str(db), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    lines: list[str] = []
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            proc.kill()
            raise AssertionError(f"clawrl serve exited: {proc.stderr.read()}")
        lines.append(line.rstrip("\n"))
        m = re.search(r"at (http://127\.0\.0\.1:\d+/v1)", line)
        if m:
            # the curl example (2 lines), then the dashboard's URL: read here, since
            # communicate() later reads the pipe itself, past what readline() buffered
            lines += [proc.stdout.readline().rstrip("\n") for _ in range(3)]
            return proc, m.group(1), lines
    proc.kill()
    raise AssertionError("clawrl serve did not print its URL in time")


def _wait_healthy(base: str) -> None:
    import httpx

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(base.removesuffix("/v1") + "/healthz").status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.1)
    raise AssertionError("server never became healthy")


def test_acknowledged_turns_survive_kill_9(tiny_dir, tmp_path):
    db = tmp_path / "kill9.db"
    proc, base, _ = _start(tiny_dir, db)
    acknowledged: dict[str, int] = {}
    try:
        _wait_healthy(base)
        client = openai.OpenAI(base_url=base, api_key="x", max_retries=0)
        for i in range(6):
            kw = {"model": "tiny", "max_tokens": 4, "temperature": 1.0, "seed": i}
            msgs = [{"role": "user", "content": f"call {i}"}]
            if i % 2:
                raw = client.chat.completions.with_raw_response.create(messages=msgs, n=2, **kw)
                r = raw.parse()
                for tid, choice in zip(
                    raw.headers["x-clawrl-turn-ids"].split(","), r.choices, strict=True
                ):
                    acknowledged[tid] = len(choice.logprobs.content) if choice.logprobs else -1
            else:
                raw = client.chat.completions.with_raw_response.create(
                    messages=msgs, stream=True, stream_options={"include_usage": True}, **kw
                )
                chunks = list(raw.parse())
                acknowledged[raw.headers["x-clawrl-turn-ids"]] = chunks[-1].usage.completion_tokens
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    assert proc.returncode == -signal.SIGKILL
    with Store(db) as store:
        for turn_id, completion_tokens in acknowledged.items():
            turn = store.get_turn(turn_id)
            assert turn is not None, f"acknowledged turn {turn_id} lost"
            assert turn.status == TurnStatus.OK
            if completion_tokens >= 0:
                assert len(turn.completion_ids) == completion_tokens
    assert len(acknowledged) == 3 * 2 + 3


def test_graceful_shutdown_curl_example_and_sessions_cli(tiny_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")  # rich tables must not wrap ids
    db = tmp_path / "graceful.db"
    proc, base, lines = _start(tiny_dir, db)
    try:
        _wait_healthy(base)
        curl = "\n".join(lines[-3:-1]).replace('"stream": true', '"stream": true, "max_tokens": 8')
        assert curl.strip().startswith("curl -N")
        out = subprocess.run(["bash", "-c", curl], capture_output=True, text=True, timeout=60)
        data = [x[6:] for x in out.stdout.splitlines() if x.startswith("data: ")]
        assert "max_tokens" in curl and data[-1] == "[DONE]" and len(data) >= 3
        assert json.loads(data[0])["choices"][0]["delta"]["role"] == "assistant"
    finally:
        proc.send_signal(signal.SIGINT)
        rest, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "engine and store closed" in err
    # the dashboard's URL at start, then one line for the request (API, session, tokens, version)
    dash = lines[-1]
    assert re.fullmatch(r"clawrl dashboard: http://127\.0\.0\.1:\d+/dashboard", dash), dash
    (req,) = [x for x in rest.splitlines() if " chat session " in x]
    assert re.fullmatch(r"\d\d:\d\d:\d\d chat session \w{12}… turn \w{8} \d+\+\d+ tokens "
                        r"[\d.]+ s v0 ok (stop|length)", req), req  # fmt: skip
    with Store(db) as store:
        (sid,) = store.session_ids()
        assert len(store.session_turns(sid)) == 1
    capsys.readouterr()
    assert main(["sessions", "list", "--store", str(db)]) == 0
    assert sid[:8] in capsys.readouterr().out
    assert main(["sessions", "show", sid, "--store", str(db)]) == 0
    assert "trainable" in capsys.readouterr().out
    out_file = tmp_path / "export.jsonl"
    assert main(["export", "--format", "jsonl", "--out", str(out_file), "--store", str(db)]) == 0
    (line,) = out_file.read_text().splitlines()
    exported = json.loads(line)
    assert exported["session_id"] == sid
    (row,) = exported["rows"]
    assert sum(row["loss_mask"]) == exported["turns"][0]["completion_len"] > 0
    # export takes a unique id prefix, as `sessions show` does
    prefixed = tmp_path / "prefixed.jsonl"
    args = ["export", "--session", sid[:12], "--out", str(prefixed), "--store", str(db)]
    assert main(args) == 0
    assert json.loads(prefixed.read_text())["session_id"] == sid
    assert main(["sessions", "list", "--store", str(tmp_path / "missing.db")]) == 1


def test_quiet_prints_no_line_per_request(tiny_dir, tmp_path):
    proc, base, lines = _start(tiny_dir, tmp_path / "quiet.db", "--quiet")
    assert lines[-1].startswith("clawrl dashboard: ")
    try:
        _wait_healthy(base)
        client = openai.OpenAI(base_url=base, api_key="x", max_retries=0)
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
    finally:
        proc.send_signal(signal.SIGINT)
        rest, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert " chat session " not in rest


def test_sigterm_ends_requests_in_flight_with_a_503_in_their_protocol(tiny_dir, tmp_path):
    """After --shutdown-grace, a request still generating gets the OpenAI error shape (503,
    unavailable) or a stream error event, not uvicorn's plain-text 500; turns are kept."""
    import threading

    import httpx

    db = tmp_path / "sigterm.db"
    proc, base, _ = _start(tiny_dir, db, "--shutdown-grace", "0.5")
    body = {"model": "m", "max_tokens": 1900, "temperature": 1.0, "seed": 1,
            "messages": [{"role": "user", "content": "Write a very long story."}]}  # fmt: skip
    got: dict[str, object] = {}

    def plain() -> None:
        r = httpx.post(f"{base}/chat/completions", json=body, timeout=60)
        got["plain"] = (r.status_code, r.json())

    try:
        _wait_healthy(base)
        t = threading.Thread(target=plain)
        t.start()
        with httpx.stream(
            "POST", f"{base}/chat/completions", json={**body, "stream": True}, timeout=60
        ) as r:
            lines = r.iter_lines()
            first = next(x for x in lines if x.startswith("data: "))
            assert json.loads(first[6:])["choices"][0]["delta"]["role"] == "assistant"
            proc.send_signal(signal.SIGTERM)
            events = [x[6:] for x in lines if x.startswith("data: ")]
        t.join(timeout=60)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    status, payload = got["plain"]
    assert status == 503 and payload["error"]["code"] == "unavailable", payload
    assert "error" in json.loads(events[-1]), events[-3:]
    with Store(db) as store:
        turns = [t for sid in store.session_ids() for t in store.session_turns(sid)]
    assert len(turns) == 2
    assert all(t.status != TurnStatus.OK for t in turns)
