"""OpenAI's rule for ``max_tokens`` (issue 38): a request whose prompt fits but not with the
completion budget it sets gets 400 ``context_length_exceeded`` in its own protocol's shape before
anything is generated (chat completions, Anthropic Messages, Responses, streamed or not), and is
recorded as an error turn; a budget the request leaves out is capped at what fits;
``sampling.max_tokens_beyond_context = "clamp"`` generates what fits instead."""

from __future__ import annotations

import httpx
import openai
import pytest

from clawrl.config import SamplingConfig
from clawrl.engine.scripted import ScriptedEngine
from clawrl.store import TurnStatus

from .conftest import serve

WINDOW = 64
HI = [{"role": "user", "content": "Hi"}]


@pytest.fixture
def gateway(tokenizer, tmp_path):
    made = []

    def make(mode: str = "refuse"):
        engine = ScriptedEngine(tokenizer, ["word " * 100] * 4, max_context=WINDOW)
        defaults = SamplingConfig.model_validate({"max_tokens_beyond_context": mode})
        ctx = serve(engine, tokenizer, tmp_path / f"{mode}{len(made)}.db", defaults=defaults)
        made.append(ctx)
        return ctx.__enter__()

    yield make
    for ctx in made:
        ctx.__exit__(None, None, None)


def _prompt_len(served) -> int:
    (turn,) = served.turns()
    return len(turn.prompt_ids)


@pytest.mark.parametrize("stream", [False, True])
def test_chat_max_tokens_beyond_the_context_is_400_before_generating(gateway, stream):
    served = gateway()
    with pytest.raises(openai.BadRequestError) as info:
        r = served.client().chat.completions.create(model="tiny", messages=HI, max_tokens=1000,
                                                    stream=stream)  # fmt: skip
        list(r) if stream else None
    assert info.value.code == "context_length_exceeded"
    assert info.value.param == "max_tokens"
    n = _prompt_len(served)
    assert f"maximum context length is {WINDOW} tokens" in info.value.message
    assert f"requested {n + 1000} tokens ({n} in the messages, 1000 in the completion)" in (
        info.value.message
    )
    (turn,) = served.turns()
    assert turn.status == TurnStatus.ERROR and not turn.trainable
    assert turn.error_kind == "context_length_exceeded" and turn.completion_ids == []
    assert served.engine.prompts == []  # nothing was generated


def test_a_budget_that_fits_or_is_left_out_is_served(gateway):
    served = gateway()
    client = served.client()
    r = client.chat.completions.create(model="tiny", messages=HI, max_tokens=5)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 5
    r = client.chat.completions.create(model="tiny", messages=HI)  # default 256: capped
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens + r.usage.completion_tokens == WINDOW
    # both fields: the smaller is the budget (here it fits)
    r = client.chat.completions.create(model="tiny", messages=HI, max_tokens=5,
                                       max_completion_tokens=900)  # fmt: skip
    assert r.usage.completion_tokens == 5


def test_anthropic_and_responses_get_it_in_their_own_shape(gateway):
    served = gateway()
    base = served.server.base_url.removesuffix("/v1")
    r = httpx.post(f"{base}/v1/messages", json={"model": "tiny", "max_tokens": 32000,
                   "messages": HI}, headers={"anthropic-version": "2023-06-01"})  # fmt: skip
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    n = _prompt_len(served)
    assert body["error"]["message"].startswith(
        f"input length and `max_tokens` exceed context limit: {n} + 32000 > {WINDOW}"
    )
    r = httpx.post(f"{base}/v1/responses", json={"model": "tiny", "input": "Hi",
                                                 "max_output_tokens": 1000})  # fmt: skip
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded" and err["param"] == "max_output_tokens"
    assert served.engine.prompts == []


def test_clamp_generates_what_fits_and_records_it(gateway):
    served = gateway("clamp")
    r = served.client().chat.completions.create(model="tiny", messages=HI, max_tokens=1000)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens + r.usage.completion_tokens == WINDOW
    (turn,) = served.turns()
    assert turn.status == TurnStatus.OK
    assert turn.sampling_params["max_tokens_clamped_to"] == WINDOW - len(turn.prompt_ids)
