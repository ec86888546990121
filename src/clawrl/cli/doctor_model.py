"""``clawrl doctor --model SPEC``: will this model work with clawrl, before anything fails?

Each check is one row (name, verdict, detail, and what to do when it fails):

1. **load**: the spec resolves and loads (architecture, parameters, where the weights are).
2. **chat template**: the tokenizer has one (or ``--chat-template`` gave one), and it renders a
   plain conversation.
3. **stop ids**: the ids that end an answer (:func:`clawrl.models.stops.stop_ids`), with their
   tokens; the template's end-of-turn token must be among them.
4. **tools**: a conversation with a tool, an assistant tool call and its result renders (native
   tool format or clawrl's text format), and the assistant's tool call, as the template writes
   it, parses back to the same call (render -> parse round trip).
5. **context**: the context window; harness prompts (system prompt + tools) are tens of
   thousands of tokens.
6. **generation**: one short greedy answer through the in-process engine (tokens/s; whether it
   ended on a stop id or ran to the token limit).
7. **judge**: which model the default judge reads (it judges any policy's turns).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from clawrl.config import Config
from clawrl.errors import ClawrlError

HARNESS_CONTEXT = 16_384
"""Below this many tokens a harness's first prompt (system prompt plus tools) may not fit."""


@dataclass
class Check:
    """One row of the report: ``ok`` True (good), False (will fail), None (a warning)."""

    name: str
    ok: bool | None
    detail: str


def _probe_conversation() -> tuple[list[Any], list[Any]]:
    from clawrl.chat import ChatMessage, ToolCall, ToolSpec

    tool = ToolSpec(
        name="get_weather",
        description="The weather in a city.",
        parameters={"type": "object", "properties": {"city": {"type": "string"}},
                    "required": ["city"]},
    )  # fmt: skip
    call = ToolCall(id="call_1", name="get_weather", arguments={"city": "Paris"})
    messages = [
        ChatMessage(role="user", content="What is the weather in Paris?"),
        ChatMessage(role="assistant", content=None, tool_calls=[call]),
        ChatMessage(role="tool", content='{"temp_c": 21}', tool_call_id="call_1"),
        ChatMessage(role="user", content="Thanks. And in Rome?"),
    ]
    return messages, [tool]


def _tool_round_trip(tokenizer: Any) -> Check:
    """Render the probe conversation with and without its tool call and parse the difference."""
    from clawrl.chat import (
        completion_format,
        parse_completion,
        render_prompt,
        supports_native_tools,
    )

    messages, tools = _probe_conversation()
    native = supports_native_tools(tokenizer)
    how = "the template's native tool format" if native else "clawrl's text tool format"
    how += f" (tool calls parsed as {completion_format(tokenizer).tool_call_format})"
    try:
        whole = render_prompt(tokenizer, messages, tools).text
        before = render_prompt(tokenizer, messages[:1], tools).text
    except ClawrlError as e:
        return Check("tools", False, f"a conversation with a tool call does not render: {e}")
    # the assistant's text: what the template writes after the generation prompt for the call
    after_prompt = whole[len(before) :] if whole.startswith(before) else None
    if after_prompt is None:
        return Check(
            "tools",
            None,
            f"renders with {how}, but the template rewrites the history before an assistant "
            "tool call (the call's text could not be isolated to check that it parses back)",
        )
    fmt = completion_format(tokenizer)
    parsed = parse_completion(
        after_prompt, tools_enabled=True, stop_markers=fmt.stop_markers,
        tool_format=fmt.tool_call_format,
    )  # fmt: skip
    got = [(c.name, c.arguments) for c in parsed.tool_calls]
    want = [(c.name, c.arguments) for c in messages[1].tool_calls]
    if got[:1] == want:
        return Check("tools", True, f"{how}; an assistant tool call parses back as written")
    return Check(
        "tools",
        False,
        f"with {how}, the assistant's tool call as the template writes it parses back as "
        f"{got or 'no tool call'}, not {want}: the model's tool calls will reach clients as "
        "text. Give a template whose tool calls clawrl parses (Hermes <tool_call>, Llama 3 "
        "JSON, Mistral [TOOL_CALLS]) with --chat-template",
    )


