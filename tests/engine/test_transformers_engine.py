"""TransformersEngine on the tiny model: exactness of ids and log-probs, batching, versions."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch

from clawrl.engine import FinishReason, SamplingParams, TransformersEngine
from clawrl.errors import ContextLengthError
from clawrl.models import tiny_policy


@pytest.fixture()
def policy():
    return tiny_policy(seed=1, max_context=256)


@pytest.fixture()
def engine(policy):
    eng = TransformersEngine.from_policy(policy, max_batch=8)
    yield eng
    eng.close()


def _prompt(tok, text: str) -> list[int]:
    return tok.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, return_dict=False
    )


def run(coro):
    return asyncio.run(coro)


def test_greedy_matches_hf_generate(policy, engine):
    ids = _prompt(policy.tokenizer, "What is 2+2?")
    c = run(engine.generate(ids, SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)))
    ref = policy.model.generate(
        torch.tensor([ids]), max_new_tokens=24, do_sample=False, min_new_tokens=24
    )[0, len(ids) :].tolist()
    assert c.token_ids == ref
    assert c.finish_reason == FinishReason.LENGTH
    assert len(c.logprobs) == len(c.token_ids) == 24
    assert c.prompt_tokens == len(ids)


def test_greedy_logprobs_are_temperature_one_logsoftmax(policy, engine):
    ids = _prompt(policy.tokenizer, "hello")
    c = run(engine.generate(ids, SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)))
    with torch.no_grad():
        logits = policy.model(torch.tensor([ids + c.token_ids])).logits[0]
    lp = torch.log_softmax(logits.float(), -1)
    for i, t in enumerate(c.token_ids):
        assert c.logprobs[i] == pytest.approx(float(lp[len(ids) + i - 1, t]), abs=1e-4)


@pytest.mark.parametrize("temperature", [0.5, 1.0, 1.7])
def test_sampling_logprobs_equal_score(policy, engine, temperature):
    ids = _prompt(policy.tokenizer, "Tell me something")
    params = SamplingParams(max_tokens=16, temperature=temperature, seed=3, ignore_eos=True)
    c = run(engine.generate(ids, params))
    scored = run(engine.score(ids, c.token_ids, temperature=temperature))
    assert max(abs(a - b) for a, b in zip(scored, c.logprobs, strict=True)) < 1e-4


def test_top_k_top_p_logprobs_are_of_the_filtered_distribution(policy, engine):
    ids = _prompt(policy.tokenizer, "x")
    p = SamplingParams(max_tokens=12, temperature=1.0, top_k=5, seed=0, logprobs_top_k=5)
    c = run(engine.generate(ids, p))
    for lp, tops in zip(c.logprobs, c.top_logprobs, strict=True):
        mass = sum(math.exp(v) for _, v in tops)
        assert mass == pytest.approx(1.0, abs=1e-4)  # all mass on the 5 kept tokens
        assert any(abs(v - lp) < 1e-6 for _, v in tops)


def test_seed_reproducible_and_batched_equals_solo(policy, engine):
    tok = policy.tokenizer
    prompts = [_prompt(tok, "story " + "very " * i) for i in range(6)]
    params = [SamplingParams(max_tokens=10 + i, temperature=1.0, seed=i) for i in range(6)]

    async def together():
        return await asyncio.gather(
            *[engine.generate(p, s) for p, s in zip(prompts, params, strict=True)]
        )

    batched = run(together())
    solo = [run(engine.generate(p, s)) for p, s in zip(prompts, params, strict=True)]
    for b, s in zip(batched, solo, strict=True):
        assert b.token_ids == s.token_ids
        assert max(abs(x - y) for x, y in zip(b.logprobs, s.logprobs, strict=True)) < 1e-4


def test_requests_join_a_running_batch(policy, engine):
    """A request arriving mid-decode finishes long before the long one ends."""
    tok = policy.tokenizer
    long_p, short_p = _prompt(tok, "long"), _prompt(tok, "short one with more words")

    async def scenario():
        order = []

        async def go(name, ids, n):
            await engine.generate(ids, SamplingParams(max_tokens=n, temperature=0, ignore_eos=True))
            order.append(name)

        long_task = asyncio.create_task(go("long", long_p, 200))
        await asyncio.sleep(0.05)
        await go("short", short_p, 3)
        await long_task
        return order

    assert run(scenario()) == ["short", "long"]
    assert engine.stats.decode_steps > 0


def test_stop_strings_and_stop_ids(policy, engine):
    tok = policy.tokenizer
    ids = _prompt(tok, "hi")
    free = run(engine.generate(ids, SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)))
    stop_tok = free.token_ids[4]
    c = run(
        engine.generate(
            ids,
            SamplingParams(
                max_tokens=20, temperature=0, ignore_eos=True, stop_token_ids=(stop_tok,)
            ),
        )
    )
    assert c.finish_reason == FinishReason.STOP
    assert c.token_ids == free.token_ids[: free.token_ids.index(stop_tok) + 1]
    text = tok.decode(free.token_ids[:6])
    stop = text[-3:] if text[-3:].strip() else text[-1]
    c2 = run(
        engine.generate(
            ids, SamplingParams(max_tokens=20, temperature=0, ignore_eos=True, stop=(stop,))
        )
    )
    assert c2.finish_reason == FinishReason.STOP and c2.stop_string == stop
    assert stop in tok.decode(c2.token_ids)
    assert stop not in tok.decode(c2.token_ids[:-1])


def test_context_window(policy, engine):
    with pytest.raises(ContextLengthError) as e:
        run(engine.generate(list(range(10, 10 + 256)), SamplingParams(max_tokens=4)))
    assert e.value.prompt_tokens == 256 and e.value.max_context == 256
    c = run(
        engine.generate(list(range(10, 10 + 250)), SamplingParams(max_tokens=50, ignore_eos=True))
    )
    assert len(c.token_ids) == 6 and c.finish_reason == FinishReason.LENGTH


def test_stream_yields_tokens_and_cancels(policy, engine):
    ids = _prompt(policy.tokenizer, "stream")

    async def first_three():
        got = []
        agen = engine.generate_stream(ids, SamplingParams(max_tokens=200, ignore_eos=True))
        async for ev in agen:
            got.append(ev)
            if len(got) == 3:
                break
        await agen.aclose()
        await asyncio.sleep(0.2)
        return got

    got = run(first_three())
    assert len(got) == 3 and all(ev.finish_reason is None for ev in got)
    assert engine.stats.batch_size == 0 or not engine._rows  # the row left the batch


def test_load_policy_versions(policy, engine):
    ids = _prompt(policy.tokenizer, "v")
    p = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    before = run(engine.generate(ids, p))
    assert before.policy_version == 0
    state = {k: v.clone() for k, v in policy.model.state_dict().items()}
    state["lm_head.weight"] = state["lm_head.weight"] * 3.0
    state["model.embed_tokens.weight"] = state["lm_head.weight"]
    assert engine.load_policy(1, state).result(timeout=30) == 1
    after = run(engine.generate(ids, p))
    assert after.policy_version == 1
    assert after.logprobs != before.logprobs
    with pytest.raises(ValueError):
        engine.load_policy(1, state)


def test_in_flight_request_finishes_on_its_version(policy, engine):
    ids = _prompt(policy.tokenizer, "swap while running")
    state = {k: v.clone() * 1.01 for k, v in policy.model.state_dict().items()}

    async def scenario():
        agen = engine.generate_stream(ids, SamplingParams(max_tokens=60, ignore_eos=True))
        events = [await agen.__anext__()]
        fut = engine.load_policy(1, state)
        async for ev in agen:
            events.append(ev)
        newer = await engine.generate(ids, SamplingParams(max_tokens=2, ignore_eos=True))
        return events, fut.result(timeout=10), newer

    events, v, newer = run(scenario())
    assert {ev.policy_version for ev in events} == {0}
    assert v == 1 and newer.policy_version == 1


def test_score_next_batch_equals_one_token_scores(policy, engine):
    tok = policy.tokenizer
    prompts = [_prompt(tok, "is this good?"), _prompt(tok, "a longer question " * 5)]
    cands = [tok.encode(w, add_special_tokens=False)[0] for w in (" good", " bad", " neutral")]
    got = run(engine.score_next_batch(prompts, cands, temperature=0.7))
    for p, row in zip(prompts, got, strict=True):
        for c, lp in zip(cands, row, strict=True):
            assert lp == pytest.approx(run(engine.score(p, [c], temperature=0.7))[0], abs=1e-5)
