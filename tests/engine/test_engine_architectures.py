"""Continuous batching on each architecture family the in-process engine serves, on tiny random
models (:func:`clawrl.models.tiny_policy`): full attention (Llama), a sliding window on every
layer (Mistral, Phi-3) and hybrids of full and sliding layers (Qwen2/3 with
``use_sliding_window``, Gemma 2/3). Windows are a few tokens, so every prompt and most
completions are longer than the window.

Exactness is checked against the same request run alone (a ``max_batch=1`` engine) and against
``transformers``' own ``generate`` (its cache keeps real sliding-window layers): rows joining
mid-decode, rows leaving (finished or cancelled), scoring. Models whose cache cannot be merged
(here LFM2's convolution states, or a cache layer faked in the test) decode one request at a
time, correctly, with one warning.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import types
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from clawrl.engine import Completion, SamplingParams, TokenEvent, TransformersEngine
from clawrl.engine import transformers_engine as te
from clawrl.models import Policy, tiny_policy
from clawrl.models.loading import TINY_ARCHS, TINY_SLIDING_WINDOW

SLIDING_ARCHS = [a for a in TINY_ARCHS if a != "llama"]
SERIAL_WARNING = "continuous batching is off"


@functools.cache
def _policy(arch: str) -> Policy:
    """One tiny model per architecture for the whole module (no test changes its weights)."""
    return tiny_policy(seed=5, arch=arch, max_context=192)


def _prompts(tok: Any) -> list[list[int]]:
    """Four prompts of 30 to 110 tokens: all longer than the window, and of unequal lengths,
    so that short rows carry more left padding than a window's worth."""
    chats = ["hi", "Tell me about the sea and the wind, please.", "Count to five."]
    out = [
        tok.apply_chat_template(
            [{"role": "user", "content": c}], add_generation_prompt=True, return_dict=False
        )
        for c in chats
    ]
    out.append(tok.encode("The quick brown fox jumps over the lazy dog. " * 10))
    assert min(len(p) for p in out) > 4 * TINY_SLIDING_WINDOW
    return out


PARAMS = [
    SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True),
    SamplingParams(max_tokens=12, temperature=1.0, seed=1, ignore_eos=True),
    SamplingParams(max_tokens=16, temperature=0.7, seed=2, top_k=50, ignore_eos=True),
    SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True),
]


def run(coro):
    return asyncio.run(coro)


@pytest.fixture(params=TINY_ARCHS)
def engines(request) -> Iterator[tuple[Policy, TransformersEngine, TransformersEngine]]:
    """``(policy, batched, alone)``: a ``max_batch=8`` engine and a ``max_batch=1`` one."""
    policy = _policy(request.param)
    batched = TransformersEngine.from_policy(policy, max_batch=8)
    alone = TransformersEngine.from_policy(policy, max_batch=1)
    yield policy, batched, alone
    batched.close()
    alone.close()


def _batch_sizes(engine: TransformersEngine) -> list[int]:
    """Record the number of rows of every decode step of ``engine`` (appended to the list)."""
    sizes: list[int] = []
    decode = engine._decode

    def recorded() -> None:
        sizes.append(len(engine._rows))
        decode()

    engine._decode = recorded  # type: ignore[method-assign]
    return sizes


def _same(got: Completion | list[TokenEvent], want: Completion) -> None:
    if isinstance(got, list):
        ids, lps = [e.token_id for e in got], [e.logprob for e in got]
    else:
        ids, lps = got.token_ids, got.logprobs
    assert ids == want.token_ids
    assert lps == pytest.approx(want.logprobs, abs=1e-4)


def _alone(engine: TransformersEngine, prompts, params) -> list[Completion]:
    return [run(engine.generate(p, s)) for p, s in zip(prompts, params, strict=True)]


def test_rows_joining_mid_decode_equal_each_request_alone(engines):
    policy, batched, alone = engines
    prompts = _prompts(policy.tokenizer)
    sizes = _batch_sizes(batched)

    async def scenario():
        a = batched.generate_stream(prompts[0], PARAMS[0])
        a_head = [await a.__anext__() for _ in range(3)]  # A decodes alone, then B and C join
        b = asyncio.create_task(batched.generate(prompts[1], PARAMS[1]))
        c = batched.generate_stream(prompts[2], PARAMS[2])
        c_head = [await c.__anext__() for _ in range(2)]
        d = asyncio.create_task(batched.generate(prompts[3], PARAMS[3]))  # joins A, B, C
        a_rest = [ev async for ev in a]
        c_rest = [ev async for ev in c]
        return a_head + a_rest, await b, c_head + c_rest, await d

    got = run(scenario())
    for g, want in zip(got, _alone(alone, prompts, PARAMS), strict=True):
        _same(g, want)
    assert max(sizes) >= 3, sizes  # the requests did decode together


