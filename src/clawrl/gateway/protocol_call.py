"""One model call for the single-choice protocols (Anthropic Messages, OpenAI Responses).

The protocol routes turn their body into neutral messages (:mod:`clawrl.chat.anthropic_messages`,
:mod:`clawrl.chat.responses_items`) and a :class:`ProtocolRequest`; from there the call goes
exactly the way of a chat completion, through the same modules, so one turn record comes out
whatever the protocol:

1. :func:`start_call` — in a worker thread, render + splice + attribute
   (:func:`clawrl.gateway.prepare.prepare_messages`) and, for a subagent, find the parent
   agent's turn; a prompt that does not fit is recorded as an error turn, then raised
   (:class:`~clawrl.errors.ContextLengthError`, a 400 in the client's error shape);
2. :func:`complete_call` (non-streamed) or :class:`TokenStream` (streamed) — generate, parse,
   record the turn (committed before the answer's last byte), with the tool-call ids the
   client will see.

The route only formats: the response JSON or the protocol's event sequence.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.to_thread
from fastapi import Request
from starlette.responses import StreamingResponse
from starlette.types import Send

from clawrl.chat import ChatMessage, ParsedCompletion, ToolCall, ToolChoice, ToolSpec
from clawrl.engine import SamplingParams, TokenEvent
from clawrl.errors import ContextLengthError, EngineError
from clawrl.gateway.attribution import ExplicitSession, agent_facts, parent_agent_turn
from clawrl.gateway.auth import key_fingerprint, presented_key
from clawrl.gateway.choices import StreamedChoice, complete_choice
from clawrl.gateway.decode import visible_text
from clawrl.gateway.errors import error_kind
from clawrl.gateway.prepare import PreparedCall, prepare_messages
from clawrl.gateway.recorder import CallContext, ChoiceResult, record_choices
from clawrl.gateway.state import GatewayState
from clawrl.store import ApiProtocol, TurnStatus

RenameCall = Callable[[str], str]
"""Maps the parser's tool-call id (``call_…``) to the id the client sees (``toolu_…``)."""


@dataclass
class ProtocolRequest:
    """A protocol request in neutral form, ready for the shared pipeline.

    Attributes:
        protocol: the client API.
        messages: the neutral messages.
        tools: the tools offered to the policy.
        tool_choice: the neutral tool choice.
        params: the engine sampling params.
        parallel_tool_calls: ``False`` keeps only the first parsed tool call.
        explicit: the session the client named, if any.
        side_kind: a side-call kind signalled in the headers (``None``: recognised from the
            messages, else a main call).
        facts: request-level facts stored with the turn's sampling params (ignored fields,
            notes such as ``ignored_tool:web_search``, stream, ...).
        requested_model: the ``model`` the client asked for.
        rename_call: tool-call id mapping (:data:`RenameCall`).
    """

    protocol: ApiProtocol
    messages: list[ChatMessage]
    tools: list[ToolSpec]
    tool_choice: ToolChoice
    params: SamplingParams
    parallel_tool_calls: bool = True
    explicit: ExplicitSession | None = None
    side_kind: str | None = None
    facts: dict[str, Any] = field(default_factory=dict)
    requested_model: str | None = None
    rename_call: RenameCall = field(default=lambda call_id: call_id)


def client_facts(request: Request, prepared: PreparedCall, model: str | None) -> dict[str, Any]:
    """Who called: user-agent, address, key fingerprint, request id, retry count, attribution,
    subagent ids; the API key itself is never stored."""
    h = request.headers
    retry = h.get("x-stainless-retry-count")
    info: dict[str, Any] = {
        "user_agent": h.get("user-agent"),
        "remote_addr": f"{request.client.host}:{request.client.port}" if request.client else None,
        "api_key_fingerprint": key_fingerprint(presented_key(request)),
        "request_id": h.get("x-request-id") or h.get("x-client-request-id"),
        "retry_count": int(retry) if retry is not None and retry.isdigit() else retry,
        "attribution": prepared.attribution,
        "requested_model": model,
        "eval": True if h.get("x-clawrl-eval", "").strip() in ("1", "true") else None,
        **agent_facts(h),
    }
    return {k: v for k, v in info.items() if v is not None}


def _prepare(gw: GatewayState, req: ProtocolRequest, client_name: str | None) -> PreparedCall:
    return prepare_messages(
        gw.tokenizer,
        gw.store,
        req.messages,
        req.tools,
        req.tool_choice,
        req.explicit,
        client_name=client_name,
        side_kind=req.side_kind,
    )


