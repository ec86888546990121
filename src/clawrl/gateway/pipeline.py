"""One model call, whatever the protocol: chat completions, Anthropic Messages, OpenAI Responses.

Each route turns its body into neutral messages (:mod:`clawrl.chat`) and a :class:`CallRequest`;
from there every call goes the same way, so each rule is written once and one turn record per
choice comes out whatever the protocol:

1. :func:`start_call` — in a worker thread, render + splice + attribute
   (:func:`clawrl.gateway.prepare.prepare_messages`) and, for a subagent, find the parent
   agent's turn; the client facts (:func:`client_facts`) and the request facts are fixed; a
   prompt that does not fit the context window is recorded as an error turn, then raised
   (:class:`~clawrl.errors.ContextLengthError`, a 400 in the client's error shape);
2. :func:`complete_call` (non-streamed: the ``n`` choices generated concurrently, the response
   built, then the turns recorded; a client that goes away cancels the call and its turns are
   recorded incomplete) or :class:`CallStream` (streamed: one :class:`ChoiceDelta` per sampled
   token; each choice's turn recorded before its last delta) — with the tool-call ids the client
   will see.

Failure rules, the same for every protocol:

* the engine fails before any token: the failed choice is an ``error`` turn, its siblings
  ``incomplete``; the route answers a plain HTTP error in its protocol's shape;
* the engine fails mid-stream: likewise, and the stream ends with an error event;
* the client disconnects, or the server shuts down: every choice not yet recorded is recorded
  ``incomplete`` with the tokens sampled so far (never trainable);
* building the response fails after generation: the choices are recorded as ``error`` turns,
  never as trainable answers the client did not get.

The routes only format: the response JSON or the protocol's event sequence.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.to_thread
from fastapi import Request
from fastapi.responses import Response
from starlette.responses import StreamingResponse
from starlette.types import Send

from clawrl.access import key_user, session_prefix
from clawrl.chat import ChatMessage, ParsedCompletion, ToolCall, ToolChoice, ToolSpec
from clawrl.engine import SamplingParams, TokenEvent
from clawrl.errors import (
    ClientInputError,
    ContextLengthError,
    EngineError,
    MaxTokensBeyondContextError,
    StoreError,
)
from clawrl.gateway.attribution import (
    ExplicitSession,
    agent_facts,
    first_user_text,
    retry_count,
    spawning_turn,
)
from clawrl.gateway.auth import key_fingerprint, presented_key
from clawrl.gateway.choices import StreamedChoice, complete_choice
from clawrl.gateway.decode import visible_text
from clawrl.gateway.disconnect import until_disconnected
from clawrl.gateway.errors import error_kind
from clawrl.gateway.prepare import PreparedCall, prepare_messages
from clawrl.gateway.recorder import (
    CallContext,
    ChoiceResult,
    build_turn,
    notify_listeners,
    record_choices,
)
from clawrl.gateway.seeding import seeded_params
from clawrl.gateway.state import GatewayState
from clawrl.gateway.users import resolve_user
from clawrl.store import ApiProtocol, TurnStatus, UntrainableReason
from clawrl.trajectory.history import HISTORY_LINK_FACT

log = logging.getLogger(__name__)

RenameCall = Callable[[str], str]
"""Maps the parser's tool-call id (``call_…``) to the id the client sees (``toolu_…``)."""


def _same_id(call_id: str) -> str:
    return call_id


@dataclass
class CallRequest:
    """A request in neutral form, ready for the shared pipeline.

    Attributes:
        protocol: the client API.
        messages: the neutral messages.
        tools: the tools offered to the policy.
        tool_choice: the neutral tool choice.
        params: the engine sampling params, one per choice (chat completions' ``n``; the
            other protocols have one).
        parallel_tool_calls: ``False`` keeps only the first parsed tool call.
        explicit: the session the client named, if any.
        side_kind: a side-call kind signalled in the headers (``None``: recognised from the
            messages, else a main call).
        facts: request-level facts stored with the turn's sampling params (ignored fields,
            notes such as ``ignored_tool:web_search``, stream, ...).
        requested_model: the ``model`` the client asked for.
        rename_call: tool-call id mapping (:data:`RenameCall`).
        max_tokens_param: the field that set the completion budget (``max_tokens``,
            ``max_completion_tokens``, ``max_output_tokens``); ``None`` when the gateway's
            default applies (then capped at what fits, never refused).
        body_user: the end-user field of the body, ``(field, value)``
            (:func:`clawrl.gateway.users.body_user`).
    """

    protocol: ApiProtocol
    messages: list[ChatMessage]
    tools: list[ToolSpec]
    tool_choice: ToolChoice
    params: list[SamplingParams]
    parallel_tool_calls: bool = True
    explicit: ExplicitSession | None = None
    side_kind: str | None = None
    facts: dict[str, Any] = field(default_factory=dict)
    requested_model: str | None = None
    rename_call: RenameCall = _same_id
    max_tokens_param: str | None = None
    body_user: tuple[str, Any] | None = None


