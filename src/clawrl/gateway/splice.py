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

**A rewritten answer.** When a recorded answer could not be spliced because the template renders
it to other text (Gemma 3 trims it, Qwen3 drops its reasoning, a native-tools template writes its
tool calls its own way), the call is linked to that turn by its messages
(:mod:`clawrl.trajectory.history`) and :func:`describe_rewrite` says how its prompt differs from
the turn's sampled ids and where the messages after the answer start; the prompt stays what the
template rendered.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from clawrl.chat import ChatMessage, RenderedPrompt, control_ids, render_prompt
from clawrl.chat.tool_format import THINK_CLOSE
from clawrl.errors import ClientInputError
from clawrl.gateway.decode import decode
from clawrl.store import TurnRecord, output_hash
from clawrl.trajectory.history import HistoryChange

MAX_END_CANDIDATES = 16

_gen_cache: weakref.WeakKeyDictionary[Any, list[int] | None] = weakref.WeakKeyDictionary()
"""Generation-prompt ids per tokenizer object (weak keys: a tokenizer's id may be reused once
it is freed, so ids are no keys)."""


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
    edits: list[tuple[int, int, int]] = field(default_factory=list)
    """``(start, end, new length)`` of each replaced range of the rendered ids, in order."""

    def position(self, rendered_at: int) -> int:
        """Where position ``rendered_at`` of the rendered ids (one not inside a replaced range)
        is in :attr:`token_ids`."""
        return rendered_at + sum(n - (b - a) for a, b, n in self.edits if b <= rendered_at)


def message_output_hash(msg: ChatMessage) -> str:
    """The :func:`clawrl.store.output_hash` of an assistant history message."""
    calls = [{"name": c.name, "arguments": c.arguments} for c in msg.tool_calls]
    return output_hash(msg.content, calls)


def generation_prompt_ids(tokenizer: Any) -> list[int] | None:
    """The ids of the template's assistant opener (``<|im_start|>assistant\\n`` for ChatML).

    Found by rendering a probe conversation with and without the generation prompt; ``None``
    when the difference is not a clean token suffix (then nothing is spliced).
    """
    with contextlib.suppress(TypeError):  # not weak-referenceable: probed each time
        if tokenizer in _gen_cache:
            return _gen_cache[tokenizer]
    probe = [ChatMessage(role="user", content="probe")]
    with_gen = render_prompt(tokenizer, probe, add_generation_prompt=True)
    without = render_prompt(tokenizer, probe, add_generation_prompt=False)
    result: list[int] | None = None
    if with_gen.text.startswith(without.text) and len(with_gen.text) > len(without.text):
        gen_text = with_gen.text[len(without.text) :]
        ids = tokenizer.encode(gen_text, add_special_tokens=False)
        if ids and with_gen.token_ids[-len(ids) :] == ids:
            result = ids
    with contextlib.suppress(TypeError):
        _gen_cache[tokenizer] = result
    return result


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
    special = control_ids(tokenizer)
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
        result.edits.append((a, b, len(body)))
    result.spliced.reverse()
    result.edits.reverse()
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


_PROBE_ANSWER = "\x1fclawrl-probe-answer\x1f"
_end_cache: weakref.WeakKeyDictionary[Any, int | None] = weakref.WeakKeyDictionary()


def assistant_end_id(tokenizer: Any) -> int | None:
    """The special token the template ends an assistant message with when it renders one in
    history (``<|im_end|>``, ``<end_of_turn>``, gpt-oss's ``<|end|>``), found by rendering a
    probe conversation (user, assistant, user): the first special id among the first four ids
    after the probe answer's text; ``None`` when there is none or the template rejects it."""
    with contextlib.suppress(TypeError):  # not weak-referenceable: probed each time
        if tokenizer in _end_cache:
            return _end_cache[tokenizer]
    probe = [
        ChatMessage(role="user", content="probe"),
        ChatMessage(role="assistant", content=_PROBE_ANSWER),
        ChatMessage(role="user", content="probe"),
    ]
    found: int | None = None
    with contextlib.suppress(ClientInputError):  # the template rejects the probe: no end id
        text = render_prompt(tokenizer, probe, add_generation_prompt=False).text
        at = text.find(_PROBE_ANSWER)
        if at >= 0:
            after = tokenizer.encode(text[at + len(_PROBE_ANSWER) :], add_special_tokens=False)
            special = control_ids(tokenizer)
            found = next((int(i) for i in after[:4] if i in special), None)
    with contextlib.suppress(TypeError):
        _end_cache[tokenizer] = found
    return found


@dataclass(frozen=True)
class Rewrite:
    """How a call's prompt differs from the sampled ids of the turn it continues by messages.

    Attributes:
        changes: :class:`~clawrl.trajectory.history.HistoryChange` values, in that enum's order.
        next_state_at: where the ids after the re-rendered answer start in the call's prompt
            (``None``: not found).
    """

    changes: list[str]
    next_state_at: int | None


