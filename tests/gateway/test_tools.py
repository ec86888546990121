"""Tools through the fallback tool format and the model's native formats, tool_choice, and
history tool-call normalisation.

A scripted engine answers with fixed texts (tokenized with the real tokenizer) so that the
OpenAI SDK, the gateway's rendering, parsing and recording are what is under test.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import json
from pathlib import Path

import httpx
import pytest

from clawrl.engine.scripted import ScriptedEngine

from .conftest import Served, serve

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


# --- native tool formats: the policy's own chat template (real templates, see tests/chat) ------

TEMPLATES = {
    "llama3_1": Path(next(iter(importlib.util.find_spec("trl").submodule_search_locations or [])))
    / "chat_templates"
    / "llama3_1.jinja",
    "mistral_nemo": Path(__file__).parents[1] / "chat" / "templates"
    / "mistral_nemo_instruct_2407.jinja",
}  # fmt: skip
LLAMA_CALL = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
MISTRAL_CALL = '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]'


@pytest.fixture
def native_server(tokenizer, tmp_path):
    """Factory: ``native_server(template_name, replies)``, a scripted policy whose tokenizer has
    that model's real chat template."""
    stack = contextlib.ExitStack()

    def make(name, replies) -> Served:
        if not TEMPLATES[name].exists():
            pytest.skip(f"{TEMPLATES[name]} is not installed")
        tok = copy.deepcopy(tokenizer)
        tok.chat_template = TEMPLATES[name].read_text()
        engine = ScriptedEngine(tok, replies)
        path = tmp_path / f"n{len(stack._exit_callbacks)}.db"
        return stack.enter_context(serve(engine, tok, path))

    with stack:
        yield make


@pytest.mark.parametrize(("name", "reply"), [("llama3_1", LLAMA_CALL),
                                             ("mistral_nemo", MISTRAL_CALL)])  # fmt: skip
def test_native_tool_call_through_the_models_own_format(native_server, name, reply):
    served = native_server(name, [reply, reply])
    client = served.client()
    r = client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    prompt = _decoded_prompt(served)
    assert "<tools>" not in prompt  # the template's own tool section, not the fallback's
    assert ("Environment: ipython" if name == "llama3_1" else "[AVAILABLE_TOOLS]") in prompt
    (turn,) = served.turns()
    assert turn.output["tool_calls"] == [
        {"id": call.id, "name": "get_weather", "arguments": {"city": "Paris"}}
    ]
    chunks = list(
        client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS, stream=True)
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == ""
    calls = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert len(calls) == 1 and calls[0].function.name == "get_weather"
    assert json.loads(calls[0].function.arguments) == {"city": "Paris"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_llama_tool_round_trip_renders_natively(native_server):
    served = native_server("llama3_1", [LLAMA_CALL, 'It is sunny: {"temp": 21}.'])
    client = served.client()
    r = client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS)
    (call,) = r.choices[0].message.tool_calls
    history = [
        *ASK,
        r.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"},
    ]
    r2 = client.chat.completions.create(model="tiny", messages=history, tools=TOOLS)
    assert r2.choices[0].message.tool_calls is None  # an answer that contains JSON is content
    assert r2.choices[0].message.content == 'It is sunny: {"temp": 21}.'
    assert r2.choices[0].finish_reason == "stop"
    assert (
        f"{LLAMA_CALL}<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n\n"
        '"sunny, 21 C"<|eot_id|>'
    ) in _decoded_prompt(served)
