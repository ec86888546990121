"""Anthropic Messages and Responses requests -> neutral chat messages (no server)."""

from __future__ import annotations

import pytest

from clawrl.chat import ChatMessage, ToolCall, ToolChoice
from clawrl.chat.anthropic_messages import normalize_anthropic_request
from clawrl.chat.responses_items import ToolOrigin, normalize_responses_request
from clawrl.errors import ClientInputError

BASH = {"name": "Bash", "description": "Run", "input_schema": {"type": "object"}}


def test_anthropic_system_blocks_billing_header_and_inner_system_role():
    conv = normalize_anthropic_request(
        [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1; cch=1;"},
            {"type": "text", "text": "You are Claude.", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "Be brief."},
        ],
        [
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {"role": "system", "content": [{"type": "text", "text": "# Environment"}]},
        ],
    )
    assert conv.messages == [
        ChatMessage(role="system", content="You are Claude.\nBe brief."),
        ChatMessage(role="user", content="hi"),
        ChatMessage(role="system", content="# Environment"),
    ]
    assert conv.notes == ["dropped:billing_header"]
    assert conv.tool_choice == ToolChoice(mode="none")


def test_anthropic_tool_use_results_in_block_order_and_names_without_id_echo():
    conv = normalize_anthropic_request(
        "sys",
        [
            {"role": "user", "content": "go"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "plan", "signature": "sig"},
                    {"type": "redacted_thinking", "data": "opaque"},
                    {"type": "text", "text": "Running."},
                    {"type": "tool_use", "id": "toolu_a_1", "name": "Bash", "input": {"c": 1}},
                    {"type": "tool_use", "id": "toolu_b_2", "name": "Read", "input": {}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "tooluA1", "content": "one"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_b_2",
                        "content": [{"type": "text", "text": "two"}],
                        "is_error": True,
                    },
                    {"type": "text", "text": "and then?"},
                ],
            },
        ],
        [BASH, {**BASH, "name": "Read"}, {"type": "web_search_20250305", "name": "web_search"}],
        {"type": "any", "disable_parallel_tool_use": True},
    )
    assert conv.messages[1:] == [
        ChatMessage(role="user", content="go"),
        ChatMessage(
            role="assistant",
            content="Running.",
            reasoning="plan",
            tool_calls=[
                ToolCall(id="toolu_a_1", name="Bash", arguments={"c": 1}),
                ToolCall(id="toolu_b_2", name="Read", arguments={}),
            ],
        ),
        # the first id came back without underscores: its name is found by position
        ChatMessage(role="tool", content="one", tool_call_id="tooluA1", name="Bash"),
        ChatMessage(role="tool", content="Error: two", tool_call_id="toolu_b_2", name="Read"),
        ChatMessage(role="user", content="and then?"),
    ]
    assert [t.name for t in conv.tools] == ["Bash", "Read"]
    assert conv.tool_choice == ToolChoice(mode="required")
    assert conv.parallel_tool_calls is False
    assert conv.notes == ["dropped:redacted_thinking", "ignored_tool:web_search_20250305"]


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        (
            [{"role": "user", "content": [{"type": "image", "source": {}}]}],
            "messages[0].content[0]",
        ),
        (
            [
                {"role": "user", "content": "look"},
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t", "name": "shot", "input": {}}],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "t",
                            "content": [{"type": "image", "source": {}}],
                        }
                    ],
                },
            ],
            "messages[2].content[0].content[0]",
        ),
    ],
)
def test_anthropic_images_are_refused_with_the_block_named(messages, param):
    with pytest.raises(ClientInputError) as e:
        normalize_anthropic_request(None, messages)
    assert e.value.param == param and e.value.code == "unsupported_content_type"


def test_anthropic_tool_choice_must_name_a_declared_tool():
    with pytest.raises(ClientInputError, match="not in tools"):
        normalize_anthropic_request(
            None, [{"role": "user", "content": "x"}], [BASH], {"type": "tool", "name": "Nope"}
        )


def test_responses_items_group_an_assistant_turn_and_flatten_namespaces():
    conv = normalize_responses_request(
        "Be terse.",
        [
            {
                "type": "message",
                "role": "developer",
                "content": [{"type": "input_text", "text": "d"}],
            },
            {"role": "user", "content": "go"},
            {"type": "reasoning", "summary": [], "encrypted_content": "gAAA"},
            {
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": "short"}],
                "content": [{"type": "reasoning_text", "text": "long"}],
            },
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Running."}],
            },
            {"type": "function_call", "call_id": "call_1", "name": "exec", "arguments": '{"c": 1}'},
            {
                "type": "custom_tool_call",
                "call_id": "call_2",
                "name": "patch",
                "input": "*** Begin",
            },
            {"type": "function_call_output", "call_id": "call1", "output": "ran"},
            {
                "type": "custom_tool_call_output",
                "call_id": "call_2",
                "output": [{"type": "input_text", "text": "patched"}],
            },
        ],
        [
            {"type": "function", "name": "exec", "parameters": {"type": "object"}},
            {"type": "custom", "name": "patch", "description": "Apply a patch."},
            {"type": "web_search", "external_web_access": False},
            {
                "type": "namespace",
                "name": "agents",
                "tools": [{"type": "function", "name": "spawn", "parameters": {}}],
            },
        ],
    )
    assert conv.messages == [
        ChatMessage(role="system", content="Be terse."),
        ChatMessage(role="system", content="d"),
        ChatMessage(role="user", content="go"),
        ChatMessage(
            role="assistant",
            content="Running.",
            reasoning="long",
            tool_calls=[
                ToolCall(id="call_1", name="exec", arguments={"c": 1}),
                ToolCall(id="call_2", name="patch", arguments={"input": "*** Begin"}),
            ],
        ),
        ChatMessage(role="tool", content="ran", tool_call_id="call1", name="exec"),
        ChatMessage(role="tool", content="patched", tool_call_id="call_2", name="patch"),
    ]
    assert [t.name for t in conv.tools] == ["exec", "patch", "spawn"]
    assert conv.tools[1].parameters["required"] == ["input"]
    assert conv.origins["spawn"] == ToolOrigin(namespace="agents")
    assert conv.origins["patch"] == ToolOrigin(kind="custom")
    assert conv.notes == ["ignored:encrypted_reasoning", "ignored_tool:web_search"]


def test_responses_media_parts_and_unknown_items_are_refused():
    with pytest.raises(ClientInputError) as e:
        normalize_responses_request(
            None, [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]
        )
    assert e.value.code == "unsupported_content_type" and e.value.param == "input[0].content[0]"
    with pytest.raises(ClientInputError, match="unsupported item type 'item_reference'"):
        normalize_responses_request(None, [{"type": "item_reference", "id": "msg_1"}])


def test_responses_string_input_is_one_user_message():
    conv = normalize_responses_request(None, "hello")
    assert conv.messages == [ChatMessage(role="user", content="hello")]
