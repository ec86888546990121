"""OpenAI chat-completions messages/tools/tool_choice -> neutral types."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from clawrl.chat import (
    ChatMessage,
    ToolCall,
    ToolChoice,
    ToolSpec,
    normalize_openai_messages,
    normalize_openai_tools,
    normalize_tool_choice,
)
from clawrl.errors import ClientInputError

BASH = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a command",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
    },
}


def _call(arguments, call_id="call_1", name="bash"):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _history(arguments):
    """A conversation whose message 3 is an assistant tool call with the given arguments."""
    return [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "ok"},
        {"role": "assistant", "content": None, "tool_calls": [_call(arguments)]},
    ]


def test_content_forms():
    msgs = normalize_openai_messages(
        [
            {"role": "user", "content": "hi"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            },
            {"role": "user", "content": None},
            {"role": "user"},
            {"role": "user", "content": ""},
            {"role": "user", "content": []},
        ]
    )
    assert [m.content for m in msgs] == ["hi", "hi", "a\nb", None, None, None, None]
    assert all(m.role == "user" for m in msgs)


def test_developer_is_system_and_roles():
    msgs = normalize_openai_messages(
        [
            {"role": "developer", "content": "be brief"},
            {"role": "system", "content": "s"},
            {"role": "user", "content": "u"},
            {"role": "assistant", "content": "a"},
            {"role": "tool", "content": "t", "tool_call_id": "call_1", "name": "bash"},
        ]
    )
    assert [m.role for m in msgs] == ["system", "system", "user", "assistant", "tool"]
    assert msgs[0] == ChatMessage(role="system", content="be brief")
    assert msgs[4].tool_call_id == "call_1" and msgs[4].name == "bash"


@pytest.mark.parametrize("role", ["function", "bot", None, 3])
def test_unknown_role_is_400(role):
    with pytest.raises(ClientInputError) as e:
        normalize_openai_messages(
            [{"role": "user", "content": "x"}, {"role": role, "content": "y"}]
        )
    assert e.value.status == 400
    assert e.value.param == "messages[1].role"
    assert "message 1" in e.value.message


@pytest.mark.parametrize("raw", [None, [], {}, "hi", [1]])
def test_messages_must_be_nonempty_list_of_objects(raw):
    with pytest.raises(ClientInputError) as e:
        normalize_openai_messages(raw)
    assert e.value.param.startswith("messages")


@pytest.mark.parametrize(
    "part", [{"type": "image_url", "image_url": {"url": "data:x"}}, {"type": "input_audio"}]
)
def test_media_parts_are_400_with_index(part):
    raw = [
        {"role": "user", "content": "x"},
        {"role": "user", "content": [{"type": "text", "text": "look"}, part]},
    ]
    with pytest.raises(ClientInputError) as e:
        normalize_openai_messages(raw)
    assert e.value.status == 400
    assert e.value.param == "messages[1].content[1]"
    assert "message 1" in e.value.message and "text-only" in e.value.message


@pytest.mark.parametrize(
    "part", [{"type": "video"}, {"text": "no type"}, "bare", {"type": "text", "text": 3}]
)
def test_bad_parts_are_400(part):
    with pytest.raises(ClientInputError) as e:
        normalize_openai_messages([{"role": "user", "content": [part]}])
    assert e.value.param.startswith("messages[0].content[0]")


def test_content_of_wrong_type_is_400():
    with pytest.raises(ClientInputError) as e:
        normalize_openai_messages([{"role": "user", "content": 5}])
    assert e.value.param == "messages[0].content"


def test_tool_calls_empty_null_missing_identical():
    base = {"role": "assistant", "content": "done"}
    forms = [base, {**base, "tool_calls": None}, {**base, "tool_calls": []}]
    results = [normalize_openai_messages([{"role": "user", "content": "q"}, m]) for m in forms]
    assert results[0] == results[1] == results[2]
    assert results[0][1].tool_calls == []


def test_assistant_content_missing_empty_null_identical():
    call = [_call('{"cmd": "ls"}')]
    forms = [
        {"role": "assistant", "tool_calls": call},
        {"role": "assistant", "content": "", "tool_calls": call},
        {"role": "assistant", "content": None, "tool_calls": call},
    ]
    results = [normalize_openai_messages([m]) for m in forms]
    assert results[0] == results[1] == results[2]
    assert results[0][0].content is None


def test_string_and_object_arguments_identical():
    args = {"cmd": "ls -la", "nested": {"a": [1, 2, {"b": "é"}]}}
    as_string = normalize_openai_messages(_history(json.dumps(args)))
    as_object = normalize_openai_messages(_history(args))
    assert as_string == as_object
    assert as_string[3].tool_calls == [ToolCall(id="call_1", name="bash", arguments=args)]


@pytest.mark.parametrize("arguments", ["", "   ", None])
def test_empty_arguments_normalise_to_empty_object(arguments):
    msgs = normalize_openai_messages(_history(arguments))
    assert msgs[3].tool_calls[0].arguments == {}


def test_missing_arguments_normalise_to_empty_object():
    call = {"id": "c", "type": "function", "function": {"name": "bash"}}
    msgs = normalize_openai_messages([{"role": "assistant", "tool_calls": [call]}])
    assert msgs[0].tool_calls[0].arguments == {}


@pytest.mark.parametrize(
    "arguments", ["[1, 2]", '"just a string"', "{broken", "42", "null", [1, 2], 42, "true"]
)
def test_bad_arguments_name_param_and_index(arguments):
    with pytest.raises(ClientInputError) as e:
        normalize_openai_messages(_history(arguments))
    assert e.value.status == 400
    assert e.value.param == "messages[3].tool_calls[0].function.arguments"
    assert "message 3" in e.value.message


def test_deeply_nested_arguments_are_400_not_crash():
    with pytest.raises(ClientInputError) as e:
        normalize_openai_messages(_history("[" * 100_000))
    assert e.value.param == "messages[3].tool_calls[0].function.arguments"


def test_tool_call_shape_errors():
    bad = [
        (
            {"id": "c", "type": "custom", "function": {"name": "x"}},
            "messages[0].tool_calls[0].type",
        ),
        ({"id": "c", "function": "x"}, "messages[0].tool_calls[0].function"),
        ({"id": "c", "function": {"name": ""}}, "messages[0].tool_calls[0].function.name"),
        ({"id": 5, "function": {"name": "x"}}, "messages[0].tool_calls[0].id"),
        ("nope", "messages[0].tool_calls[0]"),
    ]
    for call, param in bad:
        with pytest.raises(ClientInputError) as e:
            normalize_openai_messages([{"role": "assistant", "tool_calls": [call]}])
        assert e.value.param == param
    with pytest.raises(ClientInputError) as e:
        normalize_openai_messages([{"role": "assistant", "tool_calls": {"a": 1}}])
    assert e.value.param == "messages[0].tool_calls"


def test_tool_call_without_id_or_type_is_accepted():
    call = {"function": {"name": "bash", "arguments": "{}"}}
    msgs = normalize_openai_messages([{"role": "assistant", "tool_calls": [call]}])
    assert msgs[0].tool_calls == [ToolCall(id="", name="bash", arguments={})]


def test_tool_calls_only_on_assistant():
    with pytest.raises(ClientInputError) as e:
        normalize_openai_messages([{"role": "user", "content": "x", "tool_calls": [_call("{}")]}])
    assert e.value.param == "messages[0].tool_calls"


def test_tool_message_content_string_or_parts_identical():
    a = normalize_openai_messages([{"role": "tool", "tool_call_id": "c", "content": "out\nput"}])
    b = normalize_openai_messages(
        [
            {
                "role": "tool",
                "tool_call_id": "c",
                "content": [{"type": "text", "text": "out"}, {"type": "text", "text": "put"}],
            }
        ]
    )
    assert a == b


def test_reasoning_content_and_unknown_keys():
    msgs = normalize_openai_messages(
        [
            {"role": "assistant", "content": "a", "reasoning_content": "why", "refusal": None},
            {"role": "assistant", "content": "a", "reasoning": "why", "cache_control": {}},
        ]
    )
    assert msgs[0] == msgs[1] == ChatMessage(role="assistant", content="a", reasoning="why")
    with pytest.raises(ClientInputError) as e:
        normalize_openai_messages([{"role": "assistant", "reasoning_content": 3}])
    assert e.value.param == "messages[0].reasoning_content"


def test_normalize_tools_forms():
    flat = {"type": "function", "name": "bash", "description": "Run a command"}
    flat["parameters"] = BASH["function"]["parameters"]
    assert normalize_openai_tools([BASH]) == normalize_openai_tools([flat])
    assert normalize_openai_tools([BASH])[0] == ToolSpec(
        name="bash", description="Run a command", parameters=BASH["function"]["parameters"]
    )
    bare = normalize_openai_tools([{"type": "function", "function": {"name": "noop"}}])[0]
    assert bare.description == "" and bare.parameters == {"type": "object", "properties": {}}
    assert normalize_openai_tools(None) == []


@pytest.mark.parametrize(
    ("tools", "param"),
    [
        ("x", "tools"),
        ([{"type": "web_search"}], "tools[0].type"),
        ([{"type": "function", "function": {}}], "tools[0].function.name"),
        (
            [{"type": "function", "function": {"name": "a", "parameters": []}}],
            "tools[0].function.parameters",
        ),
        (
            [{"type": "function", "function": {"name": "a", "description": 1}}],
            "tools[0].function.description",
        ),
        ([BASH, BASH], "tools[1]"),
    ],
)
def test_normalize_tools_errors(tools, param):
    with pytest.raises(ClientInputError) as e:
        normalize_openai_tools(tools)
    assert e.value.param == param


def test_tool_choice():
    tools = normalize_openai_tools([BASH])
    assert normalize_tool_choice(None, tools) == ToolChoice(mode="auto")
    assert normalize_tool_choice(None) == ToolChoice(mode="none")
    assert normalize_tool_choice("none", tools).mode == "none"
    assert normalize_tool_choice("required", tools).mode == "required"
    named = {"type": "function", "function": {"name": "bash"}}
    assert normalize_tool_choice(named, tools) == ToolChoice(mode="function", name="bash")
    assert normalize_tool_choice({"type": "function", "name": "bash"}, tools).name == "bash"


@pytest.mark.parametrize(
    ("raw", "with_tools", "param"),
    [
        ("required", False, "tool_choice"),
        ({"type": "function", "function": {"name": "bash"}}, False, "tool_choice"),
        ({"type": "function", "function": {"name": "other"}}, True, "tool_choice.function.name"),
        ({"type": "function", "function": {}}, True, "tool_choice.function.name"),
        ("any", True, "tool_choice"),
        (3, True, "tool_choice"),
    ],
)
def test_tool_choice_errors(raw, with_tools, param):
    tools = normalize_openai_tools([BASH]) if with_tools else []
    with pytest.raises(ClientInputError) as e:
        normalize_tool_choice(raw, tools)
    assert e.value.param == param


def test_type_invariants():
    with pytest.raises(ValidationError):
        ToolChoice(mode="function")
    with pytest.raises(ValidationError):
        ToolChoice(mode="auto", name="x")
    with pytest.raises(ValidationError):
        ChatMessage(role="user", content="x", tool_calls=[ToolCall(name="f")])
    with pytest.raises(ValidationError):
        ChatMessage(role="developer", content="x")