@dataclass
class Call:
    """A prepared call: its shared context and one :class:`ChoiceResult` per choice."""

    ctx: CallContext
    choices: list[ChoiceResult]

    @property
    def headers(self) -> dict[str, str]:
        """``x-clawrl-session-id`` and ``x-clawrl-turn-ids`` (comma-separated, choice order)."""
        return {
            "x-clawrl-session-id": header_value(self.ctx.prepared.session_id),
            "x-clawrl-turn-ids": ",".join(c.turn_id for c in self.choices),
        }


def header_value(text: str) -> str:
    """``text`` percent-encoded where it is not a plain printable ASCII header character
    (session ids and field names come from clients; ``sess-42`` or a uuid pass unchanged)."""
    from urllib.parse import quote

    return quote(text, safe="!#$&'()*+,/:;=?@[]~-._ ")[:1024]


def _cut(value: str | None, n: int) -> str | None:
    return None if value is None else value[:n]


def client_facts(request: Request, prepared: PreparedCall, model: str | None) -> dict[str, Any]:
    """Who called: user-agent, address, key fingerprint, request id, retry count, attribution,
    subagent ids, evaluation traffic; the API key itself is never stored (only
    :func:`clawrl.gateway.auth.key_fingerprint`)."""
    h = request.headers
    raw_retry = h.get("x-stainless-retry-count")
    info: dict[str, Any] = {
        "user_agent": h.get("user-agent"),
        "remote_addr": f"{request.client.host}:{request.client.port}" if request.client else None,
        "api_key_fingerprint": key_fingerprint(presented_key(request)),
        "request_id": h.get("x-request-id") or h.get("x-client-request-id"),
        # the parsed count, else the raw header (cut) for the record
        "retry_count": count if (count := retry_count(h)) is not None else _cut(raw_retry, 64),
        "attribution": prepared.attribution,
        "attribution_confidence": None if prepared.link is None else prepared.link.confidence,
        "attribution_evidence": dict(prepared.link.extra)
        if prepared.link and prepared.link.extra
        else None,
        # a link by messages: how the template re-rendered the continued turn's answer
        HISTORY_LINK_FACT: prepared.history_link,
        "requested_model": model,
        # evaluation traffic (clawrl eval, the demo's before/after scores) is never trained on
        "eval": True if h.get("x-clawrl-eval", "").strip() in ("1", "true") else None,
        **agent_facts(h),
    }
    return {k: v for k, v in info.items() if v is not None}


