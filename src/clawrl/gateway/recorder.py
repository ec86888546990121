"""Turning one call's choices into store turns, written durably before the client hears back.

One turn per choice (``choice_index``), with: session and parent hint, prompt ids exactly as the
engine got them, sampled completion ids and their sampling log-probs, sampling params, policy
version, finish reason, parsed output, latency, time to first token, client identity and the
error kind if any. Status and trainability:

* ``ok`` — the completion finished (stop or length) and was answered: trainable;
* ``incomplete`` — the client disconnected mid-stream (or a sibling choice failed): never
  trainable (reason ``incomplete``), ``finish_reason="aborted"``;
* ``error`` — the engine failed or the prompt did not fit: never trainable (reason ``error``),
  no completion unless tokens were sampled before the failure.

An ``ok`` turn is still untrainable (with its reason) when it was an evaluation request, was
sampled with top-k / top-p (``truncated_sampling``: its log-probs are of the truncated
distribution, the trainer's and the OPD teacher's of the full one), or stopped inside an
unclosed ``<think>`` (``unclosed_reasoning``: a tool call after it never reached the client), or
was sampled with a user's own adapter while nothing trains users' adapters (``user_adapter``:
its log-probs are not the shared policy's; with per-user training, ``CallContext.adapter_trained``,
it is trainable: for that user's adapter only, :func:`clawrl.trainer.samples.decide`).

Side calls (:attr:`PreparedCall.side_kind`) are recorded with kind ``side``, untrainable with
reason ``side_call`` (data, never loss); messages left out
of the prompt are listed in ``sampling_params["dropped_messages"]``.

Writes go through :meth:`clawrl.store.Store.record_turns` (one transaction per write, committed
and fsynced on return; a new session's row is written with its first turn) in a worker thread,
shielded from cancellation so a disconnecting client cannot interrupt them.
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

from clawrl.chat import ParsedCompletion
from clawrl.engine import FinishReason, SamplingParams
from clawrl.engine.sampling import is_greedy
from clawrl.gateway.prepare import PreparedCall
from clawrl.store import (
    ApiProtocol,
    TurnKind,
    TurnRecord,
    TurnStatus,
    UntrainableReason,
    new_id,
)

if TYPE_CHECKING:
    from clawrl.gateway.state import GatewayState

log = logging.getLogger(__name__)


@dataclass
class CallContext:
    """What every choice of one call shares.

    Attributes:
        prepared: the rendered, attributed call.
        client: request facts (user-agent, remote address, key fingerprint, request id,
            retry count, attribution).
        sampling: the request-level sampling params to store (JSON object).
        created_at: seconds since the epoch when the request arrived.
        started: ``time.perf_counter()`` when the request arrived.
        protocol: the client API.
        user_id: whose request it is (:func:`clawrl.gateway.users.resolve_user`; ``""``: none).
        adapter_trained: this server trains each user's adapter (``--per-user-adapters`` with
            a method): a turn sampled with one stays trainable, for that user's learner.
    """

    prepared: PreparedCall
    client: dict[str, Any]
    sampling: dict[str, Any]
    created_at: float = field(default_factory=time.time)
    started: float = field(default_factory=time.perf_counter)
    protocol: ApiProtocol = ApiProtocol.OPENAI_CHAT
    user_id: str = ""
    adapter_trained: bool = False


@dataclass
class ChoiceResult:
    """One choice's outcome, as the gateway saw it.

    Attributes:
        index: the choice index.
        params: the engine sampling params of this choice.
        token_ids: sampled ids so far, shape ``[c]``.
        sampling_logprobs: their sampling log-probs, shape ``[c]``.
        top_logprobs: per sampled token, ``[(token_id, logprob), ...]`` alternatives when the
            client asked for them (never stored).
        finish_reason: what the client was (or would have been) told: ``stop``, ``length``,
            ``tool_calls``, or ``aborted`` for incomplete turns.
        parsed: the parsed output sent to the client.
        policy_version: the version that sampled the tokens.
        adapter_version: the version of the user's adapter that sampled them with it
            (``None``: the policy alone).
        ttft_s: seconds from request arrival to the first sampled token.
        latency_s: seconds from request arrival to the last sampled token.
        status: ok, incomplete or error.
        error: the exception for error turns.
        error_kind: its :func:`clawrl.gateway.errors.error_kind`.
        turn_id: the id the turn is recorded under (known before recording).
    """

    index: int
    params: SamplingParams
    token_ids: list[int] = field(default_factory=list)
    sampling_logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    finish_reason: str | None = None
    parsed: ParsedCompletion | None = None
    policy_version: int = 0
    adapter_version: int | None = None
    ttft_s: float | None = None
    latency_s: float | None = None
    status: TurnStatus = TurnStatus.OK
    error: BaseException | None = None
    error_kind: str | None = None
    turn_id: str = field(default_factory=new_id)


def finish_reason_for(engine_finish: FinishReason | str | None, parsed: ParsedCompletion) -> str:
    """OpenAI's finish reason: ``tool_calls`` when a normal stop produced tool calls."""
    if engine_finish == FinishReason.LENGTH:
        return "length"
    if engine_finish == FinishReason.ABORTED:
        return "aborted"
    return "tool_calls" if parsed.tool_calls else "stop"


def output_json(parsed: ParsedCompletion | None) -> dict[str, Any] | None:
    """The turn's ``output`` column: ``{"content", "reasoning", "tool_calls": [{id, name,
    arguments}]}``."""
    if parsed is None:
        return None
    return {
        "content": parsed.content,
        "reasoning": parsed.reasoning,
        "tool_calls": [
            {"id": c.id, "name": c.name, "arguments": c.arguments} for c in parsed.tool_calls
        ],
    }


