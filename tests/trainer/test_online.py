"""OnlineLearner on the tiny model with a real store and engine (judgments written directly)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from clawrl.chat import ChatMessage, render_prompt
from clawrl.config import TrainerConfig
from clawrl.engine import SamplingParams, TransformersEngine
from clawrl.models import tiny_policy
from clawrl.store import (
    JudgmentRecord,
    PolicyVersionRecord,
    Store,
    TurnRecord,
    TurnStatus,
    WeightsKind,
)
from clawrl.trainer import Trainer
from clawrl.trainer.metrics import MetricsWriter, read_metrics
from clawrl.trainer.online import OnlineLearner, hinted_messages


@pytest.fixture()
def world(tmp_path):
    policy = tiny_policy(seed=4, max_context=512)
    engine = TransformersEngine.from_policy(policy)
    store = Store(tmp_path / "s.db")
    yield policy, engine, store, tmp_path
    engine.close()
    store.close()


def _record(policy, engine, store, n, *, score, hint=None, status=TurnStatus.OK):
    tok = policy.tokenizer
    ids = []
    for i in range(n):
        s = store.new_session()
        msgs = [ChatMessage(role="user", content=f"problem {i}: what is {i} + {i}?")]
        prompt = render_prompt(tok, msgs)
        c = asyncio.run(engine.generate(prompt.token_ids, SamplingParams(max_tokens=5, seed=i)))
        t = TurnRecord(
            s.id, prompt.token_ids, c.token_ids, c.logprobs,
            request_messages=[m.model_dump() for m in msgs],
            sampling_params={"temperature": 1.0}, policy_version=c.policy_version,
            finish_reason=str(c.finish_reason), status=status,
            trainable=status == TurnStatus.OK,
        )  # fmt: skip
        store.record_turn(t)
        store.record_judgment(JudgmentRecord(t.id, s.id, score, "test", hint=hint))
        ids.append(t.id)
    return ids


def _learner(policy, engine, store, tmp, method="combine", batch=4):
    config = TrainerConfig(method=method, lr=1e-3, batch_size=batch)
    trainer = Trainer(policy.model, config, tmp / "out")
    return OnlineLearner(store, engine, policy.tokenizer, trainer,
                         MetricsWriter(tmp / "out", tensorboard=False))  # fmt: skip


def test_hint_goes_on_the_last_non_assistant_message():
    msgs = [
        ChatMessage(role="system", content="sys"),
        ChatMessage(role="user", content="q"),
        ChatMessage(role="assistant", content="a"),
    ]
    out = hinted_messages(msgs, " use fewer words ")
    assert out[1].content == "q\n\n[Hint: use fewer words]"
    assert out[0] == msgs[0] and out[2] == msgs[2]


def test_a_system_placed_hint_joins_the_system_message_or_opens_one():
    user, answer = ChatMessage(role="user", content="q"), ChatMessage(role="assistant", content="a")
    with_system = [ChatMessage(role="system", content="sys"), user, answer]
    out = hinted_messages(with_system, " use fewer words ", "system")
    assert out[0].content == "sys\n\nKeep in mind what the user asked for: use fewer words"
    assert out[1:] == [user, answer]
    out = hinted_messages([user, answer], "use fewer words", "system")
    assert out == [ChatMessage(role="system", content="Keep in mind what the user asked for: "
                               "use fewer words"), user, answer]  # fmt: skip


def test_the_methods_pass_their_hint_placement_to_the_learner():
    from clawrl.config import load_config

    cfg = load_config(None, ['trainer.method={kind="combine", hint_placement="system"}'])
    assert cfg.trainer.method.needs.hint_placement == "system"
    assert load_config(None, ['trainer.method="opd"']).trainer.method.needs.hint_placement == "user"
    with pytest.raises(Exception, match="hint_placement"):
        load_config(None, ['trainer.method={kind="opd", hint_placement="middle"}'])


def test_combine_step_trains_publishes_and_counts_drops(world):
    policy, engine, store, tmp = world
    good = _record(policy, engine, store, 2, score=1)
    hinted = _record(policy, engine, store, 2, score=-1, hint="Answer in one short sentence.")
    zero = _record(policy, engine, store, 1, score=0)
    broken = _record(policy, engine, store, 1, score=1, status=TurnStatus.INCOMPLETE)
    learner = _learner(policy, engine, store, tmp)

    async def go():
        assert await learner.collect() == 4
        return await learner.step_if_ready()

    m = asyncio.run(go())
    assert m is not None and m["policy/version"] == 1.0 and m["hint/rate"] == 0.5
    deadline = time.monotonic() + 60  # the engine swaps between its steps, asynchronously
    while engine.policy_version != 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.policy_version == 1
    counts = store.sample_counts()
    assert counts == {"trained": 4, "drop/zero_score": 1, "drop/untrainable": 1}
    for t in good + hinted:
        assert store.get_sample(t).policy_version == 1
    assert store.get_sample(zero[0]).reason == "zero_score"
    assert store.get_sample(broken[0]).reason == "untrainable"
    rows = read_metrics(tmp / "out" / "metrics.jsonl")
    assert len(rows) == 1 and rows[0]["step"] == 1 and "kl/mismatch" in rows[0]
    assert asyncio.run(learner.collect()) == 0  # nothing is decided twice


def test_training_steps_run_in_threads_that_end(world, monkeypatch):
    """A live thread that ran a training step would keep an OpenMP team slowing the serving
    engine between steps (clawrl.engine.threads)."""
    policy, engine, store, tmp = world
    _record(policy, engine, store, 2, score=1)
    learner = _learner(policy, engine, store, tmp, batch=2)
    threads: list[threading.Thread] = []
    step = learner.trainer.train_step

    def recording(samples):
        threads.append(threading.current_thread())
        return step(samples)

    monkeypatch.setattr(learner.trainer, "train_step", recording)

    async def go():
        assert await learner.collect() == 2
        assert await learner.step_if_ready() is not None
        (thread,) = threads
        thread.join(timeout=3)  # inside the loop: an executor's worker would still be alive
        assert thread is not threading.main_thread() and not thread.is_alive()

    asyncio.run(go())


def test_rl_and_opd_methods_drop_what_they_cannot_use(world):
    policy, engine, store, tmp = world
    no_hint = _record(policy, engine, store, 1, score=1)
    only_hint = _record(policy, engine, store, 1, score=None, hint="Be brief.")
    nothing = _record(policy, engine, store, 1, score=None)
    learner = _learner(policy, engine, store, tmp, method="opd", batch=1)
    asyncio.run(learner.collect())
    assert store.get_sample(no_hint[0]).reason == "no_hint"
    assert store.get_sample(nothing[0]).reason == "no_judgment"
    assert only_hint[0] in learner._ready
    sample = learner._ready[only_hint[0]]
    assert sample.teacher_logprobs is not None
    # the hint changes the context, so the teacher's log-probs differ from the student's
    assert sample.teacher_logprobs != pytest.approx(sample.sampling_logprobs, abs=1e-6)


def test_crash_after_checkpoint_resumes_without_training_twice(world):
    policy, engine, store, tmp = world
    ids = _record(policy, engine, store, 4, score=1)
    learner = _learner(policy, engine, store, tmp, method="rl")

    def crash(records):
        raise RuntimeError("killed before the samples rows were written")

    store_record = store.record_samples
    asyncio.run(learner.collect())
    store.record_samples = crash
    with pytest.raises(RuntimeError):
        asyncio.run(learner.step_if_ready())
    store.record_samples = store_record
    assert all(store.get_sample(t) is None for t in ids)
    # restart: a fresh learner resumes from the checkpoint written before the crash
    fresh = _learner(policy, engine, store, tmp, method="rl")
    version = fresh.resume()
    assert version == 1 and fresh.trainer.step == 1
    assert all(store.get_sample(t).status == "trained" for t in ids)
    assert asyncio.run(fresh.collect()) == 0


def test_samples_gone_stale_while_waiting_are_dropped_not_retried_forever(world):
    # seen in the demo: samples collected before a pause went stale while they waited, and the
    # learner retried the batch the trainer refused ("all 4 samples are stale") for ever
    policy, engine, store, tmp = world
    old = _record(policy, engine, store, 4, score=1)
    learner = _learner(policy, engine, store, tmp, method="rl")
    assert asyncio.run(learner.collect()) == 4
    # steps taken meanwhile: the trainer and the store's record both moved on
    learner.trainer.policy_version = learner.config.max_staleness + 1
    for v in range(1, learner.trainer.policy_version + 1):
        store.publish_policy_version(PolicyVersionRecord(v, WeightsKind.FULL))
    assert asyncio.run(learner.step_if_ready()) is None
    assert all(store.get_sample(t).reason == "stale" for t in old)
    assert learner._ready == {} and learner.state.drops["drop/stale"] == 4
    fresh = _record(policy, engine, store, 4, score=1)
    for t in fresh:  # as if sampled by the current version
        store.update_turn(t, policy_version=learner.trainer.policy_version)
    assert asyncio.run(learner.collect()) == 4
    m = asyncio.run(learner.step_if_ready())
    assert m is not None and all(store.get_sample(t).status == "trained" for t in fresh)


@pytest.mark.parametrize("max_staleness", [4, 0])
def test_a_step_whose_writes_failed_is_finished_by_the_retry_not_trained_again(
    world, monkeypatch, max_staleness
):
    # a transient store error after the checkpoint (the samples rows): the online loop retries;
    # the learner finishes that step first (before evicting stale samples or choosing another
    # batch, even with more samples ready meanwhile) instead of taking a second optimizer step,
    # so v1 is published once and every turn of it is trained once, by step 1
    from clawrl.errors import StoreError

    policy, engine, store, tmp = world
    turns = _record(policy, engine, store, 4, score=1)
    learner = _learner(policy, engine, store, tmp, method="rl")
    learner.config.max_staleness = max_staleness
    learner.fixed_order = True
    real = store.record_samples
    calls = []

    def flaky(records):
        calls.append(len(records))
        if len(calls) == 1:
            raise StoreError("database is locked")
        return real(records)

    monkeypatch.setattr(store, "record_samples", flaky)
    assert asyncio.run(learner.collect()) == 4
    with pytest.raises(StoreError):
        asyncio.run(learner.step_if_ready())
    assert learner.trainer.step == 1 and store.latest_policy_version() is None
    assert sorted(learner.learner.pending_turn_ids or []) == sorted(turns)
    extra = _record(policy, engine, store, 4, score=1)  # sampled by v0 meanwhile
    asyncio.run(learner.collect())
    m = asyncio.run(learner.step_if_ready())
    assert m is not None and m["policy/version"] == 1.0
    assert learner.trainer.step == 1  # no second optimizer step
    assert learner.learner.pending_turn_ids is None
    assert [v.version for v in store.policy_versions()] == [1]
    assert all(store.get_sample(t).policy_version == 1 for t in turns)
    rows = read_metrics(tmp / "out" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1]  # the step's row once
    nxt = asyncio.run(learner.step_if_ready())
    if max_staleness == 0:  # the extra samples lag v1 by one: dropped, not trained
        assert nxt is None and all(store.get_sample(t).reason == "stale" for t in extra)
    else:
        assert nxt is not None and nxt["policy/version"] == 2.0
        assert all(store.get_sample(t).policy_version == 2 for t in extra)


def test_the_trainer_scores_the_teacher_at_step_time_when_asked(world, monkeypatch):
    """``trainer.teacher_scoring = trainer``: nothing is scored on the engine when turns are
    collected; the step's hinted samples get the trainer's teacher log-probs, which equal the
    engine's for the same weights (version 0 here)."""
    from clawrl.trainer.online import teacher_on_trainer
    from clawrl.trainer.samples import teacher_prompt_ids

    policy, engine, store, tmp = world
    hinted = _record(policy, engine, store, 2, score=None, hint="Answer in one word.")
    config = TrainerConfig(method="opd", lr=1e-3, batch_size=2, teacher_scoring="trainer")
    learner = OnlineLearner(store, engine, policy.tokenizer, Trainer(policy.model, config, tmp / "o"),
                            MetricsWriter(tmp / "o", tensorboard=False))  # fmt: skip
    assert learner.teacher_on_trainer and not teacher_on_trainer("auto", engine)
    scored: list = []
    monkeypatch.setattr(engine, "score", lambda *a, **k: scored.append(a))  # must not be called
    assert asyncio.run(learner.collect()) == 2
    assert scored == [] and all(learner._ready[t].teacher_logprobs is None for t in hinted)
    monkeypatch.undo()
    expected = {}
    for t in hinted:
        turn = store.get_turn(t)
        prompt = teacher_prompt_ids(policy.tokenizer, turn, "Answer in one word.", "user")
        expected[t] = asyncio.run(engine.score(prompt, turn.completion_ids, temperature=1.0))
    stepped: list = []
    step = learner.learner.step

    def recording(samples, turn_ids, **kw):
        stepped.append(dict(zip(turn_ids, samples, strict=True)))
        return step(samples, turn_ids, **kw)

    monkeypatch.setattr(learner.learner, "step", recording)
    m = asyncio.run(learner.step_if_ready())
    assert m is not None and m["time/teacher_scoring"] > 0
    for t in hinted:
        assert stepped[0][t].teacher_logprobs == pytest.approx(expected[t], abs=1e-4)
    assert learner._teacher_prompts == {}