async def start_call(
    gw: GatewayState, request: Request, req: ProtocolRequest
) -> tuple[CallContext, ChoiceResult]:
    """Prepare, attribute and check one call (see the module docstring, step 1).

    Returns:
        The call's context and its (single) choice, not generated yet.

    Raises:
        ClientInputError: (400) the template rejects the conversation.
        ContextLengthError: (400) the prompt does not fit the context (recorded as an error turn).
        StoreError: the store could not be read or written.
    """
    started, created = time.perf_counter(), time.time()
    agent = agent_facts(request.headers)
    client_name = (request.headers.get("user-agent") or "")[:200] or None

    def blocking() -> tuple[PreparedCall, str | None]:
        prepared = _prepare(gw, req, client_name)
        parent = None
        if "parent_agent_id" in agent:
            parent = parent_agent_turn(gw.store, prepared.session_id, agent["parent_agent_id"])
        return prepared, parent

    prepared, parent_turn = await anyio.to_thread.run_sync(blocking)
    if prepared.spliced:
        gw.metrics.inc("clawrl_gateway_spliced_messages_total", len(prepared.spliced))
    client = client_facts(request, prepared, req.requested_model)
    if parent_turn is not None:
        client["parent_agent_turn_id"] = parent_turn
    sampling = {
        **req.facts,
        "tool_choice": prepared.tool_choice.model_dump(mode="json"),
        "parallel_tool_calls": req.parallel_tool_calls,
        "history_splices": [[i, t] for i, t in prepared.spliced],
    }
    ctx = CallContext(
        prepared=prepared,
        client=client,
        sampling=sampling,
        created_at=created,
        started=started,
        protocol=req.protocol,
    )
    choice = ChoiceResult(index=0, params=req.params)
    max_context = int(getattr(gw.engine, "max_context", 0) or 0)
    if max_context and len(prepared.prompt_ids) >= max_context:
        exc = ContextLengthError(len(prepared.prompt_ids), max_context)
        await record_failure(gw, ctx, choice, exc)
        raise exc
    return ctx, choice


async def record_failure(
    gw: GatewayState, ctx: CallContext, choice: ChoiceResult, exc: BaseException
) -> None:
    """Record ``choice`` as an error turn (its tokens so far, if any, kept; never trainable)."""
    choice.status = TurnStatus.ERROR
    choice.error = exc
    choice.error_kind = error_kind(exc)
    choice.finish_reason = None
    choice.policy_version = choice.policy_version or int(getattr(gw.engine, "policy_version", 0))
    await record_choices(gw.store, gw.metrics, ctx, [choice])


def renamed(parsed: ParsedCompletion, rename: RenameCall) -> ParsedCompletion:
    """``parsed`` with every tool-call id mapped by ``rename``."""
    if not parsed.tool_calls:
        return parsed
    calls = [c.model_copy(update={"id": rename(c.id)}) for c in parsed.tool_calls]
    return parsed.model_copy(update={"tool_calls": calls})


def matched_stop(gw: GatewayState, choice: ChoiceResult) -> str | None:
    """The requested stop string that ended the completion, or ``None``."""
    if not choice.params.stop:
        return None
    _, stop = visible_text(gw.tokenizer, choice.token_ids, gw.stop_token_ids, choice.params.stop)
    return stop


async def complete_call(
    gw: GatewayState, ctx: CallContext, choice: ChoiceResult, req: ProtocolRequest
) -> ChoiceResult:
    """Generate the whole completion, parse it and record the turn (step 2, non-streamed).

    Raises:
        EngineError: generation failed (recorded as an error turn first).
        StoreError: the turn could not be recorded.
    """
    admitted = time.perf_counter()
    try:
        completion = await gw.engine.generate(ctx.prepared.prompt_ids, choice.params)
    except Exception as e:  # the engine's failure is recorded, then answered by the handler
        await record_failure(gw, ctx, choice, e)
        raise
    done = complete_choice(
        gw.tokenizer,
        0,
        choice.params,
        completion,
        stop_token_ids=gw.stop_token_ids,
        prefill_text=ctx.prepared.prefill_text,
        tools_enabled=ctx.prepared.tools_enabled,
        parallel_tool_calls=req.parallel_tool_calls,
        started=ctx.started,
        admitted=admitted,
    )
    done.turn_id = choice.turn_id
    assert done.parsed is not None
    done.parsed = renamed(done.parsed, req.rename_call)
    await record_choices(gw.store, gw.metrics, ctx, [done])
    return done


