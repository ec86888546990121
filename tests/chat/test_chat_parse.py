"""parse_completion and StreamingParser: tolerant parsing of reasoning and tool calls."""

from __future__ import annotations

import itertools
import json
import random

import pytest

from clawrl.chat import (
    ContentDelta,
    ParsedCompletion,
    ReasoningDelta,
    StreamingParser,
    ToolCall,
    ToolCallEvent,
    parse_completion,
)

CALL_LS = '<tool_call>{"name": "bash", "arguments": {"cmd": "ls"}}</tool_call>'


def _ids():
    counter = itertools.count()
    return lambda: f"call_{next(counter)}"


def parse(text, tools=True):
    return parse_completion(text, tools_enabled=tools, new_id=_ids())


def calls(*pairs):
    return [ToolCall(id=f"call_{i}", name=n, arguments=a) for i, (n, a) in enumerate(pairs)]


def test_plain_text_and_whitespace():
    assert parse("  Hello there.\n") == ParsedCompletion(content="Hello there.")
    assert parse("") == ParsedCompletion()
    assert parse(" \n\t ") == ParsedCompletion()


@pytest.mark.parametrize("marker", ["<|im_end|>", "<|endoftext|>"])
def test_stop_marker_is_stripped(marker):
    assert parse(f"Hi!{marker}") == ParsedCompletion(content="Hi!")
    assert parse(f"Hi!{marker}\nignored <tool_call>") == ParsedCompletion(content="Hi!")


def test_reasoning():
    assert parse("<think>\nstep 1\n</think>\n\nAnswer.") == ParsedCompletion(
        content="Answer.", reasoning="step 1"
    )
    assert parse("\n <think>a</think>b") == ParsedCompletion(content="b", reasoning="a")
    assert parse("<think></think>Answer.") == ParsedCompletion(content="Answer.")


def test_unclosed_think_makes_the_rest_reasoning():
    assert parse("<think>I was cut off") == ParsedCompletion(
        reasoning="I was cut off", reasoning_open=True
    )
    assert parse(f"<think>x {CALL_LS}") == ParsedCompletion(
        reasoning=f"x {CALL_LS}", reasoning_open=True
    )


def test_think_not_at_start_is_content():
    assert parse("Hi <think>no</think> there") == ParsedCompletion(
        content="Hi <think>no</think> there"
    )
    assert parse("</think> stray") == ParsedCompletion(content="</think> stray")
    assert parse("<thin") == ParsedCompletion(content="<thin")


def test_one_tool_call():
    assert parse(CALL_LS) == ParsedCompletion(tool_calls=calls(("bash", {"cmd": "ls"})))


def test_two_tool_calls_with_text_around_and_hermes_newlines():
    text = (
        "Let me look.\n<tool_call>\n"
        '{"name": "bash", "arguments": {"cmd": "ls"}}\n</tool_call>\n'
        '<tool_call>{"name": "read", "arguments": {"path": "a b"}}</tool_call>\nDone?'
    )
    assert parse(text) == ParsedCompletion(
        content="Let me look.\n\n\nDone?",
        tool_calls=calls(("bash", {"cmd": "ls"}), ("read", {"path": "a b"})),
    )


def test_reasoning_then_tool_call():
    text = f"<think>need ls</think>\n{CALL_LS}<|im_end|>"
    assert parse(text) == ParsedCompletion(
        reasoning="need ls", tool_calls=calls(("bash", {"cmd": "ls"}))
    )


def test_nested_braces_and_tags_inside_strings():
    args = {"code": 'if (x) { y(); } // </tool_call> <tool_call> "q" \\', "n": {"m": [1, {}]}}
    body = json.dumps({"name": "write", "arguments": args})
    assert parse(f"<tool_call>{body}</tool_call> after") == ParsedCompletion(
        content="after", tool_calls=calls(("write", args))
    )


