"""The vLLM engine against a real vLLM server (CPU build) serving the embedded model.

Versions published by the real trainer are served with the trainer's log-probs; requests in
flight finish on the version they started with; old adapters are unloaded once idle; full
weights reload without aborting a request; a dying replica's requests end with an
``EngineUnavailableError`` and the replica is taken back once it answers again.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import time

import httpx
import pytest
import torch

from clawrl.config import TrainerConfig
from clawrl.engine import SamplingParams
from clawrl.engine.vllm import VLLMEngine, protocol
from clawrl.errors import EngineError, EngineUnavailableError
from clawrl.trainer import Trainer, TrainSample, collate, token_logprobs

from .conftest import trained_adapter

pytestmark = pytest.mark.timeout(900)

SERVED_LOGPROB_TOLERANCE = 1e-3
"""Nats: a served version's log-probs vs the trainer's (float32 server and trainer)."""


def _prompt(tokenizer, text: str = "What is 2+2?") -> list[int]:
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, return_dict=False
    )


def _adapters(vllm_server, engine) -> list[str]:
    """The adapters of ``engine`` the server lists (the server is shared by the session's
    tests)."""
    models = httpx.get(f"{vllm_server.url}/v1/models").json()["data"]
    mine = f"clawrl-{engine._run}-"
    return sorted(m["id"] for m in models if m.get("parent") and m["id"].startswith(mine))


def test_published_versions_serve_the_trainers_logprobs(vllm_server, embedded_policy, tmp_path):
    tok = embedded_policy.tokenizer
    engine = VLLMEngine([vllm_server.url], tok)
    trainer = Trainer(embedded_policy.model, TrainerConfig(method="rl", lr=1e-3), tmp_path)
    prompt = _prompt(tok)
    params = SamplingParams(max_tokens=12, temperature=0.8, seed=5, ignore_eos=True)
    try:
        for version in (1, 2):
            c = asyncio.run(engine.generate(prompt, params))
            sample = TrainSample(prompt, c.token_ids, c.logprobs, temperature=0.8, reward=1.0,
                                 policy_version=version - 1, turn_id=f"t{version}")  # fmt: skip
            trainer.train_step([sample])
            engine.load_policy(version, trainer.save_weights(version))
            trainer.policy_version = version
            deadline = time.monotonic() + 60
            while engine.policy_version < version and time.monotonic() < deadline:
                time.sleep(0.05)
            served = asyncio.run(engine.generate(prompt, params))
            assert served.policy_version == version
            batch = collate([TrainSample(prompt, served.token_ids, served.logprobs, 0.8)])
            with torch.no_grad():
                trained, _ = token_logprobs(trainer.model.eval(), batch)
            diff = (trained[batch.loss_mask] - torch.tensor(served.logprobs)).abs().max()
            assert float(diff) < SERVED_LOGPROB_TOLERANCE, float(diff)
            # the OPD teacher's scoring on the server equals the trainer's too, at T != 1
            scored = asyncio.run(engine.score(prompt, served.token_ids, temperature=0.8))
            assert max(abs(a - b) for a, b in zip(scored, served.logprobs, strict=True)) < 1e-4
        # base=True scores with the base weights, not the published adapter
        base = asyncio.run(engine.score(prompt, served.token_ids, temperature=0.8, base=True))
        with torch.no_grad(), trainer.model.disable_adapter():
            want, _ = token_logprobs(trainer.model, batch)
        diff = (want[batch.loss_mask] - torch.tensor(base)).abs().max()
        assert float(diff) < SERVED_LOGPROB_TOLERANCE
    finally:
        engine.close()
    assert _adapters(vllm_server, engine) == []  # a closed engine leaves no adapter on the server


class _CountingTransport(httpx.AsyncHTTPTransport):
    """The network, counting the ``/v1/completions`` requests sent."""

    def __init__(self) -> None:
        super().__init__()
        self.completions = 0

    async def handle_async_request(self, request):
        if request.url.path == "/v1/completions":
            self.completions += 1
        return await super().handle_async_request(request)


def test_teacher_scoring_at_a_temperature_is_one_exact_request(vllm_server, embedded_policy):
    """Issue 38's contract: on a server clawrl launched (its plugin loaded), the teacher log-probs
    of a sampled answer at T = 0.7 equal the transformers engine's within 1e-3 nats per token,
    in one HTTP request per scored sample."""
    from clawrl.engine import TransformersEngine

    tok = embedded_policy.tokenizer
    counter = _CountingTransport()
    # scoring_defer_s=0: scoring does not give way to the generation below, so both share the
    # server's steps (the batch that crashed vLLM's CPU LoRA kernels before the plugin's fix)
    engine = VLLMEngine([vllm_server.url], tok, transport=counter, scoring_defer_s=0)
    local = TransformersEngine(embedded_policy.model, eos_token_ids=[tok.eos_token_id],
                               max_context=2048)  # fmt: skip
    try:
        assert engine.replicas[0].prompt_temperature, vllm_server.log_tail()
        prompts = [_prompt(tok), _prompt(tok, "Name three colours."), _prompt(tok, "Hi!")]
        params = SamplingParams(max_tokens=24, temperature=0.7, seed=3, ignore_eos=True)
        answers = [asyncio.run(engine.generate(p, params)).token_ids for p in prompts]
        before = counter.completions
        scored = asyncio.run(engine.score(prompts[0], answers[0], temperature=0.7))
        assert counter.completions - before == 1
        pairs = list(zip(prompts, answers, strict=True))

        async def scored_while_serving():  # scoring shares the server's steps with sampling
            return await asyncio.gather(engine.score_batch(pairs, temperature=0.7),
                                        engine.generate(prompts[1], params))  # fmt: skip

        batch, _served = asyncio.run(scored_while_serving())
        assert counter.completions - before == 1 + len(prompts) + 1
        assert batch[0] == pytest.approx(scored, abs=1e-5)
        for p, a, got in zip(prompts, answers, batch, strict=True):
            want = asyncio.run(local.score(p, a, temperature=0.7))
            assert len(got) == len(a) == 24
            assert max(abs(x - y) for x, y in zip(got, want, strict=True)) < 1e-3
        # a bad value is the client's 400 (checked in the API server), the server keeps serving
        bad = protocol.prompt_logprobs_body("base", prompts[0], answers[0][:2], 0.7)
        bad["vllm_xargs"] = {"clawrl_prompt_temperature": 0}
        r = httpx.post(f"{vllm_server.url}/v1/completions", json=bad, timeout=60)
        assert r.status_code == 400 and "clawrl_prompt_temperature" in r.text
        assert httpx.get(f"{vllm_server.url}/health").status_code == 200
        # not the temperature-1 values: T matters for these answers
        at_one = asyncio.run(local.score(prompts[0], answers[0], temperature=1.0))
        assert max(abs(x - y) for x, y in zip(scored, at_one, strict=True)) > 1e-2
    finally:
        engine.close()
        local.close()


def test_seeded_requests_whose_prompts_are_prefilled_in_pieces(vllm_server, embedded_policy):
    """16 seeded requests at once whose prompts (about 190 tokens each) do not fit one engine
    step of a launched CPU server (``--max-num-batched-tokens 256``), so vLLM prefills them over
    several steps and discards the tokens it sampled for the unfinished ones: without clawrl's
    plugin that killed vLLM 0.32's CPU engine core ("CPU Generator does not use offset"). The
    server keeps serving, and each request gets the tokens it gets when sent alone."""
    args = vllm_server.args
    assert args[args.index("--max-num-batched-tokens") + 1] == "256"
    tok = embedded_policy.tokenizer
    engine = VLLMEngine([vllm_server.url], tok)
    story = "Once upon a time, in a land far away, there lived a fox who loved to read. " * 10
    prompts = [_prompt(tok, f"{story} Finish story {i} in one line.") for i in range(16)]
    assert all(150 < len(p) < 256 for p in prompts), [len(p) for p in prompts]
    params = SamplingParams(max_tokens=12, temperature=0.7, seed=1234, ignore_eos=True)

    async def together():
        return await asyncio.gather(*[engine.generate(p, params) for p in prompts])

    try:
        at_once = [c.token_ids for c in asyncio.run(together())]
        alone = [asyncio.run(engine.generate(p, params)).token_ids for p in prompts]
    finally:
        engine.close()
    assert httpx.get(f"{vllm_server.url}/health").status_code == 200
    assert "CPU Generator does not use offset" not in vllm_server.log_tail()
    assert at_once == alone


def _trained_adapter(policy, path, seed: int):
    """A LoRA adapter with non-zero B (a trained one), saved to ``path``; the PEFT model."""
    return trained_adapter(policy.model, path, seed)


def _served_logprobs_of(model, prompt, events, temperature=1.0) -> torch.Tensor:
    """``model``'s log-probs of the streamed ids: what the version that served them gives."""
    ids = [e.token_id for e in events]
    batch = collate([TrainSample(prompt, ids, [e.logprob for e in events], temperature)])
    with torch.no_grad():
        lp, _ = token_logprobs(model, batch)
    return (lp[batch.loss_mask] - torch.tensor([e.logprob for e in events])).abs().max()


