"""The dashboard's JSON and pages against a live gateway that trained a step on real traffic."""

from __future__ import annotations

import base64
import time

import httpx
import pytest

from clawrl.cli.serve import request_line
from clawrl.dashboard import DashboardSource, mount_dashboard
from clawrl.engine.scripted import ScriptedEngine
from clawrl.gateway import create_app
from clawrl.store import Store

from .conftest import HINT, TRICKY, wait_for


def get(live, path: str) -> dict:
    r = httpx.get(f"{live.url}{path}", timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def test_overview_counts_traffic_judgments_and_the_step(live):
    d = get(live, "/api/overview")
    assert d["live"] is True and d["step"] >= 1
    assert d["policy_version"] == live.runtime.engine.policy_version >= 1
    assert d["versions"][0] == {"version": 1, "step": 1, "time": d["versions"][0]["time"]}
    assert d["sessions"] == 2 and d["turns"] == 5
    assert d["judged"] >= 2 and d["trained"] >= 2
    assert d["last_step"]["step"] == d["step"] and "loss" in d["last_step"]
    # the last answer of each ended session has no next state: dropped, with the reason in words
    drops = {x["reason"]: x for x in d["drops"]}
    assert drops["no_next_state"]["count"] == 2
    assert "session ended" in drops["no_next_state"]["text"]
    assert all(x["text"] for x in drops.values())
    # rates: calls (choice 0) and sampled tokens over the window, from the store
    act = live.runtime.store.activity(0.0)
    assert act["requests"] == 5 and act["completion_tokens"] >= 5
    assert 0 <= d["requests_per_s"] <= 5 / 1.0 and d["rate_window_s"] <= 60


def test_sessions_list_and_search(live):
    d = get(live, "/api/sessions")
    ids = [s["id"] for s in d["sessions"]]
    assert set(ids) == {"dash-one", "dash-two"}
    one = next(s for s in d["sessions"] if s["id"] == "dash-one")
    assert one["turns"] == 3 and one["trainable"] == 3 and one["attribution"] == "header"
    assert d["total"] == 2 and d["limit"] == 100 and d["offset"] == 0
    two = get(live, "/api/sessions?q=TWO")
    assert [s["id"] for s in two["sessions"]] == ["dash-two"] and two["total"] == 1
    assert get(live, "/api/sessions?q=no-such-thing")["sessions"] == []
    # LIKE's wildcards are searched for literally
    assert get(live, "/api/sessions?q=%25")["total"] == 0
    assert get(live, "/api/sessions?q=dash_")["total"] == 0
    page = get(live, "/api/sessions?limit=1&offset=1")
    assert len(page["sessions"]) == 1 and page["total"] == 2
    assert page["sessions"][0]["id"] != get(live, "/api/sessions?limit=1")["sessions"][0]["id"]


def test_sessions_filter_by_user(live):
    """Each session row lists its users; ``user=`` keeps one user's sessions (``""``: requests
    that named no user); a user id that cannot be one is a 400 naming the parameter."""
    d = get(live, "/api/sessions")
    assert {s["id"]: s["users"] for s in d["sessions"]} == {"dash-one": ["alice"], "dash-two": []}
    alice = get(live, "/api/sessions?user=alice")
    assert [s["id"] for s in alice["sessions"]] == ["dash-one"] and alice["total"] == 1
    assert alice["user"] == "alice" and d["user"] is None
    assert [s["id"] for s in get(live, "/api/sessions?user=")["sessions"]] == ["dash-two"]
    assert get(live, "/api/sessions?user=bob")["total"] == 0
    assert get(live, "/api/sessions?user=alice&q=two")["total"] == 0
    r = httpx.get(f"{live.url}/api/sessions", params={"user": "a\nb"}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "user"


@pytest.mark.parametrize("query", [
    {"q": "x" * 501}, {"limit": "abc"}, {"limit": "0"}, {"limit": "501"}, {"offset": "-1"},
    {"offset": str(10**20)},
])  # fmt: skip
def test_bad_list_parameters_are_a_400_naming_the_parameter(live, query):
    r = httpx.get(f"{live.url}/api/sessions", params=query)
    assert r.status_code == 400, r.text
    assert next(iter(query)) in r.json()["error"]["message"]


def test_one_session_shows_next_state_judgment_hint_and_training(live):
    d = get(live, "/api/session?id=dash-one")
    turns = d["turns"]
    assert [t["depth"] for t in turns] == [0, 1, 2]
    first = turns[0]
    assert first["messages"][0] == {"role": "user", "text": "what is 2 + 2?"}
    assert first["next_state"]["role"] == "user"
    assert first["next_state"]["messages"][0]["text"] == "no, that is wrong, redo it"
    assert first["judgment"]["score"] == -1 and first["judgment"]["hint"] == HINT
    assert first["judgment"]["backend"]  # the scripted judge casts no separate votes
    second = turns[1]
    assert second["messages_skipped"] == 2  # the first question and answer are in its parent
    assert second["messages"] == [{"role": "user", "text": "no, that is wrong, redo it"}]
    assert second["judgment"]["score"] == 1
    trained = [t for t in turns if t["training"]["state"] == "trained"]
    assert trained and all("trained at step" in t["training"]["text"] for t in trained)
    assert turns[2]["next_state"] is None  # nobody replied to the last answer
    assert turns[2]["training"]["state"] in ("waiting", "dropped", "ready")


def test_unknown_session_and_asset_are_404_in_the_error_shape(live):
    r = httpx.get(f"{live.url}/api/session", params={"id": "nope"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "session_not_found"
    r = httpx.get(f"{live.url}/api/session")
    assert r.status_code == 400 and "id" in r.json()["error"]["message"]
    # the raw path reaches the static route (httpx would normalise a literal ../)
    for raw in ("/dashboard/static/..%2f..%2fpyproject.toml", "/dashboard/static/%2e%2e",
                "/dashboard/static/app.js%00"):  # fmt: skip
        with httpx.Client(base_url=live.url.removesuffix("/dashboard")) as c:
            r = c.send(
                c.build_request("GET", httpx.URL(c.base_url.join("/"), raw_path=raw.encode()))
            )
        assert r.status_code == 404, (raw, r.status_code)
    r = httpx.get(f"{live.url}/static/secrets.txt")
    assert r.status_code == 404 and "error" in r.json()


def test_training_and_judge_views(live):
    d = get(live, "/api/training")
    assert d["steps"] >= 1 and d["curves"]["loss"]["points"][0][0] == 1
    assert d["demo"] is None and d["output_dir"].endswith("out")
    j = get(live, "/api/judge")
    assert j["distribution"]["-1"] >= 1 and j["distribution"]["+1"] >= 1
    assert j["hinted"] >= 1 and j["agreement"] is None
    # the ended sessions' last answers were never sent to the judge: not abstentions
    assert j["skipped"] == {"no_next_state": 2} and j["no_judgment"] == {}
    assert j["backends"] == ["generative:scripted"]
    assert all(r["backend"] == "generative:scripted" for r in j["recent"])
    assert j["recent"] and {"turn_id", "session_id", "score"} <= set(j["recent"][0])


def test_the_root_leads_to_the_dashboard(live):
    r = httpx.get(live.url.removesuffix("/dashboard") + "/", follow_redirects=False)
    assert r.status_code == 307 and r.headers["location"] == "/dashboard"


def test_pages_are_html_shells_with_escaped_attributes(live):
    for path in ("", "/sessions", "/session?id=dash-one", "/training", "/judge"):
        r = httpx.get(f"{live.url}{path}")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        assert 'src="/dashboard/static/app.js"' in r.text
    r = httpx.get(f"{live.url}/session", params={"id": '"><script>x<\\script>'})
    assert r.status_code == 200 and "<script>x" not in r.text
    assert 'data-session="&quot;&gt;&lt;script&gt;x&lt;\\script&gt;"' in r.text
    for name, kind in (("app.js", "javascript"), ("style.css", "css")):
        r = httpx.get(f"{live.url}/static/{name}")
        assert r.status_code == 200 and kind in r.headers["content-type"] and len(r.text) > 1000


def test_tricky_text_reaches_the_json_verbatim(live):
    d = get(live, "/api/session?id=dash-two")
    assert d["turns"][0]["messages"][0]["text"] == f"explain {TRICKY}"
    assert d["turns"][0]["next_state"]["messages"][0]["text"] == TRICKY
    assert d["turns"][0]["judgment"]["hint"] == TRICKY and d["client"] == TRICKY


def test_one_console_line_per_request(live):
    lines = [request_line(turns) for turns in live.recorded[:5]]
    assert all(" chat session " in x and " tokens " in x and " v" in x for x in lines)
    assert sum("session dash-one user alice turn " in x for x in lines) == 3
    assert lines[0].split()[-2:] in (["ok", "length"], ["ok", "stop"])
    # a streamed call with two choices is one line, when the call ends
    before = len(live.recorded)
    stream = live.client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3, n=2,
        stream=True, extra_headers={"X-Session-Id": "dash-stream"},
    )  # fmt: skip
    list(stream)
    assert wait_for(lambda: len(live.recorded) > before, 10)
    time.sleep(0.3)
    (turns,) = live.recorded[before:]
    assert len(turns) == 2 and " x2 " in request_line(turns)


@pytest.fixture
def keyed_app(tmp_path, tokenizer):
    store = Store(tmp_path / "k.db")
    app = create_app(ScriptedEngine(tokenizer), tokenizer, store, model_name="m", api_key="sekret")
    mount_dashboard(app, DashboardSource(store, title="keyed"))
    yield app
    store.close()


def test_the_api_key_guards_the_dashboard_with_a_browser_prompt(keyed_app):
    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=keyed_app),
                                     base_url="http://t") as c:  # fmt: skip
            no = await c.get("/dashboard")
            assert no.status_code == 401
            assert no.headers["www-authenticate"].startswith("Basic")
            bad = base64.b64encode(b"me:wrong").decode()
            assert (await c.get("/dashboard/api/overview",
                                headers={"Authorization": f"Basic {bad}"})).status_code == 401  # fmt: skip
            good = base64.b64encode(b"anyone:sekret").decode()
            ok = await c.get("/dashboard/api/overview", headers={"Authorization": f"Basic {good}"})
            assert ok.status_code == 200 and ok.json()["title"] == "keyed"
            assert (await c.get("/dashboard", headers={"Authorization": "Bearer sekret"})).status_code == 200  # fmt: skip
            # Basic auth is for the dashboard only: the API keeps its bearer challenge
            api = await c.get("/v1/models", headers={"Authorization": f"Basic {good}"})
            assert api.status_code == 401 and api.headers["www-authenticate"] == "Bearer"
            junk = await c.get("/dashboard", headers={"Authorization": "Basic %%%"})
            assert junk.status_code == 401

    import anyio

    anyio.run(go)


def test_every_untrainable_reason_has_words():
    from clawrl.dashboard.data import UNTRAINABLE_WORDS
    from clawrl.store import UntrainableReason

    assert set(UNTRAINABLE_WORDS) == set(UntrainableReason)


def test_metrics_rows_without_a_step_or_with_nan_are_no_500(tmp_path):
    from clawrl.dashboard.data import thin

    store = Store(tmp_path / "m.db")
    out = tmp_path / "out"
    out.mkdir()
    (out / "metrics.jsonl").write_text(
        '{"step": 1, "time": 1.0, "loss": NaN, "policy/version": 1}\n'
        '{"time": 2.0, "loss": 1.0}\n'
        "not json\n"
        '{"step": 2, "time": 3.0, "loss": 0.5, "policy/version": 2}\n'
        '{"step": 3, "loss": 0.2'  # being written: not a whole line yet
    )
    source = DashboardSource(store, output_dir=out, read_only=True)
    rows = source.metrics()
    assert [r["step"] for r in rows] == [1, 2] and rows[0]["loss"] is None
    import json

    json.dumps(source.overview(), allow_nan=False)
    assert source.training()["curves"]["loss"]["points"] == [[2, 0.5]]
    with (out / "metrics.jsonl").open("a") as f:
        f.write(', "policy/version": 3}\n')
    source._cache.clear()
    assert [r["step"] for r in source.metrics()] == [1, 2, 3]
    assert source.overview()["policy_version"] == 3
    pts = [[i, float(i)] for i in range(2000)]
    thinned = thin(pts, 500)
    assert len(thinned) == 500 and thinned[0] == [0, 0.0] and thinned[-1] == [1999, 1999.0]
    store.close()


@pytest.mark.parametrize("sid", ["dir/../x", "..", ".", "a%2Fb", "sp ace?#&"])
def test_any_session_id_opens(live, sid):
    """Ids the gateway accepts that a URL path segment could not carry (slashes, dot segments,
    escapes) travel as a query parameter."""
    live.client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2,
        extra_headers={"X-Session-Id": sid},
    )  # fmt: skip
    d = get(live, f"/api/session?{httpx.QueryParams({'id': sid})}")
    assert d["id"] == sid and len(d["turns"]) >= 1
    r = httpx.get(f"{live.url}/session", params={"id": sid})
    assert r.status_code == 200 and "data-session=" in r.text
    live.runtime.dashboard._cache.clear()  # views are reused for a second
    assert sid in [s["id"] for s in get(live, "/api/sessions?limit=500")["sessions"]]


