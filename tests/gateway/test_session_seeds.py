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
    r = httpx.post(
        f"{served.url}/s/{sid}/{path}",
        json={"model": "tiny", "max_tokens": 12, "temperature": 1.0, **body},
        headers={"authorization": "Bearer k", **(headers or {})},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    (turn_id,) = r.headers["x-clawrl-turn-ids"].split(",")
    return served.store.get_turn(turn_id)


def test_a_seeded_session_samples_the_same_answer_and_records_its_seed(tiny_server):
    a = _chat(tiny_server, _session(tiny_server, 7), messages=MSG)
    b = _chat(tiny_server, _session(tiny_server, 7), messages=MSG)
    assert a.sampling_params["seed"] == call_seed(7, a.prompt_ids, None, 0)
    assert a.completion_ids == b.completion_ids and a.sampling_params == b.sampling_params
    other = _chat(tiny_server, _session(tiny_server, 8), messages=MSG)
    assert other.sampling_params["seed"] != a.sampling_params["seed"]
    # the Anthropic route is seeded the same way
    msg = _chat(tiny_server, _session(tiny_server, 7), path="v1/messages", messages=MSG)
    assert msg.sampling_params["seed"] == call_seed(7, msg.prompt_ids, None, 0)


def test_a_retry_or_a_clients_own_seed_or_an_unseeded_session(tiny_server):
    sid = _session(tiny_server, 7)
    retried = _chat(tiny_server, sid, messages=MSG, headers={"x-stainless-retry-count": "1"})
    assert retried.sampling_params["seed"] == call_seed(7, retried.prompt_ids, 1, 0)
    own = _chat(tiny_server, _session(tiny_server, 7), messages=MSG, seed=123)
    assert own.sampling_params["seed"] == 123
    plain = _chat(tiny_server, _session(tiny_server, None), messages=MSG)
    assert plain.sampling_params["seed"] is None


def test_only_an_integer_is_a_session_seed():
    assert session_seed({SESSION_SEED_KEY: 5}) == 5
    for value in (True, "5", 5.0, None):
        assert session_seed({SESSION_SEED_KEY: value}) is None
    assert session_seed(None) is None and session_seed({}) is None
