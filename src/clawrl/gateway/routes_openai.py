"""OpenAI-compatible routes: ``POST /v1/chat/completions``, ``GET /v1/models[/{id}]``.

The same router is mounted at ``/`` and at ``/s/{session_id}`` (session attribution by URL).

A chat call, start to end:

1. check the body's fields (:func:`clawrl.gateway.schemas.check_supported`);
2. in a worker thread: normalise, render, splice recorded ids, attribute the session
   (:func:`clawrl.gateway.prepare.prepare_call`); a client mistake here is a 400 and no turn;
3. a prompt that does not fit the context window is recorded as an error turn, then a 400;
4. generate ``n`` choices concurrently (streamed or not);
5. record one turn per choice (committed before the response or the stream's finish chunk);
6. answer, with headers ``x-clawrl-session-id`` and ``x-clawrl-turn-ids`` (comma-separated, in
   choice order) for feedback.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any
from urllib.parse import quote

import anyio.to_thread
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from clawrl.engine import SamplingParams
from clawrl.errors import ClientInputError, ContextLengthError
from clawrl.gateway.attribution import explicit_session
from clawrl.gateway.auth import key_fingerprint, presented_key
from clawrl.gateway.choices import StreamedChoice, complete_choice
from clawrl.gateway.disconnect import until_disconnected
from clawrl.gateway.errors import error_kind
from clawrl.gateway.prepare import PreparedCall, prepare_call
from clawrl.gateway.recorder import CallContext, ChoiceResult, record_choices
from clawrl.gateway.responses import (
    completion_id,
    completion_json,
    logprob_entry,
    message_json,
    usage_json,
)
from clawrl.gateway.schemas import (
    ChatCompletionRequest,
    check_supported,
    include_usage,
    max_new_tokens,
    stop_strings,
)
from clawrl.gateway.state import GatewayState
from clawrl.gateway.streaming import ChatStream, SSEResponse
from clawrl.store import TurnStatus

log = logging.getLogger(__name__)

router = APIRouter()


def _gw(request: Request) -> GatewayState:
    return request.app.state.gateway


def header_value(text: str) -> str:
    """``text`` percent-encoded where it is not a plain printable ASCII header character
    (session ids and field names come from clients; ``sess-42`` or a uuid pass unchanged)."""
    return quote(text, safe="!#$&'()*+,/:;=?@[]~-._ ")[:1024]


def sampling_params(req: ChatCompletionRequest, gw: GatewayState, index: int) -> SamplingParams:
    """Engine sampling params of choice ``index`` (request fields over the gateway defaults)."""
    d = gw.defaults
    top_k = d.top_k if req.top_k is None else max(0, req.top_k)
    return SamplingParams(
        max_tokens=max_new_tokens(req, d.max_tokens),
        temperature=d.temperature if req.temperature is None else req.temperature,
        top_p=d.top_p if req.top_p is None else req.top_p,
        top_k=top_k,
        stop=stop_strings(req),
        seed=None if req.seed is None else req.seed + index,
        logprobs_top_k=(req.top_logprobs or 0) if req.logprobs else 0,
    )


def client_info(request: Request, req: ChatCompletionRequest, prepared: PreparedCall) -> dict:
    """Who called: user-agent, address, key fingerprint, request id, retry count, attribution.

    The API key itself is never stored, only :func:`clawrl.gateway.auth.key_fingerprint`.
    """
    h = request.headers
    retry = h.get("x-stainless-retry-count")
    info: dict[str, Any] = {
        "user_agent": h.get("user-agent"),
        "remote_addr": f"{request.client.host}:{request.client.port}" if request.client else None,
        "api_key_fingerprint": key_fingerprint(presented_key(request)),
        "request_id": h.get("x-request-id") or h.get("x-client-request-id"),
        "retry_count": int(retry) if retry is not None and retry.isdigit() else retry,
        "attribution": prepared.attribution,
        "requested_model": req.model,
        # evaluation traffic (clawrl eval, the demo's before/after scores) is never trained on
        "eval": True if h.get("x-clawrl-eval", "").strip() in ("1", "true") else None,
    }
    return {k: v for k, v in info.items() if v is not None}


def _request_facts(
    req: ChatCompletionRequest, prepared: PreparedCall, ignored: list[str]
) -> dict[str, Any]:
    return {
        "n": req.n,
        "stream": bool(req.stream),
        "logprobs": bool(req.logprobs),
        "tool_choice": prepared.tool_choice.model_dump(mode="json"),
        "parallel_tool_calls": req.parallel_tool_calls,
        "ignored_fields": ignored,
        "history_splices": [[i, t] for i, t in prepared.spliced],
    }


@router.post("/v1/chat/completions", response_model=None)
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    """OpenAI chat completions, streamed or not; every choice is recorded as a turn.

    Raises:
        ClientInputError: 400 for a bad request (OpenAI error shape), incl. a prompt too long.
        EngineError: 500/503 when generation fails (the turn is recorded as an error).
        StoreError: 500 when the call could not be recorded.
    """
    gw = _gw(request)
    started, created = time.perf_counter(), time.time()
    ignored = check_supported(body)
    for name in ignored:
        gw.metrics.inc("clawrl_gateway_ignored_fields_total", field=name)
    if ignored:
        log.warning("ignoring unknown request field(s): %s", ", ".join(ignored))
    explicit = explicit_session(
        request.path_params.get("session_id"),
        request.headers,
        body.session_id,
        body.metadata,
        body.user,
    )
    prepared = await anyio.to_thread.run_sync(
        lambda: prepare_call(
            gw.tokenizer,
            gw.store,
            body.messages,
            body.tools,
            body.tool_choice,
            explicit,
            client_name=(request.headers.get("user-agent") or "")[:200] or None,
        )
    )
    if prepared.spliced:
        gw.metrics.inc("clawrl_gateway_spliced_messages_total", len(prepared.spliced))
    ctx = CallContext(
        prepared=prepared,
        client=client_info(request, body, prepared),
        sampling=_request_facts(body, prepared, ignored),
        created_at=created,
        started=started,
    )
    choices = [ChoiceResult(index=i, params=sampling_params(body, gw, i)) for i in range(body.n)]
    headers = {
        "x-clawrl-session-id": header_value(prepared.session_id),
        "x-clawrl-turn-ids": ",".join(c.turn_id for c in choices),
    }
    if ignored:
        headers["x-clawrl-ignored-fields"] = header_value(",".join(ignored))
    max_context = int(getattr(gw.engine, "max_context", 0) or 0)
    if max_context and len(prepared.prompt_ids) >= max_context:
        exc = ContextLengthError(len(prepared.prompt_ids), max_context)
        await _record_failure(gw, ctx, choices, exc)
        raise exc
    parallel = body.parallel_tool_calls is not False
    if body.stream:
        streamed = [
            StreamedChoice(
                gw.tokenizer,
                c,
                stop_token_ids=gw.stop_token_ids,
                prefill_text=prepared.prefill_text,
                tools_enabled=prepared.tools_enabled,
                parallel_tool_calls=parallel,
                started=started,
            )
            for c in choices
        ]
        stream = ChatStream(
            gw,
            ctx,
            streamed,
            response_id=completion_id(),
            model=gw.model_name,
            include_usage=include_usage(body),
            want_logprobs=bool(body.logprobs),
        )
        await stream.open()
        return SSEResponse(stream, headers=headers)
    return await until_disconnected(  # type: ignore[return-value]
        request, _complete(gw, body, ctx, choices, headers, parallel)
    )


async def _complete(
    gw: GatewayState,
    body: ChatCompletionRequest,
    ctx: CallContext,
    choices: list[ChoiceResult],
    headers: dict[str, str],
    parallel: bool,
) -> JSONResponse:
    prepared = ctx.prepared
    completions: dict[int, Any] = {}

    async def one(c: ChoiceResult) -> ChoiceResult:
        admitted = time.perf_counter()
        completion = await gw.engine.generate(prepared.prompt_ids, c.params)
        completions[c.index] = completion
        done = complete_choice(
            gw.tokenizer,
            c.index,
            c.params,
            completion,
            stop_token_ids=gw.stop_token_ids,
            prefill_text=prepared.prefill_text,
            tools_enabled=prepared.tools_enabled,
            parallel_tool_calls=parallel,
            started=ctx.started,
            admitted=admitted,
        )
        done.turn_id = c.turn_id
        return done

    try:
        outcomes = await asyncio.gather(*(one(c) for c in choices), return_exceptions=True)
    except asyncio.CancelledError:  # server shutdown: nothing was answered, keep the call
        for c in choices:
            c.status, c.finish_reason = TurnStatus.INCOMPLETE, "aborted"
        await record_choices(gw.store, gw.metrics, ctx, choices)
        raise
    errors = [o for o in outcomes if isinstance(o, BaseException)]
    if errors:
        failed = [c for c, o in zip(choices, outcomes, strict=True) if isinstance(o, BaseException)]
        await _record_failure(
            gw, ctx, failed, errors[0], done=[o for o in outcomes if isinstance(o, ChoiceResult)]
        )
        raise errors[0]
    results = [o for o in outcomes if isinstance(o, ChoiceResult)]
    await record_choices(gw.store, gw.metrics, ctx, results)
    out_choices = []
    for r in results:
        assert r.parsed is not None
        lp = None
        if body.logprobs:
            comp = completions[r.index]
            tops = comp.top_logprobs or [[] for _ in comp.token_ids]
            lp = {
                "content": [
                    logprob_entry(gw.tokenizer, t, lp_, top)
                    for t, lp_, top in zip(comp.token_ids, comp.logprobs, tops, strict=True)
                ]
            }
        out_choices.append(
            {
                "index": r.index,
                "message": message_json(r.parsed),
                "logprobs": lp,
                "finish_reason": r.finish_reason,
            }
        )
    completion_tokens = sum(len(r.token_ids) for r in results)
    payload = completion_json(
        id_=completion_id(),
        created=int(ctx.created_at),
        model=gw.model_name,
        policy_version=max(r.policy_version for r in results),
        choices=out_choices,
        usage=usage_json(len(prepared.prompt_ids), completion_tokens),
    )
    return JSONResponse(payload, headers=headers)


async def _record_failure(
    gw: GatewayState,
    ctx: CallContext,
    failed: list[ChoiceResult],
    exc: BaseException,
    done: list[ChoiceResult] | None = None,
) -> None:
    """Record failed choices as error turns (no completion) and finished siblings as they are."""
    kind = error_kind(exc)
    version = int(getattr(gw.engine, "policy_version", 0))
    for c in failed:
        c.status = TurnStatus.ERROR
        c.error = exc
        c.error_kind = kind
        c.policy_version = version
    await record_choices(gw.store, gw.metrics, ctx, [*failed, *(done or [])])


@router.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    """The one served model, in OpenAI's list format."""
    gw = _gw(request)
    return {"object": "list", "data": [_model_json(gw)]}


@router.get("/v1/models/{model_id:path}")
async def get_model(model_id: str, request: Request) -> dict[str, Any]:
    """The served model by name.

    Raises:
        ClientInputError: 404 for any other name.
    """
    gw = _gw(request)
    if model_id != gw.model_name:
        raise ClientInputError(
            f"model {model_id!r} does not exist (this server serves {gw.model_name!r})",
            status=404,
            param="model",
            code="model_not_found",
        )
    return _model_json(gw)


def _model_json(gw: GatewayState) -> dict[str, Any]:
    return {
        "id": gw.model_name,
        "object": "model",
        "created": int(gw.started_at),
        "owned_by": "clawrl",
        "max_model_len": int(getattr(gw.engine, "max_context", 0) or 0) or None,
        "policy_version": int(getattr(gw.engine, "policy_version", 0)),
    }