def test_rows_leaving_do_not_change_the_others(engines):
    policy, batched, alone = engines
    prompts = _prompts(policy.tokenizer)
    short = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    cancelled = SamplingParams(max_tokens=30, temperature=1.0, seed=4, ignore_eos=True)
    sizes = _batch_sizes(batched)

    async def scenario():
        a = batched.generate_stream(prompts[3], PARAMS[0])
        a_head = [await a.__anext__() for _ in range(2)]
        b = asyncio.create_task(batched.generate(prompts[0], short))  # finishes early
        c = batched.generate_stream(prompts[1], cancelled)
        c_head = [await c.__anext__() for _ in range(3)]
        await c.aclose()  # the client went away: its row leaves the batch
        b_done = await b
        d = await batched.generate(prompts[2], PARAMS[2])  # joins after B and C left
        a_rest = [ev async for ev in a]
        return a_head + a_rest, b_done, c_head, d

    a, b, c_head, d = run(scenario())
    want_a, want_b, want_c, want_d = _alone(
        alone,
        [prompts[3], prompts[0], prompts[1], prompts[2]],
        [PARAMS[0], short, cancelled, PARAMS[2]],
    )
    _same(a, want_a)
    _same(b, want_b)
    _same(d, want_d)
    assert [e.token_id for e in c_head] == want_c.token_ids[:3]
    assert max(sizes) >= 2, sizes


def test_greedy_equals_transformers_generate_past_the_window(engines):
    """Prompt and completion longer than the window, next to a shorter row: equal to HF
    ``generate`` (whose cache evicts with real sliding-window layers)."""
    policy, batched, _ = engines
    long_prompt, other = _prompts(policy.tokenizer)[3], _prompts(policy.tokenizer)[0]
    params = SamplingParams(max_tokens=3 * TINY_SLIDING_WINDOW, temperature=0.0, ignore_eos=True)

    async def together():
        return await asyncio.gather(
            batched.generate(long_prompt, params), batched.generate(other, params)
        )

    for prompt, c in zip([long_prompt, other], run(together()), strict=True):
        n = params.max_tokens
        ref = policy.model.generate(
            torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False
        )[0, len(prompt) :].tolist()
        assert c.token_ids == ref


def test_score_and_score_batch_equal_the_sampling_logprobs(engines):
    policy, batched, _ = engines
    prompts = _prompts(policy.tokenizer)[:3]
    params = [
        SamplingParams(max_tokens=12, temperature=0.8, seed=i, ignore_eos=True) for i in range(3)
    ]

    async def together():
        return await asyncio.gather(
            *(batched.generate(p, s) for p, s in zip(prompts, params, strict=True))
        )

    done = run(together())
    items = [(p, c.token_ids) for p, c in zip(prompts, done, strict=True)]
    scored_batch = run(batched.score_batch(items, temperature=0.8))  # left-padded together
    for (p, ids), c, in_batch in zip(items, done, scored_batch, strict=True):
        assert run(batched.score(p, ids, temperature=0.8)) == pytest.approx(c.logprobs, abs=1e-4)
        assert in_batch == pytest.approx(c.logprobs, abs=1e-4)


@pytest.mark.parametrize("arch", SLIDING_ARCHS)
def test_the_window_shapes_the_output(arch):
    """The tests above would see a wrong window: disabling it changes log-probs by far more
    than their tolerance."""
    model = _policy(arch).model
    ids = torch.tensor([_prompts(_policy(arch).tokenizer)[3]])
    assert te.config_blocker(model.config) is None
    with torch.no_grad():
        windowed = torch.log_softmax(model(ids).logits, -1)
        window, model.config.sliding_window = model.config.sliding_window, 10**6
        try:
            full = torch.log_softmax(model(ids).logits, -1)
        finally:
            model.config.sliding_window = window
    assert window == TINY_SLIDING_WINDOW
    assert float((windowed - full).abs().max()) > 0.05


# ---------------------------------------------------------------------------- serial fallback


def test_config_blocker_names_what_cannot_be_merged():
    from transformers import Lfm2Config

    for arch in TINY_ARCHS:
        assert te.config_blocker(_policy(arch).model.config) is None, arch
    lfm2 = Lfm2Config(num_hidden_layers=2, layer_types=["conv", "full_attention"])
    assert "conv" in (te.config_blocker(lfm2) or "")
    chunked = types.SimpleNamespace(layer_types=None, attention_chunk_size=8)
    assert "chunked" in (te.config_blocker(chunked) or "")
    assert te.config_blocker(None) is not None


def _serial_warnings(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno == logging.WARNING and SERIAL_WARNING in r.msg]


@functools.cache
def _tiny_lfm2() -> Any:
    """A tiny LFM2 (convolution + attention layers): its conv states cannot be padded."""
    from transformers import Lfm2Config, Lfm2ForCausalLM

    tok = _policy("llama").tokenizer
    config = Lfm2Config(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=192,
        layer_types=["conv", "full_attention", "conv"], bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )  # fmt: skip
    gen = torch.random.fork_rng()
    with gen:
        torch.manual_seed(0)
        return Lfm2ForCausalLM(config).eval()