def test_arguments_forms():
    as_string = json.dumps({"name": "f", "arguments": json.dumps({"a": 1})})
    assert parse(f"<tool_call>{as_string}</tool_call>").tool_calls == calls(("f", {"a": 1}))
    for body in (
        '{"name": "f", "arguments": ""}',
        '{"name": "f"}',
        '{"name": "f", "arguments": null}',
    ):
        assert parse(f"<tool_call>{body}</tool_call>").tool_calls == calls(("f", {}))
    alias = '{"name": "f", "parameters": {"x": true}}'
    assert parse(f"<tool_call>{alias}</tool_call>").tool_calls == calls(("f", {"x": True}))


@pytest.mark.parametrize(
    "bad",
    [
        "<tool_call>{not json}</tool_call>",
        '<tool_call>{"arguments": {}}</tool_call>',
        '<tool_call>{"name": "", "arguments": {}}</tool_call>',
        '<tool_call>{"name": 3, "arguments": {}}</tool_call>',
        '<tool_call>{"name": "f", "arguments": [1, 2]}</tool_call>',
        '<tool_call>{"name": "f", "arguments": "[1]"}</tool_call>',
        '<tool_call>{"name": "f", "arguments": "{broken"}</tool_call>',
        '<tool_call>["f", {}]</tool_call>',
        "<tool_call></tool_call>",
        "<tool_call>" + "[" * 50_000 + "</tool_call>",
    ],
)
def test_malformed_call_stays_content_verbatim(bad):
    assert parse(f"before {bad} after") == ParsedCompletion(content=f"before {bad} after")


@pytest.mark.parametrize(
    "truncated",
    [
        '<tool_call>{"name": "bash", "arguments": {"cmd": "l',
        '<tool_call>{"name": "bash", "arguments": {"cmd": "ls"}}',
        '<tool_call>{"name": "bash", "arguments": {"cmd": "ls"}}</tool_',
        "<tool_call>",
        "<tool_",
    ],
)
def test_truncated_call_is_content(truncated):
    assert parse(f"Sure. {truncated}") == ParsedCompletion(content=f"Sure. {truncated}")


def test_abandoned_call_followed_by_a_good_one():
    text = '<tool_call>{"name": "bash", "argu\n' + CALL_LS
    assert parse(text) == ParsedCompletion(
        content='<tool_call>{"name": "bash", "argu', tool_calls=calls(("bash", {"cmd": "ls"}))
    )


def test_stray_closing_tag_and_unbalanced_quotes():
    assert parse("a </tool_call> b") == ParsedCompletion(content="a </tool_call> b")
    text = '<tool_call>{"name": "f, "arguments": {}}</tool_call> tail'
    assert parse(text) == ParsedCompletion(content=text)


def test_tools_disabled_leaves_tags_as_content():
    text = f"<think>r</think>Here: {CALL_LS}"
    assert parse(text, tools=False) == ParsedCompletion(content=f"Here: {CALL_LS}", reasoning="r")


def test_default_ids_are_fresh():
    a = parse_completion(CALL_LS + CALL_LS, tools_enabled=True)
    b = parse_completion(CALL_LS, tools_enabled=True)
    ids = [c.id for c in a.tool_calls + b.tool_calls]
    assert len(set(ids)) == 3
    assert all(i.startswith("call_") and len(i) == 29 for i in ids)
    int(ids[0][5:], 16)


def test_to_message():
    msg = parse(f"<think>r</think>c {CALL_LS}").to_message()
    assert msg.role == "assistant" and msg.content == "c" and msg.reasoning == "r"
    assert msg.tool_calls == calls(("bash", {"cmd": "ls"}))


