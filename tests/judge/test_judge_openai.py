"""OpenAI-compatible backend: requests, retries with backoff, failures as abstentions."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from clawrl.errors import JudgeError
from clawrl.judge import AbstainReason, Judge, NoJudgmentReason, Score
from clawrl.judge.backends import OpenAIBackend


def reply(content, finish="stop"):
    body = {"choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                         "finish_reason": finish}]}  # fmt: skip
    return httpx.Response(200, json=body)


def backend(handler, **kw):
    kw.setdefault("backoff_s", 0.0)
    return OpenAIBackend(
        "http://judge.test/v1/", "judge-model", transport=httpx.MockTransport(handler), **kw
    )


def test_request_shape_key_and_votes(monkeypatch, mk_input):
    monkeypatch.setenv("TEST_JUDGE_KEY", "sk-test")
    seen = []

    def handler(request: httpx.Request):
        seen.append(request)
        body = json.loads(request.content)
        return reply("Reason: ok.\nScore: +1" if body["seed"] != 1 else "Score: -1")

    b = backend(handler, api_key_env="TEST_JUDGE_KEY", base_seed=0, temperature=0.7)
    j = asyncio.run(Judge(b, votes=3).judge(mk_input()))
    assert j.score == Score.GOOD and [int(v.score) for v in j.votes] == [1, -1, 1]
    assert len(seen) == 3
    r = seen[0]
    assert str(r.url) == "http://judge.test/v1/chat/completions"
    assert r.headers["authorization"] == "Bearer sk-test"
    body = json.loads(r.content)
    assert body["model"] == "judge-model" and body["temperature"] == 0.7
    assert body["messages"][0]["role"] == "system" and "Score:" in body["messages"][0]["content"]
    assert "What is 2+2?" in body["messages"][1]["content"]
    assert sorted(json.loads(x.content)["seed"] for x in seen) == [0, 1, 2]
    asyncio.run(b.aclose())


def test_missing_key_variable_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("NO_SUCH_JUDGE_KEY", raising=False)
    with pytest.raises(JudgeError, match="NO_SUCH_JUDGE_KEY"):
        OpenAIBackend("http://x/v1", "m", api_key_env="NO_SUCH_JUDGE_KEY")


def test_retries_on_503_then_succeeds(mk_input):
    attempts = []

    def handler(request):
        attempts.append(1)
        if len(attempts) < 3:
            return httpx.Response(503, text="busy")
        return reply("Score: 0")

    j = asyncio.run(Judge(backend(handler, max_retries=2), votes=1).judge(mk_input()))
    assert len(attempts) == 3 and j.score == Score.NEUTRAL


def test_retries_are_bounded_with_backoff(mk_input):
    attempts = []

    def handler(request):
        attempts.append(time.perf_counter())
        raise httpx.ReadTimeout("slow", request=request)

    b = backend(handler, max_retries=2, backoff_s=0.05)
    j = asyncio.run(Judge(b, votes=1).judge(mk_input()))
    assert len(attempts) == 3  # first try + 2 retries, then give up
    assert attempts[1] - attempts[0] >= 0.05 and attempts[2] - attempts[1] >= 0.1
    assert j.score is None and j.no_judgment_reason == NoJudgmentReason.ALL_ABSTAINED
    v = j.votes[0]
    assert v.abstain_reason == AbstainReason.BACKEND_ERROR
    assert v.detail == "timeout after 30.0s (3 attempts)"


def test_client_error_is_not_retried(mk_input):
    attempts = []

    def handler(request):
        attempts.append(1)
        return httpx.Response(401, json={"error": {"message": "bad key"}})

    j = asyncio.run(Judge(backend(handler, max_retries=3), votes=1).judge(mk_input()))
    assert len(attempts) == 1
    assert j.votes[0].abstain_reason == AbstainReason.BACKEND_ERROR
    assert "HTTP 401" in (j.votes[0].detail or "")


def test_malformed_reply_is_an_abstention(mk_input):
    j = asyncio.run(
        Judge(backend(lambda r: httpx.Response(200, json={"x": 1})), votes=1).judge(mk_input())
    )
    assert j.votes[0].abstain_reason == AbstainReason.BACKEND_ERROR
    assert "unexpected reply" in (j.votes[0].detail or "")


def test_hanging_endpoint_is_cut_by_the_judge_timeout(mk_input):
    async def handler(request):
        await asyncio.sleep(3600)  # only the judge's timeout ends the test
        return reply("Score: +1")

    j = asyncio.run(Judge(backend(handler), votes=3, timeout_s=0.3).judge(mk_input()))
    assert j.score is None and j.no_judgment_reason == NoJudgmentReason.TIMEOUT
