"""One record for three protocols; attribution and side-call rules shared by every route."""

from __future__ import annotations

import json

import pytest

from clawrl.chat import ChatMessage, ToolCall, assistant_message_text
from clawrl.gateway.attribution import explicit_session
from clawrl.gateway.ephemeral import drop_ephemeral
from clawrl.gateway.side_calls import side_kind_from_headers, side_kind_from_messages
from clawrl.store import ApiProtocol, SessionSource, TurnKind

ARGS = {"city": "Paris"}
CALL = assistant_message_text(
    ChatMessage(
        role="assistant", content="Checking.", tool_calls=[ToolCall(name="weather", arguments=ARGS)]
    )
)
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}}


def _without_ids(messages):
    """Stored messages less what differs by protocol and is never rendered: ids, and the tool
    name of a result (Anthropic and Responses results get the call's name; chat results have
    none)."""
    out = []
    for m in messages:
        m = {**m, "tool_call_id": None, "name": None}
        m["tool_calls"] = [{**c, "id": ""} for c in m["tool_calls"]]
        out.append(m)
    return out


def test_the_same_conversation_gives_the_same_turn_through_every_protocol(scripted):
    gw = scripted(["Sunny."] * 3)
    gw.openai().chat.completions.create(
        model="m",
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather?"},
            {
                "role": "assistant",
                "content": "Checking.",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "weather", "arguments": json.dumps(ARGS)},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        ],
        tools=[{"type": "function", "function": {"name": "weather", "parameters": SCHEMA}}],
    )
    gw.anthropic().messages.create(
        model="m",
        max_tokens=50,
        system="Be brief.",
        messages=[
            {"role": "user", "content": "Weather?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": ARGS},
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}],
            },
        ],
        tools=[{"name": "weather", "input_schema": SCHEMA}],
    )
    gw.openai().responses.create(
        model="m",
        instructions="Be brief.",
        input=[
            {"role": "user", "content": "Weather?"},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Checking."}],
            },
            {
                "type": "function_call",
                "call_id": "c1",
                "name": "weather",
                "arguments": json.dumps(ARGS),
            },
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        ],
        tools=[{"type": "function", "name": "weather", "parameters": SCHEMA}],
    )
    chat, messages, responses = gw.turns()
    assert [t.protocol for t in (chat, messages, responses)] == [
        ApiProtocol.OPENAI_CHAT,
        ApiProtocol.ANTHROPIC_MESSAGES,
        ApiProtocol.OPENAI_RESPONSES,
    ]
    assert chat.prompt_ids == messages.prompt_ids == responses.prompt_ids
    assert chat.tools == messages.tools == responses.tools
    assert (
        _without_ids(chat.request_messages)
        == _without_ids(messages.request_messages)
        == _without_ids(responses.request_messages)
    )
    assert chat.completion_ids == messages.completion_ids == responses.completion_ids
    # the same prompt after a *successful* call, without a retry mark, is another client
    # starting the same way: each opens its own session, and says which call it repeated
    assert len({chat.session_id, messages.session_id, responses.session_id}) == 3
    assert messages.client["attribution"] == responses.client["attribution"] == "inferred:new"
    assert messages.client["attribution_evidence"] == {"same_prompt_as": chat.id}


def test_openclaw_internal_context_is_left_out_so_turns_link(scripted):
    gw = scripted([CALL, "Sunny."])
    context = {
        "role": "user",
        "content": [
            {
                "type": "text",
                "text": "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>\nnone\n"
                "<<<END_OPENCLAW_INTERNAL_CONTEXT>>>",
            }
        ],
    }
    tools = [{"type": "function", "function": {"name": "weather", "parameters": SCHEMA}}]
    ask = [{"role": "system", "content": "OpenClaw."}, {"role": "user", "content": "Weather?"}]
    client = gw.openai()
    first = client.chat.completions.create(model="m", messages=[*ask, context], tools=tools)
    call = first.choices[0].message.tool_calls[0]
    history = [
        *ask,
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [{**call.model_dump(), "id": call.id.replace("_", "")}],
        },
        {"role": "tool", "tool_call_id": call.id.replace("_", ""), "content": "sunny"},
        context,
    ]
    client.chat.completions.create(model="m", messages=history, tools=tools)
    a, b = gw.turns()
    assert a.sampling_params["dropped_messages"] == ["dropped:openclaw_internal_context@2"]
    assert b.sampling_params["dropped_messages"] == ["dropped:openclaw_internal_context@4"]
    assert b.session_id == a.session_id and b.parent_turn_id == a.id
    assert b.prompt_ids[: len(a.seq_ids)] == a.seq_ids
    assert "OPENCLAW_INTERNAL" not in gw.engine.tokenizer.decode(b.prompt_ids)


