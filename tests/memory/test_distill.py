"""Context distillation of the preference memory (issue: preference memory, deliverable 3).

A turn sampled with a memory block is trained without it: the student's prompt is the client's
messages, the teacher is the policy on what the turn was shown (plus the hint), the OPD
advantage's student term is the policy's log-probs without the block, and an entry retires once
the gap of its recent turns falls below ``memory.retire_gap``. Real store, tiny model, real
trainer; log-probs checked against the engine's ``score`` at the same weights."""

from __future__ import annotations

import asyncio
import logging

import pytest
import torch

from clawrl.algorithms import AdvantageInputs, compute_advantages
from clawrl.chat import ChatMessage, render_prompt
from clawrl.config import TrainerConfig
from clawrl.engine import SamplingParams, TransformersEngine
from clawrl.errors import ConfigError
from clawrl.memory import MemoryKeeper
from clawrl.memory.prompt import with_memory
from clawrl.models import tiny_policy
from clawrl.store import (
    DropReason,
    JudgmentRecord,
    MemoryEntryRecord,
    MemorySource,
    MemoryStatus,
    Store,
    TurnRecord,
)
from clawrl.trainer import Trainer
from clawrl.trainer.batch import collate
from clawrl.trainer.metrics import MetricsWriter
from clawrl.trainer.online import OnlineLearner
from clawrl.trainer.samples import cut_block, distillation, mean_gap, teacher_prompt_ids
from clawrl.trainer.types import TrainSample

ENTRIES = ("Lead with the number.", "Keep it to two sentences.")


@pytest.fixture()
def world(tmp_path):
    policy = tiny_policy(seed=4, max_context=512)
    engine = TransformersEngine.from_policy(policy)
    store = Store(tmp_path / "s.db")
    keeper = MemoryKeeper(store, sync_s=0.0, retire_turns=3, retire_gap=0.05)
    entries = [MemoryEntryRecord(text=t, source=MemorySource.MANUAL) for t in ENTRIES]
    store.change_memory(add=entries)
    yield policy, engine, store, keeper, [e.id for e in entries], tmp_path
    engine.close()
    store.close()


def _memory_turn(policy, engine, store, entry_ids, i, *, score=None, hint=None, system=None):
    """A turn sampled, as the gateway does, with the memory block in its system message."""
    msgs = [ChatMessage(role="user", content=f"problem {i}: what is {i} + {i}?")]
    if system is not None:
        msgs.insert(0, ChatMessage(role="system", content=system))
    shown, info = with_memory(msgs, entry_ids, ENTRIES)
    prompt = render_prompt(policy.tokenizer, shown).token_ids
    c = asyncio.run(engine.generate(prompt, SamplingParams(max_tokens=6, seed=i)))
    s = store.new_session()
    turn = TurnRecord(
        s.id, prompt, c.token_ids, c.logprobs,
        request_messages=[m.model_dump() for m in shown], sampling_params={"temperature": 1.0},
        policy_version=c.policy_version, finish_reason=str(c.finish_reason), memory=info,
    )  # fmt: skip
    store.record_turn(turn)
    reason = DropReason.NO_NEXT_STATE if score is None and hint is None else None
    store.record_judgment(JudgmentRecord(turn.id, s.id, score, "test", hint=hint, reason=reason))
    return turn, msgs


def _learner(policy, engine, store, tmp, keeper, method="combine", batch=2):
    config = TrainerConfig(method=method, lr=1e-3, batch_size=batch)
    trainer = Trainer(policy.model, config, tmp / "out", computes_teacher=True)
    return OnlineLearner(store, engine, policy.tokenizer, trainer,
                         MetricsWriter(tmp / "out", tensorboard=False), memory=keeper)  # fmt: skip


def _record_steps(monkeypatch, learner) -> list[dict]:
    """Each step's samples by turn id, as the learner is given them."""
    stepped: list[dict] = []
    step = learner.step

    def recording(samples, turn_ids, **kw):
        stepped.append(dict(zip(turn_ids, samples, strict=True)))
        return step(samples, turn_ids, **kw)

    monkeypatch.setattr(learner, "step", recording)
    return stepped


