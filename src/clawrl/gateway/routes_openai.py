"""OpenAI-compatible routes: ``POST /v1/chat/completions``, ``GET /v1/models[/{id}]``.

The same router is mounted at ``/`` and at ``/s/{session_id}`` (session attribution by URL).

A chat call, start to end:

1. check the body's fields (:func:`clawrl.gateway.schemas.check_supported`) and normalise the
   messages, tools and tool choice (a client mistake here is a 400 and no turn);
2. the shared pipeline (:mod:`clawrl.gateway.pipeline`): render, splice recorded ids, attribute
   the session, check the context window (a prompt that does not fit is recorded as an error
   turn, then a 400), generate ``n`` choices concurrently (streamed or not), record one turn
   per choice (committed before the response or the stream's finish chunk);
3. answer, with headers ``x-clawrl-session-id`` and ``x-clawrl-turn-ids`` (comma-separated, in
   choice order) for feedback.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from clawrl.chat import normalize_openai_messages, normalize_openai_tools, normalize_tool_choice
from clawrl.engine import SamplingParams
from clawrl.errors import ClientInputError
from clawrl.gateway.attribution import explicit_session
from clawrl.gateway.errors import status_and_body
from clawrl.gateway.pipeline import (
    Call,
    CallRequest,
    CallStream,
    complete_call,
    header_value,
    start_call,
    stream_response,
)
from clawrl.gateway.recorder import ChoiceResult
from clawrl.gateway.responses import (
    chunk_json,
    completion_id,
    completion_json,
    logprob_entry,
    message_json,
    sse,
    tool_call_json,
    usage_json,
)
from clawrl.gateway.schemas import (
    ChatCompletionRequest,
    check_supported,
    include_usage,
    max_new_tokens,
    max_tokens_field,
    stop_strings,
)
from clawrl.gateway.state import GatewayState
from clawrl.gateway.users import body_user
from clawrl.policy_version import version_fields
from clawrl.store import ApiProtocol

log = logging.getLogger(__name__)

router = APIRouter()

__all__ = ["header_value", "router", "sampling_params"]


def _gw(request: Request) -> GatewayState:
    return request.app.state.gateway


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


@router.post("/v1/chat/completions", response_model=None)
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    """OpenAI chat completions, streamed or not; every choice is recorded as a turn.

    Raises:
        ClientInputError: 400 for a bad request (OpenAI error shape), incl. a prompt too long.
        EngineError: 500/503 when generation fails (the turn is recorded as an error).
        StoreError: 500 when the call could not be recorded.
    """
    gw = _gw(request)
    ignored = check_supported(body)
    for name in ignored:
        gw.metrics.inc("clawrl_gateway_ignored_fields_total", field=name)
    if ignored:
        log.warning("ignoring unknown request field(s): %s", ", ".join(ignored))
    tools = normalize_openai_tools(body.tools)
    req = CallRequest(
        protocol=ApiProtocol.OPENAI_CHAT,
        messages=normalize_openai_messages(body.messages),
        tools=tools,
        tool_choice=normalize_tool_choice(body.tool_choice, tools),
        params=[sampling_params(body, gw, i) for i in range(body.n)],
        max_tokens_param=max_tokens_field(body),
        parallel_tool_calls=body.parallel_tool_calls is not False,
        body_user=body_user(body.user, body.metadata, body.model_extra),
        explicit=explicit_session(
            request.path_params.get("session_id"),
            request.headers,
            body.session_id,
            body.metadata,
            body.user,
        ),
        facts={
            "n": body.n,
            "stream": bool(body.stream),
            "logprobs": bool(body.logprobs),
            "ignored_fields": ignored,
        },
        requested_model=body.model,
    )
    call = await start_call(gw, request, req)
    headers = call.headers
    if ignored:
        headers["x-clawrl-ignored-fields"] = header_value(",".join(ignored))
    if body.stream:
        stream = CallStream(gw, call, req)
        await stream.open()
        events = _chunks(gw, call, stream, include_usage(body), bool(body.logprobs))
        return stream_response(stream, events, headers)

    def respond(results: list[ChoiceResult]) -> Response:
        return JSONResponse(_completion(gw, call, results, bool(body.logprobs)), headers=headers)

    return await complete_call(gw, request, call, req, respond)


def _logprobs(gw: GatewayState, r: ChoiceResult) -> dict[str, Any]:
    tops = r.top_logprobs or [[] for _ in r.token_ids]
    return {
        "content": [
            logprob_entry(gw.tokenizer, t, lp, top)
            for t, lp, top in zip(r.token_ids, r.sampling_logprobs, tops, strict=True)
        ]
    }


def _completion(
    gw: GatewayState, call: Call, results: list[ChoiceResult], want_logprobs: bool
) -> dict[str, Any]:
    """The ``chat.completion`` object of a non-streamed call."""
    choices = []
    for r in results:
        assert r.parsed is not None
        choices.append(
            {
                "index": r.index,
                "message": message_json(r.parsed),
                "logprobs": _logprobs(gw, r) if want_logprobs else None,
                "finish_reason": r.finish_reason,
            }
        )
    return completion_json(
        id_=completion_id(),
        created=int(call.ctx.created_at),
        model=gw.model_name,
        policy_version=max(r.policy_version for r in results),
        choices=choices,
        usage=usage_json(len(call.ctx.prepared.prompt_ids), sum(len(r.token_ids) for r in results)),
    )


async def _chunks(
    gw: GatewayState, call: Call, stream: CallStream, want_usage: bool, want_logprobs: bool
) -> AsyncIterator[bytes]:
    """The ``chat.completion.chunk`` events: one per sampled token (the first of each choice
    carries ``role``), a finish chunk per choice after its turn is recorded, the usage chunk
    when asked, then ``[DONE]``; an engine failure mid-stream sends ``{"error": ...}`` and ends
    the stream."""
    response_id, created = completion_id(), int(call.ctx.created_at)
    calls_sent: dict[int, int] = {}

    def chunk(choices: list[dict[str, Any]], usage: dict[str, int] | None = None) -> bytes:
        version = max((r.policy_version for r in stream.results), default=0)
        return sse(
            chunk_json(
                id_=response_id, created=created, model=gw.model_name, policy_version=version,
                choices=choices, usage=usage, include_usage=want_usage,
            )
        )  # fmt: skip

    async for d in stream.deltas():
        if d.error is not None:
            _, body = status_and_body(d.error)
            yield sse(body)
            return
        delta: dict[str, Any] = {"role": "assistant", "content": d.content} if d.first else {}
        if d.content and not d.first:
            delta["content"] = d.content
        if d.reasoning:
            delta["reasoning_content"] = d.reasoning
        if d.calls:
            sent = calls_sent.get(d.index, 0)
            delta["tool_calls"] = [tool_call_json(c, index=sent + k) for k, c in enumerate(d.calls)]
            calls_sent[d.index] = sent + len(d.calls)
        lp = None
        if want_logprobs and d.event is not None:
            ev = d.event
            lp = {
                "content": [logprob_entry(gw.tokenizer, ev.token_id, ev.logprob, ev.top_logprobs)]
            }
        if delta or lp:
            yield chunk([{"index": d.index, "delta": delta, "logprobs": lp, "finish_reason": None}])
        if d.done:
            done = {"index": d.index, "delta": {}, "logprobs": None}
            yield chunk([{**done, "finish_reason": d.result.finish_reason}])
    if want_usage:
        completion = sum(len(r.token_ids) for r in stream.results)
        yield chunk([], usage=usage_json(len(call.ctx.prepared.prompt_ids), completion))
    yield sse("[DONE]")


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
        "max_model_len": gw.engine.max_context,
        **version_fields(gw.engine.policy_version),
    }
