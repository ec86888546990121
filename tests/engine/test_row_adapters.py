"""Per-request adapters on the in-process engine (:mod:`clawrl.engine.row_adapters`): each row
of one batch with its own user's LoRA, equal to PEFT's forward, isolated bit for bit, versions
kept per row, at most ``max_adapters`` in memory."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import time

import pytest
import torch

from clawrl.engine import SamplingParams, TransformersEngine
from clawrl.errors import EngineError
from clawrl.models import tiny_policy

from .conftest import trained_adapter

PARAMS = SamplingParams(max_tokens=12, temperature=1.0, seed=5, ignore_eos=True)


@pytest.fixture(scope="module")
def policy():
    return tiny_policy(seed=4, max_context=128)


@pytest.fixture(scope="module")
def adapters(policy, tmp_path_factory):
    """``seed -> (directory, PEFT model)`` of adapters with random A and B (visible effect)."""
    root = tmp_path_factory.mktemp("adapters")
    return {
        seed: (root / f"a{seed}", trained_adapter(policy.model, root / f"a{seed}", seed,
                                                  rank=4, scale=0.2, weights="lora_"))
        for seed in (1, 2, 3, 4)
    }  # fmt: skip


@pytest.fixture
def engine(policy):
    eng = TransformersEngine.from_policy(
        dataclasses.replace(policy, model=copy.deepcopy(policy.model)), max_adapters=2
    )
    yield eng
    eng.close()


def _prompt(policy, text: str = "What is 2 + 2?") -> list[int]:
    return policy.tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, return_dict=False
    )


def _gen(engine, prompt, adapter=None, **kw):
    params = dataclasses.replace(PARAMS, adapter=adapter, **kw)
    return asyncio.run(engine.generate(prompt, params))


def _teacher_forced(model, prompt: list[int], completion: list[int]) -> list[float]:
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
    lp = torch.log_softmax(logits.float(), dim=-1)
    return lp.gather(-1, torch.tensor(completion)[:, None]).squeeze(-1).tolist()


def test_an_adapted_request_is_sampled_from_the_peft_model(engine, policy, adapters):
    path, peft_model = adapters[1]
    engine.load_adapter("alice", 1, path).result(timeout=60)
    prompt = _prompt(policy)
    c = _gen(engine, prompt, "alice")
    want = _teacher_forced(peft_model, prompt, c.token_ids)
    assert c.logprobs == pytest.approx(want, abs=2e-4)
    base = _teacher_forced(policy.model, prompt, c.token_ids)
    assert max(abs(a - b) for a, b in zip(c.logprobs, base, strict=True)) > 1e-2  # it acts


def test_another_users_new_version_leaves_a_request_bit_identical(engine, policy, adapters):
    """Isolation: B's served log-probs (same prompt, same seed) are the same floats before and
    after A's adapter changes, and equal to no adapter when B has none."""
    prompt = _prompt(policy)
    engine.load_adapter("alice", 1, adapters[1][0]).result(timeout=60)
    engine.load_adapter("bob", 1, adapters[2][0]).result(timeout=60)
    bob_before, plain_before = _gen(engine, prompt, "bob"), _gen(engine, prompt)
    alice_before = _gen(engine, prompt, "alice")
    engine.load_adapter("alice", 2, adapters[3][0]).result(timeout=60)  # A's next step
    alice_after = _gen(engine, prompt, "alice")
    assert alice_after.adapter_version == 2 and alice_after.logprobs != alice_before.logprobs
    bob_after, plain_after = _gen(engine, prompt, "bob"), _gen(engine, prompt)
    assert (bob_after.token_ids, bob_after.logprobs) == (bob_before.token_ids, bob_before.logprobs)
    assert (plain_after.token_ids, plain_after.logprobs) == (
        plain_before.token_ids, plain_before.logprobs)  # fmt: skip


def test_users_decode_together_in_one_batch(engine, policy, adapters):
    """Three requests (two adapters and none) share decode steps, and each gets what it would
    get alone (up to the float error of a different batch shape)."""
    engine.load_adapter("alice", 1, adapters[1][0]).result(timeout=60)
    engine.load_adapter("bob", 1, adapters[2][0]).result(timeout=60)
    prompt = _prompt(policy)
    alone = {u: _gen(engine, prompt, u) for u in ("alice", "bob", None)}

    async def together():
        return await asyncio.gather(*(engine.generate(prompt, dataclasses.replace(PARAMS, adapter=u))
                                      for u in ("alice", "bob", None)))  # fmt: skip

    steps = engine.stats.decode_steps
    got = asyncio.run(together())
    assert engine.stats.decode_steps - steps < 3 * (PARAMS.max_tokens - 1)  # steps were shared
    for c, user in zip(got, ("alice", "bob", None), strict=True):
        assert c.token_ids == alone[user].token_ids
        assert c.logprobs == pytest.approx(alone[user].logprobs, abs=1e-4)
        assert c.adapter_version == (None if user is None else 1)


def test_a_row_keeps_the_adapter_version_it_started_with(engine, policy, adapters):
    engine.load_adapter("alice", 1, adapters[1][0]).result(timeout=60)
    prompt = _prompt(policy)
    params = dataclasses.replace(PARAMS, adapter="alice", max_tokens=30)

    async def go():
        stream = engine.generate_stream(prompt, params)
        first = await stream.__anext__()
        loaded = engine.load_adapter("alice", 2, adapters[2][0])  # while the row decodes
        rest = [ev async for ev in stream]
        return first, rest, await asyncio.wrap_future(loaded)

    first, rest, loaded = asyncio.run(go())
    assert loaded == 2 and {first.adapter_version, *(e.adapter_version for e in rest)} == {1}
    assert len(rest) == 29
    assert _gen(engine, prompt, "alice").adapter_version == 2
    v2 = engine.adapters._versions["alice"]
    assert list(v2) == [2]  # version 1 dropped once its row finished