def build_turn(ctx: CallContext, choice: ChoiceResult) -> TurnRecord:
    """The :class:`~clawrl.store.TurnRecord` of one choice."""
    p = ctx.prepared
    sampling = {
        **ctx.sampling,
        "max_tokens": choice.params.max_tokens,
        "temperature": choice.params.temperature,
        "top_p": choice.params.top_p,
        "top_k": choice.params.top_k,
        "seed": choice.params.seed,
        "stop": list(choice.params.stop),
        "logprobs_top_k": choice.params.logprobs_top_k,
        "prefill_tokens": p.prefill_tokens,
    }
    if p.dropped:
        sampling["dropped_messages"] = list(p.dropped)
    trainable = choice.status == TurnStatus.OK
    reason = None
    if choice.status == TurnStatus.INCOMPLETE:
        reason = UntrainableReason.INCOMPLETE.value
    elif choice.status == TurnStatus.ERROR:
        reason = UntrainableReason.ERROR.value
    elif not choice.token_ids:
        trainable, reason = False, UntrainableReason.NO_COMPLETION.value
    elif p.side_kind:
        trainable, reason = False, UntrainableReason.SIDE_CALL.value
    elif ctx.client.get("eval"):
        trainable, reason = False, UntrainableReason.EVAL.value
    elif truncated_sampling(choice.params):
        trainable, reason = False, UntrainableReason.TRUNCATED_SAMPLING.value
    elif choice.adapter_version is not None and not ctx.adapter_trained:  # not the shared policy's
        trainable, reason = False, UntrainableReason.USER_ADAPTER.value
    elif (
        choice.parsed is not None
        and choice.parsed.reasoning_open
        and (choice.finish_reason != "length")
    ):
        trainable, reason = False, UntrainableReason.UNCLOSED_REASONING.value
    return TurnRecord(
        id=choice.turn_id,
        session_id=p.session_id,
        prompt_ids=list(p.prompt_ids),
        completion_ids=list(choice.token_ids),
        sampling_logprobs=list(choice.sampling_logprobs),
        parent_turn_id=p.parent_turn_id,
        kind=TurnKind.SIDE if p.side_kind else TurnKind.MAIN,
        side_kind=p.side_kind,
        protocol=ctx.protocol,
        request_messages=[m.model_dump(mode="json") for m in p.messages],
        tools=[t.openai_format() for t in p.tools] or None,
        sampling_params=sampling,
        policy_version=choice.policy_version,
        finish_reason=choice.finish_reason,
        status=choice.status,
        error_kind=choice.error_kind,
        error_message=None if choice.error is None else str(choice.error)[:2000],
        output=output_json(choice.parsed),
        latency_s=choice.latency_s,
        ttft_s=choice.ttft_s,
        client=ctx.client,
        session_source=p.session_source,
        memory=p.memory,
        user_id=ctx.user_id,
        adapter_version=choice.adapter_version,
        trainable=trainable,
        untrainable_reason=reason,
        created_at=ctx.created_at,
        choice_index=choice.index,
    )


def truncated_sampling(params: SamplingParams) -> bool:
    """Whether the completion was sampled from a top-k / top-p truncated distribution (its
    sampling log-probs are then not comparable with the trainer's full-vocabulary ones: such
    turns are recorded, answered, and never trained on). Greedy decoding is not truncation."""
    if is_greedy(params.temperature):
        return False
    return params.top_k > 0 or params.top_p < 1.0


def notify_listeners(gw: GatewayState, turns: list[TurnRecord]) -> None:
    """Tell :attr:`GatewayState.turn_listeners` about one call's turns (a console line per
    call); a listener that fails is logged, never the call's failure."""
    for listener in gw.turn_listeners:
        try:
            listener(turns)
        except Exception:  # a console line must never fail a recorded call
            log.exception("a turn listener failed")


async def record_choices(
    gw: GatewayState, ctx: CallContext, choices: list[ChoiceResult], *, notify: bool = True
) -> list[TurnRecord]:
    """Record the choices' turns durably (worker thread, shielded from cancellation), count
    them in the metrics, then (``notify``) tell the turn listeners (:func:`notify_listeners`).
    A stream records each choice as it finishes and notifies once, when the call ends.

    Returns:
        The recorded turns, in choice order.

    Raises:
        StoreError: a turn could not be written (the caller answers 500: not acknowledged).
    """
    turns = [build_turn(ctx, c) for c in choices]
    metrics = gw.metrics
    with anyio.CancelScope(shield=True):
        await anyio.to_thread.run_sync(
            functools.partial(gw.store.record_turns, turns, session=ctx.prepared.new_session)
        )
    if notify:
        notify_listeners(gw, turns)
    for turn in turns:
        metrics.inc("clawrl_gateway_turns_recorded_total", status=turn.status.value)
        metrics.inc("clawrl_gateway_prompt_tokens_total", len(turn.prompt_ids))
        metrics.inc("clawrl_gateway_completion_tokens_total", len(turn.completion_ids))
        if turn.untrainable_reason is not None:
            metrics.inc("clawrl_gateway_untrainable_turns_total", reason=turn.untrainable_reason)
        if turn.ttft_s is not None:
            metrics.observe("clawrl_gateway_ttft_seconds", turn.ttft_s)
    return turns