def describe_rewrite(
    tokenizer: Any,
    turn: TurnRecord,
    messages: Sequence[ChatMessage],
    rendered: RenderedPrompt,
    spliced: SpliceResult,
    prompt_ids: Sequence[int],
) -> Rewrite:
    """How ``prompt_ids`` (the call's, as the engine receives them) re-render ``turn``'s answer,
    ``messages[len(turn.request_messages)]``.

    The answer's ids in the prompt run from ``a`` to ``b``:

    * ``a``: where the prompt stops agreeing with ``turn``'s prompt (its prefill left out), at
      most that prompt's length. When they part inside the assistant opener (the generation
      prompt's ids at that prompt's end), the rest of the opener must begin the text from ``a``
      (a merge of its last token with the answer's first), else the history opens the answer
      otherwise (``rendering``: DeepSeek-R1's generation prompt adds ``<think>``). When they
      part before it, the earlier history was re-rendered too (``earlier_history``) and ``a`` is
      found instead right after the answer's opener in its message span
      (:attr:`RenderedPrompt.message_spans`);
    * ``b``: just after the first end token from ``a`` on within the answer's message span
      (``turn``'s last sampled id when it is special, the tokenizer's EOS, or the token the
      template ends an assistant message with, :func:`assistant_end_id`), unless the
      generation prompt's first id (a message opener) comes first; else the end of that span
      when the answer has one of its own. ``b`` is ``next_state_at``.

    Changes, comparing ``turn``'s sampled text (prefill + completion, decoded) with the text of
    ``prompt_ids[a:b]``: ``reasoning_dropped`` when the sampled text holds a reasoning block (up
    to ``</think>``) that the prompt's does not, which is then left out of the comparison; then,
    when the texts still differ, ``tool_call_json`` if the turn made tool calls, else
    ``whitespace`` if they differ in whitespace only, else ``rendering``; ``tokenization`` when
    nothing above differs. When the answer is not found, ``reasoning_dropped`` when the turn
    reasoned and the client's message carries none, and ``unknown``.
    """
    n = len(turn.request_messages)
    prefill = int((turn.sampling_params or {}).get("prefill_tokens", 0) or 0)
    head = turn.prompt_ids[: len(turn.prompt_ids) - prefill]
    gen = generation_prompt_ids(tokenizer) or []
    ids = list(prompt_ids)
    agree = _common_prefix(head, ids)
    changes: set[HistoryChange] = set()
    opener_rest = ""
    if agree < len(head) - len(gen):
        changes.add(HistoryChange.EARLIER_HISTORY)
        start = _opener_end(rendered, messages, n, gen, spliced)
    else:
        start = min(agree, len(head))
        opener_rest = decode(tokenizer, head[start:])
    end = None if start is None else _answer_end(tokenizer, turn, rendered, n, spliced, ids, start)
    if start is None or end is None:
        echoed = messages[n] if n < len(messages) else None
        if (turn.output or {}).get("reasoning") and (echoed is None or not echoed.reasoning):
            changes.add(HistoryChange.REASONING_DROPPED)
        changes.add(HistoryChange.UNKNOWN)
        return Rewrite(_ordered(changes), None)
    sampled = decode(tokenizer, recorded_body(turn))
    shown = decode(tokenizer, ids[start:end])
    if shown.startswith(opener_rest):
        shown = shown[len(opener_rest) :]
    else:
        changes.add(HistoryChange.RENDERING)
    if THINK_CLOSE in sampled and THINK_CLOSE not in shown:
        changes.add(HistoryChange.REASONING_DROPPED)
        sampled = sampled.split(THINK_CLOSE, 1)[1]
    if sampled != shown:
        if (turn.output or {}).get("tool_calls"):
            changes.add(HistoryChange.TOOL_CALL_JSON)
        elif "".join(sampled.split()) == "".join(shown.split()):
            changes.add(HistoryChange.WHITESPACE)
        else:
            changes.add(HistoryChange.RENDERING)
    if not changes:
        changes.add(HistoryChange.TOKENIZATION)
    return Rewrite(_ordered(changes), end)


def _ordered(changes: set[HistoryChange]) -> list[str]:
    return [c.value for c in HistoryChange if c in changes]


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _opener_end(
    rendered: RenderedPrompt,
    messages: Sequence[ChatMessage],
    n: int,
    gen: list[int],
    spliced: SpliceResult,
) -> int | None:
    """Where message ``n``'s body starts in the spliced prompt: right after its assistant opener
    inside its span (counting the assistant messages that share the span before it)."""
    spans = rendered.message_spans
    if not gen or n >= len(spans):
        return None
    start, end = spans[n]
    before = sum(1 for i in range(n) if spans[i] == spans[n] and messages[i].role == "assistant")
    ids = rendered.token_ids
    found = [p for p in range(start, end - len(gen) + 1) if ids[p : p + len(gen)] == gen]
    return spliced.position(found[before] + len(gen)) if len(found) > before else None


def _answer_end(
    tokenizer: Any,
    turn: TurnRecord,
    rendered: RenderedPrompt,
    n: int,
    spliced: SpliceResult,
    ids: list[int],
    start: int,
) -> int | None:
    """Just after the end token of the answer that starts at ``start`` (see
    :func:`describe_rewrite`), or ``None``."""
    special = control_ids(tokenizer)
    enders = {i for i in (tokenizer.eos_token_id, assistant_end_id(tokenizer)) if i is not None}
    if turn.completion_ids and turn.completion_ids[-1] in special:
        enders.add(turn.completion_ids[-1])
    gen = generation_prompt_ids(tokenizer) or []
    opener = gen[0] if gen and gen[0] in special and gen[0] not in enders else None
    spans = rendered.message_spans
    limit = spliced.position(spans[n][1]) if n < len(spans) else len(ids)
    found = next((i for i in range(start, min(limit, len(ids))) if ids[i] in enders), None)
    if found is not None:
        return None if opener in ids[start:found] else found + 1
    if n + 1 < len(spans) and spans[n][1] <= spans[n + 1][0]:
        return limit
    return None
