"""The model's own formats, on real chat templates written by others: tool-call format detection,
stop markers, native calls parsed back (whole and streamed), native rendering of tool use.

The templates come from the installed ``trl`` (``trl/chat_templates/*.jinja``, copies of the
models' own templates) and from ``tests/chat/templates`` (Mistral-Nemo-Instruct-2407's, see the
README there). No template of Mistral's newer ``[TOOL_CALLS]name[ARGS]{...}`` layout ships with
either, so :data:`MISTRAL_ARGS_TEMPLATE` is one written for these tests after the layout of
Mistral Small 3.2 / Devstral's published templates. They are attached to the SmolLM2 tokenizer,
where their special tokens tokenize as several pieces (the parser works on text, so it does not
matter here).
"""

from __future__ import annotations

import copy
import importlib.util
import itertools
import json
import random
from pathlib import Path

import pytest

from clawrl.chat import (
    ChatMessage,
    ContentDelta,
    ParsedCompletion,
    StreamingParser,
    ToolCall,
    ToolCallEvent,
    ToolSpec,
    canonical_call_id,
    completion_format,
    detect_tool_call_format,
    parse_completion,
    render_prompt,
    template_stop_markers,
)

_TRL = importlib.util.find_spec("trl")
TRL_TEMPLATES = Path(next(iter(_TRL.submodule_search_locations or []))) / "chat_templates"
HERE = Path(__file__).parent / "templates"

MISTRAL_ARGS_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if messages[0]['role'] == 'system' %}"
    "{%- set system_message = messages[0]['content'] %}{%- set loop_messages = messages[1:] %}"
    "{%- else %}{%- set system_message = 'You are a helpful assistant.' %}"
    "{%- set loop_messages = messages %}{%- endif %}"
    "{%- if not tools is defined %}{%- set tools = none %}{%- endif %}"
    "{%- set user_messages = loop_messages | selectattr('role', 'equalto', 'user') | list %}"
    "{{- '[SYSTEM_PROMPT]' + system_message + '[/SYSTEM_PROMPT]' }}"
    "{%- for message in loop_messages %}"
    "{%- if message['role'] == 'user' %}"
    "{%- if tools is not none and (message == user_messages[-1]) %}"
    "{{- '[AVAILABLE_TOOLS]' + tools|tojson + '[/AVAILABLE_TOOLS]' }}{%- endif %}"
    "{{- '[INST]' + message['content'] + '[/INST]' }}"
    "{%- elif message['role'] == 'assistant' %}"
    "{%- if message['content'] %}{{- message['content'] }}{%- endif %}"
    "{%- if message['tool_calls'] is defined and message['tool_calls'] %}"
    "{%- for tool_call in message['tool_calls'] %}"
    "{%- set arguments = tool_call['function']['arguments'] %}"
    "{%- if arguments is not string %}{%- set arguments = arguments|tojson %}{%- endif %}"
    "{{- '[TOOL_CALLS]' + tool_call['function']['name'] + '[ARGS]' + arguments }}"
    "{%- endfor %}{%- endif %}"
    "{{- eos_token }}"
    "{%- elif message['role'] == 'tool' %}"
    "{{- '[TOOL_RESULTS]' + message['content']|string + '[/TOOL_RESULTS]' }}"
    "{%- endif %}"
    "{%- endfor %}"
)

WEATHER = ToolSpec(
    name="get_weather",
    description="Weather for a city.",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}},
)
ASK = ChatMessage(role="user", content="Weather in Paris?")


def template_text(name: str) -> str:
    """A real template by name: trl's file, or one of this directory's."""
    if name == "mistral_nemo":
        return (HERE / "mistral_nemo_instruct_2407.jinja").read_text()
    if name == "mistral_args":
        return MISTRAL_ARGS_TEMPLATE
    path = TRL_TEMPLATES / f"{name}.jinja"
    if not path.exists():
        pytest.skip(f"the installed trl does not ship {path.name}")
    return path.read_text()


@pytest.fixture(scope="module")
def templated(smol_tokenizer):
    """``name -> tokenizer``: the SmolLM2 tokenizer with that template (``smollm2``: its own)."""
    made = {"smollm2": smol_tokenizer}

    def get(name):
        if name not in made:
            tok = copy.deepcopy(smol_tokenizer)
            tok.chat_template = template_text(name)
            made[name] = tok
        return made[name]

    return get