def test_requests_in_flight_keep_their_version_and_old_adapters_go(
    vllm_server, embedded_policy, tmp_path
):
    tok = embedded_policy.tokenizer
    engine = VLLMEngine([vllm_server.url], tok)
    prompt = _prompt(tok)
    v1 = _trained_adapter(embedded_policy, tmp_path / "v1", seed=1)
    _trained_adapter(embedded_policy, tmp_path / "v2", seed=2)
    # version 0 through a zero copy of an adapter, as `clawrl serve` does (the engine module
    # docstring: base requests batched with adapter requests can read a stale adapter slot)
    engine.use_base_adapter(tmp_path / "v1")

    async def go():
        stream = engine.generate_stream(prompt, SamplingParams(max_tokens=40, ignore_eos=True))
        first = await stream.__anext__()
        published = [await asyncio.wrap_future(engine.load_policy(v, tmp_path / f"v{v}"))
                     for v in (1, 2)]  # fmt: skip
        during = await engine.generate(prompt, SamplingParams(max_tokens=2))
        rest = [ev async for ev in stream]
        return [first, *rest], published, during

    try:
        events, published, during = asyncio.run(go())
        assert published == [1, 2] and during.policy_version == 2
        assert len(events) == 40 and {e.policy_version for e in events} == {0}
        # and the tokens really came from v0: the base model's log-probs, not v1's
        assert float(_served_logprobs_of(embedded_policy.model, prompt, events)) < 1e-3
        assert float(_served_logprobs_of(v1, prompt, events)) > 1e-2
        deadline = time.monotonic() + 10
        while len(_adapters(vllm_server, engine)) > 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        # v1 went once idle; the zero base adapter stays while the engine runs
        assert _adapters(vllm_server, engine) == [
            f"clawrl-{engine._run}-base",
            f"clawrl-{engine._run}-v2",
        ]
    finally:
        engine.close()


