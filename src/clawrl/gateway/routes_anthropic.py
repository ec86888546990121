"""Anthropic Messages routes: ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``.

Mounted at ``/`` and at ``/s/{session_id}``; any query string (Claude Code's ``?beta=true``) is
accepted. Every error is answered in Anthropic's shape (:func:`clawrl.gateway.anthropic_format.
error_json`), a prompt that does not fit as ``400 invalid_request_error`` "prompt is too long:
N tokens > M maximum".

Fields (the conversation fields are described in :mod:`clawrl.chat.anthropic_messages`):

* honoured: ``max_tokens`` (default: the gateway's), ``temperature`` (0-1), ``top_p``,
  ``top_k``, ``stop_sequences``, ``stream``, ``tools``, ``tool_choice`` (incl.
  ``disable_parallel_tool_use``), ``metadata.user_id`` (a JSON string with Claude Code's
  ``session_id`` names the session);
* accepted without effect (they change nothing the policy samples; listed in the turn's
  ``sampling_params.ignored_fields`` when present): ``thinking`` (reasoning is whatever the
  policy writes in ``<think>``, always returned), ``context_management``, ``output_config``
  (effort; a ``format`` JSON schema is not enforced), ``safeguards``, ``service_tier``,
  ``container``, ``mcp_servers``, ``cache_control``, the ``anthropic-beta`` /
  ``anthropic-version`` headers, and any unknown field (also logged and counted).

Session: URL, then headers (``x-session-id``, ``x-claude-code-session-id``), then
``metadata.user_id`` (:mod:`clawrl.gateway.attribution`); subagent headers are recorded on the
turn. Side calls are recognised by :mod:`clawrl.gateway.side_calls`.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator
from typing import Any

import anyio.to_thread
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, StrictBool

from clawrl.chat import render_prompt
from clawrl.chat.anthropic_messages import AnthropicConversation, normalize_anthropic_request
from clawrl.engine import SamplingParams
from clawrl.errors import ClientInputError
from clawrl.gateway import anthropic_format as fmt
from clawrl.gateway.attribution import explicit_session
from clawrl.gateway.errors import status_and_body
from clawrl.gateway.pipeline import (
    Call,
    CallRequest,
    CallStream,
    complete_call,
    header_value,
    matched_stop,
    start_call,
    stream_response,
)
from clawrl.gateway.recorder import ChoiceResult
from clawrl.gateway.state import GatewayState
from clawrl.gateway.users import body_user
from clawrl.store import ApiProtocol

log = logging.getLogger(__name__)

router = APIRouter()

MAX_STOP = 16
NO_EFFECT_FIELDS = (
    "thinking",
    "context_management",
    "output_config",
    "safeguards",
    "service_tier",
    "container",
    "mcp_servers",
)


class MessagesRequest(BaseModel):
    """A ``POST /v1/messages`` body (module docstring: what each field does)."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    messages: Any = Field(..., description="checked by normalize_anthropic_request")
    system: Any = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=1.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    stop_sequences: list[str] | None = None
    stream: StrictBool | None = False
    tools: Any = None
    tool_choice: Any = None
    metadata: dict[str, Any] | None = None