@pytest.mark.parametrize("system", [None, "You are terse."])
def test_the_student_sees_the_client_messages_and_the_teacher_what_was_shown(world, system):
    policy, engine, store, _, ids, _ = world
    turn, client = _memory_turn(policy, engine, store, ids, 1, system=system)
    d = distillation(policy.tokenizer, turn, None, "system")
    assert d is not None and d.entries == tuple(ids) and not d.hinted
    assert d.student_prompt == render_prompt(policy.tokenizer, client).token_ids
    assert d.memory_prompt == d.teacher_prompt == turn.prompt_ids
    assert len(d.student_prompt) < len(d.memory_prompt)
    hinted = distillation(policy.tokenizer, turn, "Say it in one line.", "system")
    assert hinted is not None and hinted.hinted
    assert hinted.teacher_prompt == teacher_prompt_ids(
        policy.tokenizer, turn, "Say it in one line.", "system"
    )
    assert hinted.student_prompt == d.student_prompt
    plain = TurnRecord(turn.session_id, turn.prompt_ids, turn.completion_ids,
                       turn.sampling_logprobs, request_messages=turn.request_messages)  # fmt: skip
    assert distillation(policy.tokenizer, plain, None, "system") is None


def test_a_block_missing_from_the_recorded_messages_is_not_distilled(world, caplog):
    policy, engine, store, _, ids, _ = world
    turn, _ = _memory_turn(policy, engine, store, ids, 1)
    turn.request_messages[0]["content"] = "something else"
    # the logger's own level: another test (the demo's CLI) may have raised clawrl's to ERROR
    with caplog.at_level(logging.WARNING, logger="clawrl.trainer.samples"):
        assert distillation(policy.tokenizer, turn, None, "system") is None
    assert "not distilled" in caplog.text


def test_the_opd_advantage_uses_the_student_term_where_a_sample_has_one():
    teacher, sampled, student = [-1.0, -2.0], [-0.5, -0.5], [-3.0, -4.0]
    with_student = TrainSample([1, 2], [3, 4], sampled, teacher_logprobs=teacher,
                               student_logprobs=student)  # fmt: skip
    plain = TrainSample([1, 2], [3, 4], sampled, teacher_logprobs=teacher)
    batch = collate([with_student, plain])
    mask = batch.loss_mask
    assert batch.student_logprobs[0][mask[0]].tolist() == student
    assert batch.student_logprobs[1][mask[1]].tolist() == sampled
    from clawrl.algorithms.config import OPDAdvantage

    adv = compute_advantages(
        OPDAdvantage(),
        AdvantageInputs(loss_mask=mask, teacher_logprobs=batch.teacher_logprobs,
                        old_logprobs=batch.student_logprobs, has_hint=batch.has_hint),
    )  # fmt: skip
    assert adv.advantages[0][mask[0]].tolist() == pytest.approx([2.0, 2.0])
    assert adv.advantages[1][mask[1]].tolist() == pytest.approx([-0.5, -1.5])
    with pytest.raises(ValueError, match="student_logprobs"):
        TrainSample([1], [2, 3], [0.0, 0.0], student_logprobs=[0.0])


def test_memory_turns_train_without_their_block_and_record_each_entrys_gap(world, monkeypatch):
    """A memory-only turn (no hint, no score: the user never replied) teaches; a hinted one has
    the hint on top of the memory. The step trains on the prompts without the block, with the
    teacher and student log-probs the engine gives at the same weights (version 0)."""
    policy, engine, store, keeper, ids, tmp = world
    quiet, _ = _memory_turn(policy, engine, store, ids, 1)
    hinted, _ = _memory_turn(policy, engine, store, ids, 2, score=-1, hint="Say it in one line.")
    learner = _learner(policy, engine, store, tmp, keeper)
    assert asyncio.run(learner.collect()) == 2
    expected = {}
    for turn, hint in ((quiet, None), (hinted, "Say it in one line.")):
        d = distillation(policy.tokenizer, turn, hint, learner.needs.hint_placement)
        assert d is not None
        assert learner._ready[turn.id].prompt_ids == d.student_prompt

        def score(prompt, turn=turn):
            return asyncio.run(engine.score(prompt, turn.completion_ids, temperature=1.0))

        expected[turn.id] = (score(d.teacher_prompt), score(d.student_prompt),
                             mean_gap(score(d.memory_prompt), score(d.student_prompt)))  # fmt: skip
    stepped = _record_steps(monkeypatch, learner.learner)
    m = asyncio.run(learner.step_if_ready())
    assert m is not None and m["distill/samples"] == 2.0
    gaps = []
    for t, (teacher, student, gap) in expected.items():
        s = stepped[0][t]
        assert s.teacher_logprobs == pytest.approx(teacher, abs=1e-4)
        assert s.student_logprobs == pytest.approx(student, abs=1e-4)
        assert s.teacher_logprobs != pytest.approx(s.student_logprobs, abs=1e-3)
        gaps.append(gap)
    mean = sum(gaps) / 2
    assert m["distill/gap"] == pytest.approx(mean, abs=1e-4)
    assert m["memory/retired"] == 0.0  # two turns, retire_turns 3: never yet
    for entry_id in ids:
        e = store.get_memory_entry(entry_id)
        event = next(h for h in e.history if h["event"] == "distilled")
        assert set(event["turns"]) == set(expected) and event["step"] == 1
        assert event["mean_gap"] == pytest.approx(mean, abs=1e-4)
        assert e.status == MemoryStatus.ACTIVE
    assert learner._distill == {}


