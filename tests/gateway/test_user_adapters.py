"""``server.per_user_adapters`` on the gateway (scripted engine): a user with an adapter version
in the store is served with it and the turn records it; others get the policy alone; a newer
version serves the next request; a version the engine refuses leaves the one before."""

from __future__ import annotations

import concurrent.futures
import io
import json
import logging

import httpx

from clawrl.gateway.user_adapters import UserAdapters
from clawrl.store import UserAdapterRecord
from clawrl.trajectory.export import export_jsonl

CHAT = [{"role": "user", "content": "hi"}]


def _ask(url: str, user: str | None) -> None:
    headers = {"x-clawrl-user": user} if user else {}
    r = httpx.post(f"{url}/v1/chat/completions", headers=headers, timeout=30,
                   json={"model": "tiny", "messages": CHAT, "max_tokens": 4})  # fmt: skip
    assert r.status_code == 200, r.text


def test_each_user_is_served_with_their_newest_adapter(scripted_server, caplog):
    served = scripted_server()
    engine = served.engine
    served.store.publish_user_adapter(UserAdapterRecord("alice", 1, "/adapters/alice/v1"))
    served.app.state.gateway.user_adapters = UserAdapters(served.store, engine, refresh_s=0)

    def last() -> tuple[str, int | None, str | None]:
        t = max(served.turns(), key=lambda t: t.created_at)
        return t.user_id, t.adapter_version, engine.params[-1].adapter

    _ask(served.url, "alice")
    assert last() == ("alice", 1, "alice")
    turn = max(served.turns(), key=lambda t: t.created_at)
    # not the shared policy's log-probs: never trained into it
    assert not turn.trainable and turn.untrainable_reason == "user_adapter"
    out = io.StringIO()
    export_jsonl(served.store, out, [turn.session_id])
    (exported,) = json.loads(out.getvalue())["turns"]
    assert (exported["user_id"], exported["adapter_version"]) == ("alice", 1)
    assert exported["untrainable_reason"] == "user_adapter"
    served.app.state.gateway.user_adapters.trained = True  # this server trains users' adapters
    _ask(served.url, "alice")
    turn = max(served.turns(), key=lambda t: t.created_at)
    assert turn.trainable and turn.untrainable_reason is None  # for alice's own learner
    served.app.state.gateway.user_adapters.trained = False
    _ask(served.url, "bob")
    assert last() == ("bob", None, None)
    _ask(served.url, None)
    assert last() == ("", None, None)
    served.store.publish_user_adapter(UserAdapterRecord("alice", 2, "/adapters/alice/v2"))
    _ask(served.url, "alice")
    assert last() == ("alice", 2, "alice")

    def refuse(name, version, path):
        fut: concurrent.futures.Future[int] = concurrent.futures.Future()
        fut.set_exception(ValueError("adapter_model.safetensors is corrupt"))
        return fut

    engine.load_adapter = refuse  # type: ignore[method-assign]
    served.store.publish_user_adapter(UserAdapterRecord("alice", 3, "/adapters/alice/v3"))
    with caplog.at_level(logging.ERROR):
        _ask(served.url, "alice")
        _ask(served.url, "alice")
    assert last() == ("alice", 2, "alice")  # still their version 2, and the turn says so
    refused = [r for r in caplog.records if "version 3 of user 'alice'" in r.getMessage()]
    assert len(refused) == 1 and "serving them their version 2" in refused[0].getMessage()