def test_a_malformed_tool_call_in_the_store_is_shown_not_a_500(live):
    from clawrl.store import SessionSource, TurnRecord

    store = live.runtime.store
    store.get_or_create_session("odd-store", source=SessionSource.HEADER)
    store.record_turn(TurnRecord(
        session_id="odd-store", prompt_ids=[1, 2], completion_ids=[3], sampling_logprobs=[-1.0],
        request_messages=["hello", {"role": "assistant", "tool_calls": [{"function": "x"}, None]},
                          {"role": "user", "content": [1, {"type": "tool_use", "name": "t",
                                                              "input": {"q": 1}}]}],
        output={"content": "ok", "tool_calls": [{"function": None}, {"name": "f", "arguments": {"a": 1}}]},
        error_kind="EngineError", error_message="it broke",
    ))  # fmt: skip
    d = get(live, "/api/session?id=odd-store")
    (turn,) = d["turns"]
    assert turn["messages"][0] == {"role": "?", "text": '"hello"'}
    assert 't({"q": 1})' in turn["messages"][2]["text"]
    assert turn["output"]["tool_calls"][1] == 'f({"a": 1})'
    assert turn["error"] == "EngineError: it broke"


def test_without_a_judge_nothing_waits_for_one(tmp_path, tokenizer):
    from clawrl.config import load_config
    from clawrl.runtime import build_runtime

    runtime = build_runtime(load_config(None, []), policy=_tiny_policy(), store=tmp_path / "s.db")
    try:
        assert runtime.dashboard is not None and runtime.dashboard.judging is False
        assert runtime.dashboard.overview()["judge_backlog"] is None
    finally:
        runtime.close()


def _tiny_policy():
    from clawrl.models import tiny_policy

    return tiny_policy(seed=1, max_context=256)


def test_the_view_cache_stays_bounded(tmp_path):
    from clawrl.dashboard.data import CACHE_ENTRIES

    store = Store(tmp_path / "c.db")
    source = DashboardSource(store)
    for i in range(CACHE_ENTRIES * 3):
        source.sessions(f"q{i}", 10, 0)
    assert len(source._cache) <= CACHE_ENTRIES
    store.close()
