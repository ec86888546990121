"""Errors in OpenAI's shape with the right status, auth, unsupported fields, error turns."""

from __future__ import annotations

import httpx
import openai
import pytest

from clawrl.cli import main
from clawrl.cli.serve import check_bind, resolve_api_key
from clawrl.errors import ConfigError, EngineError
from clawrl.store import TurnStatus

HI = [{"role": "user", "content": "Hi"}]


def _chat(served, body=None, content=None, headers=None):
    kw = {"json": body} if content is None else {"content": content}
    return httpx.post(f"{served.url}/v1/chat/completions", headers=headers or {}, timeout=30, **kw)


def _error(r, status):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["message"]
    return err


def test_api_key_required(scripted_server):
    served = scripted_server(api_key="s3cret")
    err = _error(_chat(served, {"model": "tiny", "messages": HI}), 401)
    assert err["type"] == "authentication_error" and err["code"] == "invalid_api_key"
    _error(
        _chat(served, {"model": "tiny", "messages": HI}, headers={"Authorization": "Bearer no"}),
        401,
    )
    # malformed bodies are refused for lack of a key before anything is parsed
    _error(_chat(served, content=b"{not json", headers={"Content-Type": "application/json"}), 401)
    ok = _chat(
        served, {"model": "tiny", "messages": HI}, headers={"Authorization": "Bearer s3cret"}
    )
    assert ok.status_code == 200
    ok = _chat(served, {"model": "tiny", "messages": HI}, headers={"x-api-key": "s3cret"})
    assert ok.status_code == 200
    assert httpx.get(f"{served.url}/healthz").status_code == 200
    assert httpx.get(f"{served.url}/metrics").status_code == 401
    with pytest.raises(openai.AuthenticationError):
        served.client(api_key="wrong").chat.completions.create(model="tiny", messages=HI)
    assert served.client(api_key="s3cret").models.list().data[0].id == "tiny"
    assert len(served.turns()) == 2


def test_non_loopback_bind_needs_an_api_key(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("CLAWRL_API_KEY", raising=False)
    rc = main(["serve", "--host", "0.0.0.0", "--store", str(tmp_path / "s.db")])
    assert rc == 1
    assert "without an API key" in capsys.readouterr().err
    assert not (tmp_path / "s.db").exists()
    with pytest.raises(ConfigError):
        check_bind("192.168.1.7", None)
    check_bind("0.0.0.0", "key")
    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
        check_bind(host, None)
    monkeypatch.setenv("CLAWRL_API_KEY", "from-env")
    assert resolve_api_key(None, None) == "from-env"
    assert resolve_api_key("flag", "cfg") == "flag"


@pytest.mark.parametrize(
    ("content", "code"),
    [(b'{"model": "tiny", "messages": [', "invalid_json"), (b"", "invalid_value")],
    ids=["truncated", "empty"],
)
def test_malformed_body_is_400(scripted_server, content, code):
    served = scripted_server()
    err = _error(_chat(served, content=content, headers={"Content-Type": "application/json"}), 400)
    assert err["type"] == "invalid_request_error" and err["code"] == code


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "tiny", "messages": HI, "n": 0}, "n"),
        ({"model": "tiny", "messages": HI, "temperature": "hot"}, "temperature"),
        ({"model": "tiny", "messages": HI, "top_p": 0}, "top_p"),
        ({"model": "tiny", "messages": HI, "max_tokens": 0}, "max_tokens"),
        ({"model": "tiny"}, "messages"),
        ({"model": "tiny", "messages": []}, "messages"),
        ({"model": "tiny", "messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ({"model": "tiny", "messages": HI, "tool_choice": "required"}, "tool_choice"),
        ({"model": "tiny", "messages": HI, "top_logprobs": 2}, "top_logprobs"),
        # booleans are JSON booleans: "yes" or 1 is a client bug, not a request to stream
        ({"model": "tiny", "messages": HI, "stream": "yes"}, "stream"),
        ({"model": "tiny", "messages": HI, "stream": 1}, "stream"),
        ({"model": "tiny", "messages": HI, "logprobs": "true"}, "logprobs"),
    ],
)
def test_validation_errors_are_400_with_param(scripted_server, body, param):
    served = scripted_server()
    err = _error(_chat(served, body), 400)
    assert err["type"] == "invalid_request_error"
    assert err["param"] == param
    assert served.turns() == []


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "response_format",
        ),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"frequency_penalty": 0.5}, "frequency_penalty"),
        ({"logit_bias": {"42": 5}}, "logit_bias"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"modalities": ["text", "audio"]}, "modalities"),
    ],
)
def test_unsupported_fields_are_400(scripted_server, extra, param):
    served = scripted_server()
    err = _error(_chat(served, {"model": "tiny", "messages": HI, **extra}), 400)
    assert err["code"] == "unsupported_parameter" and err["param"] == param
    with pytest.raises(openai.BadRequestError):
        served.client().chat.completions.create(model="tiny", messages=HI, **extra)


