"""render_prompt with the real SmolLM2 tokenizer (fallback tool format) and a native-tools template."""

from __future__ import annotations

import copy
import itertools
import json

import pytest

from clawrl.chat import (
    ChatMessage,
    RenderedPrompt,
    ToolCall,
    ToolChoice,
    ToolSpec,
    assistant_message_text,
    normalize_openai_messages,
    parse_completion,
    render_prompt,
    supports_native_tools,
)
from clawrl.errors import ClientInputError, ModelLoadError

SMOL_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
BASH = ToolSpec(
    name="bash",
    description="Run a shell command",
    parameters={"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
)
READ = ToolSpec(name="read_file", description="Read a file")

# A small Hermes/Qwen2.5-style template with native tool support (mentions `tools`).
NATIVE_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages and messages[0].role == 'system' %}{{- messages[0].content }}"
    "{%- else %}{{- 'You are Testy.' }}{%- endif %}"
    "{{- '\\n\\n# Native Tools\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools><|im_end|>\\n' }}"
    "{%- elif messages and messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\nYou are Testy.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' %}"
    "{%- if not loop.first %}"
    "{{- '<|im_start|>system\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- elif message.role == 'user' %}"
    "{{- '<|im_start|>user\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' + message.content }}"
    "{%- for tc in message.tool_calls or [] %}"
    '{{- \'\\n<tool_call>\\n{"name": "\' + tc.function.name + \'", "arguments": \' }}'
    "{{- tc.function.arguments | tojson }}{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}"
    "{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}"
    "{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@pytest.fixture(scope="module")
def native_tokenizer(smol_tokenizer):
    tok = copy.deepcopy(smol_tokenizer)
    tok.chat_template = NATIVE_TEMPLATE
    return tok


def _with_template(tokenizer, template):
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = template
    return tok


def _call(name, args, call_id="call_x"):
    return ToolCall(id=call_id, name=name, arguments=args)


def _plain():
    return [
        ChatMessage(role="system", content="You are terse."),
        ChatMessage(role="user", content="What is 2+2?"),
        ChatMessage(role="assistant", content="4."),
        ChatMessage(role="user", content="And 3+3?"),
        ChatMessage(role="assistant", content="6."),
    ]


def _tool_use():
    return [
        ChatMessage(role="user", content="List the files, then read README."),
        ChatMessage(role="assistant", tool_calls=[_call("bash", {"cmd": "ls"})]),
        ChatMessage(role="tool", content="README.md\nsetup.py", tool_call_id="call_x"),
        ChatMessage(
            role="assistant",
            content="Reading it now.",
            tool_calls=[_call("read_file", {"path": "README.md"})],
        ),
        ChatMessage(role="tool", content="# Project — déjà vu 😀", tool_call_id="call_y"),
        ChatMessage(role="assistant", content="It is a project README."),
        ChatMessage(role="user", content="Thanks."),
    ]


def _parallel_with_reasoning():
    return [
        ChatMessage(role="system", content="Use tools."),
        ChatMessage(role="user", content="Where am I and who am I?"),
        ChatMessage(
            role="assistant",
            reasoning="I need two commands.",
            tool_calls=[_call("bash", {"cmd": "pwd"}, "a"), _call("bash", {"cmd": "whoami"}, "b")],
        ),
        ChatMessage(role="tool", content="/home/u", tool_call_id="a"),
        ChatMessage(role="tool", content="u", tool_call_id="b"),
        ChatMessage(role="assistant", reasoning="Both done.", content="You are u in /home/u."),
        ChatMessage(role="user", content=None),
        ChatMessage(role="assistant", content="Anything else?"),
    ]


CONVERSATIONS = {
    "plain": (_plain, None, None),
    "tools": (_tool_use, [BASH, READ], None),
    "parallel_reasoning": (_parallel_with_reasoning, [BASH], None),
    "required": (_tool_use, [BASH, READ], ToolChoice(mode="required")),
    "named": (_parallel_with_reasoning, [BASH], ToolChoice(mode="function", name="bash")),
    "none": (_tool_use, [BASH, READ], ToolChoice(mode="none")),
}


def _splits_tool_run(msgs, k):
    return k < len(msgs) and msgs[k - 1].role == "tool" and msgs[k].role == "tool"