def test_an_entry_retires_once_its_recent_gaps_are_small_and_leaves_the_block(world, caplog):
    _, _, store, _, ids, _ = world
    keeper = MemoryKeeper(store, sync_s=0.0, retire_turns=2, retire_gap=0.05)
    keeper.record_distillation([("t1", ids, 0.4), ("t2", ids[:1], 0.01)], step=1)
    assert [e.status for e in map(store.get_memory_entry, ids)] == [MemoryStatus.ACTIVE] * 2
    with caplog.at_level(logging.INFO, logger="clawrl.memory"):
        retired = keeper.record_distillation([("t3", ids[:1], 0.02)], step=2)
    first = store.get_memory_entry(ids[0])
    assert [e.id for e in retired] == [ids[0]] and first.status == MemoryStatus.RETIRED
    assert "mean gap 0.015" in (first.end_reason or "") and "step 2" in (first.end_reason or "")
    assert f"retired {ids[0][:8]}" in caplog.text
    event = next(h for h in first.history if h["event"] == "distilled")
    assert event["turns"] == ["t2", "t3"] and event["gaps"] == [0.01, 0.02]  # the last 2 kept
    second = store.get_memory_entry(ids[1])
    assert second.status == MemoryStatus.ACTIVE  # one turn, gap 0.4: not yet, and too far
    assert keeper.snapshot().entry_ids == (ids[1],)
    assert keeper.record_distillation([("t4", ids[:1], 0.0)], step=3) == []  # retired stays
    keeper.record_distillation([("t5", ids[1:], 0.3)], step=3)
    assert store.get_memory_entry(ids[1]).status == MemoryStatus.ACTIVE  # mean 0.35 > 0.05


def test_distilling_needs_a_method_with_a_teacher(world):
    policy, engine, store, keeper, _, tmp = world
    with pytest.raises(ConfigError, match="opd or combine"):
        _learner(policy, engine, store, tmp, keeper, method="rl")


def test_the_runtime_refuses_distill_without_an_online_learner(tmp_path):
    from clawrl.config import load_config
    from clawrl.runtime import build_runtime, build_trainer_process

    cfg = load_config(None, ["memory.distill=true"])
    with pytest.raises(ConfigError, match=r"memory\.distill"):
        build_runtime(cfg, store=tmp_path / "s.db", policy=tiny_policy(seed=0))
    cfg = load_config(None, ["memory.distill=true", "trainer.method=combine"])
    with pytest.raises(ConfigError, match="turn the memory on too"):
        build_runtime(cfg, store=tmp_path / "s.db", policy=tiny_policy(seed=0))
    cfg = load_config(None, ["memory.distill=true", "memory.enabled=true",
                             "trainer.method=combine", "server.external_trainer=true"])  # fmt: skip
    with pytest.raises(ConfigError, match="clawrl train --method combine --distill"):
        build_runtime(cfg, store=tmp_path / "s.db", policy=tiny_policy(seed=0))
    cfg = load_config(None, ["memory.distill=true", "trainer.method=rl"])
    with pytest.raises(ConfigError, match="opd or combine"):
        build_trainer_process(cfg, None)  # type: ignore[arg-type]


