"""The httpx chat client's URLs and errors, and judge-versus-simulator agreement."""

from __future__ import annotations

import asyncio
import re
import time

import pytest

from clawrl.envs import (
    Assessment,
    ChatClient,
    ChatEndpointError,
    SessionLog,
    TurnLog,
    judge_agreement,
)
from clawrl.envs.client import api_root


def test_api_root_and_session_urls():
    assert api_root("http://h:1/v1/") == api_root("http://h:1") == "http://h:1"
    assert api_root("https://h/proxy/v1") == "https://h/proxy"
    c = ChatClient("http://h:1/v1")
    assert c.chat_url() == "http://h:1/v1/chat/completions"
    assert c.chat_url("a b/c") == "http://h:1/s/a%20b%2Fc/v1/chat/completions"
    asyncio.run(c.aclose())
    with pytest.raises(ValueError):
        api_root("h:1")


def test_errors_are_clear(fake_openai):
    def reply(body):
        if body["model"] == "slow":
            time.sleep(0.5)
        if body["model"] == "bad":
            return 400, "messages[0].role is invalid"
        return "hi"

    server = fake_openai(reply)

    async def go(model, **kw):
        async with ChatClient(server.url, api_key="k", **kw) as c:
            return await c.complete([{"role": "user", "content": "x"}], model=model)

    ok = asyncio.run(go("m"))
    assert ok.content == "hi" and ok.turn_ids and ok.policy_version == 3
    assert server.requests[0].headers["authorization"] == "Bearer k"
    with pytest.raises(
        ChatEndpointError, match=re.escape("HTTP 400: messages[0].role is invalid")
    ) as e:
        asyncio.run(go("bad"))
    assert e.value.status == 400
    with pytest.raises(ChatEndpointError, match=re.escape("no answer within 0.1 s")):
        asyncio.run(go("slow", timeout_s=0.1))

    async def end_unknown():
        async with ChatClient(server.url) as c:
            await c.end_session("never-seen")

    with pytest.raises(ChatEndpointError, match="HTTP 404: no such session"):
        asyncio.run(end_unknown())


def _log(rewards: list[int | None]) -> SessionLog:
    log = SessionLog("s", "p", "student", "rule")
    for i, r in enumerate(rewards):
        a = Assessment(reward=r, score=None if r is None else (1.0 if r == 1 else 0.5))
        log.turns.append(TurnLog(i, "u", "a", "stop", f"t{i}", 0, a, "reply", 0.1))
    log.turns.append(TurnLog(len(rewards), "u", "a", "stop", "closing", 0, None, None, 0.1))
    return log


def test_judge_agreement_counts():
    logs = [_log([-1, -1, 1]), _log([None])]
    judge = {"t0": -1.0, "t1": 0.33, "t2": 0, "closing": 1}
    a = judge_agreement(logs, judge)
    # the two logs share turn ids t0: the second's truth is unknown and skipped
    assert (a.compared, a.agreed, a.judge_neutral, a.missing) == (2, 1, 1, 0)
    assert a.rate == 0.5
    assert a.confusion == {"truth=-1,judge=-1": 1, "truth=-1,judge=+1": 1, "truth=+1,judge=0": 1}
    empty = judge_agreement([_log([1])], {})
    assert empty.missing == 1 and empty.rate is None and empty.to_dict()["rate"] is None