def _check_turn_by_turn(tok, msgs, tools, choice):
    whole = render_prompt(tok, msgs, tools, choice, add_generation_prompt=False)
    with_gen = render_prompt(tok, msgs, tools, choice)
    n = len(msgs)
    assert whole.token_ids == tok.encode(whole.text, add_special_tokens=False)
    assert with_gen.token_ids[: len(whole.token_ids)] == whole.token_ids
    assert len(with_gen.token_ids) > len(whole.token_ids)
    assert with_gen.message_spans == whole.message_spans
    spans = whole.message_spans
    assert len(spans) == n and spans[0][0] == 0 and spans[-1][1] == len(whole.token_ids)
    for (s0, e0), (s1, e1) in itertools.pairwise(spans):
        assert s0 < e0 and (e0 == s1 or (s0, e0) == (s1, e1))
    for k in range(1, n + 1):
        part = render_prompt(tok, msgs[:k], tools, choice, add_generation_prompt=False)
        if not _splits_tool_run(msgs, k):
            assert whole.token_ids[: len(part.token_ids)] == part.token_ids, k
            assert part.message_spans == spans[:k], k
            assert spans[k - 1][1] == len(part.token_ids), k
        if k < n and msgs[k].role == "assistant":
            gen = render_prompt(tok, msgs[:k], tools, choice, add_generation_prompt=True)
            assert whole.token_ids[: len(gen.token_ids)] == gen.token_ids, k
            assert spans[k][1] > len(gen.token_ids)
    return whole


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_turn_by_turn_equals_whole_fallback(smol_tokenizer, name):
    build, tools, choice = CONVERSATIONS[name]
    _check_turn_by_turn(smol_tokenizer, build(), tools, choice)


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_turn_by_turn_equals_whole_native(native_tokenizer, name):
    build, tools, choice = CONVERSATIONS[name]
    _check_turn_by_turn(native_tokenizer, build(), tools, choice)


def test_detects_tool_support(smol_tokenizer, native_tokenizer):
    assert not supports_native_tools(smol_tokenizer)
    assert supports_native_tools(native_tokenizer)


def test_plain_conversation_is_the_models_own_template(smol_tokenizer):
    msgs = _plain()[1:]
    raw = [{"role": m.role, "content": m.content} for m in msgs]
    expected = smol_tokenizer.apply_chat_template(
        raw, tokenize=True, return_dict=False, add_generation_prompt=True
    )
    assert render_prompt(smol_tokenizer, msgs).token_ids == expected


def test_fallback_golden_text(smol_tokenizer):
    msgs = [
        ChatMessage(role="user", content="list"),
        ChatMessage(role="assistant", tool_calls=[_call("bash", {"cmd": "ls"})]),
        ChatMessage(role="tool", content="a.txt", tool_call_id="call_x"),
    ]
    text = render_prompt(smol_tokenizer, msgs, [BASH]).text
    schema = json.dumps(BASH.openai_format(), ensure_ascii=False)
    assert text == (
        f"<|im_start|>system\n{SMOL_SYSTEM}\n\n# Tools\n\n"
        "You may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{schema}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n"
        '<tool_call>{"name": <function-name>, "arguments": <args-json-object>}</tool_call>'
        "<|im_end|>\n"
        "<|im_start|>user\nlist<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>{"name": "bash", "arguments": {"cmd": "ls"}}'
        "</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\na.txt\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_tools_go_into_existing_system_message(smol_tokenizer):
    msgs = [
        ChatMessage(role="system", content="Be careful."),
        ChatMessage(role="user", content="hi"),
    ]
    text = render_prompt(smol_tokenizer, msgs, [BASH]).text
    assert text.startswith("<|im_start|>system\nBe careful.\n\n# Tools\n")
    assert SMOL_SYSTEM not in text
    assert text.count("<|im_start|>system") == 1


def test_spans_decode_to_each_turn(smol_tokenizer):
    msgs = _parallel_with_reasoning()
    r = render_prompt(smol_tokenizer, msgs, [BASH])
    turns = [smol_tokenizer.decode(r.token_ids[s:e]) for s, e in r.message_spans]
    assert turns[0].startswith("<|im_start|>system\nUse tools.\n\n# Tools")
    assert turns[1] == "<|im_start|>user\nWhere am I and who am I?<|im_end|>\n"
    assert turns[2] == (
        "<|im_start|>assistant\n<think>\nI need two commands.\n</think>\n"
        '<tool_call>{"name": "bash", "arguments": {"cmd": "pwd"}}</tool_call>\n'
        '<tool_call>{"name": "bash", "arguments": {"cmd": "whoami"}}</tool_call><|im_end|>\n'
    )
    # Two consecutive tool results are ONE user turn, and share its span.
    assert r.message_spans[3] == r.message_spans[4]
    assert turns[3] == (
        "<|im_start|>user\n<tool_response>\n/home/u\n</tool_response>\n"
        "<tool_response>\nu\n</tool_response><|im_end|>\n"
    )
    assert turns[5].startswith("<|im_start|>assistant\n<think>\nBoth done.\n</think>\nYou are")
    assert turns[6] == "<|im_start|>user\n<|im_end|>\n"
    assert smol_tokenizer.decode(r.token_ids[r.message_spans[-1][1] :]) == "<|im_start|>assistant\n"


def _openai_history(arguments, tool_calls_key):
    assistant = {"role": "assistant", "content": "ok"}
    if tool_calls_key is not None:
        assistant["tool_calls"] = tool_calls_key
    return [
        {"role": "user", "content": "do it"},
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "bash", "arguments": arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "done"},
        assistant,
        {"role": "user", "content": "next"},
    ]