class CountTokensRequest(BaseModel):
    """A ``POST /v1/messages/count_tokens`` body."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    messages: Any = Field(..., description="checked by normalize_anthropic_request")
    system: Any = None
    tools: Any = None
    tool_choice: Any = None


def _gw(request: Request) -> GatewayState:
    return request.app.state.gateway


def _fields(body: BaseModel) -> tuple[list[str], list[str]]:
    """(fields accepted without effect that are present, unknown fields), both sorted."""
    extra = set(body.model_extra or {})
    return sorted(extra & set(NO_EFFECT_FIELDS)), sorted(extra - set(NO_EFFECT_FIELDS))


def sampling_params(body: MessagesRequest, gw: GatewayState) -> SamplingParams:
    """Engine sampling params from the body over the gateway defaults.

    Raises:
        ClientInputError: (400) more than :data:`MAX_STOP` stop sequences.
    """
    d = gw.defaults
    stops = [s for s in (body.stop_sequences or []) if s]
    if len(stops) > MAX_STOP:
        raise ClientInputError(
            f"at most {MAX_STOP} stop sequences are supported", param="stop_sequences"
        )
    return SamplingParams(
        max_tokens=body.max_tokens or d.max_tokens,
        temperature=d.temperature if body.temperature is None else body.temperature,
        top_p=d.top_p if body.top_p is None else body.top_p,
        top_k=d.top_k if body.top_k is None else body.top_k,
        stop=tuple(stops),
    )


def _conversation(body: MessagesRequest | CountTokensRequest) -> AnthropicConversation:
    return normalize_anthropic_request(body.system, body.messages, body.tools, body.tool_choice)


@router.post("/v1/messages", response_model=None)
async def create_message(body: MessagesRequest, request: Request) -> Response:
    """Anthropic Messages, streamed or not; the call is recorded as one turn.

    Raises:
        ClientInputError: 400 (Anthropic shape) for a bad request or a prompt too long.
        EngineError: 500 when generation fails (recorded as an error turn).
        StoreError: 500 when the call could not be recorded.
    """
    gw = _gw(request)
    no_effect, unknown = _fields(body)
    for name in unknown:
        gw.metrics.inc("clawrl_gateway_ignored_fields_total", field=name)
    if unknown:
        log.warning("ignoring unknown request field(s): %s", ", ".join(unknown))
    conv = _conversation(body)
    explicit = explicit_session(
        request.path_params.get("session_id"), request.headers, None, body.metadata
    )
    req = CallRequest(
        protocol=ApiProtocol.ANTHROPIC_MESSAGES,
        messages=conv.messages,
        tools=conv.tools,
        tool_choice=conv.tool_choice,
        params=[sampling_params(body, gw)],
        max_tokens_param="max_tokens" if body.max_tokens else None,
        parallel_tool_calls=conv.parallel_tool_calls,
        explicit=explicit,
        body_user=body_user(None, body.metadata),
        facts={
            "stream": bool(body.stream),
            "ignored_fields": unknown,
            "no_effect_fields": no_effect,
            "notes": conv.notes,
            "anthropic_beta": request.headers.get("anthropic-beta"),
        },
        requested_model=body.model,
        rename_call=fmt.tool_use_id,
    )
    call = await start_call(gw, request, req)
    headers = call.headers
    if unknown:
        headers["x-clawrl-ignored-fields"] = header_value(",".join(unknown))
    if body.stream:
        stream = CallStream(gw, call, req)
        await stream.open()
        return stream_response(stream, _events(gw, call, stream, fmt.message_id()), headers)

    def respond(results: list[ChoiceResult]) -> Response:
        return JSONResponse(_message(gw, call, results[0], fmt.message_id()), headers=headers)

    return await complete_call(gw, request, call, req, respond)


def _message(gw: GatewayState, call: Call, done: ChoiceResult, id_: str) -> dict:
    assert done.parsed is not None
    stop = matched_stop(gw, done)
    return fmt.message_json(
        id_=id_,
        model=gw.model_name,
        content=fmt.content_blocks(done.parsed),
        stop_reason_=fmt.stop_reason(done.finish_reason, stop),
        stop_sequence=stop,
        usage=fmt.usage_json(len(call.ctx.prepared.prompt_ids), len(done.token_ids)),
    )


async def _events(
    gw: GatewayState, call: Call, stream: CallStream, id_: str
) -> AsyncGenerator[bytes, None]:
    prompt_tokens = len(call.ctx.prepared.prompt_ids)
    start = fmt.message_json(
        id_=id_,
        model=gw.model_name,
        content=[],
        stop_reason_=None,
        stop_sequence=None,
        usage=fmt.usage_json(prompt_tokens, 0),
    )
    yield fmt.event({"type": "message_start", "message": start})
    yield fmt.event({"type": "ping"})
    blocks = fmt.BlockWriter()
    async for delta in stream.deltas():
        if delta.error is not None:
            status, body = status_and_body(delta.error)
            yield fmt.event(fmt.error_json(status, body, delta.error))
            return
        out: list[bytes] = []
        if delta.reasoning:
            out += blocks.reasoning(delta.reasoning)
        if delta.content:
            out += blocks.text(delta.content)
        for tool_call in delta.calls:
            out += blocks.tool_use(tool_call)
        for chunk in out:
            yield chunk
    for chunk in blocks.close():
        yield chunk
    result = stream.results[0]
    stop = matched_stop(gw, result)
    yield fmt.event(
        {
            "type": "message_delta",
            "delta": {
                "stop_reason": fmt.stop_reason(result.finish_reason, stop),
                "stop_sequence": stop,
            },
            "usage": fmt.usage_json(prompt_tokens, len(result.token_ids)),
        }
    )
    yield fmt.event({"type": "message_stop"})


@router.post("/v1/messages/count_tokens")
async def count_tokens(body: CountTokensRequest, request: Request) -> dict[str, int]:
    """``{"input_tokens": N}``: the prompt rendered with the policy's chat template and tokenizer
    (what a ``/v1/messages`` call with the same fields would send to the engine, before any
    splicing of recorded ids, which never changes the text).

    Raises:
        ClientInputError: 400 (Anthropic shape) for a malformed conversation.
    """
    gw = _gw(request)
    conv = _conversation(body)
    rendered = await anyio.to_thread.run_sync(
        lambda: render_prompt(gw.tokenizer, conv.messages, conv.tools, conv.tool_choice)
    )
    return {"input_tokens": len(rendered.token_ids)}