def _ids():
    counter = itertools.count()
    return lambda: f"call_{next(counter)}"


def _parse(text, name_or_fmt, tok=None, tools=True):
    fmt = completion_format(tok) if tok is not None else None
    return parse_completion(
        text,
        tools_enabled=tools,
        new_id=_ids(),
        tool_format=fmt.tool_call_format if fmt else name_or_fmt,
        stop_markers=fmt.stop_markers if fmt else ("<|im_end|>",),
    )


def _stream(text, fmt, cuts, markers=("<|im_end|>",)):
    p = StreamingParser(tools_enabled=True, new_id=_ids(), tool_format=fmt, stop_markers=markers)
    pieces = [text[a:b] for a, b in itertools.pairwise([0, *cuts, len(text)])]
    events = [e for piece in pieces for e in p.feed(piece)]
    events += p.finish()
    return p.result, events


def _assert_any_split_equals_whole(text, fmt, markers=("<|im_end|>",)):
    whole = parse_completion(
        text, tools_enabled=True, new_id=_ids(), tool_format=fmt, stop_markers=markers
    )
    splits = [[k] for k in range(len(text) + 1)] + [list(range(1, len(text)))]
    for cuts in splits:
        result, events = _stream(text, fmt, cuts, markers)
        assert result == whole, (text, cuts)
        content = "".join(e.text for e in events if isinstance(e, ContentDelta))
        assert (content or None) == whole.content
        assert [e.call for e in events if isinstance(e, ToolCallEvent)] == whole.tool_calls
    return whole


def _calls(*pairs):
    return [ToolCall(id=f"call_{i}", name=n, arguments=a) for i, (n, a) in enumerate(pairs)]


PARIS = _calls(("get_weather", {"city": "Paris"}))

# --- format detection -------------------------------------------------------------------------

EXPECTED_FORMAT = {
    "smollm2": "hermes",  # no tool support: clawrl's fallback format
    "qwen3": "hermes",
    "qwen2_5": "hermes",
    "llama3_1": "llama3_json",
    "llama3_2": "llama3_json",
    "mistral_nemo": "mistral",
    "mistral_args": "mistral",
    "llama3": "hermes",  # Llama 3.0: no tools in the template, so the fallback format
    "phi3": "hermes",
    "gemma3": "hermes",
    "deepseek_r1_distill": "hermes",
    "gptoss": "hermes",  # harmony calls are not parsed: they stay content
}


@pytest.mark.parametrize("name", sorted(EXPECTED_FORMAT))
def test_tool_call_format_is_read_off_the_template(templated, name):
    tok = templated(name)
    assert detect_tool_call_format(tok.chat_template) == EXPECTED_FORMAT[name]
    assert completion_format(tok).tool_call_format == EXPECTED_FORMAT[name]


def test_detection_rules_on_snippets():
    assert detect_tool_call_format("{{ messages }}") == "hermes"
    assert detect_tool_call_format("{{ tools }} [TOOL_CALLS] <tool_call>") == "mistral"
    assert detect_tool_call_format("{{ tools }} <tool_call>") == "hermes"
    assert detect_tool_call_format("{{ tools }} <|python_tag|>") == "llama3_json"
    assert detect_tool_call_format("{{ tools }} 'ipython'") == "llama3_json"
    llama = '{{ tools }} Respond in the format {"name": function name, "parameters": dict}'
    assert detect_tool_call_format(llama) == "llama3_json"
    # a tool listing with a "parameters" key is not Llama's instruction
    listing = """{{ tools }} '{"name": ' + (fn.name | tojson) + ', "parameters": '"""
    assert detect_tool_call_format(listing) == "hermes"
    assert detect_tool_call_format("{{ tools }} <|channel|>") == "hermes"


# --- stop markers -----------------------------------------------------------------------------