def test_opencode_title_call_through_chat_completions_is_a_side_turn(scripted):
    gw = scripted(["Weather in Paris"])
    gw.openai().chat.completions.create(
        model="m",
        messages=[
            {
                "role": "system",
                "content": "You are a title generator. You output ONLY a thread title.",
            },
            {"role": "user", "content": "Weather in Paris?"},
        ],
        extra_headers={"x-session-id": "ses_1"},
    )
    (turn,) = gw.turns()
    assert (turn.kind, turn.side_kind, turn.session_id) == (TurnKind.SIDE, "title", "ses_1")


@pytest.mark.parametrize(
    ("headers", "metadata", "cache_key", "expected"),
    [
        (
            {"x-claude-code-session-id": "cc"},
            {"user_id": '{"session_id": "body"}'},
            None,
            ("cc", "header:x-claude-code-session-id"),
        ),
        (
            {},
            {"user_id": '{"device_id": "d", "session_id": "cc-body"}'},
            None,
            ("cc-body", "body:metadata.user_id"),
        ),
        ({}, {"user_id": "plain-user-id"}, None, None),
        ({"session-id": "codex-h"}, None, "codex-k", ("codex-h", "header:session-id")),
        ({}, None, "codex-k", ("codex-k", "body:prompt_cache_key")),
        ({"x-session-id": "ses_oc"}, None, None, ("ses_oc", "header:x-session-id")),
    ],
)
def test_explicit_session_sources(headers, metadata, cache_key, expected):
    found = explicit_session(None, headers, None, metadata, None, prompt_cache_key=cache_key)
    if expected is None:
        assert found is None
    else:
        assert (found.session_id, found.detail) == expected
        assert found.source in (SessionSource.HEADER, SessionSource.BODY)


def test_side_call_rules_are_conservative():
    def msgs(system, user):
        return [ChatMessage(role="system", content=system), ChatMessage(role="user", content=user)]

    assert side_kind_from_messages(msgs("You are Claude.", "Fix the bug.")) is None
    assert side_kind_from_messages(msgs("x", "Please summarize this file.")) is None
    claude_compact = (
        "CRITICAL: Respond with TEXT ONLY. Do NOT call any tools.\n\nYour task is to create a "
        "detailed summary of the conversation so far, paying"
    )
    assert side_kind_from_messages(msgs("x", claude_compact)) == "compaction"
    codex_compact = "You are performing a CONTEXT CHECKPOINT COMPACTION. Create a handoff summary"
    assert side_kind_from_messages(msgs("x", codex_compact)) == "compaction"
    # a user who quotes one marker is asking a question, not compacting
    quoted = "Where is 'CONTEXT CHECKPOINT COMPACTION' defined? And 'Your task is to create a"
    assert side_kind_from_messages(msgs("x", f"{quoted} detailed summary of'?")) is None
    assert (
        side_kind_from_messages(
            msgs("You are now acting as the managed memory extraction subagent for an AI", "go")
        )
        == "memory"
    )
    assert side_kind_from_headers({"x-codex-turn-metadata": '{"request_kind": "turn"}'}) is None
    assert side_kind_from_headers({"x-codex-turn-metadata": "not json"}) is None
    assert (
        side_kind_from_headers({"x-codex-turn-metadata": '{"request_kind": "review"}'}) == "other"
    )


def test_only_wrapped_context_messages_are_ephemeral():
    wrapped = ChatMessage(
        role="user",
        content="<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>\nx\n<<<END_OPENCLAW_INTERNAL_CONTEXT>>>",
    )
    quoted = ChatMessage(
        role="user", content="What does <<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>> mean?"
    )
    kept, notes = drop_ephemeral([quoted, wrapped])
    assert kept == [quoted] and notes == ["dropped:openclaw_internal_context@1"]
    assert drop_ephemeral([wrapped]) == ([wrapped], [])
