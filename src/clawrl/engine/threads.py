"""Torch work outside the engine thread, in threads that end with it.

PyTorch's CPU build runs its intra-op parallelism on OpenMP (libgomp). Every thread that runs a
parallel op gets its own OpenMP team, which lives as long as the thread. Once the process holds
more OpenMP threads than it has cores, libgomp spins only briefly before a waiting worker sleeps
(GCC's ``GOMP_SPINCOUNT`` documentation: 100 spins instead of 300,000 by default), so every
parallel op in every thread pays for waking its workers, for as long as the extra team lives.
Measured with ``benchmarks/engine_throughput.py`` on a 2-core machine: one stream of the
in-process engine on SmolLM2-135M gave 26.4 tok/s alone and 16.1 while a second thread that had
run one forward pass was still alive (an ``asyncio.to_thread`` worker, for example, lives until
its loop closes, and the main thread of ``clawrl serve`` lives as long as the server).

So the engine's thread should be the only long-lived thread that runs torch ops: a judge
model's forward pass, a training step, loading a model or building a trainer run through
:func:`in_transient_thread` (from asyncio) or :func:`call_in_transient_thread` (blocking), in a
new thread that ends with the call, and its OpenMP team with it. A thread costs ~0.1 ms to
start, nothing next to a forward pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
log = logging.getLogger(__name__)


def call_in_transient_thread(fn: Callable[..., T], *args: Any, name: str = "clawrl-call") -> T:
    """``fn(*args)`` in a new thread that ends with it; blocks until then.

    An exception ``fn`` raises is raised here. A signal handler that raises while this waits
    (``SystemExit`` on SIGTERM) interrupts the wait; ``fn`` then runs on, in a daemon thread.
    """
    box: list[tuple[Any, BaseException | None]] = []

    def run() -> None:
        try:
            box.append((fn(*args), None))
        except BaseException as e:  # handed to the caller, raised there
            box.append((None, e))

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    thread.join()
    result, error = box[0]
    if error is not None:
        raise error
    return result  # type: ignore[no-any-return]


async def in_transient_thread(
    fn: Callable[..., T], *args: Any, name: str = "clawrl-call", finish_on_cancel: bool = False
) -> T:
    """``await fn(*args)`` run in a new daemon thread that ends when ``fn`` returns.

    Use it instead of ``asyncio.to_thread`` for calls that run torch ops (see the module doc).
    An exception ``fn`` raises is raised here.

    Args:
        finish_on_cancel: if the awaiting task is cancelled, wait for ``fn`` to end before the
            cancellation goes on (a training step must not outlive the loop that started it);
            otherwise (a judgment that timed out) return at once and drop ``fn``'s result.
    """
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if done.done():  # the waiter was cancelled
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(result)

    def run() -> None:
        try:
            result = fn(*args)
        except BaseException as e:  # handed to the waiter, raised there
            outcome: tuple[Any, BaseException | None] = (None, e)
        else:
            outcome = (result, None)
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits
            loop.call_soon_threadsafe(settle, *outcome)

    threading.Thread(target=run, name=name, daemon=True).start()
    if not finish_on_cancel:
        return await done
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(done)
            break
        except asyncio.CancelledError:
            if done.done():
                raise  # fn had ended: the cancellation is the waiter's own
            cancelled = True  # fn still runs: wait for it, then go on cancelling
        except BaseException as e:
            if not cancelled:
                raise
            log.warning("%s failed after its waiter was cancelled: %r", name, e)
            break
    if cancelled:
        raise asyncio.CancelledError
    return result
