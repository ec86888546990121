"""Tools through the fallback tool format, tool_choice, and history tool-call normalisation.

A scripted engine answers with fixed texts (tokenized with the real tokenizer) so that the
OpenAI SDK, the gateway's rendering, parsing and recording are what is under test.
"""

from __future__ import annotations

import json

import httpx
import pytest

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
ASK = [{"role": "user", "content": "Weather in Paris?"}]
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


def _decoded_prompt(served, i=-1):
    return served.engine.tokenizer.decode(served.engine.prompts[i], skip_special_tokens=False)


def test_tool_call_through_fallback_format(scripted_server):
    served = scripted_server([CALL])
    r = served.client().chat.completions.create(model="tiny", messages=ASK, tools=TOOLS)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    prompt = _decoded_prompt(served)
    assert "<tools>" in prompt and '"name": "get_weather"' in prompt
    (turn,) = served.turns()
    assert turn.prompt_ids == served.engine.prompts[0]  # exactly what the engine received
    assert turn.completion_ids == served.engine.script_ids(CALL)  # exactly what it sampled
    assert turn.sampling_logprobs == [
        served.engine.logprob_at(k) for k in range(len(turn.completion_ids))
    ]
    assert turn.output["tool_calls"] == [
        {"id": call.id, "name": "get_weather", "arguments": {"city": "Paris"}}
    ]
    assert turn.finish_reason == "tool_calls"
    assert turn.tools == TOOLS


def test_streamed_tool_call(scripted_server):
    served = scripted_server(["Let me check.\n" + CALL])
    chunks = list(
        served.client().chat.completions.create(
            model="tiny", messages=ASK, tools=TOOLS, stream=True
        )
    )
    content = "".join(c.choices[0].delta.content or "" for c in chunks)
    calls = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert content == "Let me check."
    assert len(calls) == 1 and calls[0].index == 0
    assert calls[0].function.name == "get_weather"
    assert json.loads(calls[0].function.arguments) == {"city": "Paris"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert "<tool_call>" not in content


def test_tool_choice_none_offers_no_tools_and_parses_none(scripted_server):
    served = scripted_server([CALL])
    r = served.client().chat.completions.create(
        model="tiny", messages=ASK, tools=TOOLS, tool_choice="none"
    )
    assert "<tools>" not in _decoded_prompt(served)
    assert r.choices[0].message.tool_calls is None
    assert r.choices[0].message.content == CALL
    assert r.choices[0].finish_reason == "stop"


def test_tool_choice_required_prefills_the_call_opening(scripted_server, tokenizer):
    served = scripted_server(['{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>'])
    r = served.client().chat.completions.create(
        model="tiny", messages=ASK, tools=TOOLS, tool_choice="required"
    )
    prompt = served.engine.prompts[-1]
    opening = tokenizer.encode("<tool_call>", add_special_tokens=False)
    assert prompt[-len(opening) :] == opening
    (call,) = r.choices[0].message.tool_calls
    assert json.loads(call.function.arguments) == {"city": "Rome"}
    (turn,) = served.turns()
    assert turn.sampling_params["prefill_tokens"] == len(opening)
    assert "You must call at least one function" in _decoded_prompt(served)


def test_named_tool_choice_and_next_turn_extends_it_exactly(scripted_server):
    # tool_choice is part of the rendered system prompt, so both calls use the same one
    served = scripted_server(['{"city": "Oslo"}}</tool_call>', '{"city": "Bergen"}}</tool_call>'])
    client = served.client()
    named = {"type": "function", "function": {"name": "get_weather"}}
    r = client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, tool_choice=named)
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Oslo"}
    assert _decoded_prompt(served, 0).endswith('<tool_call>{"name": "get_weather", "arguments": ')
    history = [
        *ASK,
        r.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"},
    ]
    client.chat.completions.create(model="tiny", messages=history, tools=TOOLS, tool_choice=named)
    first, second = sorted(served.turns(), key=lambda t: t.created_at)
    assert second.session_id == first.session_id
    assert second.parent_turn_id == first.id
    seq = first.prompt_ids + first.completion_ids
    assert second.prompt_ids[: len(seq)] == seq


def _history(arguments, **call_extra):
    call = {"id": "call_1", "type": "function"}
    call["function"] = {
        "name": "get_weather",
        **({} if arguments is ... else {"arguments": arguments}),
    }
    return [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [{**call, **call_extra}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]


def _post(served, messages):
    return httpx.post(
        f"{served.url}/v1/chat/completions",
        json={"model": "tiny", "messages": messages, "tools": TOOLS},
        timeout=30,
    )


def test_arguments_json_string_and_object_give_identical_prompt_ids(scripted_server):
    served = scripted_server()
    a = _post(served, _history('{"city": "Paris", "days": 2}'))
    b = _post(served, _history({"city": "Paris", "days": 2}))
    assert a.status_code == b.status_code == 200
    assert served.engine.prompts[0] == served.engine.prompts[1]


@pytest.mark.parametrize(
    "arguments",
    ['["Paris"]', '"Paris"', '{"city": "Par', "Paris", ["Paris"]],
    ids=["json-list", "json-string", "broken-json", "not-json", "list-object"],
)
def test_bad_arguments_are_400_naming_the_message(scripted_server, arguments):
    served = scripted_server()
    r = _post(served, _history(arguments))
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error"
    assert err["param"] == "messages[1].tool_calls[0].function.arguments"
    assert "message 1" in err["message"]
    assert served.engine.prompts == [] and served.turns() == []


def test_empty_string_arguments_normalise_to_empty_object(scripted_server):
    served = scripted_server()
    a = _post(served, _history(""))
    b = _post(served, _history("{}"))
    c = _post(served, _history(...))  # no "arguments" key
    assert a.status_code == b.status_code == c.status_code == 200
    assert served.engine.prompts[0] == served.engine.prompts[1] == served.engine.prompts[2]


@pytest.mark.parametrize("form", ["empty-list", "null", "missing"])
def test_assistant_tool_calls_empty_null_or_missing_same_ids(scripted_server, form):
    served = scripted_server()
    reference = {"role": "assistant", "content": "Hi there."}
    variant = dict(reference)
    if form == "empty-list":
        variant["tool_calls"] = []
    elif form == "null":
        variant["tool_calls"] = None
    follow = {"role": "user", "content": "And now?"}
    a = _post(served, [*ASK, reference, follow])
    b = _post(served, [*ASK, variant, follow])
    assert a.status_code == b.status_code == 200
    assert served.engine.prompts[0] == served.engine.prompts[1]
