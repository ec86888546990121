"""Whose request it is: every protocol records its user from the header, the body's end-user
field or the API key, as ``server.user_from`` says; an id that cannot be one is a 400 in the
client's protocol and records nothing."""

from __future__ import annotations

import json

import httpx

from clawrl.gateway.auth import key_fingerprint

CHAT = [{"role": "user", "content": "hi"}]
ANTHROPIC = {"anthropic-version": "2023-06-01"}


def _chat(url: str, headers: dict | None = None, **body) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", headers=headers or {}, timeout=30,
                      json={"model": "tiny", "messages": CHAT, "max_tokens": 4, **body})  # fmt: skip


def _message(url: str, headers: dict | None = None, **body) -> httpx.Response:
    return httpx.post(f"{url}/v1/messages", headers={**ANTHROPIC, **(headers or {})}, timeout=30,
                      json={"model": "tiny", "messages": CHAT, "max_tokens": 4, **body})  # fmt: skip


def _response(url: str, **body) -> httpx.Response:
    return httpx.post(f"{url}/v1/responses", timeout=30,
                      json={"model": "tiny", "input": "hi", "max_output_tokens": 4, **body})  # fmt: skip


def _users(served) -> list[str]:
    return [t.user_id for t in sorted(served.turns(), key=lambda t: t.created_at)]


def test_each_protocol_records_the_user_its_request_names(scripted_server):
    served = scripted_server(["ok"] * 9)
    claude_code = json.dumps({"device_id": "d1", "session_id": "0b6c4c1e-session"})
    older_claude_code = ("user_4f1e9c0d2b_account_7a1c_session_"
                         "0b6c4c1e-8d2f-4f6a-9c3e-2a7b5d9e1f00")  # fmt: skip
    codes = [
        _chat(served.url, user="alice").status_code,
        _chat(served.url, headers={"x-clawrl-user": "bob"}, user="alice").status_code,
        _chat(served.url, safety_identifier="carol").status_code,
        _message(served.url, metadata={"user_id": "dave"}).status_code,
        _message(served.url, metadata={"user_id": claude_code}).status_code,
        _message(served.url, metadata={"user_id": older_claude_code}).status_code,
        _response(served.url, user="erin").status_code,
        _response(served.url, safety_identifier="frank").status_code,
        _chat(served.url).status_code,
    ]
    assert codes == [200] * 9
    # the header wins over the body; Claude Code's user_id names a session, not a user
    assert _users(served) == ["alice", "bob", "carol", "dave", "", "", "erin", "frank", ""]


def test_with_user_from_key_each_api_key_is_a_user_and_the_key_is_not_stored(
    scripted_server, tmp_path
):
    served = scripted_server(["ok"] * 3, api_key="sk-one", user_from=["key"])
    bearer = {"Authorization": "Bearer sk-one"}
    assert _chat(served.url, headers=bearer, user="alice").status_code == 200
    assert _chat(served.url, headers={**bearer, "x-clawrl-user": "bob"}).status_code == 200
    assert _users(served) == [key_fingerprint("sk-one")] * 2  # the body and header are not asked
    served.store.close()
    raw = b"".join(p.read_bytes() for p in tmp_path.glob("*.db*"))
    assert b"sk-one" not in raw


def test_no_source_records_no_user(scripted_server):
    served = scripted_server(["ok"], user_from=[])
    assert _chat(served.url, headers={"x-clawrl-user": "bob"}, user="alice").status_code == 200
    assert _users(served) == [""]


def test_an_id_that_cannot_be_a_user_is_a_400_in_the_clients_protocol(scripted_server):
    served = scripted_server(["ok"] * 4)
    r = _chat(served.url, user="x" * 300)
    assert r.status_code == 400
    err = r.json()["error"]  # (the body's user is a session id too: refused there first)
    assert err["param"] == "user" and "256" in err["message"] and err["code"] == "invalid_user"
    r = _chat(served.url, headers={"x-clawrl-user": "x" * 300})
    err = r.json()["error"]
    assert r.status_code == 400 and err["code"] == "invalid_user" and "256" in err["message"]
    r = _message(served.url, metadata={"user_id": 42})
    assert r.status_code == 400 and r.json()["type"] == "error"
    assert "metadata.user_id" in r.json()["error"]["message"]
    assert "must be a string" in r.json()["error"]["message"]
    r = _message(served.url, metadata={"user_id": "a\u0007b"})
    assert r.status_code == 400 and "control character" in r.json()["error"]["message"]
    assert served.turns() == []  # nothing recorded for a refused request
    assert _chat(served.url, user="x" * 256).status_code == 200
    assert _message(served.url, metadata={"user_id": " bob "}).status_code == 200
    assert _users(served) == ["x" * 256, "bob"]  # white space around an id is not part of it
