"""Inputs from public bug reports of serving stacks, sent through the real gateway (tiny model):
each gets a 4xx in its protocol's shape or a correct answer, and never a trainable record the
client did not get or a record whose log-probs are of another distribution."""

from __future__ import annotations

import json
import math

import httpx
import pytest

from clawrl.store import TurnStatus

CHAT = [{"role": "user", "content": "hi"}]


def _post(served, path, body, **kw):
    return httpx.post(f"{served.url}{path}", json=body, timeout=60, **kw)


@pytest.mark.parametrize("sampling", [{"top_k": 1}, {"top_p": 0.01}, {"top_p": 0.5}])
def test_top_logprobs_under_truncated_sampling_are_finite_json(tiny_server, sampling):
    body = {"model": "tiny", "messages": CHAT, "max_tokens": 4, "temperature": 1.0,
            "logprobs": True, "top_logprobs": 5, **sampling}  # fmt: skip
    r = _post(tiny_server, "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    entries = r.json()["choices"][0]["logprobs"]["content"]
    values = [t["logprob"] for e in entries for t in e["top_logprobs"]] + [
        e["logprob"] for e in entries
    ]
    assert all(math.isfinite(v) for v in values) and min(values) >= -9999.0
    turn = tiny_server.store.get_turn(r.headers["x-clawrl-turn-ids"])
    assert turn.status == TurnStatus.OK and not turn.trainable
    assert turn.untrainable_reason == "truncated_sampling"
    # streamed: every chunk is valid JSON (no bare -Infinity)
    with httpx.stream("POST", f"{tiny_server.url}/v1/chat/completions",
                      json={**body, "stream": True}, timeout=60) as s:  # fmt: skip
        lines = [x for x in s.iter_lines() if x.startswith("data: {")]
    assert lines
    for line in lines:
        json.loads(line[6:])  # raises on -Infinity / NaN
        assert "Infinity" not in line and "NaN" not in line


def test_a_tiny_temperature_is_greedy(tiny_server):
    body = {"model": "tiny", "messages": CHAT, "max_tokens": 4, "temperature": 1e-40}
    r = _post(tiny_server, "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    greedy = _post(tiny_server, "/v1/chat/completions", {**body, "temperature": 0})
    assert r.json()["choices"][0]["message"] == greedy.json()["choices"][0]["message"]


@pytest.mark.parametrize("seed", [2**70, -(2**70)])
def test_a_seed_out_of_range_is_a_400(tiny_server, seed):
    r = _post(
        tiny_server, "/v1/chat/completions", {"model": "tiny", "messages": CHAT, "seed": seed}
    )
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "seed"


def test_the_largest_seed_works(tiny_server):
    body = {"model": "tiny", "messages": CHAT, "max_tokens": 3, "seed": 2**63 - 1, "n": 2}
    assert _post(tiny_server, "/v1/chat/completions", body).status_code == 200


SURROGATE = '{"model": "tiny", "max_tokens": 4, %s}'


@pytest.mark.parametrize(
    ("path", "fields", "shape"),
    [
        (
            "/v1/chat/completions",
            '"messages": [{"role": "user", "content": "a\\ud800b"}]',
            "openai",
        ),
        ("/v1/messages", '"messages": [{"role": "user", "content": "a\\ud800b"}]', "anthropic"),
        ("/v1/responses", '"input": "a\\ud800b"', "openai"),
    ],
)
def test_a_lone_surrogate_is_a_400_in_the_protocols_shape(tiny_server, path, fields, shape):
    before = len(tiny_server.turns())
    r = httpx.post(f"{tiny_server.url}{path}", content=SURROGATE % fields,
                   headers={"content-type": "application/json"}, timeout=60)  # fmt: skip
    assert r.status_code == 400, r.text
    body = r.json()
    if shape == "anthropic":
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    else:
        assert body["error"]["code"] == "invalid_unicode"
    assert len(tiny_server.turns()) == before  # nothing recorded


def test_an_orphan_tool_result_is_a_400(tiny_server):
    body = {"model": "tiny", "max_tokens": 8, "messages": [
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": "42"}]}]}  # fmt: skip
    r = _post(tiny_server, "/v1/messages", body)
    assert r.status_code == 400
    assert "tool_use" in r.json()["error"]["message"]


def test_a_tool_call_inside_unclosed_reasoning_is_not_trained(scripted_server):
    call = '<think>need weather\n<tool_call>{"name": "weather", "arguments": {"city": "Oslo"}}</tool_call>'
    served = scripted_server([call])
    tools = [
        {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}
    ]
    r = _post(served, "/v1/chat/completions", {"model": "tiny", "messages": CHAT, "tools": tools})
    assert r.status_code == 200
    (turn,) = served.turns()
    assert not turn.trainable and turn.untrainable_reason == "unclosed_reasoning"


@pytest.mark.parametrize(
    ("path", "fields"),
    [
        ("/v1/chat/completions",
         '"messages": [{"role": "user", "content": "hi"}], "stop": ["a\\ud800"]'),
        ("/v1/chat/completions",
         '"messages": [{"role": "user", "content": "hi"}], "user": "u\\ud800"'),
        ("/v1/messages",
         '"messages": [{"role": "user", "content": "hi"}], "stop_sequences": ["\\udfff"]'),
        # any field, even one clawrl ignores, and a key (the second full fuzz run)
        ("/v1/chat/completions",
         '"messages": [{"role": "user", "content": "hi"}], "metadata": {"k\\ud800": "v"}'),
        ("/v1/responses", '"input": "hi", "unknown_field": ["\\udbff"]'),
    ],
)  # fmt: skip
def test_a_lone_surrogate_outside_the_messages_is_a_400_too(tiny_server, path, fields):
    # found by the full fuzz run: a surrogate in a stop string reached SQLite (500, and the
    # call generated first)
    before = len(tiny_server.turns())
    body = '{"model": "tiny", "max_tokens": 4, ' + fields + "}"
    r = httpx.post(f"{tiny_server.url}{path}", content=body,
                   headers={"content-type": "application/json"}, timeout=60)  # fmt: skip
    assert r.status_code == 400, r.text
    assert "invalid Unicode" in r.text
    assert len(tiny_server.turns()) == before
