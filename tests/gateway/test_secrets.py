"""API keys never reach the store, the logs or an export, on any protocol, accepted or refused."""

from __future__ import annotations

import io
import logging

import httpx

from clawrl.trajectory.export import export_jsonl

KEY = "sk-clawrl-SECRET-7f3a9c"
WRONG = "sk-clawrl-WRONG-b2d8e1"
CHAT = [{"role": "user", "content": "hi"}]


def _calls(url: str) -> list[httpx.Response]:
    bearer = {"Authorization": f"Bearer {KEY}"}
    out = [
        httpx.post(f"{url}/v1/chat/completions", headers=bearer, timeout=30,
                   json={"model": "tiny", "messages": CHAT, "max_tokens": 4}),
        httpx.post(f"{url}/v1/chat/completions", headers=bearer, timeout=30,
                   json={"model": "tiny", "messages": CHAT, "max_tokens": 4, "stream": True}),
        httpx.post(f"{url}/v1/messages", timeout=30,
                   headers={"x-api-key": KEY, "anthropic-version": "2023-06-01"},
                   json={"model": "tiny", "max_tokens": 4, "messages": CHAT}),
        httpx.post(f"{url}/v1/responses", headers=bearer, timeout=30,
                   json={"model": "tiny", "input": "hi", "max_output_tokens": 4}),
        # refused: a wrong key, and a right key on a malformed body
        httpx.post(f"{url}/v1/chat/completions", timeout=30,
                   headers={"Authorization": f"Bearer {WRONG}"},
                   json={"model": "tiny", "messages": CHAT}),
        httpx.post(f"{url}/v1/chat/completions", headers=bearer, timeout=30,
                   json={"model": "tiny", "messages": "not a list"}),
    ]  # fmt: skip
    return out


def test_keys_are_never_stored_logged_or_exported(scripted_server, tmp_path, caplog):
    served = scripted_server(["Hello there.", "Hi!", "Hey.", "Yo."], api_key=KEY)
    with caplog.at_level(logging.DEBUG):
        codes = [r.status_code for r in _calls(served.url)]
    assert codes[:4] == [200, 200, 200, 200] and codes[4] == 401 and codes[5] == 400
    turns = served.turns()
    assert len(turns) == 4
    # the key is recognisable per client (a fingerprint), never recoverable
    assert all(t.client.get("api_key_fingerprint") for t in turns)
    out = io.StringIO()
    export_jsonl(served.store, out)
    served.store.close()
    raw = b"".join(p.read_bytes() for p in tmp_path.glob("*.db*"))
    for secret in (KEY, WRONG, KEY[8:], WRONG[8:]):
        assert secret.encode() not in raw, "a key reached the store"
        assert secret not in out.getvalue(), "a key reached the export"
        assert secret not in caplog.text, "a key reached the logs"