def test_an_unmergeable_model_decodes_one_request_at_a_time(caplog):
    caplog.set_level(logging.WARNING, logger=te.__name__)
    tok = _policy("llama").tokenizer
    model = _tiny_lfm2()
    engine = TransformersEngine(model, eos_token_ids=[tok.eos_token_id], max_context=192)
    prompts = _prompts(tok)[:3]
    params = [PARAMS[3], PARAMS[1], PARAMS[3]]
    try:
        assert engine.batching == te.SERIAL
        sizes = _batch_sizes(engine)

        async def scenario():
            a = engine.generate_stream(prompts[0], params[0])
            head = [await a.__anext__()]
            others = asyncio.gather(
                *(engine.generate(p, s) for p, s in zip(prompts[1:], params[1:], strict=True))
            )
            rest = [ev async for ev in a]
            return [head + rest, *(await others)]

        got = run(scenario())
        want = _alone(engine, prompts, params)
    finally:
        engine.close()
    for g, w in zip(got, want, strict=True):
        _same(g, w)
    for prompt, w, p in zip(prompts, want, params, strict=True):
        if p.temperature == 0:
            n = p.max_tokens
            ref = model.generate(
                torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False
            )[0, len(prompt) :].tolist()
            assert w.token_ids == ref
    assert set(sizes) == {1}
    (warning,) = _serial_warnings(caplog)  # once, for all six requests
    assert "lfm2" in warning.getMessage() and "conv" in warning.getMessage()


def test_a_cache_that_cannot_join_turns_the_engine_serial(monkeypatch, caplog):
    """The first prefill whose cache is not plain (here: a layer class the engine does not
    know, from the second prefill on) turns the engine serial: that request waits for the rows
    running, then every request runs alone, and all are exact."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    class OddLayer(DynamicLayer):
        pass

    made: list[Any] = []

    def cache() -> Any:
        c = DynamicCache()
        if made:
            c.layer_class_to_replicate = OddLayer
        made.append(c)
        return c

    monkeypatch.setattr(te, "_batch_cache", cache)
    caplog.set_level(logging.WARNING, logger=te.__name__)
    policy = _policy("gemma3")
    engine = TransformersEngine.from_policy(policy, max_batch=8)
    alone = TransformersEngine.from_policy(policy, max_batch=1)
    prompts = _prompts(policy.tokenizer)
    try:
        assert engine.batching == te.CONTINUOUS
        sizes = _batch_sizes(engine)

        async def scenario():
            a = engine.generate_stream(prompts[0], PARAMS[0])
            head = [await a.__anext__() for _ in range(2)]
            others = asyncio.gather(
                *(engine.generate(p, s) for p, s in zip(prompts[1:], PARAMS[1:], strict=True))
            )
            rest = [ev async for ev in a]
            return [head + rest, *(await others)]

        got = run(scenario())
        monkeypatch.undo()
        want = _alone(alone, prompts, PARAMS)
        assert engine.batching == te.SERIAL
        assert engine.stats.requests == 4  # the request sent back to wait is counted once
    finally:
        engine.close()
        alone.close()
    for g, w in zip(got, want, strict=True):
        _same(g, w)
    assert len(made) == 2 and set(sizes) == {1}
    (warning,) = _serial_warnings(caplog)
    assert "OddLayer" in warning.getMessage()


def test_a_model_without_a_cache_it_hands_back_is_decoded_exactly(caplog):
    """RWKV keeps its recurrent state in ``out.state``, not a cache: the engine must not decode
    it statelessly. It turns serial and recomputes the whole sequence per token: the same ids as
    ``generate``, batched requests equal to each alone."""
    from transformers import RwkvConfig, RwkvForCausalLM

    caplog.set_level(logging.WARNING, logger=te.__name__)
    tok = _policy("llama").tokenizer
    config = RwkvConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2,
                        attention_hidden_size=32, intermediate_size=64, context_length=192)  # fmt: skip
    gen = torch.random.fork_rng()
    with gen:
        torch.manual_seed(0)
        model = RwkvForCausalLM(config).eval()
    engine = TransformersEngine(model, eos_token_ids=[tok.eos_token_id], max_context=192)
    prompts = _prompts(tok)[:2]
    greedy = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    try:

        async def both():
            return await asyncio.gather(*(engine.generate(p, greedy) for p in prompts))

        got = run(both())
        assert engine.batching == te.SERIAL
    finally:
        engine.close()
    for prompt, c in zip(prompts, got, strict=True):
        ref = model.generate(torch.tensor([prompt]), max_new_tokens=8, min_new_tokens=8,
                             do_sample=False)[0, len(prompt):].tolist()  # fmt: skip
        assert c.token_ids == ref
    assert len(_serial_warnings(caplog)) == 1