def test_each_users_adapter_serves_their_requests_and_leaves_the_others_bit_identical(
    vllm_server, embedded_policy, tmp_path
):
    """Per-user adapters on vLLM (issue 40): a request naming a user is sampled from that user's
    adapter (the PEFT model's log-probs); a new version of alice's adapter leaves bob's and the
    base's served tokens and log-probs bit-identical (same prompt, same seed); a stream started
    on alice's v1 keeps it; v1 is unloaded once idle; an unloaded user is refused."""
    tok = embedded_policy.tokenizer
    engine = VLLMEngine([vllm_server.url], tok)
    prompt = _prompt(tok)
    peft = {s: _trained_adapter(embedded_policy, tmp_path / f"a{s}", seed=s) for s in (1, 2, 3)}

    def gen(adapter=None):
        params = SamplingParams(max_tokens=12, temperature=1.0, seed=5, ignore_eos=True,
                                adapter=adapter)  # fmt: skip
        return asyncio.run(engine.generate(prompt, params))

    try:
        assert engine.load_adapter("alice", 1, tmp_path / "a1").result(timeout=120) == 1
        assert engine.load_adapter("bob", 1, tmp_path / "a2").result(timeout=120) == 1
        alice, bob, plain = gen("alice"), gen("bob"), gen()
        assert (alice.adapter_version, bob.adapter_version, plain.adapter_version) == (1, 1, None)
        events = [type("E", (), {"token_id": t, "logprob": lp})()
                  for t, lp in zip(alice.token_ids, alice.logprobs, strict=True)]  # fmt: skip
        assert float(_served_logprobs_of(peft[1], prompt, events)) < SERVED_LOGPROB_TOLERANCE
        assert float(_served_logprobs_of(peft[2], prompt, events)) > 1e-2

        async def during_new_version():
            params = SamplingParams(max_tokens=30, ignore_eos=True, adapter="alice")
            stream = engine.generate_stream(prompt, params)
            first = await stream.__anext__()
            await asyncio.wrap_future(engine.load_adapter("alice", 2, tmp_path / "a3"))
            return [first, *[ev async for ev in stream]]

        kept = asyncio.run(during_new_version())
        assert {e.adapter_version for e in kept} == {1}  # a stream keeps its version
        assert gen("alice").adapter_version == 2 and gen("alice").logprobs != alice.logprobs
        bob_after, plain_after = gen("bob"), gen()
        assert (bob_after.token_ids, bob_after.logprobs) == (bob.token_ids, bob.logprobs)
        assert (plain_after.token_ids, plain_after.logprobs) == (plain.token_ids, plain.logprobs)
        deadline = time.monotonic() + 10
        digest = hashlib.sha256(b"alice").hexdigest()[:12]
        while f"clawrl-{engine._run}-u{digest}-v1" in _adapters(vllm_server, engine):
            assert time.monotonic() < deadline, "alice's v1 was not unloaded once idle"
            time.sleep(0.1)
        with pytest.raises(ValueError, match="increase"):
            engine.load_adapter("alice", 2, tmp_path / "a3").result(timeout=60)
        assert engine.unload_adapter("alice").result(timeout=60) is None
        with pytest.raises(EngineError, match="alice"):
            gen("alice")
        # a LoRA policy version: a user's adapter would replace it, so it is refused
        assert engine.load_policy(1, tmp_path / "a1").result(timeout=120) == 1
        with pytest.raises(EngineError, match="LoRA"):
            gen("bob")
        with pytest.raises(ValueError, match="LoRA"):
            engine.load_adapter("carol", 1, tmp_path / "a2").result(timeout=60)
    finally:
        engine.close()
    assert _adapters(vllm_server, engine) == []