def _first_surrogate(value: Any, path: str) -> str | None:
    """The path of the first string under ``value`` that is not encodable as UTF-8 (a lone
    surrogate such as ``\\ud800``, which JSON can carry and SQLite cannot store)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path
        return None
    if isinstance(value, dict):
        for k, v in value.items():
            found = _first_surrogate(k, path) or _first_surrogate(v, f"{path}.{k}")
            if found:
                return found
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            found = _first_surrogate(v, f"{path}[{i}]")
            if found:
                return found
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            found = _first_surrogate(getattr(value, f.name), f"{path}.{f.name}" if path else f.name)
            if found:
                return found
    return None


_ESCAPED_SURROGATE = re.compile(rb"\\[uU][dD][89a-fA-F]")
"""A JSON escape of a UTF-16 surrogate (``\\ud800``-``\\udfff``): only such bodies are parsed again."""


async def _check_body_unicode(request: Request) -> None:
    """Refuse a JSON body holding a lone surrogate in any string, key or value (JSON's
    ``"\\ud800"`` decodes to one; no field of it can be stored, logged or tokenized).

    Raises:
        ClientInputError: (400, ``invalid_unicode``) naming the first such field.
    """
    try:
        raw = await request.body()  # already read (and cached) when the route parsed it
    except Exception:  # no body to check: the route's own parsing decides
        return
    if _ESCAPED_SURROGATE.search(raw) is None:
        return  # no escaped surrogate at all: the common case costs one scan
    try:
        data = json.loads(raw)
    except ValueError:
        return
    found = _first_surrogate(data, "")
    if found is not None:
        field = found.lstrip(".") or "body"
        raise ClientInputError(
            f"{field} contains invalid Unicode (a lone surrogate such as \\ud800); send valid "
            "UTF-8 text",
            param=field.split("[")[0].split(".")[0],
            code="invalid_unicode",
        )


def _check_unicode(req: CallRequest) -> None:
    """Refuse a request whose recorded fields (sampling params and their stop strings, request
    facts, the model name, the session id it names) hold a lone surrogate; messages and tools are checked where the
    prompt is rendered (:func:`clawrl.chat.render_prompt`).

    Raises:
        ClientInputError: (400, ``invalid_unicode``) naming the field.
    """
    found = (
        _first_surrogate([dataclasses.asdict(p) for p in req.params], "params")
        or _first_surrogate(req.facts, "request")
        or _first_surrogate(req.requested_model or "", "model")
        or _first_surrogate(req.explicit, "session")
    )
    if found:
        raise ClientInputError(
            f"{found} contains invalid Unicode (a lone surrogate such as \\ud800); send valid "
            "UTF-8 text",
            param=found.split("[")[0].split(".")[-1] if found != "model" else "model",
            code="invalid_unicode",
        )


async def start_call(gw: GatewayState, request: Request, req: CallRequest) -> Call:
    """Prepare, attribute and check one call (see the module docstring, step 1).

    Returns:
        The call's context and its choices, not generated yet.

    Raises:
        ClientInputError: (400) the template rejects the conversation.
        ContextLengthError: (400) the prompt does not fit the context, or not with the
            ``max_tokens`` the client set (:class:`MaxTokensBeyondContextError`, unless
            ``sampling.max_tokens_beyond_context`` is ``clamp``); recorded as an error turn.
        StoreError: the store could not be read or written.
    """
    started, created = time.perf_counter(), time.time()
    await _check_body_unicode(request)
    _check_unicode(req)
    user_id = resolve_user(request, req.body_user, gw.user_from)
    adapter = None if gw.user_adapters is None else await gw.user_adapters.for_user(user_id)
    agent = agent_facts(request.headers)
    client_name = (request.headers.get("user-agent") or "")[:200] or None
    retries = retry_count(request.headers)
    who = {
        "user_agent": request.headers.get("user-agent"),
        "api_key_fingerprint": key_fingerprint(presented_key(request)),
    }

    prefix = session_prefix(request)  # a user's key: their sessions are their own

    def blocking() -> tuple[PreparedCall, tuple[str | None, str] | None]:
        prepared = prepare_messages(
            gw.tokenizer, gw.store, req.messages, req.tools, req.tool_choice, req.explicit,
            client_name=client_name, side_kind=req.side_kind, retry_count=retries, client=who,
            memory=gw.memory, session_prefix=prefix,
        )  # fmt: skip
        spawn = None
        if "agent_id" in agent:
            spawn = spawning_turn(
                gw.store, prepared.session_id, agent["agent_id"], agent.get("parent_agent_id"),
                first_user_text(prepared.messages),
            )  # fmt: skip
        return prepared, spawn

    prepared, spawn = await anyio.to_thread.run_sync(blocking)
    keyed = key_user(request)
    if keyed is not None:  # a user's key acts in their own sessions only
        others = await anyio.to_thread.run_sync(gw.store.session_user_ids, prepared.session_id)
        if others - {keyed}:
            raise ClientInputError(
                "this call's history continues a conversation of another user: a user's key can "
                "only add to that user's own sessions; start a new conversation",
                status=403, code="session_of_another_user",
            )  # fmt: skip
    if prepared.spliced:
        gw.metrics.inc("clawrl_gateway_spliced_messages_total", len(prepared.spliced))
    client = client_facts(request, prepared, req.requested_model)
    if spawn is not None and spawn[0] is not None:
        client["parent_agent_turn_id"], client["spawn_link"] = spawn
    sampling = {
        **req.facts,
        "tool_choice": prepared.tool_choice.model_dump(mode="json"),
        "parallel_tool_calls": req.parallel_tool_calls,
        "history_splices": [[i, t] for i, t in prepared.spliced],
    }
    ctx = CallContext(
        prepared=prepared, client=client, sampling=sampling, created_at=created,
        started=started, protocol=req.protocol, user_id=user_id,
        adapter_trained=gw.user_adapters is not None and gw.user_adapters.trained,
    )  # fmt: skip
    params = seeded_params(
        req.params, prepared.sampling_seed, prepared.prompt_ids, prepared.sampling_attempt
    )
    if adapter is not None:  # the user's own adapter on top of the policy
        params = [dataclasses.replace(p, adapter=adapter) for p in params]
    call = Call(ctx, [ChoiceResult(index=i, params=p) for i, p in enumerate(params)])
    prompt_len, window = len(prepared.prompt_ids), gw.engine.max_context
    asked = max(p.max_tokens for p in params)
    exc: ContextLengthError | None = None
    if prompt_len >= window:
        exc = ContextLengthError(prompt_len, window)
    elif req.max_tokens_param and prompt_len + asked > window:
        if gw.defaults.max_tokens_beyond_context == "refuse":
            exc = MaxTokensBeyondContextError(prompt_len, asked, window, req.max_tokens_param)
        else:
            sampling["max_tokens_clamped_to"] = window - prompt_len
    if exc is not None:
        await record_failure(gw, ctx, call.choices, exc)
        raise exc
    return call


async def record_failure(
    gw: GatewayState,
    ctx: CallContext,
    failed: Sequence[ChoiceResult],
    exc: BaseException,
    *,
    siblings: Sequence[ChoiceResult] = (),
    notify: bool = True,
) -> None:
    """Record ``failed`` as error turns (their tokens so far kept; never trainable) and
    ``siblings`` — choices the client will not receive because the call failed — as
    incomplete (``notify``: tell the turn listeners, :func:`recorder.record_choices`)."""
    kind = error_kind(exc)
    for c in failed:
        c.status = TurnStatus.ERROR
        c.error = exc
        c.error_kind = kind
        c.finish_reason = None
        c.policy_version = c.policy_version or gw.engine.policy_version
    for c in siblings:
        c.status, c.finish_reason = TurnStatus.INCOMPLETE, "aborted"
    await record_choices(gw, ctx, [*failed, *siblings], notify=notify)


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


Respond = Callable[[list[ChoiceResult]], Response]
"""Builds the route's response from the finished choices (before they are recorded)."""