@dataclass
class Delta:
    """What one sampled token added to a streamed answer.

    Attributes:
        content: new client-visible text.
        reasoning: new reasoning text.
        calls: tool calls completed by this token (ids as the client sees them).
        done: the completion finished; the turn is recorded and ``result`` is final.
        error: the engine failed mid-stream (the turn is recorded as an error).
    """

    content: str = ""
    reasoning: str = ""
    calls: list[ToolCall] = field(default_factory=list)
    done: bool = False
    error: BaseException | None = None


class TokenStream:
    """A streamed single-choice completion: engine tokens in, :class:`Delta` out.

    Await :meth:`open` in the route (a failure before the first token is then a plain HTTP
    error), iterate :meth:`deltas` in the response body, and always :meth:`aclose` (the SSE
    response does): a stream cut short — the client went away — is recorded as an
    ``incomplete`` turn with the tokens sampled so far.
    """

    def __init__(
        self, gw: GatewayState, ctx: CallContext, choice: ChoiceResult, req: ProtocolRequest
    ) -> None:
        self.gw = gw
        self.ctx = ctx
        self.result = choice
        self._rename = req.rename_call
        self._choice = StreamedChoice(
            gw.tokenizer,
            choice,
            stop_token_ids=gw.stop_token_ids,
            prefill_text=ctx.prepared.prefill_text,
            tools_enabled=ctx.prepared.tools_enabled,
            parallel_tool_calls=req.parallel_tool_calls,
            started=ctx.started,
        )
        self._events: AsyncIterator[TokenEvent] | None = None
        self._first: TokenEvent | None = None
        self._recorded = False
        self._closed = False

    async def open(self) -> None:
        """Start generating and wait for the first token.

        Raises:
            ClientInputError, EngineError: the engine refused or failed before any token (the
                turn is recorded as an error first).
        """
        self._events = self.gw.engine.generate_stream(
            self.ctx.prepared.prompt_ids, self.result.params
        )
        try:
            self._first = await self._next()
        except Exception as e:  # recorded, then answered as a plain HTTP error by the handler
            await self._fail(e)
            await self.aclose()
            raise
        except BaseException:  # cancelled (shutdown): nothing was answered
            with anyio.CancelScope(shield=True):
                await self.aclose()
            raise

    async def _next(self) -> TokenEvent:
        assert self._events is not None
        try:
            return await self._events.__anext__()
        except StopAsyncIteration:
            raise EngineError("the engine's stream ended without a finish reason") from None

    async def _fail(self, exc: BaseException) -> None:
        self._recorded = True
        self._choice.finished = True
        await record_failure(self.gw, self.ctx, self.result, exc)

    async def deltas(self) -> AsyncIterator[Delta]:
        """Yield one :class:`Delta` per sampled token; the last has ``done`` or ``error``."""
        assert self._first is not None, "TokenStream.open() must be awaited first"
        ev = self._first
        while True:
            content, reasoning, calls = self._choice.push(ev)
            calls = [c.model_copy(update={"id": self._rename(c.id)}) for c in calls]
            if self._choice.finished:
                assert self.result.parsed is not None
                self.result.parsed = renamed(self.result.parsed, self._rename)
                self._recorded = True
                await record_choices(self.gw.store, self.gw.metrics, self.ctx, [self.result])
                yield Delta(content, reasoning, calls, done=True)
                return
            yield Delta(content, reasoning, calls)
            try:
                ev = await self._next()
            except Exception as e:  # mid-stream engine failure: recorded, sent as an event
                self.gw.metrics.inc("clawrl_gateway_errors_total", kind=error_kind(e))
                await self._fail(e)
                yield Delta(error=e)
                return

    async def aclose(self) -> None:
        """Stop generating; record the turn as incomplete unless it was recorded (idempotent)."""
        if self._closed:
            return
        self._closed = True
        close = getattr(self._events, "aclose", None)
        if close is not None:
            await close()
        if not self._recorded:
            self._recorded = True
            self._choice.abort()
            self.result.parsed = renamed(self.result.parsed or ParsedCompletion(), self._rename)
            await record_choices(self.gw.store, self.gw.metrics, self.ctx, [self.result])


class EventStreamResponse(StreamingResponse):
    """A ``text/event-stream`` response that always runs ``on_close`` when it ends — finished,
    failed or cut by the client — in a cancellation-shielded scope (so an aborted turn is still
    recorded)."""

    media_type = "text/event-stream"

    def __init__(
        self,
        body: AsyncIterator[bytes],
        on_close: Callable[[], Awaitable[None]],
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(
            body,
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})},
        )
        self._on_close = on_close

    async def stream_response(self, send: Send) -> None:
        try:
            await super().stream_response(send)
        finally:
            with anyio.CancelScope(shield=True):
                await self._on_close()
