"""The :class:`clawrl.engine.Engine` contract: what every backend must do, checked on each.

Each backend is a parametrisation of the ``case`` fixture: the in-process transformers engine
on tiny models of several architectures (Llama; sliding windows: Mistral, Phi-3; hybrids of full
and sliding layers: Qwen2, Gemma 2, Gemma 3) and the scripted test engine here; a remote backend
(vLLM) adds its own case and runs the same tests. A backend passes only if the gateway, the judge and the trainer can rely
on it: ids and log-probs that agree, streams equal to one-shot generation for a seed, scoring
equal to the sampling log-probs at the sampling temperature, version swaps between requests,
cancellation that frees the request, a context-length error, a clean close, and concurrent
requests (joining one that decodes) that get what each would get alone.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import dataclasses
import functools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from clawrl.engine import Engine, FinishReason, SamplingParams, TransformersEngine
from clawrl.engine.scripted import ScriptedEngine
from clawrl.errors import ContextLengthError, EngineClosedError, EngineError
from clawrl.models import tiny_policy, tokenizer_fingerprint

from .conftest import trained_adapter


@dataclass
class Case:
    """One backend under test.

    Attributes:
        engine: the engine.
        tokenizer: the tokenizer its ids belong to.
        weights: ``version -> weights`` the engine accepts in ``load_policy``.
        deterministic_text: a completion text the engine will sample for any prompt, if known.
        batch_invariant: a request's ids and log-probs do not depend on the requests decoded
            with it (a remote server's batched kernels may differ by float error).
        adapter: ``seed -> directory`` of a LoRA adapter for ``load_adapter``; ``None``: the
            backend serves no per-request adapters (it must say so).
    """

    engine: Engine
    tokenizer: Any
    weights: Callable[[int], Any]
    deterministic_text: str | None = None
    batch_invariant: bool = True
    adapter: Callable[[int], Any] | None = None


@functools.cache
def _tiny(arch: str) -> Any:
    return tiny_policy(seed=11, max_context=96, arch=arch)


def _transformers(arch: str = "llama", root: Any = None) -> Iterator[Case]:
    import torch

    # a fresh copy of the weights per test: version swaps overwrite them
    policy = dataclasses.replace(_tiny(arch), model=copy.deepcopy(_tiny(arch).model))
    engine = TransformersEngine.from_policy(policy)

    def weights(version: int) -> dict[str, torch.Tensor]:
        gen = torch.Generator().manual_seed(version)
        return {
            k: v + 0.05 * torch.randn(v.shape, generator=gen, dtype=v.dtype)
            for k, v in policy.model.state_dict().items()
            if v.is_floating_point()
        }

    def adapter(seed: int) -> Any:
        path = root / f"adapter-{seed}"
        if not path.exists():
            trained_adapter(policy.model, path, seed, rank=4, scale=0.05)
        return path

    yield Case(engine, policy.tokenizer, weights, adapter=adapter)
    engine.close()


def _scripted() -> Iterator[Case]:
    tok = tiny_policy(seed=0).tokenizer
    text = "The answer is four, as two plus two makes four in every base above four."
    engine = ScriptedEngine(tok, default_reply=text, max_context=96, token_delay_s=0.001)
    yield Case(engine, tok, lambda version: None, deterministic_text=text,
               adapter=lambda seed: f"scripted-{seed}")  # fmt: skip
    engine.close()


def _vllm(request: pytest.FixtureRequest) -> Iterator[Case]:
    """A real vLLM server (the session's ``vllm_server``) on the embedded model; versions are
    LoRA adapters with non-zero B, published as the trainer publishes them."""

    from clawrl.engine.vllm import VLLMEngine

    server = request.getfixturevalue("vllm_server")
    policy = request.getfixturevalue("embedded_policy")
    root = request.getfixturevalue("tmp_path")
    engine = VLLMEngine([server.url], policy.tokenizer)

    def weights(version: int) -> str:
        trained_adapter(policy.model, root / f"v{version}", version, scale=0.01)
        return str(root / f"v{version}")

    def adapter(seed: int) -> str:
        path = root / f"adapter-{seed}"
        if not path.exists():
            trained_adapter(policy.model, path, seed, rank=4, scale=0.05)
        return str(path)

    yield Case(engine, policy.tokenizer, weights, batch_invariant=False, adapter=adapter)
    engine.close()


BACKENDS: dict[str, Callable[[pytest.FixtureRequest], Iterator[Case]]] = {
    "transformers": lambda request: _transformers(root=request.getfixturevalue("tmp_path")),
    **{
        f"transformers-{arch}": lambda request, arch=arch: _transformers(
            arch, request.getfixturevalue("tmp_path")
        )
        for arch in ("mistral", "qwen2", "gemma2", "gemma3", "phi3")
    },
    "scripted": lambda request: _scripted(),
    "vllm": _vllm,
}


@pytest.fixture(params=list(BACKENDS))
def case(request) -> Iterator[Case]:
    yield from BACKENDS[request.param](request)


def _prompt(case: Case, text: str = "What is 2 + 2?") -> list[int]:
    return case.tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, return_dict=False
    )


def run(coro):
    return asyncio.run(coro)


async def _stream(engine: Engine, prompt, params):
    return [ev async for ev in engine.generate_stream(prompt, params)]


def test_declares_the_contract(case):
    engine = case.engine
    assert isinstance(engine, Engine)
    assert engine.max_context > 0 and engine.policy_version == 0
    assert case.tokenizer.eos_token_id in engine.eos_token_ids
    assert engine.tokenizer_id == tokenizer_fingerprint(case.tokenizer)
    assert engine.available is True
    assert isinstance(engine.needs_base_adapter, bool)


def test_ids_and_logprobs_agree(case):
    prompt = _prompt(case)
    params = SamplingParams(max_tokens=8, temperature=0.9, seed=3, logprobs_top_k=2)
    c = run(case.engine.generate(prompt, params))
    assert 1 <= len(c.token_ids) <= 8
    assert len(c.logprobs) == len(c.token_ids) == len(c.top_logprobs)
    assert all(lp <= 0.0 for lp in c.logprobs)
    assert c.finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
    assert c.prompt_tokens == len(prompt) and c.policy_version == case.engine.policy_version
    if c.finish_reason == FinishReason.STOP:
        assert c.token_ids[-1] in case.engine.eos_token_ids  # the stop token is kept
    if case.deterministic_text is not None:
        want = case.tokenizer.encode(case.deterministic_text, add_special_tokens=False)
        assert c.token_ids == want[:8]
    assert case.engine.stats.generated_tokens >= len(c.token_ids)


def test_max_tokens_ends_with_length(case):
    c = run(case.engine.generate(_prompt(case), SamplingParams(max_tokens=3, ignore_eos=True)))
    assert len(c.token_ids) == 3 and c.finish_reason == FinishReason.LENGTH


def test_stream_equals_generate_for_the_same_seed(case):
    prompt = _prompt(case)
    params = SamplingParams(max_tokens=10, temperature=0.8, seed=42)
    one = run(case.engine.generate(prompt, params))
    events = run(_stream(case.engine, prompt, params))
    assert [e.token_id for e in events] == one.token_ids
    assert [e.logprob for e in events] == pytest.approx(one.logprobs, abs=1e-5)
    assert [e.finish_reason is not None for e in events] == [False] * (len(events) - 1) + [True]
    assert events[-1].finish_reason == one.finish_reason


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_score_equals_the_sampling_logprobs(case, temperature):
    prompt = _prompt(case)
    params = SamplingParams(max_tokens=8, temperature=temperature, seed=7, ignore_eos=True)
    c = run(case.engine.generate(prompt, params))
    scored = run(case.engine.score(prompt, c.token_ids, temperature=temperature))
    assert scored == pytest.approx(c.logprobs, abs=1e-4)
    (batched,) = run(case.engine.score_batch([(prompt, c.token_ids)], temperature=temperature))
    assert batched == pytest.approx(scored, abs=1e-5)


def test_next_token_scoring_equals_one_token_scoring(case):
    prompts = [_prompt(case, "hi"), _prompt(case, "How are you today?")]
    candidates = [11, 220, 1123]
    rows = run(case.engine.score_next_batch(prompts, candidates))
    assert len(rows) == 2 and all(len(r) == 3 for r in rows)
    for prompt, row in zip(prompts, rows, strict=True):
        for cand, value in zip(candidates, row, strict=True):
            (one,) = run(case.engine.score(prompt, [cand]))
            assert value == pytest.approx(one, abs=1e-4)


def test_concurrent_requests_joining_mid_decode(case):
    """Requests that arrive while another decodes are served together with it; on a
    batch-invariant backend each gets exactly what it gets alone."""
    engine = case.engine
    prompts = [_prompt(case, t) for t in ("Count to ten.", "hi", "Tell me about the sea.")]
    params = [
        SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True),
        SamplingParams(max_tokens=6, temperature=1.0, seed=5, ignore_eos=True),
        SamplingParams(max_tokens=8, temperature=0.8, seed=9, ignore_eos=True),
    ]

    async def together():
        first = engine.generate_stream(prompts[0], params[0])
        head = [await first.__anext__() for _ in range(2)]  # decoding: the others join it
        joined = asyncio.gather(
            *(engine.generate(p, s) for p, s in zip(prompts[1:], params[1:], strict=True))
        )
        rest = [ev async for ev in first]
        return head + rest, await joined

    events, others = run(together())
    alone = [run(engine.generate(p, s)) for p, s in zip(prompts, params, strict=True)]
    got = [([e.token_id for e in events], [e.logprob for e in events])]
    got += [(c.token_ids, c.logprobs) for c in others]
    for (ids, lps), want, p in zip(got, alone, params, strict=True):
        assert 1 <= len(ids) == len(lps) <= p.max_tokens
        if case.batch_invariant:
            assert ids == want.token_ids
            assert lps == pytest.approx(want.logprobs, abs=1e-4)


def test_version_swap_between_requests(case):
    engine = case.engine
    prompt = _prompt(case)
    params = SamplingParams(max_tokens=12, temperature=1.0, seed=1, ignore_eos=True)

    async def go():
        stream = engine.generate_stream(prompt, params)
        first = await stream.__anext__()
        swapped = engine.load_policy(1, case.weights(1))  # while a request is in flight
        rest = [ev async for ev in stream]
        version = await asyncio.wrap_future(swapped)
        after = await engine.generate(prompt, SamplingParams(max_tokens=2))
        return first, rest, version, after

    first, rest, version, after = run(go())
    assert {first.policy_version, *(e.policy_version for e in rest)} == {0}  # started on v0
    assert version == 1 and engine.policy_version == 1
    assert after.policy_version == 1
    with pytest.raises(ValueError, match="increase"):
        engine.load_policy(1, case.weights(1))
    assert isinstance(engine.load_policy(2, case.weights(2)), concurrent.futures.Future)


def test_per_request_adapters(case):
    """A request naming an adapter is served with the version loaded under that name (each
    adapter's versions only increase); an unknown or unloaded name is an ``EngineError``. A
    backend without per-request adapters says so the same way."""
    engine = case.engine
    prompt = _prompt(case)
    params = SamplingParams(max_tokens=4, temperature=1.0, seed=2, adapter="alice")
    if case.adapter is None:
        with pytest.raises(EngineError, match="not served"):
            engine.load_adapter("alice", 1, "/nonexistent").result(timeout=30)
        with pytest.raises(EngineError, match="not served"):
            run(engine.generate(prompt, params))
        return
    with pytest.raises(EngineError, match="alice"):
        run(engine.generate(prompt, params))
    assert engine.load_adapter("alice", 1, case.adapter(1)).result(timeout=60) == 1
    c = run(engine.generate(prompt, params))
    events = run(_stream(engine, prompt, params))
    assert c.adapter_version == 1 and {e.adapter_version for e in events} == {1}
    assert [e.token_id for e in events] == c.token_ids
    plain = run(engine.generate(prompt, dataclasses.replace(params, adapter=None)))
    assert plain.adapter_version is None
    with pytest.raises(ValueError, match="increase"):
        engine.load_adapter("alice", 1, case.adapter(1)).result(timeout=60)
    assert engine.load_adapter("alice", 2, case.adapter(2)).result(timeout=60) == 2
    assert run(engine.generate(prompt, params)).adapter_version == 2
    assert engine.unload_adapter("alice").result(timeout=60) is None
    with pytest.raises(EngineError, match="alice"):
        run(engine.generate(prompt, params))


def test_cancelling_a_stream_frees_the_request(case):
    engine = case.engine
    prompt = _prompt(case)

    async def go():
        before = engine.stats.generated_tokens
        stream = engine.generate_stream(prompt, SamplingParams(max_tokens=50, ignore_eos=True))
        await stream.__anext__()
        await stream.aclose()  # the client went away
        await asyncio.sleep(0.5)
        after = await engine.generate(prompt, SamplingParams(max_tokens=3, ignore_eos=True))
        return after, engine.stats.generated_tokens - before

    after, sampled = run(go())
    assert len(after.token_ids) == 3  # the engine keeps serving
    # the abandoned request stopped within a few decode steps, far from its 50 tokens
    assert sampled <= 1 + 3 + 8, sampled
    deadline = time.monotonic() + 5
    while engine.stats.batch_size and time.monotonic() < deadline:  # gauges update per step
        time.sleep(0.05)
    assert engine.stats.batch_size == 0


def test_a_prompt_that_does_not_fit_is_a_context_length_error(case):
    engine = case.engine
    prompt = [case.tokenizer.eos_token_id] * engine.max_context
    with pytest.raises(ContextLengthError):
        run(engine.generate(prompt, SamplingParams(max_tokens=2)))
    with pytest.raises(ContextLengthError):
        run(_stream(engine, prompt, SamplingParams(max_tokens=2)))
    with pytest.raises(ContextLengthError):
        run(engine.score(prompt, [1, 2]))


def test_closed_engine_refuses(case):
    case.engine.close()
    assert case.engine.available is False  # /healthz answers 503
    with pytest.raises(EngineClosedError):
        run(case.engine.generate(_prompt(case), SamplingParams(max_tokens=2)))
    case.engine.close()  # idempotent