async def complete_call(
    gw: GatewayState, request: Request, call: Call, req: CallRequest, respond: Respond
) -> Response:
    """Generate every choice, build the response, record the turns, answer (step 2).

    The response is built before the turns are recorded, so a response that cannot be built
    leaves error turns, never trainable answers nobody received; a client that disconnects
    first gets nothing and the call's turns are recorded incomplete.

    Raises:
        EngineError: generation failed (the failed choice recorded as an error, its siblings
            incomplete).
        StoreError: the turns could not be recorded.
    """
    result = await until_disconnected(request, _complete(gw, call, req, respond))
    return result


async def _complete(gw: GatewayState, call: Call, req: CallRequest, respond: Respond) -> Response:
    ctx = call.ctx

    async def one(c: ChoiceResult) -> ChoiceResult:
        admitted = time.perf_counter()
        completion = await gw.engine.generate(ctx.prepared.prompt_ids, c.params)
        done = complete_choice(
            gw.tokenizer, c.index, c.params, completion,
            stop_token_ids=gw.stop_token_ids, prefill_text=ctx.prepared.prefill_text,
            tools_enabled=ctx.prepared.tools_enabled, parallel_tool_calls=req.parallel_tool_calls,
            started=ctx.started, admitted=admitted,
        )  # fmt: skip
        done.turn_id = c.turn_id
        assert done.parsed is not None
        done.parsed = renamed(done.parsed, req.rename_call)
        return done

    try:
        outcomes = await asyncio.gather(*(one(c) for c in call.choices), return_exceptions=True)
    except asyncio.CancelledError:  # client gone or server shutdown: nothing was answered
        for c in call.choices:
            c.status, c.finish_reason = TurnStatus.INCOMPLETE, "aborted"
        await record_choices(gw, ctx, call.choices)
        raise
    failed = [
        c for c, o in zip(call.choices, outcomes, strict=True) if isinstance(o, BaseException)
    ]
    results = [o for o in outcomes if isinstance(o, ChoiceResult)]
    if failed:
        error = next(o for o in outcomes if isinstance(o, BaseException))
        await record_failure(gw, ctx, failed, error, siblings=results)
        raise error
    try:
        response = respond(results)
    except Exception as e:  # the client will get an error, not these answers
        await record_failure(gw, ctx, results, e)
        raise
    await record_choices(gw, ctx, results)
    return response


