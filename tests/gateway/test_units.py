"""Unit tests of the gateway's pure parts: text assembly, splicing, attribution, metrics."""

from __future__ import annotations

import pytest
from starlette.datastructures import Headers

from clawrl.chat import ChatMessage, render_prompt
from clawrl.errors import ClientInputError
from clawrl.gateway.attribution import explicit_session
from clawrl.gateway.decode import TextAssembler, visible_text
from clawrl.gateway.metrics import Metrics
from clawrl.gateway.splice import generation_prompt_ids, splice_history
from clawrl.store import SessionSource, TurnRecord


def _stream(tokenizer, ids, stops):
    asm = TextAssembler(tokenizer, {tokenizer.eos_token_id}, stops)
    deltas = [asm.push(t, last=k == len(ids) - 1) for k, t in enumerate(ids)]
    return deltas, asm


@pytest.mark.parametrize("stops", [(), ("world",), ("lo w", "xyz"), ("never",)])
def test_streamed_text_equals_whole_text(tokenizer, stops):
    ids = [*tokenizer.encode("Hello world, héllo wörld 🙂!", add_special_tokens=False), 2]
    deltas, asm = _stream(tokenizer, ids, stops)
    whole, stop = visible_text(tokenizer, ids, {tokenizer.eos_token_id}, stops)
    assert "".join(deltas) == whole == asm.text
    assert stop == asm.stop_string
    assert "<|im_end|>" not in whole
    assert all("\ufffd" not in d for d in deltas)


def test_stop_string_is_never_streamed(tokenizer):
    ids = tokenizer.encode("abc STOP def", add_special_tokens=False)
    deltas, asm = _stream(tokenizer, ids, ("STOP",))
    assert "".join(deltas) == "abc " and asm.stop_string == "STOP"
    # nothing of a possible stop string leaks before it is decided
    released = ""
    for d in deltas:
        released += d
        assert "ST" not in released


def test_splice_uses_recorded_ids_only_when_text_is_identical(tokenizer):
    text = "Hello world"
    odd = [i for ch in text for i in tokenizer.encode(ch, add_special_tokens=False)]
    history = [
        ChatMessage(role="user", content="Hi"),
        ChatMessage(role="assistant", content=text),
        ChatMessage(role="user", content="Go on"),
    ]
    rendered = render_prompt(tokenizer, history)
    gen = generation_prompt_ids(tokenizer)
    assert gen == tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False)

    def turn(completion):
        return TurnRecord(session_id="s", prompt_ids=[1], completion_ids=completion)

    stopped = turn([*odd, tokenizer.eos_token_id])  # finished with EOS
    out = splice_history(tokenizer, history, rendered, lambda h: [stopped])
    assert out.spliced == [(1, stopped.id)]
    assert tokenizer.decode(out.token_ids) == tokenizer.decode(rendered.token_ids)
    start = rendered.message_spans[1][0] + len(gen)
    assert out.token_ids[start : start + len(odd) + 1] == stopped.completion_ids

    truncated = turn(odd)  # finish_reason length: no EOS, the template closes the turn
    out = splice_history(tokenizer, history, rendered, lambda h: [truncated])
    assert out.spliced == [(1, truncated.id)]
    assert out.token_ids[start : start + len(odd)] == odd

    other = turn([*tokenizer.encode("Hello world!", add_special_tokens=False), 2])
    out = splice_history(tokenizer, history, rendered, lambda h: [other])
    assert out.spliced == [] and out.token_ids == rendered.token_ids


def test_explicit_session_order():
    h = Headers({"X-SESSION-ID": "hdr", "session-id": "codex"})
    assert explicit_session("url", h, "body").source == SessionSource.URL
    got = explicit_session(None, h, "body", {"session_id": "meta"}, "user")
    assert (got.session_id, got.detail) == ("hdr", "header:x-session-id")
    got = explicit_session(None, Headers({}), None, {"session_id": 12}, "u")
    assert (got.session_id, got.detail) == ("12", "body:metadata.session_id")
    assert explicit_session(None, Headers({}), "  ", None, None) is None
    with pytest.raises(ClientInputError):
        explicit_session(None, Headers({}), {"not": "a string"})
    with pytest.raises(ClientInputError):
        explicit_session(None, Headers({"x-session-id": "x" * 300}))


def test_metrics_text_format():
    m = Metrics()
    m.inc("clawrl_gateway_errors_total", kind='we"ird')
    m.observe("clawrl_gateway_ttft_seconds", 0.2)
    m.observe("clawrl_gateway_ttft_seconds", 3.0)
    text = m.render()
    assert 'clawrl_gateway_errors_total{kind="we\\"ird"} 1' in text
    assert 'clawrl_gateway_ttft_seconds_bucket{le="0.25"} 1' in text
    assert 'clawrl_gateway_ttft_seconds_bucket{le="+Inf"} 2' in text
    assert "clawrl_gateway_ttft_seconds_count 2" in text
    assert "clawrl_gateway_ttft_seconds_sum 3.2" in text
    with pytest.raises(KeyError):
        m.inc("undeclared_total")
