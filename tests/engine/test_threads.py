"""clawrl.engine.threads: a blocking call runs in a thread that ends with it."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from clawrl.engine.threads import call_in_transient_thread, in_transient_thread


def _ended(thread: threading.Thread) -> bool:
    """Whether ``thread`` ends within a few seconds (an executor's worker never does)."""
    thread.join(timeout=3)
    return not thread.is_alive()


def test_the_result_comes_back_and_the_thread_ends_while_the_loop_runs():
    seen: list[threading.Thread] = []

    def work(a: int, b: int) -> int:
        seen.append(threading.current_thread())
        return a + b

    async def go() -> None:
        assert await in_transient_thread(work, 2, 3, name="clawrl-test-call") == 5
        (thread,) = seen
        assert thread is not threading.main_thread() and thread.name == "clawrl-test-call"
        # checked inside the loop: asyncio.run joins its executor's workers on the way out, so
        # an asyncio.to_thread worker would pass a check made after it
        assert _ended(thread)

    asyncio.run(go())


def test_an_exception_is_raised_to_the_waiter():
    def boom() -> None:
        raise ValueError("the model failed")

    with pytest.raises(ValueError, match="the model failed"):
        asyncio.run(in_transient_thread(boom))
    with pytest.raises(ValueError, match="the model failed"):
        call_in_transient_thread(boom)


def test_the_blocking_form_runs_in_a_thread_that_ends():
    seen: list[threading.Thread] = []

    def work() -> str:
        seen.append(threading.current_thread())
        return "ok"

    assert call_in_transient_thread(work) == "ok"
    assert seen[0] is not threading.current_thread() and _ended(seen[0])


def _slow(started: threading.Event, finished: threading.Event) -> int:
    started.set()
    time.sleep(1.0)
    finished.set()
    return 1


def test_a_cancelled_waiter_returns_at_once_and_leaves_no_error_behind():
    """A judge timeout cancels the waiter; the call ends later and its result is dropped."""
    errors: list[dict] = []
    started, finished = threading.Event(), threading.Event()

    async def go() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: errors.append(ctx))
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(
                in_transient_thread(_slow, started, finished, name="clawrl-test-slow"), timeout=0.05
            )
        assert not finished.is_set()  # it did not wait for the call
        (thread,) = [t for t in threading.enumerate() if t.name == "clawrl-test-slow"]
        assert _ended(thread) and finished.is_set()
        await asyncio.sleep(0)  # the call's settle callback runs on a cancelled future
        await asyncio.sleep(0)

    asyncio.run(go())
    assert errors == []


def test_finish_on_cancel_waits_for_the_call_before_cancelling():
    """A training step must not outlive the loop that started it."""
    started, finished = threading.Event(), threading.Event()

    async def go() -> None:
        task = asyncio.ensure_future(
            in_transient_thread(_slow, started, finished, finish_on_cancel=True)
        )
        await asyncio.to_thread(started.wait, 5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert finished.is_set()

    asyncio.run(go())


def test_a_cancel_stays_a_cancel_when_the_call_then_fails():
    started = threading.Event()

    def fails_later() -> None:
        started.set()
        time.sleep(0.3)
        raise ValueError("the step failed")

    async def go() -> None:
        task = asyncio.ensure_future(in_transient_thread(fails_later, finish_on_cancel=True))
        await asyncio.to_thread(started.wait, 5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(go())
