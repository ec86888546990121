"""Sessions created with a sampling seed (harness rollouts) have every unseeded call seeded."""

from __future__ import annotations

import uuid

import httpx

from clawrl.gateway.seeding import SESSION_SEED_KEY, call_seed, session_seed
from clawrl.store import SessionSource

MSG = [{"role": "user", "content": "Say something."}]


def _session(served, seed: int | None) -> str:
    sid = uuid.uuid4().hex
    meta = {} if seed is None else {SESSION_SEED_KEY: seed}
    served.store.get_or_create_session(sid, SessionSource.HARNESS, metadata=meta)
    return sid


def _chat(served, sid: str, path: str = "v1/chat/completions", headers=None, **body):
    if path == "v1/chat/completions" or path == "v1/messages":
        body = {"max_tokens": 12, **body}
    r = httpx.post(
        f"{served.url}/s/{sid}/{path}",
        json={"model": "tiny", "temperature": 1.0, **body},
        headers={"authorization": "Bearer k", **(headers or {})},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    (turn_id,) = r.headers["x-clawrl-turn-ids"].split(",")
    return served.store.get_turn(turn_id)


def test_a_seeded_session_samples_the_same_answer_and_records_its_seed(tiny_server):
    a = _chat(tiny_server, _session(tiny_server, 7), messages=MSG)
    b = _chat(tiny_server, _session(tiny_server, 7), messages=MSG)
    assert a.sampling_params["seed"] == call_seed(7, a.prompt_ids, 0, 0)
    assert a.completion_ids == b.completion_ids and a.sampling_params == b.sampling_params
    other = _chat(tiny_server, _session(tiny_server, 8), messages=MSG)
    assert other.sampling_params["seed"] != a.sampling_params["seed"]
    # the Anthropic route is seeded the same way
    msg = _chat(tiny_server, _session(tiny_server, 7), path="v1/messages", messages=MSG)
    assert msg.sampling_params["seed"] == call_seed(7, msg.prompt_ids, 0, 0)


def test_a_prompt_asked_again_gets_a_fresh_seed(tiny_server):
    sid = _session(tiny_server, 7)
    first = _chat(tiny_server, sid, messages=MSG)
    # a retry (with or without the SDK's header) or a harness asking again: the next attempt
    again = _chat(tiny_server, sid, messages=MSG, headers={"x-stainless-retry-count": "1"})
    third = _chat(tiny_server, sid, messages=MSG)
    assert first.prompt_ids == again.prompt_ids == third.prompt_ids
    assert [t.sampling_params["seed"] for t in (first, again, third)] == [
        call_seed(7, first.prompt_ids, attempt, 0) for attempt in range(3)
    ]
    # n choices of one call: one seed each
    r = httpx.post(
        f"{tiny_server.url}/s/{_session(tiny_server, 7)}/v1/chat/completions",
        json={"model": "tiny", "max_tokens": 4, "messages": MSG, "n": 2},
        headers={"authorization": "Bearer k"},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    a, b = (tiny_server.store.get_turn(t) for t in r.headers["x-clawrl-turn-ids"].split(","))
    assert [a.sampling_params["seed"], b.sampling_params["seed"]] == [
        call_seed(7, a.prompt_ids, 0, 0), call_seed(7, a.prompt_ids, 0, 1)
    ]  # fmt: skip


def test_streaming_and_responses_calls_are_seeded(tiny_server):
    sid = _session(tiny_server, 7)
    with httpx.stream(
        "POST", f"{tiny_server.url}/s/{sid}/v1/chat/completions",
        json={"model": "tiny", "max_tokens": 4, "messages": MSG, "stream": True},
        headers={"authorization": "Bearer k"}, timeout=60,
    ) as r:  # fmt: skip
        assert r.status_code == 200
        r.read()
        (turn_id,) = r.headers["x-clawrl-turn-ids"].split(",")
    streamed = tiny_server.store.get_turn(turn_id)
    assert streamed.sampling_params["seed"] == call_seed(7, streamed.prompt_ids, 0, 0)
    resp = _chat(tiny_server, _session(tiny_server, 7), path="v1/responses",
                 input="Say something.", max_output_tokens=16)  # fmt: skip
    assert resp.sampling_params["seed"] == call_seed(7, resp.prompt_ids, 0, 0)


def test_a_clients_own_seed_or_an_unseeded_session(tiny_server):
    own = _chat(tiny_server, _session(tiny_server, 7), messages=MSG, seed=123)
    assert own.sampling_params["seed"] == 123
    plain = _chat(tiny_server, _session(tiny_server, None), messages=MSG)
    assert plain.sampling_params["seed"] is None


def test_only_an_integer_is_a_session_seed():
    assert session_seed({SESSION_SEED_KEY: 5}) == 5
    for value in (True, "5", 5.0, None):
        assert session_seed({SESSION_SEED_KEY: value}) is None
    assert session_seed(None) is None and session_seed({}) is None