@pytest.mark.parametrize("tok_name", ["smol_tokenizer", "native_tokenizer"])
def test_string_and_object_arguments_render_identically(request, tok_name):
    tok = request.getfixturevalue(tok_name)
    args = {"cmd": "echo 'héllo' && ls", "flags": [1, 2.5, None, True], "deep": {"x": {}}}
    a = normalize_openai_messages(_openai_history(json.dumps(args), None))
    b = normalize_openai_messages(_openai_history(args, None))
    c = normalize_openai_messages(_openai_history(json.dumps(args, indent=2), None))
    ids = [render_prompt(tok, m, [BASH]).token_ids for m in (a, b, c)]
    assert ids[0] == ids[1] == ids[2]


@pytest.mark.parametrize("tok_name", ["smol_tokenizer", "native_tokenizer"])
def test_tool_calls_empty_null_missing_render_identically(request, tok_name):
    tok = request.getfixturevalue(tok_name)
    missing = _openai_history("{}", None)
    assert "tool_calls" not in missing[3]
    null = _openai_history("{}", None)
    null[3]["tool_calls"] = None
    empty = _openai_history("{}", [])
    ids = [
        render_prompt(tok, normalize_openai_messages(raw), [BASH]).token_ids
        for raw in (missing, null, empty)
    ]
    assert ids[0] == ids[1] == ids[2]


