"""Two training steps through the reference harness: gateway, sandbox, verifier, prefix tree,
group advantages, the shared trainer and published versions.

The engine is scripted (the policy's answers decide the rewards, so they must be known); the
trainer trains the tiny random model on the recorded token ids.
"""

from __future__ import annotations

import itertools
import threading

import pytest

from clawrl.config import TrainerConfig
from clawrl.engine.scripted import ScriptedEngine
from clawrl.errors import ConfigError, TrainerError
from clawrl.gateway import create_app
from clawrl.gateway.seeding import SESSION_SEED_KEY, call_seed
from clawrl.harness.loop import (
    HarnessRunner,
    HarnessSettings,
    eval_row,
    evaluate,
    rollout_seed,
    train,
)
from clawrl.harness.samples import step_samples
from clawrl.harness.tasks import BUILTIN_TASKS, load_task
from clawrl.store import GroupDecision, RolloutPurpose, Store
from clawrl.trainer.learner import Learner
from clawrl.trainer.trainer import Trainer


def _engine(tokenizer):
    """Alternates a correct command with a wrong one; a second call in a rollout says DONE."""
    counter = itertools.count()
    lock = threading.Lock()

    def reply(prompt_ids, params):
        text = tokenizer.decode(prompt_ids)
        if "Output:" in text.rsplit("<|im_start|>user", 1)[-1]:
            return "DONE"
        with lock:
            n = next(counter)
        return "```bash\necho hello > hello.txt\n```" if n % 2 == 0 else "```bash\nls\n```"

    return ScriptedEngine(tokenizer, reply_fn=reply)


@pytest.mark.timeout(300)
def test_two_training_steps_through_the_reference_harness(tmp_path, tiny):
    engine = _engine(tiny.tokenizer)
    task = load_task(BUILTIN_TASKS / "create-file-0")
    settings = HarnessSettings(harnesses=["reference"], group_size=2, parallel=2)
    trainer = Trainer(
        tiny.model,
        TrainerConfig(
            method={"kind": "grpo", "loss": {"kl": {"beta": 0.0}}}, micro_batch_size=2, lr=1e-3
        ),
        tmp_path / "run",
    )
    with Store(tmp_path / "s.db") as store:
        app = create_app(engine, tiny.tokenizer, store, model_name="policy")
        runner = HarnessRunner(app, store, settings)
        calls: list[tuple[bool, int, int]] = []
        runner.on_rollout = lambda r, done, total: calls.append((r is None, done, total))
        try:
            ended: list[int] = []
            learner = Learner(trainer, store, engines=[engine])
            history = train(runner, learner, engine, [task], steps=2, tasks_per_step=1,
                            on_step=lambda step, m: ended.append(step))  # fmt: skip
        finally:
            runner.close()
        assert ended == [1, 2]  # each step reported as it ends (the CLI prints a line)
        # each batch announced, then each rollout as it ends (the CLI's progress lines)
        assert calls == [(True, 0, 2), (False, 1, 2), (False, 2, 2)] * 2
        assert [m["policy/version"] for m in history] == [1.0, 2.0]
        assert engine.policy_version == 2
        # the one learner records what every mode records: versions, samples rows, checkpoints
        assert [v.version for v in store.policy_versions()] == [1, 2]
        trained = [store.get_sample(t) for r in store.rollout_results(run_id=runner.run_id)
                   for t in [x.id for x in store.session_turns(r.rollout.id)]]  # fmt: skip
        assert sum(s is not None and s.status.value == "trained" for s in trained) == 8
        assert {s.policy_version for s in trained if s is not None} == {1, 2}
        assert len(list((tmp_path / "run" / "checkpoints").glob("step-*"))) >= 1
        for m in history:
            assert m["group/skipped_zero_variance"] == 0
            assert m["harness/reference/rollouts"] == 2
            assert m["rollout/reward_mean"] == 0.5  # one 1.0, one 0.0 (file missing)
            assert m["samples/trained"] == 4  # 2 rollouts x (command turn + DONE turn)
        recorded = store.rollout_results(run_id=runner.run_id)
        assert len(recorded) == 4
        assert {r.rollout.isolation for r in recorded} == {str(runner.isolation)}
        assert sorted(r.reward for r in recorded) == [0.0, 0.0, 1.0, 1.0]
        assert all(r.verifier is not None and r.verifier.error is None for r in recorded)
        groups = store.rollout_groups(runner.run_id)
        assert [(g.step, g.size, g.policy_version, g.purpose) for g in groups] == [
            (1, 2, 0, RolloutPurpose.TRAIN), (2, 2, 1, RolloutPurpose.TRAIN)
        ]  # fmt: skip
        assert all(g.decision is GroupDecision.KEPT and g.reward_mean == 0.5 for g in groups)
        assert groups[0].label == "create-file-0/reference/1" and groups[0].task_id == task.id
        # seeded sampling: each rollout's session carries its seed (members, steps differ),
        # and each call was sampled (and recorded) with a seed fixed by it and the prompt
        seeds = {r.rollout.id: store.get_session(r.rollout.id).metadata[SESSION_SEED_KEY]
                 for r in recorded}  # fmt: skip
        assert sorted(seeds.values()) == sorted(
            rollout_seed(0, RolloutPurpose.TRAIN, g.step, g.label, m)
            for g in groups
            for m in (0, 1)
        )
        assert len(set(seeds.values())) == 4
        for rid, seed in seeds.items():
            for t in store.session_turns(rid):
                assert t.sampling_params["seed"] == call_seed(seed, t.prompt_ids, 0, 0)

        # credit: every sampled token of each rollout is trained exactly once, carrying its
        # rollout's reward, group and episode (the trainer's GRPO turns them into A = +-0.707)
        rewards = {r.rollout.id: r.reward for r in recorded if r.reward is not None}
        built = step_samples(
            store, rewards, {r.rollout.id: r.group.id for r in recorded},
            {r.rollout.id: r.harness for r in recorded},
        )  # fmt: skip
        turn_ids = [s.turn_id for s in built.samples]
        assert len(turn_ids) == len(set(turn_ids)) == 8
        for s in built.samples:
            turn = store.get_turn(s.turn_id)
            assert s.completion_ids == turn.completion_ids and s.prompt_ids == turn.prompt_ids
            rid = str(s.meta["rollout"])
            assert s.reward == rewards[rid] and s.teacher_logprobs is None
            assert s.episode_id == rid
        versions = {store.get_turn(t).policy_version for t in turn_ids}
        assert versions == {0, 1}  # step 2's rollouts ran on the published version 1
        # outcome only: nothing is judged, and no step carries a score
        assert all(store.judgments_for_session(rid) == [] for rid in rewards)
        assert {s.step_score for s in built.samples} == {None}
        assert not any(k.startswith("prm/") for m in history for k in m)


