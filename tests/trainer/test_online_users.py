"""Per-user training (``server.per_user_adapters`` with a method): each user's judged turns train
that user's own adapter through the one learner, on the tiny model with a real store and engine."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
from pathlib import Path

import pytest
import torch

from clawrl.chat import ChatMessage, render_prompt
from clawrl.config import TrainerConfig, load_config
from clawrl.engine import SamplingParams, TransformersEngine
from clawrl.engine.lora import lora_factors
from clawrl.errors import ConfigError
from clawrl.models import tiny_policy
from clawrl.store import JudgmentRecord, Store, TurnRecord, TurnStatus, UserAdapterRecord
from clawrl.trainer import Trainer
from clawrl.trainer.metrics import MetricsWriter
from clawrl.trainer.online import OnlineLearner
from clawrl.trainer.users import load_user_adapter, user_digest

from ..engine.conftest import trained_adapter


@pytest.fixture()
def world(tmp_path):
    policy = tiny_policy(seed=4, max_context=512)
    engine = TransformersEngine.from_policy(
        dataclasses.replace(policy, model=copy.deepcopy(policy.model))
    )
    store = Store(tmp_path / "s.db")
    yield policy, engine, store, tmp_path
    engine.close()
    store.close()


def _record(policy, engine, store, user, n, *, score=1, hint=None, adapter=None):
    """``n`` judged turns of ``user`` (sampled with their adapter ``adapter``, if loaded)."""
    ids = []
    for i in range(n):
        s = store.new_session()
        msgs = [ChatMessage(role="user", content=f"{user} asks {i}: what is {i} + {i}?")]
        prompt = render_prompt(policy.tokenizer, msgs)
        params = SamplingParams(max_tokens=5, seed=i, adapter=adapter)
        c = asyncio.run(engine.generate(prompt.token_ids, params))
        t = TurnRecord(
            s.id, prompt.token_ids, c.token_ids, c.logprobs,
            request_messages=[m.model_dump() for m in msgs],
            sampling_params={"temperature": 1.0}, policy_version=c.policy_version,
            finish_reason=str(c.finish_reason), status=TurnStatus.OK,
            trainable=c.adapter_version is None,
            untrainable_reason=None if c.adapter_version is None else "user_adapter",
            user_id=user, adapter_version=c.adapter_version,
        )  # fmt: skip
        store.record_turn(t)
        store.record_judgment(JudgmentRecord(t.id, s.id, score, "test", hint=hint))
        ids.append(t.id)
    return ids


def _learner(policy, engine, store, tmp, batch=2, **config):
    cfg = TrainerConfig(method="combine", lr=1e-2, batch_size=batch, **config)
    trainer = Trainer(policy.model, cfg, tmp / "out")
    return OnlineLearner(store, engine, policy.tokenizer, trainer,
                         MetricsWriter(tmp / "out", tensorboard=False), per_user=True)  # fmt: skip


def _steps(learner, n):
    async def go():
        out = []
        for _ in range(n):
            await learner.collect()
            out.append(await learner.step_if_ready())
        return out

    return asyncio.run(go())


def _meta(tmp, user):
    root = tmp / "out" / "users" / user_digest(user) / "checkpoints"
    return json.loads((root / (root / "latest").read_text() / "meta.json").read_text())


def _served(engine, policy, adapter):
    prompt = render_prompt(policy.tokenizer, [ChatMessage(role="user", content="hi there")])
    params = SamplingParams(max_tokens=8, seed=3, temperature=1.0, ignore_eos=True,
                            adapter=adapter)  # fmt: skip
    c = asyncio.run(engine.generate(prompt.token_ids, params))
    return c.token_ids, c.logprobs


def test_each_users_turns_train_their_own_adapter_and_no_other(world):
    policy, engine, store, tmp = world
    alice = _record(policy, engine, store, "alice", 2, hint="Answer in one word.")
    bob = _record(policy, engine, store, "bob", 2, score=-1)
    nobody = _record(policy, engine, store, "", 1)
    learner = _learner(policy, engine, store, tmp)
    first, second = _steps(learner, 2)
    assert first is not None and second is not None
    assert first["policy/version"] == 1.0 and first["step"] == 1.0 and second["step"] == 2.0
    # A's samples never enter B's batch: each checkpoint holds its own user's turns only
    assert sorted(_meta(tmp, "alice")["turn_ids"]) == sorted(alice)
    assert sorted(_meta(tmp, "bob")["turn_ids"]) == sorted(bob)
    (a1,) = store.user_adapter_versions("alice")
    (b1,) = store.user_adapter_versions("bob")
    assert (a1.version, a1.step, b1.version, b1.step) == (1, 1, 1, 1)
    assert a1.weights != b1.weights and store.latest_policy_version() is None  # shared: untouched
    for t in alice + bob:
        sample = store.get_sample(t)
        assert (sample.status, sample.policy_version) == ("trained", 1)
    assert store.get_sample(nobody[0]).reason == "no_user"
    # each v1 is one AdamW step from B = 0 (every |B| at most lr): bob's did not start from alice's
    for rec in (a1, b1):
        top = max(float(b.abs().max()) for _, b, _ in lora_factors(rec.weights).values())
        assert 0.5e-2 < top <= 1.001e-2
    assert learner.state.drops == {"drop/no_user": 1}
    # the versions serve: each user's adapter changes their answers, and differently
    base = _served(engine, policy, None)
    engine.load_adapter("alice", 1, a1.weights).result(timeout=60)
    engine.load_adapter("bob", 1, b1.weights).result(timeout=60)
    served_a, served_b = _served(engine, policy, "alice"), _served(engine, policy, "bob")
    assert len({json.dumps(base), json.dumps(served_a), json.dumps(served_b)}) == 3


def test_training_one_user_leaves_anothers_served_logprobs_bit_identical(world):
    policy, engine, store, tmp = world
    _record(policy, engine, store, "bob", 2)
    learner = _learner(policy, engine, store, tmp)
    _steps(learner, 1)
    (b1,) = store.user_adapter_versions("bob")
    engine.load_adapter("bob", 1, b1.weights).result(timeout=60)
    bob_before, plain_before = _served(engine, policy, "bob"), _served(engine, policy, None)
    bob_files = {p.name: p.read_bytes() for p in Path(b1.weights).iterdir()}
    for v in (1, 2):  # two steps of alice's adapter, each served
        _record(policy, engine, store, "alice", 2, score=1 if v == 1 else -1,
                adapter="alice" if v == 2 else None)  # fmt: skip
        (m,) = _steps(learner, 1)
        assert m is not None and m["policy/version"] == float(v)
        rec = store.user_adapter_versions("alice")[-1]
        engine.load_adapter("alice", rec.version, rec.weights).result(timeout=60)
        assert _served(engine, policy, "bob") == bob_before
        assert _served(engine, policy, None) == plain_before
    # alice's second batch was sampled with her v1: trainable for her, lag 1
    assert learner.state.drops == {}
    # her steps wrote nothing of bob's: his version's files are the bytes they were
    assert {p.name: p.read_bytes() for p in Path(b1.weights).iterdir()} == bob_files
    assert store.user_adapter_versions("bob") == [b1]


def test_a_users_adapter_resumes_from_its_checkpoint(world):
    policy, engine, store, tmp = world
    _record(policy, engine, store, "alice", 2)
    _steps(_learner(policy, engine, store, tmp), 1)
    rec = store.user_adapter_versions("alice")[-1]
    engine.load_adapter("alice", 1, rec.weights).result(timeout=60)
    _record(policy, engine, store, "alice", 2, score=-1, adapter="alice")
    again = _learner(policy, engine, store, tmp)  # a restarted server
    assert again.resume() == engine.policy_version and again.state.steps == 1
    (m,) = _steps(again, 1)
    assert m is not None and m["policy/version"] == 2.0 and m["user/step"] == 2.0
    assert m["step"] == 2.0 and _meta(tmp, "alice")["step"] == 2
    assert [r.version for r in store.user_adapter_versions("alice")] == [1, 2]


def test_training_goes_on_from_a_version_recorded_by_hand(world):
    policy, engine, store, tmp = world
    path = tmp / "hand"
    trained_adapter(policy.model, path, 7, rank=4, scale=0.2, weights="lora_")
    store.publish_user_adapter(UserAdapterRecord("alice", 1, str(path)))
    engine.load_adapter("alice", 1, str(path)).result(timeout=60)
    _record(policy, engine, store, "alice", 2, adapter="alice")
    learner = _learner(policy, engine, store, tmp)
    (m,) = _steps(learner, 1)
    assert m is not None and m["policy/version"] == 2.0
    assert learner.state.drops == {}  # sampled with her v1: no lag
    # v2 went on from the hand version (rank 4 in the trainer's rank 16: the rows past 4 stay 0)
    hand = lora_factors(path)
    v2 = lora_factors(store.user_adapter_versions("alice")[-1].weights)
    for name, (a, b, s) in hand.items():
        a2, b2, s2 = v2[name]
        assert a2.shape[0] == 16 and torch.count_nonzero(a2[4:]) == 0
        assert torch.allclose(a2[:4], a, atol=0.05) and not torch.equal(a2[:4], a)
        assert torch.allclose(b2[:, :4] * s2, b * s, atol=0.05)


def test_an_adapter_the_trainer_cannot_hold_drops_that_users_turns_only(world):
    policy, engine, store, tmp = world
    path = tmp / "big"
    trained_adapter(policy.model, path, 7, rank=16, scale=0.2, weights="lora_")
    store.publish_user_adapter(UserAdapterRecord("alice", 1, str(path)))
    _record(policy, engine, store, "alice", 2)
    _record(policy, engine, store, "bob", 2)
    learner = _learner(policy, engine, store, tmp, lora_rank=8)
    first, second = _steps(learner, 2)
    assert first is None and second is not None  # alice refused, then bob's step
    assert learner.state.drops == {"drop/adapter_refused": 2}
    assert [r.version for r in store.user_adapter_versions("alice")] == [1]
    assert [r.version for r in store.user_adapter_versions("bob")] == [1]


def test_a_smaller_rank_and_another_alpha_load_exactly(world, tmp_path):
    policy, _, _, _ = world
    peft_model = trained_adapter(policy.model, tmp_path / "a", 3, rank=4, scale=0.2,
                                 weights="lora_")  # fmt: skip
    trainer = Trainer(policy.model, TrainerConfig(method="rl", lora_rank=8, lora_alpha=8),
                      tmp_path / "out")  # fmt: skip
    load_user_adapter(trainer, tmp_path / "a")
    ids = torch.tensor([[1, 5, 9, 14, 3, 7]])
    with torch.no_grad():
        want = peft_model(input_ids=ids).logits
        got = trainer.model.eval()(input_ids=ids).logits
    assert torch.allclose(got, want, atol=1e-5)
    small = Trainer(policy.model, TrainerConfig(method="rl", lora_rank=2), tmp_path / "o2")
    with pytest.raises(ConfigError, match="lora_rank"):
        load_user_adapter(small, tmp_path / "a")


def test_per_user_training_refuses_what_it_cannot_do(world):
    policy, engine, store, tmp = world
    with pytest.raises(Exception, match="clawrl train trains the shared policy only"):
        load_config(None, ["server.per_user_adapters=true", "server.external_trainer=true",
                           'trainer.method="combine"'])  # fmt: skip
    cfg = TrainerConfig(method="combine", full_finetune=True)
    trainer = Trainer(policy.model, cfg, tmp / "ff")
    with pytest.raises(ConfigError, match="full_finetune"):
        OnlineLearner(store, engine, policy.tokenizer, trainer,
                      MetricsWriter(tmp / "ff", tensorboard=False), per_user=True)  # fmt: skip


def test_the_shared_policy_never_trains_a_turn_sampled_with_a_users_adapter(world):
    policy, engine, store, tmp = world
    path = tmp / "hand"
    trained_adapter(policy.model, path, 7, rank=4, scale=0.2, weights="lora_")
    engine.load_adapter("alice", 1, str(path)).result(timeout=60)
    _record(policy, engine, store, "alice", 2, adapter="alice")
    cfg = TrainerConfig(method="combine", lr=1e-2, batch_size=2)
    shared = OnlineLearner(store, engine, policy.tokenizer, Trainer(policy.model, cfg, tmp / "s"),
                           MetricsWriter(tmp / "s", tensorboard=False))  # fmt: skip
    with_trainable = [store.update_turn(t, trainable=True, untrainable_reason=None)
                      for t in store.judged_untrained_turns()]  # fmt: skip
    assert all(t.adapter_version == 1 for t in with_trainable)
    assert asyncio.run(shared.collect()) == 0
    assert shared.state.drops == {"drop/untrainable": 2}


def test_a_crash_before_a_users_samples_rows_resumes_without_training_twice(world):
    policy, engine, store, tmp = world
    ids = _record(policy, engine, store, "alice", 2)
    learner = _learner(policy, engine, store, tmp)

    def crash(records):
        raise RuntimeError("killed before the samples rows were written")

    kept = store.record_samples
    asyncio.run(learner.collect())
    store.record_samples = crash
    with pytest.raises(RuntimeError):
        asyncio.run(learner.step_if_ready())
    store.record_samples = kept
    assert all(store.get_sample(t) is None for t in ids)
    again = _learner(policy, engine, store, tmp)  # the restarted server
    again.resume()
    assert all(store.get_sample(t).status == "trained" for t in ids)
    assert asyncio.run(again.collect()) == 0  # nothing to train twice
    _record(policy, engine, store, "alice", 2, score=-1)
    (m,) = _steps(again, 1)
    assert m is not None and m["user/step"] == 2.0 and m["policy/version"] == 1.0 + 1.0


def test_a_version_recorded_by_hand_after_training_is_where_training_goes_on(world):
    policy, engine, store, tmp = world
    _record(policy, engine, store, "alice", 2)
    _record(policy, engine, store, "bob", 2)
    learner = _learner(policy, engine, store, tmp)
    _steps(learner, 2)  # alice v1, bob v1
    path = tmp / "hand"
    trained_adapter(policy.model, path, 7, rank=4, scale=0.2, weights="lora_")
    store.publish_user_adapter(UserAdapterRecord("alice", 2, str(path)))
    _record(policy, engine, store, "alice", 2, score=-1)
    _record(policy, engine, store, "bob", 2, score=-1)
    first, second = _steps(learner, 2)
    assert first is not None and second is not None
    assert [r.version for r in store.user_adapter_versions("alice")] == [1, 2, 3]
    assert [r.version for r in store.user_adapter_versions("bob")] == [1, 2]
    v3 = lora_factors(store.user_adapter_versions("alice")[-1].weights)
    for name, (a, _, _) in lora_factors(path).items():  # v3 went on from the hand version
        assert torch.allclose(v3[name][0][:4], a, atol=0.05)


def test_a_user_forgotten_while_serving_is_never_trained_and_the_others_go_on(world):
    policy, engine, store, tmp = world
    alice = _record(policy, engine, store, "alice", 2)
    learner = _learner(policy, engine, store, tmp)
    asyncio.run(learner.collect())  # alice's batch is ready
    store.forget_user("alice")
    bob = _record(policy, engine, store, "bob", 2)
    (m,) = _steps(learner, 1)
    assert m is None  # alice's deleted turns are never trained
    (m,) = _steps(learner, 1)
    assert m is not None and sorted(_meta(tmp, "bob")["turn_ids"]) == sorted(bob)
    assert store.user_adapter_versions("alice") == [] and all(
        store.get_turn(t) is None for t in alice
    )
    assert not (tmp / "out" / "users" / user_digest("alice")).exists()
