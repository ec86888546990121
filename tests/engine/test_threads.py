"""clawrl.engine.threads: a blocking call runs in a thread that ends with it."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from clawrl.engine.threads import in_transient_thread


def test_the_result_comes_back_and_the_thread_ends():
    seen: list[threading.Thread] = []

    def work(a: int, b: int) -> int:
        seen.append(threading.current_thread())
        return a + b

    assert asyncio.run(in_transient_thread(work, 2, 3, name="clawrl-test-call")) == 5
    (thread,) = seen
    assert thread is not threading.main_thread() and thread.name == "clawrl-test-call"
    thread.join(timeout=5)
    assert not thread.is_alive()


def test_an_exception_is_raised_to_the_waiter():
    def boom() -> None:
        raise ValueError("the model failed")

    with pytest.raises(ValueError, match="the model failed"):
        asyncio.run(in_transient_thread(boom))


def test_a_cancelled_waiter_leaves_no_error_behind():
    """A judge timeout cancels the waiter; the call ends later and its result is dropped."""
    errors: list[dict] = []
    finished = threading.Event()

    def slow() -> int:
        time.sleep(0.2)
        finished.set()
        return 1

    async def go() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: errors.append(ctx))
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(in_transient_thread(slow), timeout=0.01)
        await asyncio.sleep(0.4)  # the call ends and settles a cancelled future

    asyncio.run(go())
    assert finished.is_set() and errors == []
