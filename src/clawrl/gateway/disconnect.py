"""Stop work for clients that have gone away (non-streamed requests).

A streamed answer notices a disconnect when its next chunk cannot be sent. A non-streamed
answer sends nothing until it is complete, so without a watch a client that timed out would
keep its rows in the engine's batch up to ``max_tokens`` and its turn would be recorded as a
normal, trainable answer that nobody received. :func:`until_disconnected` polls the connection
while the handler runs and cancels the handler when the client is gone; the handler's
cancellation path records the turn as ``incomplete`` (never trained).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

from fastapi import Request
from fastapi.responses import Response

T = TypeVar("T")

POLL_S = 0.5
CLIENT_CLOSED_REQUEST = 499  # nginx's code; the client never sees it


async def until_disconnected(request: Request, work: Awaitable[T]) -> T | Response:
    """Await ``work``; if the client disconnects first, cancel it and return a 499 response.

    Raises:
        whatever ``work`` raises.
    """
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=POLL_S)
            if done:
                return task.result()
            if await request.is_disconnected():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                return Response(status_code=CLIENT_CLOSED_REQUEST)
    except asyncio.CancelledError:  # the server is shutting down: let the handler record it
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        raise