def test_neutral_and_unknown_fields_are_accepted_and_reported(scripted_server):
    served = scripted_server()
    body = {
        "model": "tiny",
        "messages": HI,
        "response_format": {"type": "text"},
        "frequency_penalty": 0,
        "store": False,
        "vendor_knob": 3,
    }
    r = _chat(served, body)
    assert r.status_code == 200
    assert r.headers["x-clawrl-ignored-fields"] == "vendor_knob"
    (turn,) = served.turns()
    assert turn.sampling_params["ignored_fields"] == ["vendor_knob"]


def test_unknown_route_is_404_in_openai_shape(scripted_server):
    served = scripted_server()
    err = _error(httpx.get(f"{served.url}/v1/nothing"), 404)
    assert err["code"] == "not_found"


def test_prompt_too_long_is_400_and_an_error_turn(scripted_server):
    served = scripted_server(max_context=64)
    with pytest.raises(openai.BadRequestError) as info:
        served.client().chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "word " * 200}]
        )
    assert info.value.code == "context_length_exceeded"
    (turn,) = served.turns()
    assert turn.status == TurnStatus.ERROR and not turn.trainable
    assert turn.error_kind == "context_length_exceeded"
    assert turn.completion_ids == [] and len(turn.prompt_ids) >= 64
    assert served.engine.prompts == []


def test_engine_failure_is_500_an_error_turn_and_the_retry_is_a_sibling(scripted_server):
    served = scripted_server([EngineError("GPU on fire"), "Recovered."])
    client = served.client()
    with pytest.raises(openai.InternalServerError) as info:
        client.chat.completions.create(model="tiny", messages=HI)
    assert info.value.body["type"] == "server_error"
    (failed,) = served.turns()
    assert failed.status == TurnStatus.ERROR and failed.error_kind == "engine"
    assert "GPU on fire" in failed.error_message
    # the SDK's own retry (x-stainless-retry-count: 1) is the failed call's sibling
    served = scripted_server([EngineError("GPU on fire"), "Recovered."])
    retrying = openai.OpenAI(base_url=served.server.base_url, api_key="k", max_retries=1)
    r = retrying.chat.completions.create(model="tiny", messages=HI)
    assert r.choices[0].message.content == "Recovered."
    failed, ok = sorted(served.turns(), key=lambda t: t.created_at)
    assert failed.status == TurnStatus.ERROR and ok.status == TurnStatus.OK
    assert ok.session_id == failed.session_id and ok.prompt_ids == failed.prompt_ids
    assert ok.parent_turn_id == failed.parent_turn_id is None


def test_engine_failure_mid_stream_sends_an_error_event_and_records_it(scripted_server):
    served = scripted_server(["one two three four five six"], fail_after_tokens=3)
    with pytest.raises(openai.APIError) as info:
        list(served.client().chat.completions.create(model="tiny", messages=HI, stream=True))
    assert "scripted failure" in info.value.message
    (turn,) = served.turns()
    assert turn.status == TurnStatus.ERROR and not turn.trainable
    assert len(turn.completion_ids) == 3 and turn.error_kind == "engine"