@pytest.mark.filterwarnings("ignore:Seems like `optimizer.step\\(\\)` has been overridden")
def test_clawrl_train_distils_memory_turns_as_the_online_learner_does(world, monkeypatch):
    """The trainer process (``clawrl train --distill``, one rank here): a memory turn's sample
    is its prompt without the block, the step scores teacher and student with the trainer's
    weights (the engine's log-probs at the same weights), records each entry's gap, prints it
    on the step line, and an entry whose gaps are small retires (gateways read it)."""
    from clawrl.trainer.distributed import init_distributed, shutdown_distributed
    from clawrl.trainer.fsdp import ShardedTrainer
    from clawrl.trainer.process import TrainerProcess

    policy, engine, store, _, ids, tmp = world
    quiet, _ = _memory_turn(policy, engine, store, ids, 1)
    hinted, _ = _memory_turn(policy, engine, store, ids, 2, score=-1, hint="Say it in one line.")
    keeper = MemoryKeeper(store, sync_s=0.0, retire_turns=2, retire_gap=1e9)  # retire at once
    env = init_distributed("cpu")
    try:
        config = TrainerConfig(method="combine", lr=1e-3, batch_size=2,
                               output_dir=str(tmp / "proc"))  # fmt: skip
        trainer = ShardedTrainer(tiny_policy(seed=4, max_context=512).model, config, env,
                                 computes_teacher=True)  # fmt: skip
        lines: list[str] = []
        proc = TrainerProcess(
            trainer, env, config, store=store, tokenizer=policy.tokenizer, max_context=512,
            metrics=MetricsWriter(tmp / "proc", tensorboard=False), out=lines.append,
            memory=keeper,
        )  # fmt: skip
        assert proc.resume() == 0
        order = proc.next_order()
        assert order is not None and not isinstance(order, str)
        assert order.turn_ids == [quiet.id, hinted.id] and order.teacher_prompts == [None, None]
        stepped = _record_steps(monkeypatch, proc.learner)
        m = proc.step(order)
        for turn, hint in ((quiet, None), (hinted, "Say it in one line.")):
            d = distillation(policy.tokenizer, turn, hint, proc.needs.hint_placement)
            assert d is not None and order.distill[order.turn_ids.index(turn.id)] == d
            s = stepped[0][turn.id]
            assert s.prompt_ids == d.student_prompt

            def score(prompt, turn=turn):
                return asyncio.run(engine.score(prompt, turn.completion_ids, temperature=1.0))

            assert s.teacher_logprobs == pytest.approx(score(d.teacher_prompt), abs=1e-4)
            assert s.student_logprobs == pytest.approx(score(d.student_prompt), abs=1e-4)
        assert m["distill/samples"] == 2.0 and m["memory/retired"] == 2.0
        assert all(store.get_memory_entry(i).status == MemoryStatus.RETIRED for i in ids)
        assert not set(ids) & set(keeper.snapshot().entry_ids)  # (the hint becomes one)
        assert any("distilled 2 gap" in x and "retired 2" in x for x in lines), lines
        assert sum("memory: retired" in x for x in lines) == 2
        proc.close()
    finally:
        shutdown_distributed()


def test_gap_is_the_mean_difference():
    assert mean_gap([-1.0, -2.0], [-1.5, -3.0]) == pytest.approx(0.75)
    with pytest.raises(ValueError):
        mean_gap([], [])
    assert torch.isfinite(torch.tensor(mean_gap([-1e-3], [-20.0])))


def test_the_student_prompt_keeps_what_follows_the_block_as_sampled():
    """Only the block's tokens change: spliced history ids and a prefill after it stay."""
    shown = [1, 2, 70, 71, 72, 3, 4, 5]  # template, system text + block, the rest
    client = [1, 2, 3, 4, 5]
    sampled = [1, 2, 70, 71, 72, 3, 9, 9, 5, 8]  # history spliced (9, 9), a prefill (8)
    assert cut_block(sampled, shown, client) == [1, 2, 3, 9, 9, 5, 8]
    assert cut_block([1, 2, 70, 99, 72, 3, 4, 5], shown, client) is None  # not the block shown
    appended = [1, 2, 60, 61, 3]  # the block joins the client's system text: 60 -> 60 61
    assert cut_block([1, 2, 60, 61, 3, 7], appended, [1, 2, 60, 3]) == [1, 2, 60, 3, 7]


