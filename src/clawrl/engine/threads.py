"""Torch work off the event loop without slowing the engine thread afterwards.

PyTorch's CPU build runs its intra-op parallelism on OpenMP (libgomp). Every thread that runs a
parallel op gets its own OpenMP team, which lives as long as the thread. Once the process holds
more OpenMP threads than it has cores, libgomp spins only briefly before a waiting worker sleeps
(GCC's ``GOMP_SPINCOUNT`` documentation: 100 spins instead of 300,000 by default), so every parallel op
in every thread pays for waking its workers, for as long as the extra team lives. Measured with
``benchmarks/engine_throughput.py`` on a 2-core machine: one stream of the in-process engine on
SmolLM2-135M gave 26.4 tok/s alone and 16.1 while a second thread that had run one forward pass
was still alive (an ``asyncio.to_thread`` worker, for example, lives until its loop closes).

:func:`in_transient_thread` therefore runs a blocking call (a judge model's forward pass) in a
new thread that ends with the call, so its OpenMP team ends too. Starting a thread costs ~0.1 ms,
nothing next to a forward pass.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


async def in_transient_thread(fn: Callable[..., T], *args: Any, name: str = "clawrl-call") -> T:
    """``await fn(*args)`` run in a new daemon thread that ends when ``fn`` returns.

    Use it instead of ``asyncio.to_thread`` for calls that run torch ops (see the module doc).
    An exception ``fn`` raises is raised here. If the awaiting task is cancelled, ``fn`` still
    runs to its end in its thread and its result is dropped.
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
        if not loop.is_closed():
            loop.call_soon_threadsafe(settle, *outcome)

    threading.Thread(target=run, name=name, daemon=True).start()
    return await done
