"""Real streaming of chat completions: one SSE chunk per sampled token.

Flow: one producer task per choice reads :meth:`Engine.generate_stream` into a shared queue; the
response body (:class:`ChatStream`) turns each token into a chunk as it arrives — the first
chunk (``role: assistant``) right after prefill, so time to first token is the prefill time.
When a choice finishes, its turn is recorded (committed) *before* its finish chunk is sent;
after every choice: a usage chunk (``choices: []``) when ``stream_options.include_usage``, then
``data: [DONE]``.

Disconnects: :class:`SSEResponse` always closes the body, shielded from cancellation, whether the
stream ended, failed or the client went away; :meth:`ChatStream.aclose` then cancels the
producers (which aborts the engine requests) and records every choice not yet recorded as
``incomplete`` with the tokens sampled so far (never trainable).

Errors: a failure before the first token is raised by :meth:`ChatStream.open` so the route can
answer a plain HTTP error; a failure mid-stream records the failed choice as ``error`` (the
others as incomplete), sends ``data: {"error": {...}}`` and ends the stream.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Send

from clawrl.engine import TokenEvent
from clawrl.errors import EngineError, StoreError
from clawrl.gateway.choices import StreamedChoice
from clawrl.gateway.errors import error_kind, status_and_body
from clawrl.gateway.recorder import CallContext, record_choices
from clawrl.gateway.responses import chunk_json, logprob_entry, sse, tool_call_json, usage_json
from clawrl.gateway.state import GatewayState
from clawrl.store import TurnStatus

log = logging.getLogger(__name__)

_Item = tuple[StreamedChoice, TokenEvent | BaseException]


class ChatStream:
    """The body of a streamed chat completion (an async iterator of SSE bytes).

    Args:
        gw: the gateway state.
        ctx: the call's shared context.
        choices: one :class:`StreamedChoice` per ``n``.
        response_id: the ``chatcmpl-`` id shared by every chunk.
        model: the ``model`` field of the chunks.
        include_usage: end with a usage chunk.
        want_logprobs: attach ``logprobs`` to token chunks.
    """

    def __init__(
        self,
        gw: GatewayState,
        ctx: CallContext,
        choices: list[StreamedChoice],
        *,
        response_id: str,
        model: str,
        include_usage: bool,
        want_logprobs: bool,
    ) -> None:
        self._gw = gw
        self._ctx = ctx
        self._choices = choices
        self._id = response_id
        self._model = model
        self._created = int(ctx.created_at)
        self._include_usage = include_usage
        self._want_logprobs = want_logprobs
        self._queue: asyncio.Queue[_Item] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []
        self._first: _Item | None = None
        self._gen: AsyncIterator[bytes] | None = None
        self._closed = False

    async def open(self) -> None:
        """Start generating and wait for the first token of any choice.

        Raises:
            ClientInputError, EngineError: the engine refused or failed before any token (every
                choice is then recorded: the failed one as an error, the others incomplete).
        """
        prompt = self._ctx.prepared.prompt_ids
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
        stream = self._gw.engine.generate_stream(prompt, ch.result.params)
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
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()

    def __aiter__(self) -> ChatStream:
        return self

    async def __anext__(self) -> bytes:
        if self._gen is None:
            self._gen = self._run()
        return await self._gen.__anext__()

    def _chunk(self, choices: list[dict[str, Any]], usage: dict[str, int] | None = None) -> bytes:
        version = max((c.result.policy_version for c in self._choices), default=0)
        return sse(
            chunk_json(
                id_=self._id,
                created=self._created,
                model=self._model,
                policy_version=version,
                choices=choices,
                usage=usage,
                include_usage=self._include_usage,
            )
        )

    async def _run(self) -> AsyncIterator[bytes]:
        assert self._first is not None, "ChatStream.open() must be awaited first"
        item: _Item = self._first
        tok = self._gw.tokenizer
        while True:
            ch, ev = item
            if isinstance(ev, BaseException):
                await self._fail(ch, ev)
                self._gw.metrics.inc("clawrl_gateway_errors_total", kind=error_kind(ev))
                _, body = status_and_body(ev)
                yield sse(body)
                return
            content, reasoning, calls = ch.push(ev)
            delta: dict[str, Any] = {}
            if not ch.role_sent:
                delta = {"role": "assistant", "content": content}
                ch.role_sent = True
            elif content:
                delta["content"] = content
            if reasoning:
                delta["reasoning_content"] = reasoning
            if calls:
                delta["tool_calls"] = [
                    tool_call_json(c, index=ch.calls_sent + k) for k, c in enumerate(calls)
                ]
                ch.calls_sent += len(calls)
            lp = None
            if self._want_logprobs:
                lp = {"content": [logprob_entry(tok, ev.token_id, ev.logprob, ev.top_logprobs)]}
            if delta or lp:
                choice = {"index": ch.result.index, "delta": delta, "logprobs": lp}
                yield self._chunk([{**choice, "finish_reason": None}])
            if ch.finished:
                await self._record([ch])
                done = {"index": ch.result.index, "delta": {}, "logprobs": None}
                yield self._chunk([{**done, "finish_reason": ch.result.finish_reason}])
            if all(c.finished for c in self._choices):
                break
            item = await self._queue.get()
        if self._include_usage:
            completion = sum(len(c.result.token_ids) for c in self._choices)
            usage = usage_json(len(self._ctx.prepared.prompt_ids), completion)
            yield self._chunk([], usage=usage)
        yield sse("[DONE]")

    async def _fail(self, ch: StreamedChoice, exc: BaseException) -> None:
        ch.finished = True
        ch.result.status = TurnStatus.ERROR
        ch.result.error = exc
        ch.result.error_kind = error_kind(exc)
        ch.result.finish_reason = None
        for other in self._choices:
            other.abort()
        await self._record([c for c in self._choices if not c.recorded])

    async def _record(self, choices: list[StreamedChoice]) -> None:
        for c in choices:
            c.recorded = True
        await record_choices(
            self._gw.store, self._gw.metrics, self._ctx, [c.result for c in choices]
        )

    async def aclose(self) -> None:
        """Stop generating and record every choice not recorded yet as incomplete (idempotent).

        Called by :class:`SSEResponse` when the response ends for any reason.
        """
        if self._closed:
            return
        self._closed = True
        if self._gen is not None:
            gen_close = getattr(self._gen, "aclose", None)
            if gen_close is not None:
                await gen_close()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        pending = [c for c in self._choices if not c.recorded]
        for c in pending:
            c.abort()
        try:
            if pending:
                await self._record(pending)
        except StoreError as e:
            log.error("could not record %d aborted stream choice(s): %s", len(pending), e)
            self._gw.metrics.inc("clawrl_gateway_errors_total", kind="store")


class SSEResponse(StreamingResponse):
    """A ``text/event-stream`` response that always closes its :class:`ChatStream`.

    Starlette cancels the sending task when the client disconnects; the body is then closed in a
    cancellation-shielded scope so the aborted turn is still recorded.
    """

    media_type = "text/event-stream"

    def __init__(self, body: ChatStream, headers: dict[str, str] | None = None) -> None:
        super().__init__(
            body,
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})},
        )
        self._body = body

    async def stream_response(self, send: Send) -> None:
        try:
            await super().stream_response(send)
        finally:
            with anyio.CancelScope(shield=True):
                await self._body.aclose()
