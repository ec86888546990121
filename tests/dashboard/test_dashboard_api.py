"""The dashboard's JSON and pages against a live gateway that trained a step on real traffic."""

from __future__ import annotations

import base64

import httpx
import pytest

from clawrl.cli.serve import request_line
from clawrl.dashboard import DashboardSource, mount_dashboard
from clawrl.gateway import create_app
from clawrl.gateway.testing import ScriptedEngine
from clawrl.store import Store

from .conftest import HINT, TRICKY


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
    assert d["requests_per_s"] > 0 and d["tokens_per_s"] > 0
    assert d["judged"] >= 2 and d["trained"] >= 2
    assert d["last_step"]["step"] == d["step"] and "loss" in d["last_step"]
    # the last answer of each session has no next state: a judgment-less drop or backlog
    reasons = {x["reason"]: x for x in d["drops"]}
    for x in reasons.values():
        assert x["text"], x  # every reason is explained in words


def test_sessions_list_and_search(live):
    d = get(live, "/api/sessions")
    ids = [s["id"] for s in d["sessions"]]
    assert set(ids) == {"dash-one", "dash-two"}
    one = next(s for s in d["sessions"] if s["id"] == "dash-one")
    assert one["turns"] == 3 and one["trainable"] == 3 and one["attribution"] == "header"
    assert [s["id"] for s in get(live, "/api/sessions?q=TWO")["sessions"]] == ["dash-two"]
    assert get(live, "/api/sessions?q=no-such-thing")["sessions"] == []
    r = httpx.get(f"{live.url}/api/sessions", params={"q": "x" * 501})
    assert r.status_code == 400 and r.json()["error"]["param"] == "q"


def test_one_session_shows_next_state_judgment_hint_and_training(live):
    d = get(live, "/api/sessions/dash-one")
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
    r = httpx.get(f"{live.url}/api/sessions/nope")
    assert r.status_code == 404 and r.json()["error"]["code"] == "session_not_found"
    r = httpx.get(f"{live.url}/static/../../etc/passwd")
    assert r.status_code == 404
    r = httpx.get(f"{live.url}/static/secrets.txt")
    assert r.status_code == 404 and "error" in r.json()


def test_training_and_judge_views(live):
    d = get(live, "/api/training")
    assert d["steps"] >= 1 and d["curves"]["loss"]["points"][0][0] == 1
    assert d["demo"] is None and d["output_dir"].endswith("out")
    j = get(live, "/api/judge")
    assert j["distribution"]["-1"] >= 1 and j["distribution"]["+1"] >= 1
    assert j["hinted"] >= 1 and j["agreement"] is None
    assert j["recent"] and {"turn_id", "session_id", "score"} <= set(j["recent"][0])


def test_pages_are_html_shells_with_escaped_attributes(live):
    for path in ("", "/sessions", "/sessions/dash-one", "/training", "/judge"):
        r = httpx.get(f"{live.url}{path}")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        assert 'src="/dashboard/static/app.js"' in r.text
    r = httpx.get(f"{live.url}/sessions/%22%3E%3Cscript%3Ex%3C%5Cscript%3E")  # "><script>x<\script>
    assert r.status_code == 200 and "<script>x" not in r.text
    assert 'data-session="&quot;&gt;&lt;script&gt;x&lt;\\script&gt;"' in r.text
    for name, kind in (("app.js", "javascript"), ("style.css", "css")):
        r = httpx.get(f"{live.url}/static/{name}")
        assert r.status_code == 200 and kind in r.headers["content-type"] and len(r.text) > 1000


def test_tricky_text_reaches_the_json_verbatim(live):
    d = get(live, "/api/sessions/dash-two")
    assert d["turns"][0]["messages"][0]["text"] == f"explain {TRICKY}"
    assert d["turns"][0]["next_state"]["messages"][0]["text"] == TRICKY


def test_one_console_line_per_request(live):
    lines = [request_line(turns) for turns in live.recorded]
    assert len(lines) == 5
    assert all(" chat session " in x and " tokens " in x and " v" in x for x in lines)
    assert any("session dash-one turn " in x for x in lines)
    assert lines[0].split()[-2:] == ["ok", "length"] or lines[0].endswith(" ok stop")


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
