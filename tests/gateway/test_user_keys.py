"""Users' API keys (``clawrl serve --user-keys FILE``): a request with a user's key is that user's
and sees only that user's sessions, turns and feedback; what spans every user needs the admin key;
naming another user is a 403 in the client's protocol."""

from __future__ import annotations

import base64

import httpx
import pytest

from clawrl.dashboard import DashboardSource, mount_dashboard
from clawrl.engine.scripted import ScriptedEngine
from clawrl.errors import ConfigError
from clawrl.gateway import create_app
from clawrl.gateway.auth import load_user_keys
from clawrl.gateway.server import LiveServer
from clawrl.store import Store

KEYS = {"key-alice-1": "alice", "key-bob-2": "bob"}
ADMIN = "key-admin-0"


@pytest.fixture
def served(tokenizer, tmp_path):
    store = Store(tmp_path / "s.db")
    engine = ScriptedEngine(tokenizer, ["hello there"] * 20)
    app = create_app(engine, tokenizer, store, model_name="tiny", api_key=ADMIN, user_keys=KEYS)
    mount_dashboard(app, DashboardSource(store, title="keys"))
    server = LiveServer(app).start()
    try:
        yield server.url, store
    finally:
        server.stop()
        store.close()


def _h(key: str, **extra: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", **extra}


def _chat(url: str, key: str, **headers: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", headers=_h(key, **headers), timeout=30,
                      json={"model": "tiny", "max_tokens": 4,
                            "messages": [{"role": "user", "content": f"hi from {key}"}]})  # fmt: skip


def test_a_users_key_acts_for_that_user_and_sees_only_their_data(served):
    url, store = served
    assert _chat(url, "key-alice-1").status_code == 200
    assert _chat(url, "key-bob-2").status_code == 200
    assert _chat(url, ADMIN, **{"x-clawrl-user": "carol"}).status_code == 200
    turns = {t.user_id: t for s in store.list_sessions() for t in store.session_turns(s.session.id)}
    assert set(turns) == {"alice", "bob", "carol"}  # the key's user, without any header
    alice, bob = turns["alice"], turns["bob"]
    # a user's sessions live in their own namespace; the admin's do not
    assert alice.session_id.startswith("alice:") and bob.session_id.startswith("bob:")
    assert ":" not in turns["carol"].session_id
    # naming another user with a user's key: 403 in the client's own protocol
    r = _chat(url, "key-alice-1", **{"x-clawrl-user": "bob"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "user_mismatch"
    r = httpx.post(f"{url}/v1/messages", headers={"x-api-key": "key-alice-1"}, timeout=30,
                   json={"model": "tiny", "max_tokens": 4, "metadata": {"user_id": "bob"},
                         "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
    assert r.status_code == 403 and r.json()["type"] == "error"
    assert "bob" in r.json()["error"]["message"]
    # a session bob names is his own (stored as bob:NAME): naming alice's reaches nothing of hers
    r = _chat(url, "key-bob-2", **{"x-session-id": alice.session_id})
    assert r.status_code == 200
    assert r.headers["x-clawrl-session-id"] == f"bob:{alice.session_id}"
    r = _chat(url, "key-bob-2", **{"x-session-id": "no-such-session"})  # answers the same
    assert r.status_code == 200 and r.headers["x-clawrl-session-id"] == "bob:no-such-session"
    assert len(store.session_turns(alice.session_id)) == 1
    # alice naming her own (inferred) session by the id the gateway gave her: it is hers
    r = _chat(url, "key-alice-1", **{"x-session-id": alice.session_id})
    assert r.headers["x-clawrl-session-id"] == alice.session_id
    assert len(store.session_turns(alice.session_id)) == 2
    # sending her history (her question and the answer she got) opens a session of his own:
    # nothing joins hers, and nothing tells him it exists
    history = [{"role": "user", "content": "hi from key-alice-1"},
               {"role": "assistant", "content": "hello there"},
               {"role": "user", "content": "and then?"}]  # fmt: skip
    r = httpx.post(f"{url}/v1/chat/completions", headers=_h("key-bob-2"), timeout=30,
                   json={"model": "tiny", "max_tokens": 4, "messages": history})  # fmt: skip
    assert r.status_code == 200 and r.headers["x-clawrl-session-id"].startswith("bob:")
    assert r.headers["x-clawrl-session-id"] != f"bob:{alice.session_id}"
    assert len(store.session_turns(alice.session_id)) == 2
    assert len(store.list_sessions()) == 6
    # the dashboard (a browser's Basic login): alice's sessions only
    basic = {"Authorization": "Basic " + base64.b64encode(b"any:key-alice-1").decode()}
    r = httpx.get(f"{url}/dashboard/api/sessions", headers=basic, timeout=30)
    assert r.status_code == 200
    assert {s["id"] for s in r.json()["sessions"]} == {alice.session_id}
    r = httpx.get(f"{url}/dashboard/api/sessions?user=bob", headers=basic, timeout=30)
    assert r.status_code == 403
    r = httpx.get(f"{url}/dashboard/api/session", params={"id": bob.session_id}, headers=basic,
                  timeout=30)  # fmt: skip
    assert r.status_code == 404  # as an unknown session: its existence is not told
    r = httpx.get(f"{url}/dashboard/api/session", params={"id": alice.session_id},
                  headers=basic, timeout=30)  # fmt: skip
    assert r.status_code == 200 and "key-bob-2" not in r.text
    for path in ("/dashboard/api/overview", "/dashboard/api/training", "/dashboard/api/judge",
                 "/dashboard/api/memory", "/metrics", "/v1/memory"):  # fmt: skip
        r = httpx.get(f"{url}{path}", headers=_h("key-alice-1"), timeout=30)
        assert r.status_code == 403 and "admin key" in r.text, path
    # feedback and session ends: on their own turns only
    fb = {"turn_id": bob.id, "reward": 1.0}
    assert httpx.post(f"{url}/v1/feedback", json=fb, headers=_h("key-alice-1")).status_code == 404
    fb = {"session_id": bob.session_id, "reward": 1.0}
    assert httpx.post(f"{url}/v1/feedback", json=fb, headers=_h("key-alice-1")).status_code == 404
    fb = {"turn_id": alice.id, "reward": -1.0, "comment": "shorter"}
    assert httpx.post(f"{url}/v1/feedback", json=fb, headers=_h("key-alice-1")).status_code == 200
    end = f"{url}/v1/sessions/{bob.session_id}/end"
    assert httpx.post(end, headers=_h("key-alice-1")).status_code == 404
    assert store.get_session(bob.session_id).ended_at is None
    # the admin key sees every user; an unknown key nothing
    r = httpx.get(f"{url}/dashboard/api/sessions", headers=_h(ADMIN), timeout=30)
    assert len(r.json()["sessions"]) == 6
    assert httpx.get(f"{url}/metrics", headers=_h(ADMIN)).status_code == 200
    assert httpx.post(end, headers=_h(ADMIN)).status_code == 200
    assert _chat(url, "key-nobody").status_code == 401


def test_the_keys_file_is_checked_line_by_line(tmp_path):
    path = tmp_path / "keys"
    path.write_text("# users\nalice k1\n\nbob   k2\n")
    assert load_user_keys(path) == {"k1": "alice", "k2": "bob"}
    for text, why in (("alice\n", "two fields"), ("alice k1\nbob k1\n", "given to user 'alice' already"),
                      ("alice admin\n", "admin key"), ("# none\n", "no 'USER KEY'"),
                      ("a:b k3\n", "must not contain ':'")):  # fmt: skip
        path.write_text(text)
        with pytest.raises(ConfigError, match=why):
            load_user_keys(path, admin_key="admin")
    with pytest.raises(ConfigError, match="cannot read"):
        load_user_keys(tmp_path / "missing")