EXPECTED_MARKERS = {  # the SmolLM2 tokenizer's eos_token is <|im_end|>
    "smollm2": ("<|im_end|>",),
    "qwen3": ("<|im_end|>",),
    "llama3_1": ("<|eot_id|>", "<|eom_id|>", "<|im_end|>"),
    "llama3_2": ("<|eot_id|>", "<|im_end|>"),
    "phi3": ("<|end|>", "<|im_end|>"),
    "gemma3": ("<end_of_turn>", "<|im_end|>"),
    "deepseek_r1_distill": ("<｜end▁of▁sentence｜>", "<|im_end|>"),
    "gptoss": ("<|return|>", "<|call|>", "<|im_end|>"),
    "mistral_nemo": ("<|im_end|>",),  # Mistral ends a turn with eos_token itself
    "mistral_args": ("<|im_end|>",),
}


@pytest.mark.parametrize("name", sorted(EXPECTED_MARKERS))
def test_stop_markers_are_the_templates_own(templated, name):
    tok = templated(name)
    markers = template_stop_markers(tok)
    assert markers == EXPECTED_MARKERS[name]
    # the parser also cuts at ChatML's markers that the tokenizer has as special tokens (here
    # the SmolLM2 tokenizer's <|endoftext|>, which no template writes), as it always did
    cut = completion_format(tok).stop_markers
    assert cut[: len(markers)] == markers
    assert set(cut[len(markers) :]) <= {"<|im_end|>", "<|endoftext|>"}
    for marker in markers:
        assert _parse(f"Hi!{marker}\nuser: more", name, tok) == ParsedCompletion(content="Hi!")


def test_stop_markers_include_the_eos_token(smol_tokenizer):
    tok = copy.deepcopy(smol_tokenizer)
    tok.chat_template = template_text("llama3_1")
    assert template_stop_markers(tok)[-1] == "<|im_end|>"
    tok.eos_token = "<|endoftext|>"
    assert template_stop_markers(tok) == ("<|eot_id|>", "<|eom_id|>", "<|endoftext|>")
    # recomputed; then the ChatML marker this tokenizer has as a special token
    assert completion_format(tok).stop_markers == (*template_stop_markers(tok), "<|im_end|>")
    tok.chat_template = template_text("gemma3")
    assert template_stop_markers(tok) == ("<end_of_turn>", "<|endoftext|>")
    assert completion_format(tok).tool_call_format == "hermes"


def test_another_models_markers_are_plain_text(templated):
    # Llama's parser does not cut at ChatML's marker, and ChatML's does not cut at Llama's
    llama, qwen = templated("llama3_2"), templated("qwen3")
    assert "<|im_start|>" in (_parse("a <|im_start|> b", "", llama).content or "")
    assert _parse("a <|eot_id|> b", "", qwen).content == "a <|eot_id|> b"
    assert _parse("a <|eot_id|> b", "", llama).content == "a"


# --- native calls parsed back -----------------------------------------------------------------

ROUND_TRIP = ["smollm2", "qwen3", "qwen2_5", "llama3_1", "llama3_2", "mistral_nemo", "mistral_args"]


def _generated_text(tok, calls):
    """What the template writes for an assistant turn with ``calls``, after its generation
    prompt: the completion a model trained on it produces."""
    prompt = render_prompt(tok, [ASK], [WEATHER]).text
    msg = ChatMessage(role="assistant", tool_calls=calls)
    full = render_prompt(tok, [ASK, msg], [WEATHER], add_generation_prompt=False).text
    assert full.startswith(prompt)
    return full[len(prompt) :]


@pytest.mark.parametrize("name", ROUND_TRIP)
def test_the_templates_own_call_is_parsed_back(templated, name):
    tok = templated(name)
    fmt = completion_format(tok)
    text = _generated_text(tok, [ToolCall(id="call_9", name="get_weather",
                                          arguments={"city": "Paris"})])  # fmt: skip
    whole = _assert_any_split_equals_whole(text, fmt.tool_call_format, fmt.stop_markers)
    assert whole == ParsedCompletion(tool_calls=PARIS), text


@pytest.mark.parametrize("name", ["smollm2", "qwen3", "mistral_nemo", "mistral_args"])
def test_the_templates_own_parallel_calls_are_parsed_back(templated, name):
    tok = templated(name)
    fmt = completion_format(tok)
    two = [ToolCall(id="a", name="get_weather", arguments={"city": c}) for c in ("Paris", "Oslo")]
    text = _generated_text(tok, two)
    whole = _assert_any_split_equals_whole(text, fmt.tool_call_format, fmt.stop_markers)
    assert whole.tool_calls == _calls(("get_weather", {"city": "Paris"}),
                                      ("get_weather", {"city": "Oslo"}))  # fmt: skip