def test_streaming_releases_content_early_and_holds_tags():
    p = StreamingParser(tools_enabled=True, new_id=_ids())
    assert p.feed("Hello ") == [ContentDelta("Hello")]
    assert p.feed("wor") == [ContentDelta(" wor")]
    assert p.feed("ld <tool") == [ContentDelta("ld")]
    assert p.feed('_call>{"name": "bash", "arguments": {"cmd": "ls"}}') == []
    assert p.feed("</tool_call>") == [ToolCallEvent(calls(("bash", {"cmd": "ls"}))[0])]
    # The space held before the call is released with the text after it.
    assert p.feed(" <toolbox> x<|im_") == [ContentDelta("  <toolbox> x")]
    assert p.feed("end|> ignored") == []
    assert p.finish() == []
    assert p.result == ParsedCompletion(
        content="Hello world  <toolbox> x", tool_calls=calls(("bash", {"cmd": "ls"}))
    )
    with pytest.raises(RuntimeError):
        p.feed("more")


def test_streaming_reasoning_deltas():
    p = StreamingParser(tools_enabled=False)
    assert p.feed(" <thi") == []
    assert p.feed("nk>\nabc") == [ReasoningDelta("abc")]
    assert p.feed(" def</th") == [ReasoningDelta(" def")]
    assert p.feed("ink>\n\nAns") == [ContentDelta("Ans")]
    assert p.finish() == []
    assert p.result == ParsedCompletion(content="Ans", reasoning="abc def")


def test_streaming_malformed_call_is_released_as_content_when_closed():
    p = StreamingParser(tools_enabled=True)
    assert p.feed("<tool_call>{oops}") == []
    events = p.feed("</tool_call>!")
    assert "".join(e.text for e in events) == "<tool_call>{oops}</tool_call>!"


FRAGMENTS = [
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    '{"name": "f", "arguments": {"a": 1}}',
    '{"name": "g", "arguments": "{\\"x\\": \\"</tool_call>\\"}"}',
    '{"name": "h"',
    '{"code": "{ } \\\\ \\" <tool_call>"}',
    '"',
    "\\",
    "{",
    "}",
    " ",
    "\n",
    "\n\n",
    "hello",
    "wörld 😀",
    "<",
    "<tool",
    "</tool_call",
    "<think",
    "</th",
    "<|im_end|>",
    "<|im_",
    "<|endoftext|>",
    CALL_LS,
    CALL_LS,
    '<tool_call>\n{"name": "w", "arguments": {"s": "a\\"</tool_call>}"}}\n</tool_call>',
    "<think>r</think>",
]


def _random_text(rng):
    return "".join(rng.choice(FRAGMENTS) for _ in range(rng.randint(0, 14)))


def _stream(text, tools, rng):
    cuts = sorted(rng.sample(range(len(text) + 1), k=min(len(text) + 1, rng.randint(0, 8))))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    p = StreamingParser(tools_enabled=tools, new_id=_ids())
    events = [e for piece in pieces for e in p.feed(piece)]
    events += p.finish()
    return p.result, events


ADVERSARIAL = [
    f"<think>a</think>b {CALL_LS} c {CALL_LS}",
    '<tool_call>{"name": "x", "arguments": {"s": "</tool_call>"}}</tool_call>',
    '<tool_call>{"name": "x"\n<tool_call>{"name": "y", "arguments": {}}</tool_call> z',
    "<think>unclosed <tool_call>",
    "text <tool_call>{bad}</tool_call> more<|im_end|>trailing",
    " \n <think>\n</think>\n\n \n",
]


@pytest.mark.parametrize("tools", [True, False])
def test_streaming_equals_whole_on_random_splits(tools):
    rng = random.Random(1234 + tools)
    texts = ADVERSARIAL + [_random_text(rng) for _ in range(1500)]
    for text in texts:
        for _ in range(3):
            result, events = _stream(text, tools, rng)
            whole = parse(text, tools)
            assert result == whole, text
            content = "".join(e.text for e in events if isinstance(e, ContentDelta))
            reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
            assert (content or None) == whole.content, text
            assert (reasoning or None) == whole.reasoning, text
            assert [e.call for e in events if isinstance(e, ToolCallEvent)] == whole.tool_calls
