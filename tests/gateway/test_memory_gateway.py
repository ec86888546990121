"""``clawrl serve --memory`` through the live gateway: a feedback comment reaches the next
session's prompt (token-exact, recorded on the turn), a conversation keeps the memory it began
with, side calls get none, and /v1/memory reads and changes the entries."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import httpx
import openai
import pytest

from clawrl.chat import ChatMessage, render_prompt
from clawrl.engine.scripted import ScriptedEngine
from clawrl.gateway import create_app
from clawrl.gateway.server import LiveServer
from clawrl.memory import MEMORY_HEADER, MemoryKeeper
from clawrl.store import Store, TurnKind

Q = [{"role": "user", "content": "What is 17 + 25?"}]


@contextlib.contextmanager
def _served(tokenizer, path, *, memory: bool = True) -> Iterator[tuple[LiveServer, Store]]:
    store = Store(path)
    keeper = MemoryKeeper(store, sync_s=0.0) if memory else None
    engine = ScriptedEngine(tokenizer, ["The answer is 42, because 17 + 25 = 42."] * 20)
    server = LiveServer(create_app(engine, tokenizer, store, model_name="tiny",
                                   memory=keeper)).start()  # fmt: skip
    try:
        yield server, store
    finally:
        server.stop()
        store.close()


def _client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)


def _turns(store: Store, session: str):
    return store.session_turns(session)


def test_a_feedback_comment_shapes_the_next_session(tokenizer, tmp_path):
    with _served(tokenizer, tmp_path / "s.db") as (server, store):
        client = _client(server)
        client.chat.completions.create(model="tiny", messages=Q,
                                       extra_headers={"x-session-id": "monday"})  # fmt: skip
        (first,) = _turns(store, "monday")
        assert first.memory is None
        r = httpx.post(f"{server.url}/v1/feedback", json={
            "turn_id": first.id, "reward": -1, "comment": "Too long. Please lead with the number.",
        })  # fmt: skip
        assert r.status_code == 200 and r.json()["memory_changed"] == 1
        client.chat.completions.create(model="tiny", messages=Q,
                                       extra_headers={"x-session-id": "tuesday"})  # fmt: skip
        (second,) = _turns(store, "tuesday")
        (entry,) = store.memory_entries()
        assert second.memory == {"entries": [entry.id], "mode": "inserted", "index": 0,
                                 "text": f"{MEMORY_HEADER}\n- Too long. Please lead with the number."}  # fmt: skip
        # token-exact: the ids the engine sampled from are the render of what the turn records
        system = second.request_messages[0]
        assert (system["role"], system["content"]) == ("system", second.memory["text"])
        text = tokenizer.decode(second.prompt_ids)
        assert "Please lead with the number." in text
        assert "lead with" not in tokenizer.decode(first.prompt_ids)
        msgs = [ChatMessage.model_validate(m) for m in second.request_messages]
        assert render_prompt(tokenizer, msgs, None).token_ids == second.prompt_ids
        assert second.prompt_ids[: len(first.prompt_ids)] != first.prompt_ids


def test_a_conversation_keeps_the_memory_it_began_with(tokenizer, tmp_path):
    with _served(tokenizer, tmp_path / "s.db") as (server, store):
        client = _client(server)
        keeper = server.app.state.gateway.memory
        keeper.remember("Lead with the number.")
        for headers, later in (
            ({}, "Answer in French."),
            ({"x-session-id": "named"}, "Use bullet points."),
        ):
            r1 = client.chat.completions.create(model="tiny", messages=Q, extra_headers=headers)
            keeper.remember(later)  # the memory changes mid-conversation
            messages = [*Q, r1.choices[0].message.model_dump(exclude_none=True),
                        {"role": "user", "content": "And 18 + 25?"}]  # fmt: skip
            client.chat.completions.create(model="tiny", messages=messages, extra_headers=headers)
            sessions = {
                t.session_id for sid in store.session_ids() for t in store.session_turns(sid)
            }
            sid = "named" if headers else next(s for s in sessions if s != "named")
            t1, t2 = _turns(store, sid)
            assert t2.parent_turn_id == t1.id  # still one conversation
            assert t2.memory == t1.memory and later not in t1.memory["text"]
            assert t2.prompt_ids[: len(t1.prompt_ids) + len(t1.completion_ids)] == t1.seq_ids
        # a new conversation gets the memory as it is now
        client.chat.completions.create(
            model="tiny", messages=Q, extra_headers={"x-session-id": "new"}
        )
        (t,) = _turns(store, "new")
        assert "bullet" in t.memory["text"] and len(t.memory["entries"]) == 3


def test_side_calls_and_memory_off_get_nothing(tokenizer, tmp_path):
    with _served(tokenizer, tmp_path / "s.db") as (server, store):
        server.app.state.gateway.memory.remember("Lead with the number.")
        title = [{"role": "system", "content": "You are a title generator. Name it."}, *Q]
        _client(server).chat.completions.create(model="tiny", messages=title,
                                                extra_headers={"x-session-id": "t"})  # fmt: skip
        (t,) = _turns(store, "t")
        assert t.kind == TurnKind.SIDE and t.memory is None
        assert "Lead with" not in tokenizer.decode(t.prompt_ids)
    with _served(tokenizer, tmp_path / "off.db", memory=False) as (server, store):
        MemoryKeeper(store).remember("Lead with the number.")
        _client(server).chat.completions.create(model="tiny", messages=Q,
                                                extra_headers={"x-session-id": "o"})  # fmt: skip
        (t,) = _turns(store, "o")
        assert t.memory is None and "Lead with" not in tokenizer.decode(t.prompt_ids)
        added = httpx.post(f"{server.url}/v1/memory", json={"text": "Use bullet points."}).json()
        assert "memory is off" in added["note"]
        listed = httpx.get(f"{server.url}/v1/memory").json()
        assert listed["enabled"] is False and [e["text"] for e in listed["data"]] == [
            "Lead with the number.",
            "Use bullet points.",
        ]


def test_memory_routes(tokenizer, tmp_path):
    with _served(tokenizer, tmp_path / "s.db") as (server, store):
        url = f"{server.url}/v1/memory"
        r = httpx.post(url, json={"text": "Keep it short."})
        assert r.status_code == 201 and r.json()["status"] == "active" and "note" not in r.json()
        eid = r.json()["id"]
        r = httpx.post(url, json={"text": "Longer answers please."})  # contradicts: replaces
        new = r.json()["id"]
        assert [e["id"] for e in httpx.get(url).json()["data"]] == [new]
        every = httpx.get(url, params={"all": "true"}).json()["data"]
        assert {e["id"]: e["status"] for e in every} == {eid: "replaced", new: "active"}
        one = httpx.get(f"{url}/{new}").json()
        assert one["history"][0]["event"] == "added" and one["history"][0]["replaces"] == eid
        r = httpx.patch(f"{url}/{new}", json={"text": "Longer answers, please.", "active": False})
        assert r.status_code == 200 and r.json()["status"] == "disabled"
        assert httpx.get(url).json()["data"] == []
        r = httpx.patch(f"{url}/{eid}", json={"active": True})  # replaced: add it again instead
        assert r.status_code == 400 and "add it again" in r.json()["error"]["message"]
        r = httpx.get(f"{url}/{eid[:12]}")  # the CLI's short id: named in the 404
        assert r.status_code == 404 and f"did you mean '{eid}'" in r.json()["error"]["message"]
        assert httpx.delete(f"{url}/{new}").json()["deleted"] is True
        r = httpx.delete(f"{url}/{new[:12]}")  # forgotten: not offered as a match
        assert r.status_code == 404 and "did you mean" not in r.json()["error"]["message"]
        assert "Longer" not in str(store.get_memory_entry(new).history)
        for method, path, body, code in [
            ("GET", f"{url}/nope", None, 404),
            ("PATCH", f"{url}/nope", {"text": "x"}, 404),
            ("DELETE", f"{url}/nope", None, 404),
            ("DELETE", f"{url}/{new}", None, 404),  # forgotten already
            ("POST", url, {"text": ""}, 400),
            ("POST", url, {"text": "x" * 501}, 400),
            ("POST", url, {"txt": "x"}, 400),
            ("PATCH", f"{url}/{eid}", {}, 400),
        ]:
            r = httpx.request(method, path, json=body)
            assert r.status_code == code, (method, path, body, r.text)
            assert "error" in r.json()


@pytest.mark.parametrize("memory", [True, False])
def test_memory_routes_need_the_api_key(tokenizer, tmp_path, memory):
    store = Store(tmp_path / "k.db")
    app = create_app(ScriptedEngine(tokenizer, ["ok"]), tokenizer, store, model_name="tiny",
                     api_key="k", memory=MemoryKeeper(store) if memory else None)  # fmt: skip
    server = LiveServer(app).start()
    try:
        assert httpx.get(f"{server.url}/v1/memory").status_code == 401
        ok = httpx.get(f"{server.url}/v1/memory", headers={"authorization": "Bearer k"})
        assert ok.status_code == 200 and ok.json()["enabled"] is memory
    finally:
        server.stop()
        store.close()