NATIVE = {
    "hermes": [
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        '<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}</tool_call>',
    ],
    "llama3_json": [
        '{"name": "get_weather", "parameters": {"city": "Paris"}}',
        ' \n<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}\n',
        '{"type": "function", "name": "get_weather", "parameters": {"city": "Paris"}};',
        '{"name": "get_weather", "arguments": {"city": "Paris"}}',
    ],
    "mistral": [
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]',
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "a1b2c3d4e"}]',
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}',
        '[TOOL_CALLS]get_weather[ARGS] {"city": "Paris"}\n',
    ],
}


@pytest.mark.parametrize(
    ("fmt", "text"), [(fmt, text) for fmt, texts in NATIVE.items() for text in texts]
)
def test_native_call_whole_and_streamed(fmt, text):
    assert _assert_any_split_equals_whole(text, fmt) == ParsedCompletion(tool_calls=PARIS)


def test_several_calls_per_format():
    a, b = '{"name": "a", "parameters": {"x": ";"}}', '{"name": "b", "parameters": {}}'
    expected = _calls(("a", {"x": ";"}), ("b", {}))
    assert _assert_any_split_equals_whole(f"{a}; {b}", "llama3_json").tool_calls == expected
    assert _assert_any_split_equals_whole(f"{a};\n{b};", "llama3_json").tool_calls == expected
    mistral = '[TOOL_CALLS]a[ARGS]{"x": ";"}[TOOL_CALLS]b[ARGS]{}'
    assert _assert_any_split_equals_whole(mistral, "mistral").tool_calls == expected
    mixed = 'Let me check. [TOOL_CALLS][{"name": "a", "arguments": {"x": ";"}}] then [TOOL_CALLS]b[ARGS]{}'
    whole = _assert_any_split_equals_whole(mixed, "mistral")
    assert whole == ParsedCompletion(content="Let me check.  then", tool_calls=expected)


def test_reasoning_then_native_call():
    llama = '<think>\nneed weather\n</think>\n\n{"name": "get_weather", "parameters": {"city": "Paris"}}'
    whole = _assert_any_split_equals_whole(llama, "llama3_json")
    assert whole == ParsedCompletion(reasoning="need weather", tool_calls=PARIS)
    mistral = '<think>r</think>[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}'
    whole = _assert_any_split_equals_whole(mistral, "mistral")
    assert whole == ParsedCompletion(reasoning="r", tool_calls=PARIS)


MALFORMED = {
    "hermes": [
        '<tool_call>{"name": "get_weather", "arguments": [1]}</tool_call>',
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Par',
    ],
    "llama3_json": [
        '{"name": "get_weather"}',  # no parameters: a JSON answer, not a call
        '{"name": "get_weather", "parameters": {"city": "Paris"}} Done.',
        'Here you go: {"name": "get_weather", "parameters": {"city": "Paris"}}',
        '{"name": "get_weather", "parameters": {"city": "Par',
        '{"name": "get_weather", "parameters": [1]}',
        '{"name": "a", "parameters": {}}; oops',
        '{"name": "a", "parameters": {}}; {"name": ""}',
        '<|python_tag|>brave_search.call(query="weather in Paris")',
        "[1, 2, 3]",
        '{"name": "a", "parameters": {}}}',
    ],
    "mistral": [
        '[TOOL_CALLS][{"name": "get_weather", "arguments": "not json"}]',
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {}}, {"arguments": {}}]',
        "[TOOL_CALLS][]",
        "[TOOL_CALLS]get weather[ARGS]{}",
        '[TOOL_CALLS]get_weather[ARGS]"Paris"',
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Par',
        "[TOOL_CALLS]get_weather",
        "[TOOL_CALLS]",
        '[TOOL_CALLS]{"name": "get_weather"}',
    ],
}


@pytest.mark.parametrize(
    ("fmt", "text"), [(fmt, text) for fmt, texts in MALFORMED.items() for text in texts]
)
def test_malformed_native_call_stays_content(fmt, text):
    whole = _assert_any_split_equals_whole(text, fmt)
    assert whole == ParsedCompletion(content=text.strip()), text


