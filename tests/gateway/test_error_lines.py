"""A request refused without a recorded turn still gets a console line (``clawrl serve``)."""

from __future__ import annotations

import httpx

from clawrl.cli.serve import error_line
from clawrl.engine.scripted import ScriptedEngine

from .conftest import serve


def test_a_refused_request_reaches_the_error_listeners(tiny, tmp_path):
    engine = ScriptedEngine(tiny.tokenizer, default_reply="ok", max_context=256)
    seen: list[tuple] = []
    try:
        with serve(engine, tiny.tokenizer, tmp_path / "s.db") as served:
            served.app.state.gateway.error_listeners.append(lambda *e: seen.append(e))
            bad = {"model": "tiny", "messages": [{"role": "wizard", "content": "hi"}]}
            r = httpx.post(f"{served.url}/v1/chat/completions", json=bad)
            assert r.status_code == 400
            too_long = {"model": "tiny", "messages": [{"role": "user", "content": "hi " * 400}]}
            r = httpx.post(f"{served.url}/v1/chat/completions", json=too_long)
            assert r.status_code == 400  # recorded as an error turn: its turn line says so
    finally:
        engine.close()
    assert len(seen) == 1, seen
    method, path, status, message = seen[0]
    assert (method, path, status) == ("POST", "/v1/chat/completions", 400) and message
    line = error_line(*seen[0])
    assert " POST /v1/chat/completions 400: " in line and "\n" not in line
