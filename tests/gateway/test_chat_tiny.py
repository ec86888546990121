"""The OpenAI SDK against a live gateway on the real engine with the tiny random model."""

from __future__ import annotations

import json

import httpx
import pytest

from clawrl.store import TurnStatus

MSG = [{"role": "user", "content": "Say something."}]


def _turn(served, response):
    turn_ids = response.headers["x-clawrl-turn-ids"].split(",")
    return [served.store.get_turn(t) for t in turn_ids]


def test_plain_chat_records_exact_turn(tiny_server):
    raw = tiny_server.client().chat.completions.with_raw_response.create(
        model="tiny", messages=MSG, max_tokens=8, temperature=1.0, seed=1
    )
    r = raw.parse()
    (turn,) = _turn(tiny_server, raw)
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens == len(turn.prompt_ids)
    assert r.usage.completion_tokens == len(turn.completion_ids) == len(turn.sampling_logprobs)
    assert turn.status == TurnStatus.OK and turn.trainable
    assert turn.session_id == raw.headers["x-clawrl-session-id"]
    assert turn.sampling_params["max_tokens"] == 8 and turn.sampling_params["seed"] == 1
    assert turn.client["user_agent"].startswith("OpenAI/Python")
    assert turn.client["api_key_fingerprint"].startswith("sha256:")
    assert "test-key" not in json.dumps(turn.client)
    assert turn.latency_s is not None and turn.ttft_s is not None
    assert turn.ttft_s <= turn.latency_s


def test_streaming_sends_a_chunk_per_sampled_token(tiny_server):
    client = tiny_server.client()
    raw = client.chat.completions.with_raw_response.create(
        model="tiny", messages=MSG, max_tokens=12, stream=True, logprobs=True, temperature=1.0
    )
    chunks = list(raw.parse())
    (turn,) = _turn(tiny_server, raw)
    assert chunks[0].choices[0].delta.role == "assistant"
    token_chunks = [c for c in chunks if c.choices and c.choices[0].logprobs is not None]
    streamed = [e.logprob for c in token_chunks for e in c.choices[0].logprobs.content]
    assert len(token_chunks) == len(turn.completion_ids)
    assert streamed == turn.sampling_logprobs  # floats round-trip exactly through JSON
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip() == (turn.output["content"] or "")


@pytest.mark.parametrize("top", ["absent", None, 0])
def test_logprobs_with_top_logprobs_absent_null_or_zero(tiny_server, top):
    body = {"model": "tiny", "messages": MSG, "max_tokens": 6, "logprobs": True}
    if top != "absent":
        body["top_logprobs"] = top
    r = httpx.post(f"{tiny_server.url}/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    data = r.json()
    entries = data["choices"][0]["logprobs"]["content"]
    assert len(entries) == data["usage"]["completion_tokens"]
    assert all(e["top_logprobs"] == [] for e in entries)
    assert all(isinstance(e["logprob"], float) and e["logprob"] <= 0 for e in entries)


def test_top_logprobs_gives_alternatives(tiny_server):
    r = tiny_server.client().chat.completions.create(
        model="tiny", messages=MSG, max_tokens=5, logprobs=True, top_logprobs=3
    )
    for entry in r.choices[0].logprobs.content:
        assert len(entry.top_logprobs) == 3
        assert entry.logprob <= entry.top_logprobs[0].logprob + 1e-9


def test_include_usage_last_chunk_then_done(tiny_server):
    body = {
        "model": "tiny",
        "messages": MSG,
        "max_tokens": 6,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.stream("POST", f"{tiny_server.url}/v1/chat/completions", json=body, timeout=30) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        data = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    last = json.loads(data[-2])
    assert last["choices"] == []
    usage = last["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert usage["completion_tokens"] >= 1
    assert all(json.loads(d)["usage"] is None for d in data[:-2])


def test_n_choices_are_sampled_concurrently_and_recorded_each(tiny_server):
    raw = tiny_server.client().chat.completions.with_raw_response.create(
        model="tiny", messages=MSG, max_tokens=6, n=3, temperature=1.0, seed=7
    )
    r = raw.parse()
    turns = _turn(tiny_server, raw)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert [t.choice_index for t in turns] == [0, 1, 2]
    assert len({tuple(t.prompt_ids) for t in turns}) == 1
    assert len({t.session_id for t in turns}) == 1
    assert [t.sampling_params["seed"] for t in turns] == [7, 8, 9]
    assert r.usage.completion_tokens == sum(len(t.completion_ids) for t in turns)


def test_streamed_n_choices(tiny_server):
    chunks = list(
        tiny_server.client().chat.completions.create(
            model="tiny", messages=MSG, max_tokens=4, n=2, stream=True
        )
    )
    finished = {c.choices[0].index for c in chunks if c.choices and c.choices[0].finish_reason}
    assert finished == {0, 1}


def test_same_seed_same_completion(tiny_server):
    client = tiny_server.client()
    kw = {"model": "tiny", "messages": MSG, "max_tokens": 8, "temperature": 1.0, "seed": 42}
    a = client.chat.completions.create(**kw).choices[0].message.content
    b = client.chat.completions.create(**kw).choices[0].message.content
    assert a == b


def test_max_tokens_and_max_completion_tokens(tiny_server):
    client = tiny_server.client()
    r = client.chat.completions.create(
        model="tiny", messages=MSG, max_tokens=5, temperature=1.0, seed=3
    )
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 5
    r = client.chat.completions.create(
        model="tiny", messages=MSG, max_completion_tokens=3, temperature=1.0, seed=3
    )
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 3


def test_models_and_healthz(tiny_server, monkeypatch):
    models = tiny_server.client().models.list()
    assert [m.id for m in models.data] == ["tiny"]
    health = httpx.get(f"{tiny_server.url}/healthz").json()
    assert health == {"status": "ok", "model": "tiny", "policy_version": 0}
    r = httpx.get(f"{tiny_server.url}/v1/models/other")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    # an engine that can serve nothing (vLLM replicas down): the protocol's `available` fact
    monkeypatch.setattr(type(tiny_server.engine), "available", property(lambda self: False))
    down = httpx.get(f"{tiny_server.url}/healthz")
    monkeypatch.undo()
    assert down.status_code == 503 and down.json()["status"] == "unavailable"


def test_metrics_exposition(tiny_server):
    client = tiny_server.client()
    client.chat.completions.create(model="tiny", messages=MSG, max_tokens=3)
    bad = httpx.post(f"{tiny_server.url}/v1/chat/completions", json={"model": "tiny", "n": 0})
    assert bad.status_code == 400
    text = httpx.get(f"{tiny_server.url}/metrics").text
    lines = text.splitlines()

    def value(prefix: str) -> float:
        return sum(float(x.rsplit(" ", 1)[1]) for x in lines if x.startswith(prefix))

    assert value('clawrl_gateway_requests_total{route="/v1/chat/completions",status="200"}') >= 1
    assert value('clawrl_gateway_requests_total{route="/v1/chat/completions",status="400"}') >= 1
    assert value('clawrl_gateway_errors_total{kind="validation"}') >= 1
    assert value("clawrl_gateway_prompt_tokens_total") > 0
    assert value("clawrl_gateway_completion_tokens_total") >= 3
    assert value('clawrl_gateway_turns_recorded_total{status="ok"}') >= 1
    assert value('clawrl_gateway_request_latency_seconds_count{route="/v1/chat/completions"}') >= 2
    assert value("clawrl_gateway_ttft_seconds_count") >= 1
    assert "clawrl_engine_queue_depth 0" in lines
    assert "# TYPE clawrl_gateway_request_latency_seconds histogram" in lines