def test_malformed_region_does_not_hide_a_later_call():
    text = '[TOOL_CALLS]get_weather[ARGS]{"city": [TOOL_CALLS]b[ARGS]{}'
    whole = _assert_any_split_equals_whole(text, "mistral")
    assert whole == ParsedCompletion(
        content='[TOOL_CALLS]get_weather[ARGS]{"city":', tool_calls=_calls(("b", {}))
    )


@pytest.mark.parametrize("fmt", ["hermes", "llama3_json", "mistral"])
def test_other_formats_markup_is_content(fmt):
    others = [t for f, texts in NATIVE.items() if f != fmt for t in texts]
    for text in others:
        assert _parse(text, fmt).tool_calls == [], (fmt, text)


def test_tools_disabled_leaves_native_markup_as_content():
    for fmt, texts in NATIVE.items():
        for text in texts:
            assert _parse(text, fmt, tools=False) == ParsedCompletion(content=text.strip())


def test_unknown_format_is_refused():
    with pytest.raises(ValueError):
        StreamingParser(tools_enabled=True, tool_format="xml")  # type: ignore[arg-type]


# --- streaming: calls are never sent as content ----------------------------------------------


def test_llama3_call_json_is_never_streamed_as_content():
    text = ' <|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}} ; '
    p = StreamingParser(tools_enabled=True, new_id=_ids(), tool_format="llama3_json")
    assert [e for ch in text for e in p.feed(ch)] == []
    assert p.finish() == [ToolCallEvent(PARIS[0])]


def test_llama3_plain_answer_streams_as_soon_as_it_cannot_be_a_call():
    p = StreamingParser(tools_enabled=True, new_id=_ids(), tool_format="llama3_json")
    assert p.feed("  ") == []
    assert p.feed("<|py") == []  # could still be <|python_tag|>
    assert p.feed("x") == [ContentDelta("<|pyx")]
    assert p.feed(" and more") == [ContentDelta(" and more")]
    p = StreamingParser(tools_enabled=True, new_id=_ids(), tool_format="llama3_json")
    assert p.feed('{"answer": 4') == []  # could still be a call
    assert p.feed("2}") == [ContentDelta('{"answer": 42}')]  # a complete object with no name
    p = StreamingParser(tools_enabled=True, new_id=_ids(), tool_format="llama3_json")
    assert p.feed('{"name": "a", "parameters": {}}') == []
    assert p.feed(" so") == [ContentDelta('{"name": "a", "parameters": {}} so')]


def test_mistral_region_is_held_until_decided():
    p = StreamingParser(tools_enabled=True, new_id=_ids(), tool_format="mistral")
    assert p.feed("Checking [TOOL_") == [ContentDelta("Checking")]
    assert p.feed("CALLS]get_weather[AR") == []
    assert p.feed('GS]{"city": "Paris"') == []
    assert p.feed("}") == [ToolCallEvent(PARIS[0])]
    assert p.feed(" ok") == [ContentDelta("  ok")]


# --- random splits, per format ----------------------------------------------------------------

FRAGMENTS = {
    "llama3_json": [
        '{"name": "f", "parameters": {"a": 1}}',
        '{"name": "g", "arguments": "{\\"x\\": \\"};\\"}"}',
        '{"name": "h"}',
        '{"code": "{ } \\\\ \\" ;"}',
        "<|python_tag|>",
        "<|python",
        ";",
        "; ",
        "{",
        "}",
        '"',
        "\\",
        " ",
        "\n",
        "hello",
        "<think>",
        "</think>",
        "<|eot_id|>",
        "<|eot",
    ],
    "mistral": [
        "[TOOL_CALLS]",
        "[TOOL_",
        "[ARGS]",
        "[AR",
        '[{"name": "f", "arguments": {"a": 1}}]',
        '[{"name": "g", "arguments": {"s": "[TOOL_CALLS]]"}}, {"name": "h"}]',
        "get_weather",
        '{"city": "Paris"}',
        '{"s": "}]\\"["}',
        "[",
        "]",
        "{",
        "}",
        '"',
        "\\",
        " ",
        "\n",
        "hello",
        "<think>",
        "</think>",
        "<|eot_id|>",
    ],
}


CALLS = {
    "llama3_json": ['{"name": "f", "parameters": {"a": [1, "};"]}}', '{"name": "g", "arguments": {}}'],
    "mistral": ['[TOOL_CALLS][{"name": "f", "arguments": {"a": "[TOOL_CALLS]"}}]',
                '[TOOL_CALLS]g[ARGS]{"b": {"c": "]"}}'],
}  # fmt: skip