def test_least_recently_used_adapters_leave_memory_and_come_back_the_same(
    engine, policy, adapters, tmp_path
):
    """Evicted adapters are written to the engine's spill folder: they come back with the same
    floats even when the user's own directory is gone (or rewritten) by then."""
    import shutil

    prompt = _prompt(policy)
    for i, user in enumerate(("u1", "u2", "u3"), start=1):
        own = tmp_path / user
        shutil.copytree(adapters[i][0], own)
        engine.load_adapter(user, 1, own).result(timeout=60)
        shutil.rmtree(own)
    stats = engine.adapters.stats
    assert stats.live == 2 and stats.evictions == 1 and stats.names == ["u1", "u2", "u3"]
    loads = stats.loads
    first = _gen(engine, prompt, "u1")  # u1 was evicted: reloaded from its directory
    assert stats.loads == loads + 1 and stats.live == 2
    _gen(engine, prompt, "u2")
    _gen(engine, prompt, "u3")  # u1 evicted again
    again = _gen(engine, prompt, "u1")
    assert (again.token_ids, again.logprobs) == (first.token_ids, first.logprobs)


def test_bad_adapters_are_refused_with_the_reason(engine, policy, adapters, tmp_path):
    with pytest.raises(FileNotFoundError):
        engine.load_adapter("alice", 1, tmp_path / "none").result(timeout=60)
    # an adapter made for another model: one A matrix of another input size
    from safetensors.torch import load_file, save_file

    bad = tmp_path / "other-model"
    bad.mkdir()
    src = adapters[1][0]
    (bad / "adapter_config.json").write_text((src / "adapter_config.json").read_text())
    tensors = load_file(str(src / "adapter_model.safetensors"))
    key = next(k for k in tensors if k.endswith("q_proj.lora_A.weight"))
    tensors[key] = torch.zeros(tensors[key].shape[0], 32)
    save_file(tensors, str(bad / "adapter_model.safetensors"))
    with pytest.raises(ValueError, match="do not fit a linear layer of 64 -> 64"):
        engine.load_adapter("alice", 1, bad).result(timeout=60)
    with pytest.raises(EngineError, match="no adapter named 'alice'"):
        _gen(engine, _prompt(policy), "alice")
    assert _gen(engine, _prompt(policy)).adapter_version is None  # still serving


def test_many_adapters_in_one_batch_take_the_batched_path(engine, policy, adapters):
    """More than two adapters in a batch are gathered and added with batched matmuls; every
    row still gets what it gets alone (up to float error), over the memory cap while they all
    serve rows."""
    from clawrl.engine.row_adapters import GROUPED_UP_TO

    users = ["u1", "u2", "u3", "u4"]
    assert len(users) > GROUPED_UP_TO
    for i, user in enumerate(users, start=1):
        engine.load_adapter(user, 1, adapters[i][0]).result(timeout=60)
    prompt = _prompt(policy)
    alone = {u: _gen(engine, prompt, u) for u in [*users, None]}
    paths = []
    rows = engine.adapters.rows

    @contextlib.contextmanager
    def spy(keys):
        with rows(keys):
            batch = engine.adapters._batch
            paths.append(None if batch is None else batch.many)
            yield

    engine.adapters.rows = spy  # type: ignore[method-assign]

    async def together():
        return await asyncio.gather(*(engine.generate(prompt, dataclasses.replace(PARAMS, adapter=u))
                                      for u in [*users, None]))  # fmt: skip

    got = asyncio.run(together())
    assert True in paths  # decode steps with every row took the batched path
    for c, user in zip(got, [*users, None], strict=True):
        assert c.token_ids == alone[user].token_ids, user
        assert c.logprobs == pytest.approx(alone[user].logprobs, abs=1e-4)
    deadline = time.monotonic() + 10  # rows leave the batch just after their last event
    while engine.adapters.stats.live != 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.adapters.stats.live == 2  # back under the cap once the rows finished


def test_versions_keep_increasing_after_an_unload(engine, policy, adapters):
    engine.load_adapter("alice", 2, adapters[1][0]).result(timeout=60)
    engine.unload_adapter("alice").result(timeout=60)
    with pytest.raises(ValueError, match="increase"):
        engine.load_adapter("alice", 2, adapters[2][0]).result(timeout=60)
    assert engine.load_adapter("alice", 3, adapters[2][0]).result(timeout=60) == 3
    assert _gen(engine, _prompt(policy), "alice").adapter_version == 3


def test_a_row_that_fails_in_prefill_gives_its_adapter_back(engine, policy, adapters):
    engine.load_adapter("alice", 1, adapters[1][0]).result(timeout=60)
    sample = engine._sample
    calls = {"n": 0}

    def failing_once(rows, logits):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("out of memory")
        return sample(rows, logits)

    engine._sample = failing_once  # type: ignore[method-assign]
    with pytest.raises(EngineError, match="prefill failed"):
        _gen(engine, _prompt(policy), "alice")
    held = engine.adapters._versions["alice"][1]
    assert held.in_use == 0  # released: it can be evicted or replaced again
    assert _gen(engine, _prompt(policy), "alice").adapter_version == 1
