"""Teacher scoring gives way to generation on a vLLM replica (clawrl.engine.vllm.yielding): the
gate alone, then through the engine on a fake server."""

from __future__ import annotations

import asyncio

import pytest

from clawrl.engine.types import SamplingParams
from clawrl.engine.vllm.yielding import ServingFirst


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))  # a hang is a failure, not a stuck suite


def request_log(log: list[str], seconds: float):
    """A scoring request that takes ``seconds`` and writes what happened to it into ``log``."""

    async def request() -> str:
        log.append("sent")
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            log.append("cancelled")
            raise
        log.append("done")
        return "scores"

    return request


def test_scoring_waits_while_the_replica_generates():
    async def go():
        gate, log = ServingFirst(max_defer_s=5, slots=2), []
        gate.serving_started()
        scoring = asyncio.create_task(gate.run(request_log(log, 0.01)))
        await asyncio.sleep(0.1)
        assert log == []  # held back
        gate.serving_ended()
        assert await scoring == "scores"
        return gate, log

    gate, log = run(go())
    assert log == ["sent", "done"]
    assert gate.preempted == 0 and gate.deferred_s >= 0.09


def test_generation_that_starts_cancels_scoring_which_is_sent_again_after():
    async def go():
        gate, log = ServingFirst(max_defer_s=5, slots=2), []
        scoring = asyncio.create_task(gate.run(request_log(log, 0.2)))
        await asyncio.sleep(0.05)
        gate.serving_started()  # a user's request arrives while the scoring request runs
        await asyncio.sleep(0.05)
        assert log == ["sent", "cancelled"]
        gate.serving_ended()
        return gate, await scoring, log

    gate, got, log = run(go())
    assert got == "scores"
    assert log == ["sent", "cancelled", "sent", "done"]
    assert gate.preempted == 1


def test_after_max_defer_s_scoring_runs_whatever_arrives():
    async def go():
        gate, log = ServingFirst(max_defer_s=0.2, slots=2), []
        gate.serving_started()  # generation never stops
        scoring = asyncio.create_task(gate.run(request_log(log, 0.3)))
        await asyncio.sleep(0.3)
        gate.serving_started()  # past the deadline: no longer cancelled
        return gate, await scoring, log

    gate, got, log = run(go())
    assert got == "scores" and log == ["sent", "done"] and gate.preempted == 0


def test_max_defer_0_never_holds_scoring_back():
    async def go():
        gate, log = ServingFirst(max_defer_s=0, slots=2), []
        gate.serving_started()
        return await gate.run(request_log(log, 0.01)), log

    assert run(go()) == ("scores", ["sent", "done"])


def test_slots_bound_scoring_in_flight_but_not_per_position_requests():
    async def go():
        gate = ServingFirst(max_defer_s=5, slots=2)
        now, peak = [0], [0]

        async def request():
            now[0] += 1
            peak[0] = max(peak[0], now[0])
            await asyncio.sleep(0.02)
            now[0] -= 1

        await asyncio.gather(*(gate.run(request) for _ in range(6)))
        bounded = peak[0]
        peak[0] = 0
        await asyncio.gather(*(gate.run(request, slot=False) for _ in range(6)))
        return bounded, peak[0]

    assert run(go()) == (2, 6)


def test_an_error_of_the_request_is_raised_and_frees_the_slot():
    async def go():
        gate = ServingFirst(max_defer_s=5, slots=1)

        async def broken():
            raise RuntimeError("replica said no")

        with pytest.raises(RuntimeError, match="replica said no"):
            await gate.run(broken)
        return await gate.run(request_log([], 0.0))

    assert run(go()) == "scores"


@pytest.mark.parametrize("bad", [{"max_defer_s": -1, "slots": 1}, {"max_defer_s": 1, "slots": 0}])
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValueError):
        ServingFirst(**bad)


def test_the_engine_cancels_a_teacher_score_when_a_user_request_starts(fake_vllm):
    """Through the engine: one scoring request in flight, then a generation request on the same
    replica; the scoring request is cancelled, sent again once generation ended, and its
    log-probs are those of an undisturbed request."""
    engine, (server,) = fake_vllm(plugin=True)
    server.delay_s = 0.3

    def sent() -> int:
        return sum(b.get("prompt") == [1, 2, 3, 11, 12] for _, b in server.calls)

    async def go():
        scoring = asyncio.create_task(engine.score([1, 2, 3], [11, 12], temperature=0.7))
        while sent() == 0:  # the scoring request is on the server
            await asyncio.sleep(0.01)
        done = await engine.generate([1, 2, 3], SamplingParams(max_tokens=2, temperature=0.0))
        return await scoring, done

    scores, done = run(go())
    assert done.token_ids == [11, 12]
    assert scores == pytest.approx([-0.25 / 0.7] * 2)
    assert sent() == 2  # sent, cancelled, sent again
    assert engine.replicas[0].scoring.preempted == 1
    assert engine.replicas[0].scoring.deferred_s >= 0.15  # it waited for the generation


def test_waiting_for_a_slot_does_not_use_up_the_deferral():
    """Three requests, one slot: the later ones, once they have the slot, still give way to a
    generation request (waiting behind other scoring is not deferral)."""

    async def go():
        gate, log = ServingFirst(max_defer_s=0.3, slots=1), []
        runs = [asyncio.create_task(gate.run(request_log(log, 0.2))) for _ in range(3)]
        await asyncio.sleep(0.45)  # the first done, the second running
        gate.serving_started()
        await asyncio.sleep(0.1)
        gate.serving_ended()
        await asyncio.gather(*runs)
        return gate, log

    gate, log = run(go())
    assert gate.preempted >= 1 and log.count("done") == 3