def _random_text(fmt, rng):
    """Random fragments, or (half the time) well-formed calls with a few fragments mixed in."""
    if rng.random() < 0.5:
        return "".join(rng.choice(FRAGMENTS[fmt]) for _ in range(rng.randint(0, 10)))
    sep = "; " if fmt == "llama3_json" else rng.choice(["", " ", "\ntext "])
    parts = [rng.choice(CALLS[fmt]) for _ in range(rng.randint(1, 3))]
    if fmt == "llama3_json" and rng.random() < 0.3:
        parts[0] = "<|python_tag|>" + parts[0]
    for _ in range(rng.choice([0, 0, 1, 2])):
        k = rng.randrange(len(parts) + 1)
        parts.insert(k, rng.choice(FRAGMENTS[fmt]))
    return sep.join(parts)


def _llama_reference(text, markers):
    """An independent reading of the llama3_json rule with ``json.JSONDecoder.raw_decode``."""
    cut = min((i for i in (text.find(m) for m in markers) if i >= 0), default=len(text))
    body = text[:cut].lstrip()
    reasoning = None
    if body.startswith("<think>"):
        close = body.find("</think>")
        if close < 0:
            return None  # reasoning_open: no calls, no content
        reasoning, body = body[len("<think>") : close].strip() or None, body[close + 8 :]
    rest = body.strip().removeprefix("<|python_tag|>")
    decoder, calls, i = json.JSONDecoder(), [], 0
    while True:
        i = len(rest) - len(rest[i:].lstrip())
        if i == len(rest) or rest[i] != "{":
            break
        try:
            obj, i = decoder.raw_decode(rest, i)
        except ValueError:
            break
        args = obj.get("arguments", obj.get("parameters")) if isinstance(obj, dict) else None
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                break
        ok = isinstance(obj, dict) and ("parameters" in obj or "arguments" in obj)
        if not ok or not isinstance(obj.get("name"), str) or not obj["name"]:
            break
        if not isinstance(args, dict | None):
            break
        calls.append((obj["name"], args or {}))
        j = len(rest) - len(rest[i:].lstrip())
        if j == len(rest):
            return reasoning, None, calls
        if rest[j] != ";":
            break
        i = j + 1
        if not rest[i:].strip():
            return reasoning, None, calls
    return reasoning, body.strip() or None, []


@pytest.mark.parametrize("fmt", ["llama3_json", "mistral"])
def test_streaming_equals_whole_on_random_splits(fmt):
    rng = random.Random(4321)
    markers = ("<|eot_id|>",)
    for _ in range(1200):
        text = _random_text(fmt, rng)
        whole = parse_completion(
            text, tools_enabled=True, new_id=_ids(), tool_format=fmt, stop_markers=markers
        )
        if fmt == "llama3_json":
            ref = _llama_reference(text, markers)
            if ref is not None:
                got = (
                    whole.reasoning,
                    whole.content,
                    [(c.name, c.arguments) for c in whole.tool_calls],
                )
                assert got == ref, text
        for _ in range(3):
            cuts = sorted(rng.sample(range(len(text) + 1), k=min(len(text) + 1, rng.randint(0, 8))))
            result, events = _stream(text, fmt, cuts, markers)
            assert result == whole, (text, cuts)
            content = "".join(e.text for e in events if isinstance(e, ContentDelta))
            assert (content or None) == whole.content
            assert [e.call for e in events if isinstance(e, ToolCallEvent)] == whole.tool_calls


# --- native rendering of tool use -------------------------------------------------------------

NATIVE_TEMPLATES = ["qwen3", "qwen2_5", "llama3_1", "llama3_2", "gptoss", "mistral_nemo",
                    "mistral_args"]  # fmt: skip