def test_full_weights_reload_without_aborting(vllm_server, embedded_policy, tmp_path):
    tok = embedded_policy.tokenizer
    engine = VLLMEngine([vllm_server.url], tok, publish_dir=tmp_path)
    prompt = _prompt(tok)
    changed = copy.deepcopy(embedded_policy.model)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in changed.named_parameters():
            if ".mlp." in name:
                p.add_(0.002 * torch.randn(p.shape, generator=gen))
    params = SamplingParams(max_tokens=30, temperature=0.7, seed=1, ignore_eos=True)

    async def go():
        stream = engine.generate_stream(prompt, params)
        first = await stream.__anext__()
        reload = asyncio.wrap_future(engine.load_policy(1, changed.state_dict()))
        rest = [ev async for ev in stream]  # finishes on v0 while v1 waits for it
        await reload
        return first, rest, await engine.generate(prompt, params)

    try:
        first, rest, after = asyncio.run(go())
        assert len(rest) == 29 and {first.policy_version, *(e.policy_version for e in rest)} == {0}
        # the whole stream came from the old weights: no reload under a request in flight
        assert float(_served_logprobs_of(embedded_policy.model, prompt, [first, *rest], 0.7)) < 1e-3
        assert after.policy_version == 1
        batch = collate([TrainSample(prompt, after.token_ids, after.logprobs, 0.7)])
        with torch.no_grad():
            want, _ = token_logprobs(changed.eval(), batch)
        diff = (want[batch.loss_mask] - torch.tensor(after.logprobs)).abs().max()
        assert float(diff) < SERVED_LOGPROB_TOLERANCE
    finally:  # the session's server goes back to the embedded weights
        restore = engine.load_policy(2, embedded_policy.model.state_dict())
        restore.result(timeout=300)
        engine.close()