def test_the_trainer_takes_the_student_term_into_its_advantage(world):
    policy, _, _, _, _, tmp = world
    trainer = Trainer(policy.model, TrainerConfig(method="opd", lr=1e-3, batch_size=2), tmp / "t")
    sampled, student = [-0.5, -0.5], [-3.0, -4.0]
    samples = [
        TrainSample([1, 2], [3, 4], sampled, teacher_logprobs=[-1.0, -2.0],
                    student_logprobs=student),
        TrainSample([1, 2], [3, 4], sampled, teacher_logprobs=[-1.0, -2.0]),
    ]  # fmt: skip
    full = collate(samples)
    old = trainer._advantage_inputs(full, trainer.method).old_logprobs
    assert old is not None
    assert old[0][full.loss_mask[0]].tolist() == student
    assert old[1][full.loss_mask[1]].tolist() == sampled


def test_a_turn_counts_once_and_a_changed_entry_keeps_its_change(world):
    _, _, store, _, ids, _ = world
    keeper = MemoryKeeper(store, sync_s=0.0, retire_turns=2, retire_gap=0.05)
    keeper.record_distillation([("t1", ids[:1], 0.0)], step=1)
    keeper.record_distillation([("t1", ids[:1], 0.0)], step=1)  # a retried step
    assert store.get_memory_entry(ids[0]).status == MemoryStatus.ACTIVE  # one gap, not two
    keeper.edit(ids[0], text="Lead with the answer.")  # new words: the old gaps go
    e = store.get_memory_entry(ids[0])
    assert not any(h["event"] == "distilled" for h in e.history)
    stale = store.get_memory_entry(ids[1])
    assert keeper.forget(ids[1])  # another process forgets it while a step measures

    def read_stale(entry_id):
        return stale if entry_id == ids[1] else Store.get_memory_entry(store, entry_id)

    keeper.store = type("S", (), {"get_memory_entry": staticmethod(read_stale),
                                  "save_memory_if_unchanged": store.save_memory_if_unchanged})()  # fmt: skip
    assert keeper.record_distillation([("t2", ids[1:], 0.0), ("t3", ids[1:], 0.0)], step=2) == []
    gone = store.get_memory_entry(ids[1])
    assert gone.status == MemoryStatus.FORGOTTEN and ENTRIES[1] not in gone.text


class _Keeper:
    """Records what record_gaps asks of the memory; ``fail`` makes the memory raise."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[list[tuple[str, tuple[str, ...], float]], int]] = []
        self.fail = fail

    def record_distillation(self, seen, *, step):
        if self.fail:
            raise RuntimeError("store gone")
        self.calls.append((list(seen), step))
        return ["retired-entry"]


def test_record_gaps_is_one_rule_for_both_learners(caplog):
    """``record_gaps`` (the in-process learner and ``clawrl train`` both call it): the mean gap
    of the distilled samples only, each distilled turn recorded with its block's entries, a
    lease check before the store is written that stops the write when it raises, and a memory
    error logged, never raised."""
    from clawrl.trainer.samples import Distillation, record_gaps

    part = Distillation([1], [1, 2], [1, 2], ("e1", "e2"))
    ids, parts, gaps = ["t1", "t2", "t3"], [part, None, part], [0.2, None, 0.4]
    assert record_gaps(_Keeper(), ids, [None] * 3, [None] * 3, step=1) == ({}, [])
    metrics, retired = record_gaps(None, ids, parts, gaps, step=3)  # a rank other than 0
    assert metrics == {"distill/samples": 2.0, "distill/gap": pytest.approx(0.3)}
    assert retired == []
    keeper = _Keeper()
    metrics, retired = record_gaps(keeper, ids, parts, gaps, step=3)
    assert keeper.calls == [([("t1", ("e1", "e2"), 0.2), ("t3", ("e1", "e2"), 0.4)], 3)]
    assert metrics["memory/retired"] == 1.0 and retired == ["retired-entry"]

    class LostLease(Exception):
        pass

    def lost() -> None:
        raise LostLease

    keeper = _Keeper()
    with pytest.raises(LostLease):
        record_gaps(keeper, ids, parts, gaps, step=3, before_write=lost)
    assert keeper.calls == []
    with caplog.at_level(logging.ERROR):
        metrics, retired = record_gaps(_Keeper(fail=True), ids, parts, gaps, step=3)
    assert "memory/retired" not in metrics and retired == []
    assert "recording the memory's distillation gaps" in caplog.text
