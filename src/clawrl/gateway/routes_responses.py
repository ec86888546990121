"""OpenAI Responses route: ``POST /v1/responses`` (and a fast refusal of its WebSocket).

Mounted at ``/`` and at ``/s/{session_id}``. Errors use OpenAI's shape; a prompt that does not
fit is a 400 with code ``context_length_exceeded``.

Fields (the conversation fields are described in :mod:`clawrl.chat.responses_items`):

* honoured: ``input``, ``instructions``, ``tools`` (namespaces flattened, built-ins noted),
  ``tool_choice``, ``parallel_tool_calls``, ``stream``, ``max_output_tokens``, ``temperature``,
  ``top_p``, ``prompt_cache_key`` (names the session when no header does: Codex sets it to its
  session id), ``metadata.session_id``, ``user``;
* accepted without effect: ``store`` (nothing is stored server-side for later retrieval: every
  request carries its whole input, as Codex sends it with ``store: false``), ``include``,
  ``reasoning``, ``text`` (a ``format`` JSON schema is not enforced), ``truncation``,
  ``service_tier``, ``client_metadata``, ``safety_identifier``, ``prompt_cache_retention``,
  ``stream_options``, ``top_logprobs``, and unknown fields (logged, counted, listed in the turn);
* refused (400): ``previous_response_id`` and ``conversation`` (no server-side state),
  ``background: true``.

WebSocket: Codex's built-in provider first tries ``GET /v1/responses`` as a WebSocket upgrade.
The gateway has no WebSocket transport; it refuses at once — a plain GET (uvicorn without a
WebSocket library passes the upgrade through as HTTP) gets ``426 Upgrade Required`` in OpenAI's
error shape, and a WebSocket handshake (uvicorn with one) is closed before it is accepted
(HTTP 403) — and Codex falls back to HTTP ``POST``.

Side calls: Codex's ``x-codex-turn-metadata`` header with ``request_kind: "compaction"`` makes
the turn a ``compaction`` side turn (:mod:`clawrl.gateway.side_calls`).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator
from typing import Any

from fastapi import APIRouter, Request, WebSocket
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, StrictBool

from clawrl.chat.responses_items import ResponsesConversation, ToolOrigin
from clawrl.chat.responses_items import normalize_responses_request as normalize
from clawrl.engine import SamplingParams
from clawrl.errors import ClientInputError
from clawrl.gateway import responses_format as fmt
from clawrl.gateway.attribution import explicit_session
from clawrl.gateway.errors import error_body, status_and_body
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
from clawrl.gateway.side_calls import codex_turn_metadata, side_kind_from_headers
from clawrl.gateway.state import GatewayState
from clawrl.gateway.users import body_user
from clawrl.store import ApiProtocol

log = logging.getLogger(__name__)

router = APIRouter()

NO_EFFECT_FIELDS = (
    "store",
    "include",
    "reasoning",
    "text",
    "truncation",
    "service_tier",
    "client_metadata",
    "safety_identifier",
    "prompt_cache_retention",
    "stream_options",
    "top_logprobs",
)


class ResponsesRequest(BaseModel):
    """A ``POST /v1/responses`` body (module docstring: what each field does)."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    input: Any = Field(..., description="checked by normalize_responses_request")
    instructions: Any = None
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: StrictBool | None = None
    stream: StrictBool | None = False
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    prompt_cache_key: str | None = None
    metadata: dict[str, Any] | None = None
    user: str | None = None
    previous_response_id: str | None = None
    conversation: Any = None
    background: StrictBool | None = None


def _gw(request: Request) -> GatewayState:
    return request.app.state.gateway


def _refuse_stateful(body: ResponsesRequest) -> None:
    for name in ("previous_response_id", "conversation"):
        if getattr(body, name) is not None:
            raise ClientInputError(
                f"'{name}' is not supported: this server keeps no responses; send the whole "
                "input with every request",
                param=name,
                code="unsupported_parameter",
            )
    if body.background:
        raise ClientInputError(
            "'background' responses are not supported",
            param="background",
            code="unsupported_parameter",
        )


def sampling_params(body: ResponsesRequest, gw: GatewayState) -> SamplingParams:
    """Engine sampling params from the body over the gateway defaults.

    Without ``max_output_tokens`` the budget is ``[sampling] responses_max_tokens`` (4096 by
    default), not the 256-token chat default: Codex sends none, and a 256-token cap would cut
    every longer answer to ``response.incomplete``. The engine caps it at what fits after the
    prompt.
    """
    d = gw.defaults
    return SamplingParams(
        max_tokens=body.max_output_tokens or d.responses_max_tokens,
        temperature=d.temperature if body.temperature is None else body.temperature,
        top_p=d.top_p if body.top_p is None else body.top_p,
        top_k=d.top_k,
    )


def _echo(body: ResponsesRequest, req: CallRequest) -> dict[str, Any]:
    extra = body.model_extra or {}
    return {
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "metadata": body.metadata or {},
        "parallel_tool_calls": req.parallel_tool_calls,
        "reasoning": extra.get("reasoning"),
        "store": bool(extra.get("store", False)),
        "temperature": req.params[0].temperature,
        "text": extra.get("text") or {"format": {"type": "text"}},
        "tool_choice": body.tool_choice or "auto",
        "tools": body.tools or [],
        "top_p": req.params[0].top_p,
    }


