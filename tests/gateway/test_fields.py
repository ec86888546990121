"""Request fields with exactly known effects, on a scripted engine: stop, parallel_tool_calls,
reasoning, policy version."""

from __future__ import annotations

import json

HI = [{"role": "user", "content": "Hi"}]


def test_stop_string_cuts_text_but_keeps_sampled_ids(scripted_server, tokenizer):
    served = scripted_server(["Hello world. Bye now.", "Hello world. Bye now."])
    client = served.client()
    r = client.chat.completions.create(model="tiny", messages=HI, stop=["world"])
    assert r.choices[0].message.content == "Hello"
    assert r.choices[0].finish_reason == "stop"
    chunks = list(
        client.chat.completions.create(model="tiny", messages=HI, stop="world", stream=True)
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert streamed.strip() == "Hello" and "w" not in streamed
    for turn in served.turns():
        sampled = tokenizer.decode(turn.completion_ids)
        assert sampled.endswith("world") and "Bye" not in sampled
        assert turn.output["content"] == "Hello" and turn.trainable
        assert turn.sampling_params["stop"] == ["world"]


def test_parallel_tool_calls_false_keeps_the_first_call(scripted_server):
    two = (
        '<tool_call>{"name": "a", "arguments": {}}</tool_call>\n'
        '<tool_call>{"name": "b", "arguments": {"x": 1}}</tool_call>'
    )
    tools = [{"type": "function", "function": {"name": n}} for n in ("a", "b")]
    served = scripted_server([two, two, two])
    client = served.client()
    both = client.chat.completions.create(model="tiny", messages=HI, tools=tools)
    assert [c.function.name for c in both.choices[0].message.tool_calls] == ["a", "b"]
    one = client.chat.completions.create(
        model="tiny", messages=HI, tools=tools, parallel_tool_calls=False
    )
    assert [c.function.name for c in one.choices[0].message.tool_calls] == ["a"]
    chunks = list(
        client.chat.completions.create(
            model="tiny", messages=HI, tools=tools, parallel_tool_calls=False, stream=True
        )
    )
    calls = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert [c.function.name for c in calls] == ["a"]
    recorded = [t.output["tool_calls"] for t in sorted(served.turns(), key=lambda t: t.created_at)]
    assert [[c["name"] for c in calls] for calls in recorded] == [["a", "b"], ["a"], ["a"]]


def test_reasoning_is_returned_as_reasoning_content(scripted_server):
    served = scripted_server(["<think>\n6 times 7\n</think>\nIt is 42."] * 2)
    r = served.client().chat.completions.with_raw_response.create(model="tiny", messages=HI)
    body = json.loads(r.text)
    message = body["choices"][0]["message"]
    assert message["content"] == "It is 42." and message["reasoning_content"] == "6 times 7"
    chunks = list(served.client().chat.completions.create(model="tiny", messages=HI, stream=True))
    content = "".join(c.choices[0].delta.content or "" for c in chunks)
    reasoning = "".join(
        (c.choices[0].delta.model_extra or {}).get("reasoning_content") or "" for c in chunks
    )
    assert content == "It is 42." and reasoning == "6 times 7"


def test_policy_version_is_recorded_and_fingerprinted(scripted_server):
    served = scripted_server()
    client = served.client()
    assert client.chat.completions.create(model="tiny", messages=HI).system_fingerprint == (
        "clawrl-policy-v0"
    )
    served.engine.load_policy(3, None)
    r = client.chat.completions.create(model="tiny", messages=HI)
    assert r.system_fingerprint == "clawrl-policy-v3"
    assert sorted(t.policy_version for t in served.turns()) == [0, 3]