def model_checks(config: Config, *, generate: bool = True) -> list[Check]:
    """Run the checks of the module docstring on ``config.model``; never raises for the model's
    faults (they become failed checks)."""
    from clawrl.runtime import judge_model_spec, load_model

    checks: list[Check] = []
    spec = config.model.spec
    t0 = time.perf_counter()
    try:
        policy = load_model(config)
    except ClawrlError as e:
        return [Check("load", False, str(e))]
    model, tok = policy.model, policy.tokenizer
    params = sum(p.numel() for p in model.parameters())
    checks.append(Check(
        "load", True,
        f"{type(model).__name__} ({model.config.model_type}), {params / 1e6:.0f}M parameters, "
        f"{policy.path or spec}, {time.perf_counter() - t0:.1f} s",
    ))  # fmt: skip
    if not tok.chat_template:
        checks.append(Check(
            "chat template", False,
            "the tokenizer has no chat template (a base model?): give one with --chat-template "
            "FILE (or --set model.chat_template=FILE); the trl package ships many real ones "
            "under trl/chat_templates/ (gemma3.jinja, llama3_2.jinja, qwen3.jinja, ...)",
        ))  # fmt: skip
        return checks
    from clawrl.chat import ChatMessage, render_prompt

    source = "from --chat-template" if config.model.chat_template else "the tokenizer's own"
    try:
        rendered = render_prompt(tok, [ChatMessage(role="user", content="Hi")])
    except ClawrlError as e:
        checks.append(Check("chat template", False, f"{source}, but it fails to render: {e}"))
        return checks
    checks.append(Check("chat template", True, f"{source}; a one-message prompt is "
                        f"{len(rendered.token_ids)} tokens"))  # fmt: skip
    checks.append(_stop_check(policy))
    checks.append(_tool_round_trip(tok))
    window = policy.max_context
    checks.append(Check(
        "context", True if window >= HARNESS_CONTEXT else None,
        f"{window} tokens"
        + ("" if window >= HARNESS_CONTEXT else
           f" (< {HARNESS_CONTEXT}: a harness's system prompt and tools may not fit; such "
           "calls get 400 context_length_exceeded)"),
    ))  # fmt: skip
    if generate:
        checks.append(_generation_check(policy, rendered.token_ids))
    checks.append(Check("judge", True, f"the default judge (head) reads {judge_model_spec(config)}"
                        " and judges any policy's turns from their next state"))  # fmt: skip
    return checks


def _stop_check(policy: Any) -> Check:
    from clawrl.engine.inputs import policy_eos_ids
    from clawrl.models import template_end_of_turn_ids

    tok = policy.tokenizer
    ids = sorted(policy_eos_ids(policy))
    shown = ", ".join(f"{i} {tok.convert_ids_to_tokens(i)!r}" for i in ids)
    eot = template_end_of_turn_ids(tok)
    if not eot:
        return Check(
            "stop ids", None,
            f"{shown}; the template puts no special token after an answer, so only these end "
            "one: add the end-of-turn token with --set model.stop_ids=[ID]",
        )  # fmt: skip
    return Check("stop ids", True, f"{shown} (the template's end of turn: "
                 f"{', '.join(repr(tok.convert_ids_to_tokens(i)) for i in eot)})")  # fmt: skip


def _generation_check(policy: Any, prompt: list[int]) -> Check:
    from clawrl.engine import SamplingParams, TransformersEngine
    from clawrl.engine.types import FinishReason

    engine = TransformersEngine.from_policy(policy, max_batch=1)
    try:
        t0 = time.perf_counter()
        c = asyncio.run(engine.generate(prompt, SamplingParams(max_tokens=24, temperature=0.0)))
        dt = time.perf_counter() - t0
    except ClawrlError as e:
        return Check("generation", False, f"the engine failed: {e}")
    finally:
        engine.close()
    text = policy.tokenizer.decode(c.token_ids, skip_special_tokens=True).strip()
    rate = f"{len(c.token_ids)} tokens in {dt:.1f} s ({len(c.token_ids) / dt:.1f} tok/s)"
    if c.finish_reason == FinishReason.STOP:
        return Check("generation", True, f"{rate}, ended on a stop id: {text[:80]!r}")
    return Check(
        "generation", None,
        f"{rate}, ran to the 24-token limit without a stop id ({text[:80]!r}): fine for a long "
        "answer; if the model writes past its turn, a stop id is missing (--set "
        "model.stop_ids=[ID])",
    )  # fmt: skip
