"""``POST /v1/responses`` through the real ``openai`` SDK: items, tools, streams, errors."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from clawrl.chat import ChatMessage, ToolCall, assistant_message_text
from clawrl.store import ApiProtocol, TurnKind, TurnStatus
from clawrl.trajectory import load_tree
from clawrl.trajectory.next_state import NextStateRole, next_state

EXEC = {
    "type": "function",
    "name": "exec_command",
    "description": "Run a command.",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
}
TOOLS = [
    EXEC,
    {"type": "web_search", "external_web_access": False},
    {
        "type": "namespace",
        "name": "multi_agent_v1",
        "description": "Sub-agents.",
        "tools": [{"type": "function", "name": "spawn_agent", "parameters": {"type": "object"}}],
    },
    {"type": "custom", "name": "apply_patch", "description": "Apply a patch."},
]
INPUT = [
    {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Codex."}]},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Make x.txt"}]},
]
ARGS = {"cmd": "echo hi > x.txt"}


def _text(content=None, reasoning=None, calls=()):
    msg = ChatMessage(
        role="assistant",
        content=content,
        reasoning=reasoning,
        tool_calls=[ToolCall(name=n, arguments=a) for n, a in calls],
    )
    return assistant_message_text(msg)


CALL = _text("Running it.", "Need a shell.", [("exec_command", ARGS)])


def test_stream_event_sequence(scripted):
    gw = scripted([CALL])
    events = list(
        gw.openai().responses.create(model="m", input=INPUT, tools=TOOLS, stream=True, store=False)
    )
    kinds = [e.type for e in events]
    compact = [k for i, k in enumerate(kinds) if i == 0 or k != kinds[i - 1]]
    assert compact == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response
    assert [o.type for o in final.output] == ["reasoning", "message", "function_call"]
    assert final.output[1].content[0].text == "Running it."
    call = final.output[2]
    assert call.name == "exec_command" and json.loads(call.arguments) == ARGS
    (turn,) = gw.turns()
    assert turn.protocol == ApiProtocol.OPENAI_RESPONSES
    assert final.usage.input_tokens == len(turn.prompt_ids)
    assert final.usage.output_tokens == len(turn.completion_ids)
    assert turn.output["tool_calls"][0]["id"] == call.call_id
    assert turn.sampling_params["notes"] == ["ignored_tool:web_search"]
    prompt = gw.engine.tokenizer.decode(turn.prompt_ids)
    assert '"name": "spawn_agent"' in prompt and '"name": "apply_patch"' in prompt


def test_round_trip_with_reasoning_echo_links_by_prompt_cache_key(scripted):
    gw = scripted([CALL, "x.txt is there."])
    client = gw.openai()
    first = client.responses.create(
        model="m", input=INPUT, tools=TOOLS, store=False, prompt_cache_key="codex-s"
    )
    echoed = [o.model_dump(exclude_none=True) for o in first.output]
    echoed[0]["encrypted_content"] = "gAAAA-opaque"  # Codex asks for it and sends it back
    fc = echoed[-1]
    history = [
        *INPUT,
        *echoed,
        {"type": "function_call_output", "call_id": fc["call_id"].replace("_", ""), "output": "ok"},
    ]
    second = client.responses.create(
        model="m", input=history, tools=TOOLS, store=False, prompt_cache_key="codex-s"
    )
    assert second.output_text == "x.txt is there." and second.status == "completed"
    a, b = gw.turns()
    assert a.session_id == b.session_id == "codex-s"
    assert b.client["attribution"] == "body:prompt_cache_key"
    assert b.prompt_ids[: len(a.seq_ids)] == a.seq_ids
    assert "ignored:encrypted_reasoning" in b.sampling_params["notes"]
    tree = load_tree(gw.store, "codex-s")
    assert tree.node(b.id).parent_id == a.id
    state = next_state(tree, a.id)
    assert state.role == NextStateRole.TOOL and [m["content"] for m in state.messages] == ["ok"]


def test_namespace_and_custom_tool_calls_are_answered_in_their_own_shape(scripted):
    reply = _text(calls=[("spawn_agent", {"task": "t"}), ("apply_patch", {"input": "*** Begin"})])
    gw = scripted([reply])
    r = gw.openai().responses.create(model="m", input=INPUT, tools=TOOLS)
    spawn, patch = r.output
    assert spawn.type == "function_call" and spawn.name == "spawn_agent"
    assert spawn.model_dump()["namespace"] == "multi_agent_v1"
    assert patch.type == "custom_tool_call" and patch.input == "*** Begin"


def test_max_output_tokens_gives_an_incomplete_response(scripted):
    gw = scripted(["one two three four five six"])
    client = gw.openai()
    r = client.responses.create(model="m", input="hi", max_output_tokens=2)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    events = list(client.responses.create(model="m", input="hi", max_output_tokens=2, stream=True))
    assert events[-1].type == "response.incomplete"
    assert gw.engine.params[0].max_tokens == 2


def test_codex_compaction_header_makes_a_side_turn(scripted):
    gw = scripted(["Summary."])
    meta = {"session_id": "cx", "request_kind": "compaction"}
    gw.openai().responses.create(
        model="m",
        input=INPUT,
        extra_headers={"session-id": "cx", "x-codex-turn-metadata": json.dumps(meta)},
    )
    (turn,) = gw.turns()
    assert (turn.kind, turn.side_kind, turn.session_id) == (TurnKind.SIDE, "compaction", "cx")
    assert turn.sampling_params["codex_request_kind"] == "compaction"


def test_websocket_upgrade_is_refused_at_once(scripted):
    gw = scripted()
    headers = {
        "Connection": "Upgrade",
        "Upgrade": "websocket",
        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
        "Sec-WebSocket-Version": "13",
    }
    r = httpx.get(f"{gw.server.base_url}/responses", headers=headers, timeout=30)
    assert r.status_code in (403, 426)
    if r.status_code == 426:  # uvicorn without a WebSocket library: a plain GET
        assert r.json()["error"]["code"] == "websocket_not_supported"
    assert gw.turns() == []


def test_errors(scripted):
    gw = scripted(["x"], max_context=64)
    client = gw.openai()
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="m", input="hi", previous_response_id="resp_1")
    assert e.value.body["param"] == "previous_response_id"
    image = {"type": "input_image", "image_url": "data:image/png;base64,x"}
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="m", input=[{"role": "user", "content": [image]}])
    assert e.value.body["code"] == "unsupported_content_type"
    with pytest.raises(openai.BadRequestError) as e:  # a JSON boolean, not "yes"
        client.responses.create(model="m", input="hi", extra_body={"stream": "yes"})
    assert e.value.body["param"] == "stream"
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="m", input="word " * 200)
    (failed,) = gw.turns()
    assert failed.status == TurnStatus.ERROR
    assert e.value.body["code"] == "context_length_exceeded"
    assert f"{len(failed.prompt_ids)} tokens > 64" in e.value.body["message"]


def test_tiny_model_stream_and_non_stream_are_well_formed(tiny_gateway):
    client = tiny_gateway.openai()
    before = len(tiny_gateway.turns())
    r = client.responses.create(model="m", input="Hello", max_output_tokens=8)
    events = list(
        client.responses.create(model="m", input="Hello", max_output_tokens=8, stream=True)
    )
    done = events[-1].response
    assert events[0].type == "response.created"
    assert events[-1].type in ("response.completed", "response.incomplete")
    turns = tiny_gateway.turns()[before:]
    assert len(turns) == 2
    for turn, resp in zip(turns, (r, done), strict=True):
        assert turn.protocol == ApiProtocol.OPENAI_RESPONSES
        assert resp.usage.output_tokens == len(turn.completion_ids) == len(turn.sampling_logprobs)
        assert resp.usage.input_tokens == len(turn.prompt_ids)
        assert all(o.type in ("message", "reasoning") for o in resp.output)