@router.post("/v1/responses", response_model=None)
async def create_response(body: ResponsesRequest, request: Request) -> Response:
    """OpenAI Responses, streamed or not; the call is recorded as one turn.

    Raises:
        ClientInputError: 400 for a bad request or a prompt too long.
        EngineError: 500 when generation fails (recorded as an error turn).
        StoreError: 500 when the call could not be recorded.
    """
    gw = _gw(request)
    _refuse_stateful(body)
    extra = set(body.model_extra or {})
    unknown = sorted(extra - set(NO_EFFECT_FIELDS))
    for name in unknown:
        gw.metrics.inc("clawrl_gateway_ignored_fields_total", field=name)
    if unknown:
        log.warning("ignoring unknown request field(s): %s", ", ".join(unknown))
    conv = normalize(body.instructions, body.input, body.tools, body.tool_choice)
    explicit = explicit_session(
        request.path_params.get("session_id"),
        request.headers,
        None,
        body.metadata,
        body.user,
        prompt_cache_key=body.prompt_cache_key,
    )
    codex = codex_turn_metadata(request.headers)
    req = CallRequest(
        protocol=ApiProtocol.OPENAI_RESPONSES,
        messages=conv.messages,
        tools=conv.tools,
        tool_choice=conv.tool_choice,
        params=[sampling_params(body, gw)],
        max_tokens_param="max_output_tokens" if body.max_output_tokens else None,
        parallel_tool_calls=body.parallel_tool_calls is not False,
        explicit=explicit,
        body_user=body_user(body.user, None, body.model_extra),
        side_kind=side_kind_from_headers(request.headers),
        facts={
            "stream": bool(body.stream),
            "ignored_fields": unknown,
            "no_effect_fields": sorted(extra & set(NO_EFFECT_FIELDS)),
            "notes": conv.notes,
            "codex_request_kind": codex.get("request_kind"),
        },
        requested_model=body.model,
    )
    call = await start_call(gw, request, req)
    headers = call.headers
    if unknown:
        headers["x-clawrl-ignored-fields"] = header_value(",".join(unknown))
    echo = _echo(body, req)
    origin = _origins(conv)
    if body.stream:
        stream = CallStream(gw, call, req)
        await stream.open()
        return stream_response(stream, _events(gw, call, stream, echo, origin), headers)

    def respond(results: list[ChoiceResult]) -> Response:
        done = results[0]
        assert done.parsed is not None
        length = done.finish_reason == "length"
        payload = fmt.response_json(
            id_=fmt.new_id("resp"),
            created_at=call.ctx.created_at,
            model=gw.model_name,
            status="incomplete" if length else "completed",
            output=fmt.output_items(done.parsed, origin),
            usage=fmt.usage_json(len(call.ctx.prepared.prompt_ids), len(done.token_ids)),
            echo=echo,
            incomplete_reason="max_output_tokens" if length else None,
        )
        return JSONResponse(payload, headers=headers)

    return await complete_call(gw, request, call, req, respond)


def _origins(conv: ResponsesConversation) -> Any:
    def origin(name: str) -> ToolOrigin:
        return conv.origins.get(name, ToolOrigin())

    return origin


async def _events(
    gw: GatewayState,
    call: Call,
    stream: CallStream,
    echo: dict[str, Any],
    origin: Any,
) -> AsyncGenerator[bytes, None]:
    ctx = call.ctx
    prompt_tokens = len(ctx.prepared.prompt_ids)
    id_ = fmt.new_id("resp")

    def response(status: str, **kw: Any) -> dict[str, Any]:
        return fmt.response_json(
            id_=id_, created_at=ctx.created_at, model=gw.model_name, status=status, echo=echo, **kw
        )

    w = fmt.EventWriter(origin)
    yield w.event(
        {"type": "response.created", "response": response("in_progress", output=[], usage=None)}
    )
    yield w.event(
        {"type": "response.in_progress", "response": response("in_progress", output=[], usage=None)}
    )
    async for delta in stream.deltas():
        if delta.error is not None:
            _, body = status_and_body(delta.error)
            failed = response("failed", output=w.output, usage=None, error=body["error"])
            yield w.event({"type": "response.failed", "response": failed})
            return
        out: list[bytes] = []
        if delta.reasoning:
            out += w.reasoning(delta.reasoning)
        if delta.content:
            out += w.text(delta.content)
        for tool_call in delta.calls:
            out += w.call(tool_call)
        for chunk in out:
            yield chunk
    for chunk in w.close():
        yield chunk
    result = stream.results[0]
    usage = fmt.usage_json(prompt_tokens, len(result.token_ids))
    if result.finish_reason == "length":
        final = response(
            "incomplete", output=w.output, usage=usage, incomplete_reason="max_output_tokens"
        )
        yield w.event({"type": "response.incomplete", "response": final})
    else:
        yield w.event(
            {
                "type": "response.completed",
                "response": response("completed", output=w.output, usage=usage),
            }
        )


@router.get("/v1/responses")
async def refuse_upgrade(request: Request) -> JSONResponse:
    """426: no WebSocket transport here; use ``POST /v1/responses`` (Codex falls back to it)."""
    body = error_body(
        "WebSocket transport is not supported; use POST /v1/responses over HTTP",
        "invalid_request_error",
        code="websocket_not_supported",
    )
    return JSONResponse(body, status_code=426, headers={"Connection": "close"})


@router.websocket("/v1/responses")
async def refuse_websocket(websocket: WebSocket) -> None:
    """Close the handshake before accepting it (the client sees HTTP 403) and falls back."""
    await websocket.close(code=1008, reason="use POST /v1/responses")