def test_assistant_content_null_missing_empty_render_identically(smol_tokenizer):
    call = {"id": "c", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
    forms = [{}, {"content": None}, {"content": ""}, {"content": []}]
    ids = []
    for extra in forms:
        raw = [
            {"role": "user", "content": "x"},
            {"role": "assistant", "tool_calls": [call], **extra},
        ]
        ids.append(render_prompt(smol_tokenizer, normalize_openai_messages(raw), [BASH]).token_ids)
    assert all(i == ids[0] for i in ids)


def test_content_none_never_reaches_the_template(smol_tokenizer):
    msgs = [
        ChatMessage(role="system"),
        ChatMessage(role="user"),
        ChatMessage(role="assistant"),
        ChatMessage(role="tool"),
    ]
    r = render_prompt(smol_tokenizer, msgs)
    assert r.text == (
        "<|im_start|>system\n<|im_end|>\n<|im_start|>user\n<|im_end|>\n"
        "<|im_start|>assistant\n<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_tool_choice_rendering(smol_tokenizer):
    msgs = [ChatMessage(role="user", content="hi")]
    auto = render_prompt(smol_tokenizer, msgs, [BASH]).text
    none = render_prompt(smol_tokenizer, msgs, [BASH], ToolChoice(mode="none")).text
    required = render_prompt(smol_tokenizer, msgs, [BASH], ToolChoice(mode="required")).text
    named = render_prompt(smol_tokenizer, msgs, [BASH], ToolChoice(mode="function", name="bash"))
    assert "<tools>" in auto and "You must" not in auto
    assert none == render_prompt(smol_tokenizer, msgs).text
    assert "<tools>" not in none
    assert "</tool_call>\n\nYou must call at least one function in this turn.<|im_end|>" in required
    assert 'You must call the function "bash" in this turn.<|im_end|>' in named.text


def test_native_path_uses_the_template(native_tokenizer):
    msgs = _tool_use()
    text = render_prompt(native_tokenizer, msgs, [BASH, READ]).text
    assert "# Native Tools\n<tools>\n" in text
    assert "# Tools\n\nYou may call" not in text
    assert text.startswith("<|im_start|>system\nYou are Testy.\n\n# Native Tools")
    assert (
        '<|im_start|>assistant\n\n<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls"}}' in text
    )
    assert (
        "<|im_start|>user\n<tool_response>\nREADME.md\nsetup.py\n</tool_response><|im_end|>" in text
    )
    none = render_prompt(native_tokenizer, msgs, [BASH, READ], ToolChoice(mode="none")).text
    assert "<tools>" not in none and '{"name": "bash"' in none
    required = render_prompt(native_tokenizer, msgs, [BASH], ToolChoice(mode="required")).text
    assert required.startswith(
        "<|im_start|>system\nYou are Testy.\n\nYou must call at least one function in this turn."
        "\n\n# Native Tools"
    )


def test_native_consecutive_tool_results_share_a_span(native_tokenizer):
    r = render_prompt(native_tokenizer, _parallel_with_reasoning(), [BASH])
    assert r.message_spans[3] == r.message_spans[4]
    assert native_tokenizer.decode(r.token_ids[slice(*r.message_spans[3])]) == (
        "<|im_start|>user\n<tool_response>\n/home/u\n</tool_response>\n"
        "<tool_response>\nu\n</tool_response><|im_end|>\n"
    )


def test_template_that_rewrites_history_gets_coarse_exact_spans(smol_tokenizer):
    template = (
        "{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' + m.content }}"
        "{%- if loop.last %}{{- ' (last)' }}{%- endif %}{{- '<|im_end|>\\n' }}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    )
    tok = _with_template(smol_tokenizer, template)
    msgs = _plain()
    whole = render_prompt(tok, msgs, add_generation_prompt=False)
    r = render_prompt(tok, msgs)
    assert whole.message_spans == [(0, len(whole.token_ids))] * len(msgs)
    assert r.message_spans == whole.message_spans
    assert r.token_ids[: len(whole.token_ids)] == whole.token_ids


def test_template_rejection_is_client_error(smol_tokenizer):
    template = (
        "{%- for m in messages %}"
        "{%- if loop.index0 > 0 and m.role == messages[loop.index0 - 1].role %}"
        "{{- raise_exception('roles must alternate') }}{%- endif %}"
        "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endfor %}"
    )
    tok = _with_template(smol_tokenizer, template)
    msgs = [ChatMessage(role="user", content="a"), ChatMessage(role="user", content="b")]
    with pytest.raises(ClientInputError) as e:
        render_prompt(tok, msgs)
    assert e.value.status == 400 and "roles must alternate" in e.value.message
    one = render_prompt(tok, msgs[:1])
    assert one.message_spans == [(0, len(one.token_ids))] and one.text.endswith("a<|im_end|>\n")


def test_no_chat_template(smol_tokenizer):
    tok = _with_template(smol_tokenizer, None)
    with pytest.raises(ModelLoadError):
        render_prompt(tok, [ChatMessage(role="user", content="a")])


def test_assistant_message_text_format_and_round_trip(smol_tokenizer):
    msg = ChatMessage(
        role="assistant",
        reasoning="think first",
        content="Running two.",
        tool_calls=[_call("bash", {"cmd": "ls"}), _call("read_file", {"path": "ü.txt"})],
    )
    text = assistant_message_text(msg)
    assert text == (
        "<think>\nthink first\n</think>\nRunning two.\n"
        '<tool_call>{"name": "bash", "arguments": {"cmd": "ls"}}</tool_call>\n'
        '<tool_call>{"name": "read_file", "arguments": {"path": "ü.txt"}}</tool_call>'
    )
    rendered = render_prompt(smol_tokenizer, [ChatMessage(role="user", content="u"), msg]).text
    assert f"<|im_start|>assistant\n{text}<|im_end|>\n" in rendered
    parsed = parse_completion(text + "<|im_end|>", tools_enabled=True)
    assert (parsed.content, parsed.reasoning) == (msg.content, msg.reasoning)
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [
        (c.name, c.arguments) for c in msg.tool_calls
    ]
    assert assistant_message_text(ChatMessage(role="assistant")) == ""
    with pytest.raises(ValueError):
        assistant_message_text(ChatMessage(role="user", content="x"))


def test_rendered_prompt_is_plain_data(smol_tokenizer):
    r = render_prompt(smol_tokenizer, [ChatMessage(role="user", content="hi")])
    assert isinstance(r, RenderedPrompt)
    assert all(isinstance(t, int) for t in r.token_ids)
    generation_prompt = smol_tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False)
    assert r.message_spans == [(0, len(r.token_ids) - len(generation_prompt))]
    assert r.token_ids[r.message_spans[0][1] :] == generation_prompt


def test_text_prefix_that_is_not_a_token_boundary_is_merged(smol_tokenizer):
    tok = _with_template(smol_tokenizer, "{%- for m in messages %}{{- m.content }}{%- endfor %}")
    msgs = [ChatMessage(role="user", content="hel"), ChatMessage(role="user", content="lo world")]
    r = render_prompt(tok, msgs, add_generation_prompt=False)
    assert r.text == "hello world"
    assert tok.encode("hel", add_special_tokens=False) != r.token_ids[:1]
    assert r.message_spans == [(0, len(r.token_ids))] * 2
    clean = [ChatMessage(role="user", content="hello"), ChatMessage(role="user", content=" world")]
    assert render_prompt(tok, clean, add_generation_prompt=False).message_spans == [(0, 1), (1, 2)]
