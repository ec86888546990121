"""vLLM request bodies, response parsing and start-up checks, without a server (no I/O).

What the real server does is checked in ``test_vllm_engine.py`` and the engine contract suite;
here every way a response can be malformed must be an :class:`EngineError`, never a shorter or
silently different record.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from clawrl.engine import FinishReason, SamplingParams
from clawrl.engine.vllm import protocol
from clawrl.engine.vllm.checks import check_logprobs_mode, local_probe_hash, probe_ids
from clawrl.errors import ContextLengthError, EngineError, EngineUnavailableError


def _chunk(**choice):
    return {"choices": [{"index": 0, "text": "", **choice}]}


def test_completion_body_is_in_ids_and_keeps_what_was_sampled():
    params = SamplingParams(max_tokens=9, temperature=0.0, top_k=0, seed=2**64 - 1,
                            stop=("END",), stop_token_ids=(7,), logprobs_top_k=3)  # fmt: skip
    body = protocol.completion_body("m", [1, 2, 3], params, 9, stream=True)
    assert body["prompt"] == [1, 2, 3] and body["return_token_ids"] is True
    assert body["temperature"] == 0.0 and body["top_k"] == 0 and body["logprobs"] == 3
    assert body["include_stop_str_in_output"] is True and body["stop"] == ["END"]
    assert body["stop_token_ids"] == [7] and body["seed"] == -1  # 2**64 - 1 as signed 64-bit
    assert body["return_tokens_as_token_ids"] is True and body["skip_special_tokens"] is False


def test_a_choice_is_parsed_in_ids_with_alternatives_by_id():
    payload = _chunk(
        text="Hi", token_ids=[5, 6], finish_reason="stop", stop_reason="END",
        prompt_token_ids=[1, 2],
        logprobs={"token_logprobs": [-0.5, -0.25],
                  "top_logprobs": [{"token_id:5": -0.5, "token_id:9": -1.5},
                                   {"token_id:6": -0.25}]},
    )  # fmt: skip
    c = protocol.parse_choice(payload, want_top=2)
    assert c.token_ids == [5, 6] and c.logprobs == [-0.5, -0.25]
    assert c.top_logprobs == [[(5, -0.5), (9, -1.5)], [(6, -0.25)]]
    assert c.finish_reason == FinishReason.STOP and c.stop_string == "END"
    assert c.prompt_token_ids == [1, 2]
    with pytest.raises(EngineUnavailableError, match="aborted"):  # never a (shorter) turn
        protocol.parse_choice(_chunk(finish_reason="abort"))


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        (_chunk(text="Hi", logprobs={"token_logprobs": [-1.0]}), "without its token ids"),
        (_chunk(token_ids=[1, 2], logprobs={"token_logprobs": [-1.0]}), "2 token ids with 1"),
        (_chunk(token_ids=[1], logprobs={"token_logprobs": [None]}), "not numbers <= 0"),
        (_chunk(token_ids=[1], logprobs={"token_logprobs": [0.5]}), "not numbers <= 0"),
        (_chunk(token_ids=["a"], logprobs={"token_logprobs": [-1.0]}), "not a list of ids"),
        ({"choices": [None]}, "exactly one choice"),
        (_chunk(token_ids=[1]), "1 token ids with 0"),
        ({"choices": []}, "exactly one choice"),
        (_chunk(token_ids=[], finish_reason="weird"), "unknown reason"),
    ],
)
def test_a_malformed_choice_is_an_engine_error(payload, match):
    with pytest.raises(EngineError, match=match):
        protocol.parse_choice(payload)


def test_alternatives_named_by_text_are_refused():
    payload = _chunk(token_ids=[5], logprobs={"token_logprobs": [-0.5],
                                              "top_logprobs": [{"Hi": -0.5}]})  # fmt: skip
    with pytest.raises(EngineError, match="by text"):
        protocol.parse_choice(payload, want_top=1)


def test_prompt_logprobs_are_read_at_the_target_positions():
    entries = [None, {"9": {"logprob": -3.0}}, {"4": {"logprob": -0.5}}, {"8": {"logprob": -2.0}}]
    payload = {"choices": [{"prompt_logprobs": entries}]}
    assert protocol.parse_prompt_logprobs(payload, 2, [4, 8]) == [-0.5, -2.0]
    with pytest.raises(EngineError, match="lack token 7"):
        protocol.parse_prompt_logprobs(payload, 2, [7, 8])
    with pytest.raises(EngineError, match="no prompt log-probs"):
        protocol.parse_prompt_logprobs(payload, 3, [4, 8])


def test_errors_map_to_clawrl_errors():
    body = json.dumps({"error": {"message": "This model's maximum context length is 2048"}})
    with pytest.raises(ContextLengthError):
        protocol.raise_for_error(400, body, 3000, 2048)
    with pytest.raises(EngineError, match="HTTP 404: The model `v9` does not exist"):
        protocol.raise_for_error(404, json.dumps({"error": {"message": "The model `v9` "
                                                            "does not exist"}}), 3, 2048)  # fmt: skip


def _server(logprob_at: dict[float, float]) -> httpx.AsyncClient:
    """A fake server whose top log-prob depends on the temperature as ``logprob_at`` says."""

    def handle(request: httpx.Request) -> httpx.Response:
        t = json.loads(request.content)["temperature"]
        lp = logprob_at[t]
        return httpx.Response(200, json={"choices": [{"logprobs": {
            "token_logprobs": [lp], "top_logprobs": [{"token_id:3": lp}]}}]})  # fmt: skip

    return httpx.AsyncClient(transport=httpx.MockTransport(handle))


def test_a_server_with_raw_logprobs_is_refused():
    async def go(table):
        async with _server(table) as client:
            await check_logprobs_mode(client, "http://x", "m", 1)

    asyncio.run(go({1.0: -0.7, 2.0: -1.1}))  # processed: depends on the temperature
    with pytest.raises(EngineError, match="--logprobs-mode processed_logprobs"):
        asyncio.run(go({1.0: -0.7, 2.0: -0.7}))  # raw
    with pytest.raises(EngineError, match="logits, not log-probs"):
        asyncio.run(go({1.0: 7.5, 2.0: 3.7}))  # processed_logits


def test_the_probe_hash_tells_tokenizers_apart(tokenizer, tmp_path):
    from transformers import AutoTokenizer

    ids = probe_ids(len(tokenizer))
    assert ids[0] == 0 and ids[-1] == len(tokenizer) - 1 and len(ids) == 256
    tokenizer.save_pretrained(str(tmp_path / "same"))
    same = AutoTokenizer.from_pretrained(str(tmp_path / "same"))
    assert local_probe_hash(same) == local_probe_hash(tokenizer)  # the same tokenizer reloaded
    other = AutoTokenizer.from_pretrained(str(tmp_path / "same"))
    other.add_tokens(["Hello,"])  # one more piece: "Hello, world!" splits differently
    assert local_probe_hash(other) != local_probe_hash(tokenizer)


@pytest.mark.parametrize(
    ("error", "raised"),
    [
        ({"message": "EngineCore encountered an issue", "code": 500}, EngineUnavailableError),
        ({"message": "bad request", "code": 400}, EngineError),
        ({"message": "no code"}, EngineError),
        ("a bare string", EngineError),
    ],
)
def test_an_error_event_in_a_stream_maps_by_its_code(error, raised):
    with pytest.raises(raised, match="vLLM stream error") as info:
        protocol.raise_stream_error(error)
    if raised is EngineError:  # not the subclass: a 4xx is not worth a retry
        assert not isinstance(info.value, EngineUnavailableError)