@dataclass
class ChoiceDelta:
    """What one sampled token added to one choice of a streamed answer.

    Attributes:
        index: the choice.
        content: new client-visible text.
        reasoning: new reasoning text.
        calls: tool calls completed by this token (ids as the client sees them).
        event: the engine's token event (id, log-prob, alternatives); ``None`` on an error.
        first: the first delta of this choice.
        done: the choice finished; its turn is recorded and ``result`` is final.
        error: the engine failed (the call's turns are recorded); the stream ends.
        result: the choice's record (final when ``done``).
    """

    index: int
    result: ChoiceResult
    content: str = ""
    reasoning: str = ""
    calls: list[ToolCall] = field(default_factory=list)
    event: TokenEvent | None = None
    first: bool = False
    done: bool = False
    error: BaseException | None = None


_Item = tuple[StreamedChoice, TokenEvent | BaseException]


class CallStream:
    """A streamed call: engine tokens of every choice in, :class:`ChoiceDelta` out.

    Await :meth:`open` in the route (a failure before the first token is then a plain HTTP
    error), iterate :meth:`deltas` in the response body, and always :meth:`aclose`
    (:class:`EventStreamResponse` does): a stream cut short — the client went away — records
    every choice not yet recorded as ``incomplete`` with the tokens sampled so far.
    """

    def __init__(self, gw: GatewayState, call: Call, req: CallRequest) -> None:
        self.gw = gw
        self.call = call
        self._rename = req.rename_call
        prepared = call.ctx.prepared
        self._choices = [
            StreamedChoice(
                gw.tokenizer, c, stop_token_ids=gw.stop_token_ids,
                prefill_text=prepared.prefill_text, tools_enabled=prepared.tools_enabled,
                parallel_tool_calls=req.parallel_tool_calls, started=call.ctx.started,
            )
            for c in call.choices
        ]  # fmt: skip
        self._queue: asyncio.Queue[_Item] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []
        self._first: _Item | None = None
        self._closed = False
        self._notified = False

    @property
    def results(self) -> list[ChoiceResult]:
        """The choices' records, in choice order."""
        return self.call.choices

    async def open(self) -> None:
        """Start generating every choice and wait for the first token of any.

        Raises:
            ClientInputError, EngineError: the engine refused or failed before any token (the
                failed choice is recorded as an error, the others incomplete).
        """
        prompt = self.call.ctx.prepared.prompt_ids
        for ch in self._choices:
            self._tasks.append(asyncio.create_task(self._produce(ch, prompt)))
        try:
            first = await self._queue.get()
        except BaseException:  # cancelled (shutdown): record the choices as incomplete
            with anyio.CancelScope(shield=True):
                await self.aclose()
            raise
        if isinstance(first[1], BaseException):
            try:
                await self._fail(first[0], first[1])
            finally:
                await self.aclose()
            raise first[1]
        self._first = first

    async def _produce(self, ch: StreamedChoice, prompt: list[int]) -> None:
        stream = self.gw.engine.generate_stream(prompt, ch.result.params)
        try:
            finished = False
            async for ev in stream:
                self._queue.put_nowait((ch, ev))
                finished = ev.finish_reason is not None
            if not finished:
                raise EngineError("the engine's stream ended without a finish reason")
        except Exception as e:  # delivered to the consumer, which maps and records it
            self._queue.put_nowait((ch, e))
        finally:
            aclose = getattr(stream, "aclose", None)  # an async generator's, if it is one
            if aclose is not None:
                await aclose()

    async def deltas(self) -> AsyncIterator[ChoiceDelta]:
        """Yield one :class:`ChoiceDelta` per sampled token until every choice is done; an
        engine failure yields one delta with ``error`` and ends the stream."""
        assert self._first is not None, "CallStream.open() must be awaited first"
        item: _Item = self._first
        while True:
            ch, ev = item
            if isinstance(ev, BaseException):
                self.gw.metrics.inc("clawrl_gateway_errors_total", kind=error_kind(ev))
                await self._fail(ch, ev)
                yield ChoiceDelta(ch.result.index, ch.result, error=ev)
                return
            first = not ch.result.token_ids
            content, reasoning, calls = ch.push(ev)
            calls = [c.model_copy(update={"id": self._rename(c.id)}) for c in calls]
            if ch.finished:
                assert ch.result.parsed is not None
                ch.result.parsed = renamed(ch.result.parsed, self._rename)
                await self._record([ch])
            yield ChoiceDelta(
                ch.result.index, ch.result, content, reasoning, calls, event=ev, first=first,
                done=ch.finished,
            )  # fmt: skip
            if all(c.finished for c in self._choices):
                self._notify()
                return
            item = await self._queue.get()

    async def _fail(self, ch: StreamedChoice, exc: BaseException) -> None:
        ch.finished = True
        for other in self._choices:
            other.abort()
        done = [c for c in self._choices if c is not ch and c.recorded]
        siblings = [c for c in self._choices if c is not ch and not c.recorded]
        for c in (ch, *siblings):
            c.recorded = True
        await record_failure(
            self.gw, self.call.ctx, [ch.result], exc, siblings=[c.result for c in siblings],
            notify=False,
        )  # fmt: skip
        # Choices recorded as finished before this failure: the stream now ends with an error,
        # which clients treat as a failed call, so they are no trainable answers either.
        for c in done:
            c.result.status, c.result.finish_reason = TurnStatus.INCOMPLETE, "aborted"
        if done:
            await anyio.to_thread.run_sync(_mark_incomplete, self.gw, [c.result for c in done])
        self._notify()

    async def _record(self, choices: list[StreamedChoice]) -> None:
        for c in choices:
            c.recorded = True
        await record_choices(self.gw, self.call.ctx, [c.result for c in choices], notify=False)

    def _notify(self) -> None:
        """Tell the turn listeners once about every choice of the call, as it ended."""
        if self._notified or not self.gw.turn_listeners:
            return
        self._notified = True
        notify_listeners(self.gw, [build_turn(self.call.ctx, c.result) for c in self._choices])

    async def aclose(self) -> None:
        """Stop generating; record every choice not recorded yet as incomplete (idempotent)."""
        if self._closed:
            return
        self._closed = True
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        pending = [c for c in self._choices if not c.recorded]
        for c in pending:
            c.abort()
            if c.result.parsed is not None:
                c.result.parsed = renamed(c.result.parsed, self._rename)
        try:
            if pending:
                await self._record(pending)
        except StoreError as e:  # the response has started: log it, never mask a cancellation
            log.error("could not record %d aborted stream choice(s): %s", len(pending), e)
            self.gw.metrics.inc("clawrl_gateway_errors_total", kind="store")
        else:
            self._notify()


def _mark_incomplete(gw: GatewayState, results: list[ChoiceResult]) -> None:
    for r in results:
        gw.store.update_turn(
            r.turn_id,
            status=TurnStatus.INCOMPLETE,
            finish_reason="aborted",
            trainable=False,
            untrainable_reason=UntrainableReason.INCOMPLETE.value,
        )


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


def stream_response(
    stream: CallStream, events: AsyncIterator[bytes], headers: dict[str, str]
) -> EventStreamResponse:
    """The SSE response of a streamed call: ``events`` (the route's formatting of
    :meth:`CallStream.deltas`), then the stream closed whatever happened."""

    async def on_close() -> None:
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()
        await stream.aclose()

    return EventStreamResponse(events, on_close, headers=headers)
