"""Exact ids across turns: splice recorded completions back into re-rendered history.

Principle 1 (chat outside, tokens inside) meets a practical problem: a client sends the
assistant's earlier answer back as *text*, and the chat template re-tokenizes it. The policy
sampled ``"Hello<|im_end|>"`` as, say, ``[19556, 2]``; the template may render the same text as
different ids, and it puts the turn framing (``<|im_start|>assistant\\n`` … ``<|im_end|>\\n``)
around it. Then the next prompt no longer extends ``prompt + completion`` of the earlier call,
and linking calls into a trajectory by ids fails.

**The rule.** For each assistant message of the request's history:

1. Hash it with :func:`clawrl.store.output_hash` (content and tool calls; reasoning and tool-call
   ids excluded) and look up recorded turns with that output hash — in the attributed session,
   then (if none there, or no session is known yet) in any session.
2. Its body in the rendered prompt is found inside its token span
   (:attr:`clawrl.chat.RenderedPrompt.message_spans`) right after the template's assistant
   opener (the generation-prompt ids, e.g. ``<|im_start|>assistant\\n``).
3. The recorded body is what the policy produced after that opener: the turn's prefilled ids
   (``sampling_params["prefill_tokens"]`` tokens at the end of its prompt, for forced tool
   calls) followed by its sampled completion ids — which end with the EOS token when the
   completion stopped normally.
4. Only when the recorded body decodes to exactly the same text as a run of the rendered ids
   starting at the body's start are those ids replaced by the recorded ones. A client that
   edited the message (or dropped its reasoning, or a stop string cut it) gets the template's
   re-rendering, and the trajectory starts a new segment there: mismatched ids are never
   spliced.
5. Second chance, for what the gateway itself normalised: the answer's parse strips whitespace
   around the content (and a tool call is re-serialised), so a client that echoes our answer
   verbatim can differ from the sampled text in whitespace only. When step 4 finds no run, the
   rendered body is taken up to the first special token after the opener (``<|im_end|>``); if
   its text equals the recorded body's text with all whitespace runs collapsed, it is replaced
   (the rendered end token too when the recorded body ends with its own). The output hash
   matched already, so the client did not change the message's content.

The prompt text is unchanged by a splice (same decoded text), only its tokenization.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from clawrl.chat import ChatMessage, RenderedPrompt, render_prompt
from clawrl.gateway.decode import decode
from clawrl.store import TurnRecord, output_hash

MAX_END_CANDIDATES = 16

_gen_cache: dict[int, list[int] | None] = {}


@dataclass
class SpliceResult:
    """Prompt ids after splicing.

    Attributes:
        token_ids: the ids to send to the engine, shape ``[p]``.
        spliced: ``(message index, turn id)`` of each message whose ids were replaced.
        matched: ``(message index, turn id)`` of each message found recorded, replaced or
            already identical.
    """

    token_ids: list[int]
    spliced: list[tuple[int, str]] = field(default_factory=list)
    matched: list[tuple[int, str]] = field(default_factory=list)


def message_output_hash(msg: ChatMessage) -> str:
    """The :func:`clawrl.store.output_hash` of an assistant history message."""
    calls = [{"name": c.name, "arguments": c.arguments} for c in msg.tool_calls]
    return output_hash(msg.content, calls)


def generation_prompt_ids(tokenizer: Any) -> list[int] | None:
    """The ids of the template's assistant opener (``<|im_start|>assistant\\n`` for ChatML).

    Found by rendering a probe conversation with and without the generation prompt; ``None``
    when the difference is not a clean token suffix (then nothing is spliced).
    """
    key = id(tokenizer)
    if key not in _gen_cache:
        probe = [ChatMessage(role="user", content="probe")]
        with_gen = render_prompt(tokenizer, probe, add_generation_prompt=True)
        without = render_prompt(tokenizer, probe, add_generation_prompt=False)
        result: list[int] | None = None
        if with_gen.text.startswith(without.text) and len(with_gen.text) > len(without.text):
            gen_text = with_gen.text[len(without.text) :]
            ids = tokenizer.encode(gen_text, add_special_tokens=False)
            if ids and with_gen.token_ids[-len(ids) :] == ids:
                result = ids
        _gen_cache[key] = result
    return _gen_cache[key]


def recorded_body(turn: TurnRecord) -> list[int]:
    """What the policy produced after the assistant opener: prefilled ids + sampled ids."""
    k = int((turn.sampling_params or {}).get("prefill_tokens", 0) or 0)
    prefill = turn.prompt_ids[len(turn.prompt_ids) - k :] if k > 0 else []
    return [*prefill, *turn.completion_ids]


def splice_history(
    tokenizer: Any,
    messages: Sequence[ChatMessage],
    rendered: RenderedPrompt,
    find_turns: Callable[[str], list[TurnRecord]],
) -> SpliceResult:
    """Replace the ids of recorded assistant messages by their exact recorded ids.

    Args:
        tokenizer: the policy's tokenizer.
        messages: the request's messages, as rendered.
        rendered: :func:`clawrl.chat.render_prompt` of ``messages``.
        find_turns: ``output_hash -> candidate turns`` (newest first; the caller scopes it to
            the session and falls back to every session).

    Returns:
        The spliced ids (``rendered.token_ids`` when nothing matched) and what was spliced.
    """
    gen = generation_prompt_ids(tokenizer)
    ids = list(rendered.token_ids)
    result = SpliceResult(token_ids=ids)
    if not gen:
        return result
    special = frozenset(getattr(tokenizer, "all_special_ids", ()) or ())
    replacements: list[tuple[int, int, list[int], int, str]] = []
    used_starts: set[int] = set()
    for i, msg in enumerate(messages):
        if msg.role != "assistant" or not (msg.content or msg.tool_calls):
            continue
        turns = [t for t in find_turns(message_output_hash(msg)) if t.completion_ids]
        if not turns:
            continue  # (spans are computed only when a message was recorded: they cost renders)
        if i >= len(rendered.message_spans):
            break
        start, end = rendered.message_spans[i]
        for turn in turns:
            body = recorded_body(turn)
            found = _locate(tokenizer, ids, start, end, gen, body, special, used_starts)
            if found is None:
                continue
            a, b = found
            used_starts.add(a)
            result.matched.append((i, turn.id))
            if ids[a:b] != body:
                replacements.append((a, b, body, i, turn.id))
            break
    for a, b, body, i, turn_id in sorted(replacements, reverse=True):
        ids[a:b] = body
        result.spliced.append((i, turn_id))
    result.spliced.reverse()
    result.token_ids = ids
    return result


def _locate(
    tokenizer: Any,
    ids: list[int],
    start: int,
    end: int,
    gen: list[int],
    body: list[int],
    special: frozenset[int],
    used: set[int],
) -> tuple[int, int] | None:
    """``(a, b)`` such that ``ids[a:b]`` decodes like ``body`` and follows an opener in the span."""
    target = decode(tokenizer, body)
    n = len(gen)
    for p in range(start, max(start, end - n) + 1):
        if ids[p : p + n] != gen or p + n in used:
            continue
        a = p + n
        if ids[a : a + len(body)] == body:
            return a, a + len(body)
        ends = [
            b
            for b in range(a + 1, end + 1)
            if ids[b - 1] == body[-1] or (b < end and ids[b] in special)
        ]
        for b in ends[:MAX_END_CANDIDATES]:
            if decode(tokenizer, ids[a:b]) == target:
                return a, b
    return _locate_modulo_whitespace(tokenizer, ids, start, end, gen, body, special, used)


def _squash(text: str) -> str:
    return " ".join(text.split())


def _locate_modulo_whitespace(
    tokenizer: Any,
    ids: list[int],
    start: int,
    end: int,
    gen: list[int],
    body: list[int],
    special: frozenset[int],
    used: set[int],
) -> tuple[int, int] | None:
    """Rule 5: the rendered body up to its end token equals the recorded one but for spaces."""
    target = _squash(decode(tokenizer, body))
    n = len(gen)
    for p in range(start, max(start, end - n) + 1):
        if ids[p : p + n] != gen or p + n in used:
            continue
        a = p + n
        e = next((b for b in range(a, end) if ids[b] in special), None)
        if e is None or _squash(decode(tokenizer, ids[a:e])) != target:
            continue
        return a, (e + 1 if body and body[-1] in special else e)
    return None