def test_a_dying_replica_is_taken_out_and_back(
    vllm_server, embedded_policy, tmp_path, killable_proxy
):
    tok = embedded_policy.tokenizer
    proxy = killable_proxy(vllm_server.port)
    engine = VLLMEngine([vllm_server.url, proxy.url], tok, health_interval_s=0.2)
    trainer = Trainer(embedded_policy.model, TrainerConfig(method="rl"), tmp_path)
    prompt = _prompt(tok)
    # long enough that no stream ends between the last one's first event and the kill
    long = SamplingParams(max_tokens=800, ignore_eos=True)

    async def stream_all(n: int) -> list[BaseException | int]:
        started: set[int] = set()
        all_started = asyncio.Event()

        async def one(i: int) -> BaseException | int:
            count = 0
            try:
                async for _ in engine.generate_stream(prompt, long):
                    count += 1
                    started.add(i)
                    if len(started) == n:
                        all_started.set()
                return count
            except EngineUnavailableError as e:
                return e

        tasks = [asyncio.create_task(one(i)) for i in range(n)]
        # every stream is under way on one replica or the other (not a fixed sleep: a fast
        # machine finishes short streams before it ends)
        await asyncio.wait_for(all_started.wait(), timeout=120)
        proxy.kill()
        return await asyncio.gather(*tasks)

    try:
        assert {r.url for r in engine.replicas} == {vllm_server.url, proxy.url}
        results = asyncio.run(stream_all(4))
        died = [r for r in results if isinstance(r, EngineUnavailableError)]
        assert 1 <= len(died) <= 3 and all(r == 800 for r in results if isinstance(r, int))
        down = next(r for r in engine.replicas if r.url == proxy.url)
        assert not down.healthy
        # new requests go to the live replica; a version published now skips the dead one
        version = engine.load_policy(1, trainer.save_weights(1)).result(timeout=60)
        c = asyncio.run(engine.generate(prompt, SamplingParams(max_tokens=3)))
        assert version == 1 and c.policy_version == 1
        proxy.revive()  # back: the health loop gives it v1 before it takes requests
        deadline = time.monotonic() + 30
        while not down.healthy and time.monotonic() < deadline:
            time.sleep(0.1)
        assert down.healthy and down.synced_version == 1
    finally:
        engine.close()


def test_a_launched_server_killed_with_sigkill_comes_back_on_the_current_version(
    vllm_server, embedded_policy, tmp_path
):
    """Issue 38: the server clawrl launched is supervised (``VLLMServer.supervise``): SIGKILLed
    during a run, its request in flight ends with ``EngineUnavailableError`` (the gateway's
    503, recorded incomplete), it is restarted on its port, and the engine gives it the current
    policy version before it serves again."""
    import os
    import signal

    tok = embedded_policy.tokenizer
    engine = VLLMEngine([vllm_server.url], tok, health_interval_s=0.5)
    trainer = Trainer(embedded_policy.model, TrainerConfig(method="rl"), tmp_path)
    prompt = _prompt(tok)
    restarts = vllm_server.restarts
    try:
        assert engine.load_policy(1, trainer.save_weights(1)).result(timeout=60) == 1

        async def killed_mid_stream() -> BaseException | int:
            streaming = asyncio.Event()

            async def one() -> BaseException | int:
                # long enough that no machine streams it all between the first event and the
                # kill (a fixed 1 s sleep let a fast CI runner finish 400 tokens first)
                long = SamplingParams(max_tokens=1500, ignore_eos=True)
                n = 0
                try:
                    async for _ in engine.generate_stream(prompt, long):
                        n += 1
                        streaming.set()
                    return n
                except EngineUnavailableError as e:
                    return e

            task = asyncio.create_task(one())
            await asyncio.wait_for(streaming.wait(), timeout=120)
            os.killpg(vllm_server.process.pid, signal.SIGKILL)
            return await task

        assert isinstance(asyncio.run(killed_mid_stream()), EngineUnavailableError)
        deadline = time.monotonic() + 600
        while vllm_server.restarts == restarts and time.monotonic() < deadline:
            time.sleep(0.2)  # restarted (spawned; the health loop has taken it out by now)
        assert vllm_server.restarts == restarts + 1
        assert not engine.replicas[0].healthy
        while not engine.available and time.monotonic() < deadline:
            time.sleep(0.5)
        assert engine.available, vllm_server.log_tail()
        assert engine.replicas[0].synced_version == 1
        c = asyncio.run(engine.generate(prompt, SamplingParams(max_tokens=4)))
        assert c.policy_version == 1
        assert f"clawrl-{engine._run}-v1" in _adapters(vllm_server, engine)
        assert engine.replicas[0].prompt_temperature  # the restarted server loaded the plugin
    finally:
        engine.close()
