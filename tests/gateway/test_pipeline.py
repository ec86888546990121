"""The one call pipeline: rules written once hold for chat completions too.

Subagent linking, failure recording of ``n`` choices, a response that cannot be built, and the
tokenizer check of ``create_app`` — each once through the chat route, the path that used to have
its own copy of these rules.
"""

from __future__ import annotations

import httpx
import pytest

from clawrl.engine.scripted import ScriptedEngine
from clawrl.errors import ConfigError, EngineError
from clawrl.gateway import create_app
from clawrl.store import Store, TurnStatus


def test_chat_subagent_is_linked_to_its_parent(scripted_server):
    served = scripted_server(["Spawning.", "Sub result."])
    client = served.client(default_headers={"x-claude-code-session-id": "main-s"})
    client.chat.completions.create(
        model="tiny", max_tokens=20, messages=[{"role": "user", "content": "Do the thing."}]
    )
    client.chat.completions.create(
        model="tiny",
        max_tokens=20,
        messages=[{"role": "user", "content": "Look around."}],
        extra_headers={
            "x-claude-code-agent-id": "agent-7",
            "x-claude-code-parent-agent-id": "main",
        },
    )
    main, sub = sorted(served.turns(), key=lambda t: t.created_at)
    assert sub.session_id == main.session_id == "main-s"
    assert sub.client["agent_id"] == "agent-7"
    assert sub.client["parent_agent_turn_id"] == main.id


def test_a_failed_choice_leaves_no_trainable_sibling(scripted_server):
    """n = 2, the second choice fails: the client gets an error, so neither choice may be stored
    as a trainable answer (the finished one is recorded incomplete)."""
    served = scripted_server(["First answer.", EngineError("boom")])
    r = httpx.post(
        f"{served.url}/v1/chat/completions",
        json={"model": "tiny", "n": 2, "messages": [{"role": "user", "content": "hi"}]},
    )
    assert r.status_code >= 500 and "error" in r.json()
    by_index = {t.choice_index: t for t in served.turns()}
    assert by_index[1].status == TurnStatus.ERROR and not by_index[1].trainable
    assert by_index[0].status == TurnStatus.INCOMPLETE and not by_index[0].trainable


def test_a_stream_that_fails_after_a_choice_finished_leaves_it_untrainable(scripted_server):
    """n = 2 streamed, the second choice fails mid-stream after the first finished: the stream
    ends with an error event (clients drop the call), so the finished one is not trainable."""
    served = scripted_server(["Done.", "A much longer second answer that fails."])
    served.engine.fail_after_tokens = 5
    with httpx.stream(
        "POST",
        f"{served.url}/v1/chat/completions",
        json={"model": "tiny", "n": 2, "stream": True,
              "messages": [{"role": "user", "content": "hi"}]},
    ) as r:  # fmt: skip
        body = r.read().decode()
    assert '"error"' in body and "[DONE]" not in body
    turns = served.turns()
    assert len(turns) == 2 and not any(t.trainable for t in turns)
    assert {t.status for t in turns} == {TurnStatus.ERROR, TurnStatus.INCOMPLETE}


def test_a_response_that_cannot_be_built_is_recorded_as_an_error(scripted_server, monkeypatch):
    from clawrl.gateway import routes_openai

    def broken(*args, **kwargs):
        raise ValueError("Out of range float values are not JSON compliant")

    monkeypatch.setattr(routes_openai, "_completion", broken)
    served = scripted_server(["An answer."])
    with pytest.raises(httpx.HTTPError):
        httpx.post(
            f"{served.url}/v1/chat/completions",
            json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
        ).raise_for_status()
    (turn,) = served.turns()
    assert turn.status == TurnStatus.ERROR and not turn.trainable


def test_create_app_refuses_an_engine_of_another_tokenizer(tokenizer, tmp_path):
    engine = ScriptedEngine(tokenizer)
    engine.tokenizer_id = "sha256:0000000000000000"
    with Store(tmp_path / "s.db") as store, pytest.raises(ConfigError, match="tokenizer"):
        create_app(engine, tokenizer, store, model_name="tiny")
