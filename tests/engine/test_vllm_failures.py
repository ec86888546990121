"""The vLLM engine's failure paths, against fake replicas (``fake_vllm`` in conftest.py): no
server needed, so these run wherever the suite runs. What a real server does is in
``test_vllm_engine.py``; here: aborts, malformed streams, dying and returning replicas,
publishes that fail on some replicas or race each other, and closing with work in flight."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import time
from pathlib import Path

import pytest
import torch

from clawrl.engine import SamplingParams
from clawrl.errors import EngineClosedError, EngineError, EngineUnavailableError

pytestmark = pytest.mark.timeout(120)
PROMPT = [1, 2, 3]
PARAMS = SamplingParams(max_tokens=4, temperature=0.7, seed=1)


def _gen(engine, params=PARAMS):
    return asyncio.run(engine.generate(PROMPT, params))


def _stream(engine, params=PARAMS):
    async def go():
        return [e async for e in engine.generate_stream(PROMPT, params)]

    return asyncio.run(asyncio.wait_for(go(), 30))  # a hang is a failure, not a stuck suite


def _wait(cond, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.02)
    return cond()


def _adapter(tmp_path, name):
    """A minimal PEFT-shaped adapter dir: config and one lora_A / lora_B pair (non-zero)."""
    from safetensors.torch import save_file

    path = tmp_path / name
    path.mkdir()
    (path / "adapter_config.json").write_text('{"r": 2}')
    save_file({"m.q_proj.lora_A.weight": torch.ones(2, 4), "m.q_proj.lora_B.weight": torch.ones(4, 2)},
              str(path / "adapter_model.safetensors"))  # fmt: skip
    return path


def _full(tmp_path, name):
    path = tmp_path / name
    path.mkdir()
    (path / "model.safetensors").write_bytes(b"")
    return path


def test_a_fake_replica_serves_ids_and_logprobs(fake_vllm):
    engine, servers = fake_vllm()
    c = _gen(engine)
    assert c.token_ids == [11, 12, 13, 14] and c.logprobs == [-0.5] * 4
    events = _stream(engine)
    assert [e.token_id for e in events] == c.token_ids and events[-1].finish_reason == "length"
    body = [b for p, b in servers[0].calls if p == "/v1/completions"][-1]
    # every request pins the sampling vLLM would otherwise take from generation_config.json
    assert body["repetition_penalty"] == 1.0 and body["min_p"] == 0.0


def test_a_5xx_error_event_in_a_stream_is_unavailable(fake_vllm):
    engine, (server,) = fake_vllm()
    error = {"error": {"message": "EngineCore encountered an issue", "code": 500}}
    server.chunks = ["data: " + json.dumps(error), "data: [DONE]"]
    with pytest.raises(EngineUnavailableError, match="EngineCore"):
        _stream(engine)


def test_an_aborted_request_is_unavailable_not_a_turn(fake_vllm):
    engine, (server,) = fake_vllm()
    server.finish = "abort"
    with pytest.raises(EngineUnavailableError, match="aborted"):
        _gen(engine)
    with pytest.raises(EngineUnavailableError, match="aborted"):
        _stream(engine)


@pytest.mark.parametrize(
    "chunk",
    ["data: null", 'data: {"choices": [{"token_ids": [5], "logprobs": [1, 2]}]}',
     'data: {"choices": [{"text": "x", "finish_reason": null}]}',
     'data: {"choices": [{"token_ids": ["a"], "logprobs": {"token_logprobs": [-1.0]}}]}'],
)  # fmt: skip
def test_a_malformed_stream_ends_with_an_error_never_a_hang(fake_vllm, chunk):
    engine, (server,) = fake_vllm()
    server.chunks = [chunk, "data: [DONE]"]
    with pytest.raises(EngineError):
        _stream(engine)
    assert engine.stats.batch_size == 0  # the request was released


def test_a_5xx_is_unavailable_and_three_in_a_row_take_the_replica_out(fake_vllm):
    engine, (a, b) = fake_vllm(2, health_interval_s=600)  # no health check takes it back
    a.status = b.status = 503
    with pytest.raises(EngineUnavailableError):
        _stream(engine)
    with pytest.raises(EngineUnavailableError):
        _gen(engine)
    assert all(r.healthy for r in engine.replicas)  # one failure does not take a replica out
    assert engine.available
    for _ in range(4):
        with pytest.raises(EngineUnavailableError):
            _gen(engine)
    assert not any(r.healthy for r in engine.replicas)
    assert not engine.available  # the gateway's /healthz answers 503
    with pytest.raises(EngineUnavailableError, match="no vLLM replica is available"):
        _gen(engine)


def test_a_replica_that_lost_its_adapter_is_resynced(fake_vllm, tmp_path):
    engine, (server,) = fake_vllm()
    assert engine.load_policy(1, _adapter(tmp_path, "v1")).result(10) == 1
    name = next(iter(server.adapters))
    server.adapters.clear()  # the server restarted between two health checks
    with pytest.raises(EngineUnavailableError, match="lost adapter"):
        _gen(engine)
    assert _wait(lambda: engine.replicas[0].healthy)  # the health loop loaded it again
    assert name in server.adapters and _gen(engine).policy_version == 1


def test_a_returning_replica_gets_the_current_full_weights(fake_vllm, tmp_path):
    engine, (_a, b) = fake_vllm(2)
    b.down = True
    assert _wait(lambda: not engine.replicas[1].healthy)
    assert engine.load_policy(1, _full(tmp_path, "w1")).result(10) == 1
    assert not [c for c in b.calls if c[0] == "/collective_rpc"]
    b.down = False
    assert _wait(lambda: engine.replicas[1].healthy)
    reloads = [body for path, body in b.calls if path == "/collective_rpc"]
    assert reloads and reloads[-1]["kwargs"]["weights_path"].endswith("w1")
    assert engine.replicas[1].synced_version == 1


def test_a_replica_that_fails_a_publish_is_taken_out_the_others_serve_it(fake_vllm, tmp_path):
    engine, (a, b) = fake_vllm(2)
    b.fail_rpc = {"/collective_rpc"}
    assert engine.load_policy(1, _full(tmp_path, "w1")).result(10) == 1
    assert engine.replicas[0].synced_version == 1 and engine.replicas[1].synced_version == -1
    for _ in range(4):  # every request goes to the replica that has v1
        assert _gen(engine).policy_version == 1
    assert not [c for c in b.calls if c[0] == "/v1/completions" and "seed" in c[1]
                and c[1]["prompt"] == PROMPT]  # fmt: skip
    a.fail_rpc = {"/collective_rpc"}
    with pytest.raises(EngineError):  # every replica failed: nothing changes
        engine.load_policy(2, _full(tmp_path, "w2")).result(10)
    assert engine.policy_version == 1


def test_publishes_apply_in_order_and_versions_never_go_back(fake_vllm, tmp_path):
    engine, (server,) = fake_vllm()
    server.delay_s = 0.3

    async def go():
        stream = engine.generate_stream(PROMPT, PARAMS)  # holds the full reload back
        first = asyncio.create_task(stream.__anext__())
        await asyncio.sleep(0.05)
        f1 = engine.load_policy(1, _full(tmp_path, "w1"))
        f2 = engine.load_policy(2, _adapter(tmp_path, "v2"))
        await first
        rest = [e async for e in stream]
        return f1, f2, rest

    f1, f2, rest = asyncio.run(go())
    assert f1.result(10) == 1 and f2.result(10) == 2 and engine.policy_version == 2
    assert {e.policy_version for e in rest} == {0}
    with pytest.raises(ValueError, match="only increase"):
        engine.load_policy(2, _adapter(tmp_path, "v2b"))


def test_old_adapters_are_unloaded_once_idle_without_errors(fake_vllm, tmp_path, caplog):
    engine, (server,) = fake_vllm()
    for v in (1, 2, 3):
        engine.load_policy(v, _adapter(tmp_path, f"v{v}")).result(10)
    assert _wait(lambda: len(server.adapters) == 2)
    assert server.adapters == {f"clawrl-{engine._run}-base", f"clawrl-{engine._run}-v3"}
    assert "Task exception was never retrieved" not in caplog.text


def test_close_ends_streams_and_settles_pending_publishes(fake_vllm, tmp_path):
    engine, (server,) = fake_vllm()
    server.delay_s = 2.0
    pool = concurrent.futures.ThreadPoolExecutor(1)
    stream = pool.submit(_stream, engine)
    assert _wait(lambda: engine.stats.batch_size == 1)
    publish = engine.load_policy(1, _full(tmp_path, "w1"))  # waits for the stream to finish
    engine.close()
    with pytest.raises(EngineClosedError):
        publish.result(10)
    with pytest.raises(EngineClosedError):
        stream.result(10)
    with pytest.raises(EngineClosedError):
        engine.load_policy(2, _adapter(tmp_path, "v2"))
    pool.shutdown()


def test_base_weights_are_served_through_a_zero_adapter_once_adapters_exist(fake_vllm, tmp_path):
    """vLLM's CPU LoRA kernels can give a no-adapter token a stale adapter slot (the engine
    module docstring): after the first adapter, version 0 and base scoring name a zero adapter."""
    from safetensors.torch import load_file

    engine, (server,) = fake_vllm()

    def score_base():  # the fake sends no prompt log-probs: only the model asked for matters
        with contextlib.suppress(EngineError):
            asyncio.run(engine.score(PROMPT, [11, 12], base=True))
        return server.calls[-1][1]["model"]

    assert score_base() == "base"  # no adapter yet: the plain base model
    engine.load_policy(1, _adapter(tmp_path, "v1")).result(10)
    base_name = f"clawrl-{engine._run}-base"
    assert base_name in server.adapters
    loaded = next(b for p, b in server.calls
                  if p == "/v1/load_lora_adapter" and b["lora_name"] == base_name)  # fmt: skip
    zero = load_file(str(Path(loaded["lora_path"]) / "adapter_model.safetensors"))
    assert torch.count_nonzero(zero["m.q_proj.lora_B.weight"]) == 0
    assert torch.equal(zero["m.q_proj.lora_A.weight"], torch.ones(2, 4))  # A kept: same shapes
    assert score_base() == base_name
    engine.close()
    assert server.adapters == set()  # closing unloads it with the versions
    assert not Path(loaded["lora_path"]).exists()


def test_use_base_adapter_loads_it_before_the_first_request(fake_vllm, tmp_path):
    engine, (server,) = fake_vllm()
    engine.use_base_adapter(_adapter(tmp_path, "initial"))
    _gen(engine)
    assert server.calls[-1][1]["model"] == f"clawrl-{engine._run}-base"
    with pytest.raises(EngineError, match="not a PEFT adapter"):
        fresh, _ = fake_vllm()
        fresh.use_base_adapter(tmp_path)


def _completions(server) -> int:
    return sum(1 for path, _ in server.calls if path == "/v1/completions")


def test_scoring_at_a_temperature_is_one_request_with_the_plugin(fake_vllm):
    engine, (server,) = fake_vllm(plugin=True)
    assert engine.replicas[0].prompt_temperature
    before = _completions(server)
    got = asyncio.run(engine.score(PROMPT, [11, 12, 13], temperature=0.5))
    assert _completions(server) - before == 1
    assert server.calls[-1][1]["vllm_xargs"] == {"clawrl_prompt_temperature": 0.5}
    assert got == pytest.approx([-0.5, -0.5, -0.5])


def test_without_the_plugin_scoring_says_so_and_stays_exact_per_position(fake_vllm, caplog):
    """A server of the user's own without clawrl's plugin answers prompt log-probs at T = 1
    whatever the request asks: clawrl finds out at start, says so, and scores per position
    (never silently at T = 1)."""
    with caplog.at_level("WARNING", logger="clawrl.engine.vllm.engine"):
        engine, (server,) = fake_vllm(plugin=False)
    assert not engine.replicas[0].prompt_temperature
    assert "lacks clawrl's plugin" in caplog.text and "server_plugin" in caplog.text
    before = _completions(server)
    got = asyncio.run(engine.score(PROMPT, [11, 12, 13], temperature=0.5))
    assert _completions(server) - before == 3
    assert got == pytest.approx([-0.5, -0.5, -0.5])  # T = 0.5's values, not T = 1's (-0.25)
    assert asyncio.run(engine.score(PROMPT, [11, 12], temperature=1.0)) == [-0.25, -0.25]
    assert _completions(server) - before == 4  # T = 1: prompt log-probs, one request


def test_a_replica_taken_back_is_probed_for_the_plugin_again(fake_vllm):
    engine, (server,) = fake_vllm(plugin=True)
    server.down = True
    _wait(lambda: not engine.replicas[0].healthy)
    server.plugin = False  # restarted without it
    server.down = False
    _wait(lambda: engine.replicas[0].healthy)
    assert not engine.replicas[0].prompt_temperature
    got = asyncio.run(engine.score(PROMPT, [11, 12], temperature=0.5))
    assert got == pytest.approx([-0.5, -0.5])
