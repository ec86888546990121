"""Teacher scoring yields to serving, per vLLM replica.

A scoring request (an OPD teacher's prompt log-probs, next-token scores) is a long prefill that
vLLM batches with whatever else runs: every decode step of a user's request that shares the
server with it pays for its compute. Measured with ``benchmarks/vllm_online.py --decompose`` on
one vLLM CPU server (2 cores, SmolLM2-135M, float32): an 8-token request took 0.10 s idle and
46 s while a burst of eight 956-token scoring requests ran, 6.2 s with one scoring request in
flight at a time. vLLM's priority scheduling orders only the waiting queue (running requests are
scheduled first), so clawrl keeps the order itself: scoring runs when the replica is not
generating, and gives way when generation starts.

:class:`ServingFirst`, one per replica:

1. at most ``slots`` scoring requests are in flight on the replica (a burst waits here, never in
   front of a user's request on the server); per-position scoring (a server without clawrl's
   plugin) and next-token judge prompts are bounded by the engine's ``SCORE_CONCURRENCY``
   instead;
2. a scoring request waits while the replica serves a generation request;
3. if a generation request starts while a scoring request runs, the scoring HTTP request is
   cancelled (vLLM aborts a completion whose client disconnected) and waits again (2);
4. ``max_defer_s`` after it got its slot, a scoring request runs to the end whatever arrives:
   under constant traffic scoring is delayed, never starved. ``max_defer_s = 0`` turns 2-3 off.

Counters (``preempted``, ``deferred_s``) say what yielding cost the learner.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")


class ServingFirst:
    """Scoring on one replica yields to its generation requests (see the module doc).

    Args:
        max_defer_s: seconds a scoring request may be held back or cancelled for serving,
            counted from when it got its slot (0: never held back).
        slots: scoring requests in flight at once on this replica.

    Attributes:
        serving: generation requests in flight on the replica now.
        preempted: scoring requests cancelled so far because generation started.
        deferred_s: seconds scoring requests waited for serving so far (summed).
    """

    def __init__(self, max_defer_s: float, slots: int) -> None:
        if max_defer_s < 0:
            raise ValueError(f"max_defer_s must be >= 0, got {max_defer_s}")
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        self.max_defer_s = float(max_defer_s)
        self.serving = 0
        self.preempted = 0
        self.deferred_s = 0.0
        self._slots = asyncio.Semaphore(slots)
        self._idle = asyncio.Event()
        self._idle.set()
        self._started = asyncio.Event()  # set when serving goes from 0 to 1, then replaced

    def serving_started(self) -> None:
        """A generation request starts on the replica (call :meth:`serving_ended` after)."""
        self.serving += 1
        if self.serving == 1:
            self._idle.clear()
            self._started.set()
            self._started = asyncio.Event()

    def serving_ended(self) -> None:
        """A generation request on the replica ended (however it ended)."""
        self.serving -= 1
        if self.serving == 0:
            self._idle.set()

    async def run(self, request: Callable[[], Awaitable[T]], *, slot: bool = True) -> T:
        """``await request()`` when serving lets it; a new call of ``request`` after each
        preemption (it must be safe to send again: scoring is).

        Args:
            request: makes and awaits one scoring HTTP request.
            slot: take one of the replica's scoring slots (``False`` for the many one-token
                requests of per-position scoring, bounded elsewhere).

        Raises:
            whatever ``request`` raises.
        """
        loop = asyncio.get_running_loop()
        async with self._slots if slot else contextlib.nullcontext():
            deadline = loop.time() + self.max_defer_s  # waiting for a slot is not deferral
            while True:
                left = deadline - loop.time()
                if left <= 0:
                    return await request()
                if self.serving:
                    t = loop.time()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._idle.wait(), left)
                    self.deferred_s += loop.time() - t
                    continue  # the deadline is checked again
                started = self._started
                task = asyncio.ensure_future(request())
                task.add_done_callback(_retrieve)  # a cancelled or failed try logs nothing
                waiter = asyncio.ensure_future(started.wait())
                try:
                    done, _ = await asyncio.wait({task, waiter}, timeout=left,
                                                 return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
                except BaseException:
                    task.cancel()
                    raise
                finally:
                    waiter.cancel()
                if task in done or waiter not in done:  # finished, or past the deadline
                    return await task
                task.cancel()  # generation started: give way, ask again
                await asyncio.wait({task})
                self.preempted += 1


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Mark a try's outcome as seen (the caller awaits the try that counts)."""
    if not task.cancelled():
        task.exception()