@pytest.mark.timeout(300)
def test_eval_reports_pass_at_k(tmp_path, tiny):
    engine = _engine(tiny.tokenizer)
    task = load_task(BUILTIN_TASKS / "create-file-0")
    settings = HarnessSettings(harnesses=["reference"], parallel=2)
    with Store(tmp_path / "s.db") as store:
        app = create_app(engine, tiny.tokenizer, store, model_name="policy")
        runner = HarnessRunner(app, store, settings)
        try:
            (row,) = evaluate(runner, [task], k=2)
        finally:
            runner.close()
        (group,) = store.rollout_groups(runner.run_id)
        assert group.purpose is RolloutPurpose.EVAL and group.step is None and group.size == 2
        recorded = store.rollout_results(run_id=runner.run_id)
        assert sorted(r.reward for r in recorded) == [0.0, 1.0]
        # the table is computed from the store's records: the same records give the same row
        again = eval_row("reference", recorded, k=2, wall_s=row.wall_s)
    assert again == row
    assert row.rollouts == 2 and row.verifier_errors == 0
    assert row.pass_at_1 == pytest.approx(0.5) and row.pass_at_k == pytest.approx(1.0)


@pytest.mark.timeout(300)
def test_a_killed_run_resumes_at_the_next_step_and_trains_no_group_twice(tmp_path, tiny):
    """Step 1, then a new process (a new trainer on the same output directory, as ``clawrl
    harness train`` run again on the same ``--out``): it restores step 1's checkpoint, goes on
    at step 2 with the next task, and the store records each step's group and version once."""
    from clawrl.harness.loop import resume_point
    from clawrl.models import tiny_policy

    engine = _engine(tiny.tokenizer)
    task = load_task(BUILTIN_TASKS / "create-file-0")
    settings = HarnessSettings(harnesses=["reference"], group_size=2, parallel=2)
    config = TrainerConfig(
        method={"kind": "grpo", "loss": {"kl": {"beta": 0.0}}}, micro_batch_size=2, lr=1e-3
    )
    with Store(tmp_path / "s.db") as store:
        app = create_app(engine, tiny.tokenizer, store, model_name="policy")
        first = Learner(Trainer(tiny.model, config, tmp_path / "run"), store, engines=[engine])
        runner = HarnessRunner(app, store, settings)
        try:
            train(runner, first, engine, [task], steps=1, tasks_per_step=1)
        finally:
            runner.close()
        run_ids = [runner.run_id]
        # the "restarted process": fresh weights, everything else from the output directory
        second = Learner(
            Trainer(tiny_policy(seed=0).model, config, tmp_path / "run"), store, engines=[engine]
        )
        start = resume_point(second.resume())
        assert (start.step, start.cursor) == (1, 1) and second.policy_version == 1
        runner = HarnessRunner(app, store, settings)
        try:
            history = train(runner, second, engine, [task], steps=2, tasks_per_step=1,
                            start=start)  # fmt: skip
        finally:
            runner.close()
        run_ids.append(runner.run_id)
        assert [m["policy/version"] for m in history] == [2.0]  # only step 2 ran
        steps = sorted(g.step for r in run_ids for g in store.rollout_groups(r))
        assert steps == [1, 2]  # no step's group ran (or trained) twice
        assert [v.version for v in store.policy_versions()] == [1, 2]
        # a trainer whose store is ahead of it is refused before it publishes a clashing version
        stale = Learner(Trainer(tiny.model, config, tmp_path / "other"), store)
        with pytest.raises(TrainerError, match="another trainer"):
            stale.next_version()
        with pytest.raises(ConfigError, match="no checkpoint"):
            stale.resume()
        # the next number comes from the store, which must end at the trainer's own version
        assert second.next_version() == store.latest_policy_version().version + 1 == 3
    with Store(tmp_path / "fresh.db") as empty:
        behind = Learner(Trainer(tiny.model, config, tmp_path / "run"), empty)
        behind.restore()  # the trainer is at v2, the store has no record of it
        with pytest.raises(TrainerError, match=r"call Learner\.resume"):
            behind.next_version()