def _tool_conversation(id_a="call_8f2a9c41d3e0b7a6c5d4e3f2", id_b="toolu_01ABC"):
    return [
        ChatMessage(role="system", content="Be brief."),
        ChatMessage(role="user", content="Weather in Paris?"),
        ChatMessage(role="assistant", tool_calls=[ToolCall(id=id_a, name="get_weather",
                                                           arguments={"city": "Paris"})]),
        ChatMessage(role="tool", content="sunny, 21 C", tool_call_id=id_a),
        ChatMessage(role="assistant", content="Sunny, 21 C."),
        ChatMessage(role="user", content="And Rome and Oslo?"),
        ChatMessage(role="assistant", content="Checking both.", tool_calls=[
            ToolCall(id=id_b, name="get_weather", arguments={"city": "Rome"}),
            ToolCall(id=id_b + "x", name="get_weather", arguments={"city": "Oslo"}),
        ]),
        ChatMessage(role="tool", content="rain, 12 C", tool_call_id=id_b),
        ChatMessage(role="tool", content="snow, -3 C", tool_call_id=id_b + "x"),
        ChatMessage(role="assistant", content="Rain in Rome, snow in Oslo."),
        ChatMessage(role="user", content="Thanks."),
    ]  # fmt: skip


@pytest.mark.parametrize("name", NATIVE_TEMPLATES)
def test_native_rendering_of_tool_use_with_real_templates(templated, name):
    tok = templated(name)
    msgs = _tool_conversation()
    r = render_prompt(tok, msgs, [WEATHER])
    assert len(r.message_spans) == len(msgs)
    assert r.token_ids == tok.encode(r.text, add_special_tokens=False)
    shown = ["Paris", "Rome"] if name == "gptoss" else ["Paris", "Rome", "Oslo"]
    for city in shown:  # gpt-oss's template renders only the first call of a message
        assert f'"city": "{city}"' in r.text, city
    for result in ("sunny, 21 C", "rain, 12 C", "snow, -3 C", "Rain in Rome, snow in Oslo."):
        assert result in r.text
    # the client's ids never reach the template: other ids, the same prompt
    assert render_prompt(tok, _tool_conversation("c1", "c2"), [WEATHER]).text == r.text
    assert "call_8f2a9c41" not in r.text and "toolu_01ABC" not in r.text


def test_mistral_gets_nine_character_call_ids(templated):
    text = render_prompt(templated("mistral_nemo"), _tool_conversation(), [WEATHER]).text
    assert '"city": "Paris"}, "id": "call00000"}]' in text
    assert '{"content": sunny, 21 C, "call_id": "call00000"}' in text
    assert '"id": "call00001"}, {"name": "get_weather"' in text
    assert '{"content": snow, -3 C, "call_id": "call00002"}' in text
    assert [canonical_call_id(k) for k in (0, 1, 12)] == ["call00000", "call00001", "call00012"]


def test_tool_results_without_known_ids_pair_with_pending_calls(templated):
    msgs = _tool_conversation()
    msgs[7] = msgs[7].model_copy(update={"tool_call_id": None})
    msgs[8] = msgs[8].model_copy(update={"tool_call_id": "unknown"})
    tok = templated("mistral_nemo")
    assert render_prompt(tok, msgs, [WEATHER]).text == (
        render_prompt(tok, _tool_conversation(), [WEATHER]).text
    )


@pytest.mark.parametrize("name", ["llama3_1", "llama3_2"])
def test_llama_renders_parallel_calls_as_one_call_per_message(templated, name):
    text = render_prompt(templated(name), _tool_conversation(), [WEATHER]).text
    rome = '{"name": "get_weather", "parameters": {"city": "Rome"}}<|eot_id|>'
    oslo = '{"name": "get_weather", "parameters": {"city": "Oslo"}}<|eot_id|>'
    assert f"{rome}<|start_header_id|>assistant<|end_header_id|>\n\n{oslo}" in text
    assert '<|start_header_id|>ipython<|end_header_id|>\n\n"snow, -3 C"<|eot_id|>' in text


def test_a_template_that_fails_in_python_is_a_client_error(tokenizer):
    """A template that concatenates the client's data (deepseekv3 adds dict arguments to a
    string) raises a Python error, not a TemplateError: still a 400, never a 500."""
    import copy

    from clawrl.chat import ChatMessage, render_prompt
    from clawrl.errors import ClientInputError

    tok = copy.deepcopy(tokenizer)
    tok.chat_template = "{% for m in messages %}{{ m['content'] + 1 }}{% endfor %}"
    with pytest.raises(ClientInputError, match="rejected the conversation"):
        render_prompt(tok, [ChatMessage(role="user", content="hi")])
