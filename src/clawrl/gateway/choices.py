"""Per-choice assembly of what the client sees: text, parsed output, logprobs, finish reason.

Shared by the streamed and the non-streamed paths so both give the same answer for the same
sampled ids. The text parsed is the prefill (forced tool-call opening, if any) followed by the
client-visible completion text (:mod:`clawrl.gateway.decode`), parsed in the policy's own format:
its native tool-call format and its chat template's stop markers
(:func:`clawrl.chat.completion_format`).
"""

from __future__ import annotations

import time
from typing import Any

from clawrl.chat import (
    ContentDelta,
    ParsedCompletion,
    ReasoningDelta,
    StreamingParser,
    ToolCallEvent,
    completion_format,
    parse_completion,
)
from clawrl.engine import Completion, FinishReason, SamplingParams, TokenEvent
from clawrl.gateway.decode import TextAssembler, visible_text
from clawrl.gateway.recorder import ChoiceResult, finish_reason_for
from clawrl.store import TurnStatus


def limit_calls(parsed: ParsedCompletion, parallel_tool_calls: bool) -> ParsedCompletion:
    """Keep only the first tool call when the client asked for ``parallel_tool_calls: false``."""
    if parallel_tool_calls or len(parsed.tool_calls) <= 1:
        return parsed
    return parsed.model_copy(update={"tool_calls": parsed.tool_calls[:1]})


def complete_choice(
    tokenizer: Any,
    index: int,
    params: SamplingParams,
    completion: Completion,
    *,
    stop_token_ids: frozenset[int],
    prefill_text: str,
    tools_enabled: bool,
    parallel_tool_calls: bool,
    started: float,
    admitted: float,
) -> ChoiceResult:
    """The :class:`ChoiceResult` of a finished, non-streamed completion.

    Args:
        started: ``perf_counter()`` when the request arrived.
        admitted: ``perf_counter()`` when the engine was called (its ttft/latency count from
            there).
    """
    text, _ = visible_text(tokenizer, completion.token_ids, stop_token_ids, params.stop)
    fmt = completion_format(tokenizer)
    parsed = parse_completion(
        prefill_text + text, tools_enabled=tools_enabled, stop_markers=fmt.stop_markers,
        tool_format=fmt.tool_call_format,
    )  # fmt: skip
    parsed = limit_calls(parsed, parallel_tool_calls)
    offset = admitted - started
    return ChoiceResult(
        index=index,
        params=params,
        token_ids=list(completion.token_ids),
        sampling_logprobs=list(completion.logprobs),
        top_logprobs=list(completion.top_logprobs),
        finish_reason=finish_reason_for(completion.finish_reason, parsed),
        parsed=parsed,
        policy_version=completion.policy_version,
        adapter_version=completion.adapter_version,
        ttft_s=offset + completion.time_to_first_token if completion.token_ids else None,
        latency_s=offset + completion.latency,
    )


class StreamedChoice:
    """One choice of a streamed response, fed token by token.

    Args:
        tokenizer: the policy's tokenizer.
        result: the choice's record-to-be (ids, logprobs and timings are appended to it).
        stop_token_ids: ids that end a completion (not part of its text).
        prefill_text: forced text before the sampled tokens (parsed, never streamed as text).
        tools_enabled: whether tool-call markup is parsed.
        parallel_tool_calls: ``False`` keeps only the first tool call.
        started: ``perf_counter()`` when the request arrived.
    """

    def __init__(
        self,
        tokenizer: Any,
        result: ChoiceResult,
        *,
        stop_token_ids: frozenset[int],
        prefill_text: str,
        tools_enabled: bool,
        parallel_tool_calls: bool,
        started: float,
    ) -> None:
        self.result = result
        self.calls_sent = 0
        self.finished = False
        self.recorded = False
        self._started = started
        self._parallel = parallel_tool_calls
        self._assembler = TextAssembler(tokenizer, stop_token_ids, result.params.stop)
        fmt = completion_format(tokenizer)
        self._parser = StreamingParser(
            tools_enabled=tools_enabled, stop_markers=fmt.stop_markers,
            tool_format=fmt.tool_call_format,
        )  # fmt: skip
        if prefill_text:
            self._parser.feed(prefill_text)

    def push(self, ev: TokenEvent) -> tuple[str, str, list[Any]]:
        """Add one sampled token; return the new ``(content, reasoning, tool_calls)`` to send."""
        r = self.result
        now = time.perf_counter() - self._started
        if not r.token_ids:
            r.ttft_s = now
        r.token_ids.append(ev.token_id)
        r.sampling_logprobs.append(ev.logprob)
        r.top_logprobs.append(ev.top_logprobs)
        r.policy_version = ev.policy_version
        r.adapter_version = ev.adapter_version
        r.latency_s = now
        last = ev.finish_reason is not None
        delta = self._assembler.push(ev.token_id, last=last)
        events = self._parser.feed(delta) if delta else []
        if last:
            events += self._parser.finish()
            self.finished = True
            parsed = limit_calls(self._parser.result, self._parallel)
            r.parsed = parsed
            r.finish_reason = finish_reason_for(ev.finish_reason, parsed)
        return self._split(events)

    def abort(self) -> None:
        """Mark the choice cut short (client gone, sibling failed): incomplete, never trained."""
        if self.finished:
            return
        self.finished = True
        self._assembler.finish()
        self._parser.finish()
        self.result.parsed = limit_calls(self._parser.result, self._parallel)
        self.result.status = TurnStatus.INCOMPLETE
        self.result.finish_reason = FinishReason.ABORTED.value

    def _split(self, events: list[Any]) -> tuple[str, str, list[Any]]:
        content = "".join(e.text for e in events if isinstance(e, ContentDelta))
        reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
        calls = [e.call for e in events if isinstance(e, ToolCallEvent)]
        if not self._parallel:
            calls = calls[: max(0, 1 - self.calls_sent)]
        self.calls_sent += len(calls)
        return content, reasoning, calls
