"""Integrated PRM + outcome through the reference harness: each turn's next state judged and the
judgment stored, samples carrying step indices and step scores, the shared trainer stepping on
``PRM + outcome``; judge failures counted, never fatal.

The engine is scripted (its answers decide the rewards); the judge is scripted (its verdicts
must be known); the trainer trains the tiny random model on the recorded token ids. In every
rollout turn 0 writes a command, the harness runs it and sends its output back (turn 0's next
state), and turn 1 says DONE, after which the harness exits: turn 1 has no next state.
"""

from __future__ import annotations

import asyncio
import itertools
import threading

import pytest

from clawrl.config import TrainerConfig
from clawrl.engine.scripted import ScriptedEngine
from clawrl.errors import JudgeError
from clawrl.gateway import create_app
from clawrl.harness.loop import HarnessRunner, HarnessSettings, train
from clawrl.harness.samples import step_samples
from clawrl.harness.tasks import BUILTIN_TASKS, load_task
from clawrl.judge.types import BackendKind, Judgment, Score
from clawrl.store import GroupDecision, Store
from clawrl.trainer.learner import Learner
from clawrl.trainer.trainer import Trainer

GOOD = "```bash\necho hello > hello.txt\n```"
BAD = "```bash\nls\n```"


def _engine(tokenizer, commands):
    """Answers the next of ``commands`` (cycled) to a task, DONE once it has seen an output."""
    cycle = itertools.cycle(commands)
    lock = threading.Lock()

    def reply(prompt_ids, params):
        if "Output:" in tokenizer.decode(prompt_ids).rsplit("<|im_start|>user", 1)[-1]:
            return "DONE"
        with lock:
            return next(cycle)

    return ScriptedEngine(tokenizer, reply_fn=reply)


async def _judge_by_command(inp):
    """+1 for the command that solves the task, -1 otherwise (the judge sees the tool output)."""
    assert inp.next_state.text  # the tool output that followed the command
    good = "hello" in (inp.output.content or "")
    return Judgment(score=Score.GOOD if good else Score.BAD, backend=BackendKind.GENERATIVE,
                    model="scripted")  # fmt: skip


def _run(tmp_path, tiny, engine, judge, steps=1, **kwargs):
    """prm_outcome training steps on create-file-0 (a group of 2 each): (the last step's
    metrics, store, runner)."""
    task = load_task(BUILTIN_TASKS / "create-file-0")
    method = {"kind": "prm_outcome", "loss": {"kl": {"beta": 0.0}}}
    config = TrainerConfig(method=method, micro_batch_size=2, lr=1e-3)
    trainer = Trainer(tiny.model, config, tmp_path / "run")
    store = Store(tmp_path / "s.db")
    runner = HarnessRunner(
        create_app(engine, tiny.tokenizer, store, model_name="policy"), store,
        HarnessSettings(harnesses=["reference"], group_size=2, parallel=2),
    )  # fmt: skip
    try:
        learner = Learner(trainer, store, engines=[engine])
        history = train(runner, learner, engine, [task], steps=steps, tasks_per_step=1,
                        judge=judge, **kwargs)  # fmt: skip
    finally:
        runner.close()
    assert len(history) == steps
    return history[-1], store, runner


def _turns_by_step(store, rollout_id):
    """The rollout's turns oldest first (turn 0: the command, turn 1: DONE)."""
    return store.session_turns(rollout_id)


@pytest.mark.timeout(300)
def test_prm_outcome_step_judges_turns_stores_judgments_and_trains(tmp_path, tiny):
    engine = _engine(tiny.tokenizer, [GOOD, BAD])
    metrics, store, runner = _run(tmp_path, tiny, engine, _judge_by_command)
    with store:
        assert metrics["policy/version"] == 1.0 and engine.policy_version == 1
        assert metrics["samples/trained"] == 4  # 2 rollouts x (command turn + DONE turn)
        assert metrics["prm/judged_turns"] == 2 and metrics["prm/no_next_state"] == 2
        assert metrics["prm/judge_failures"] == 0
        assert metrics["prm/step_score_mean"] == 0.0  # one +1, one -1
        assert metrics["prm/score/+1"] == 1 and metrics["prm/score/-1"] == 1
        recorded = store.rollout_results(run_id=runner.run_id)
        rewards = {r.rollout.id: r.reward for r in recorded}
        assert sorted(rewards.values()) == [0.0, 1.0]
        for rollout_id, reward in rewards.items():
            command, done = _turns_by_step(store, rollout_id)
            judged = store.get_judgment(command.id)
            assert judged is not None and judged.score == (1 if reward == 1.0 else -1)
            assert judged.backend == "generative:scripted"
            assert judged.next_state_role == "environment"  # the harness's output, not a person
            last = store.get_judgment(done.id)
            assert last is not None and last.score is None and last.reason == "no_next_state"

        # the samples carry their step within the rollout and the stored score of that step
        built = step_samples(
            store, rewards, {r.rollout.id: r.group.id for r in recorded},
            {r.rollout.id: r.harness for r in recorded}, step_scores=True,
        )  # fmt: skip
        for rollout_id, reward in rewards.items():
            mine = sorted(
                (s for s in built.samples if s.episode_id == rollout_id),
                key=lambda s: s.step_index,
            )
            assert [s.step_index for s in mine] == [0, 1]
            assert [s.step_score for s in mine] == [1.0 if reward == 1.0 else -1.0, None]
            assert [s.turn_id for s in mine] == [t.id for t in _turns_by_step(store, rollout_id)]
        # without step_scores (outcome only) the same samples carry no step score
        plain = step_samples(
            store, rewards, {r.rollout.id: r.group.id for r in recorded},
            {r.rollout.id: r.harness for r in recorded},
        )  # fmt: skip
        assert {s.step_score for s in plain.samples} == {None}
        assert sorted(s.step_index for s in plain.samples) == [0, 0, 1, 1]


@pytest.mark.timeout(300)
def test_judge_failures_are_counted_stored_and_do_not_stop_the_step(tmp_path, tiny):
    async def failing_judge(inp):
        if "hello" in (inp.output.content or ""):
            raise JudgeError("the judge endpoint said 500")
        await asyncio.sleep(30)  # past the deadline
        raise AssertionError("not reached")

    engine = _engine(tiny.tokenizer, [GOOD, BAD])
    metrics, store, runner = _run(tmp_path, tiny, engine, failing_judge, judge_timeout_s=0.5)
    with store:
        assert metrics["prm/judge_failures"] == 2 and metrics["prm/judged_turns"] == 0
        assert metrics["prm/no_next_state"] == 2
        assert metrics["policy/version"] == 1.0  # trained on the outcome alone
        reasons = set()
        for r in store.rollout_results(run_id=runner.run_id):
            command, _ = _turns_by_step(store, r.rollout.id)
            judged = store.get_judgment(command.id)
            assert judged is not None and judged.score is None
            reasons.add(judged.reason)
        assert reasons == {"judge_error", "timeout"}


@pytest.mark.timeout(300)
def test_equal_outcomes_with_differing_step_scores_still_train(tmp_path, tiny):
    votes = itertools.cycle([Score.GOOD, Score.BAD])
    loops = set()

    async def alternating_judge(inp):
        loops.add(id(asyncio.get_running_loop()))
        return Judgment(score=next(votes), backend=BackendKind.GENERATIVE, model="scripted")

    engine = _engine(tiny.tokenizer, [BAD])  # every rollout fails: outcomes [0, 0]
    metrics, store, runner = _run(tmp_path, tiny, engine, alternating_judge, steps=2)
    with store:
        assert metrics["rollout/reward_mean"] == 0.0
        assert metrics["group/kept_by_step_scores"] == 1
        assert metrics["group/skipped_zero_variance"] == 0
        assert metrics["policy/version"] == 2.0 and metrics["samples/trained"] == 4
        groups = store.rollout_groups(runner.run_id)
        assert [g.decision for g in groups] == [GroupDecision.KEPT] * 2
    # both steps judged on one event loop (a judge's HTTP client stays bound to its first loop)
    assert len(loops) == 1


def test_a_method_with_step_scores_needs_a_judge(tmp_path, tiny):
    from clawrl.errors import ConfigError

    trainer = Trainer(tiny.model, TrainerConfig(method="prm_outcome"), tmp_path / "run")
    with pytest.raises(ConfigError, match="needs a judge"):
        learner = Learner(trainer, None, writer=False)
        train(None, learner, None, [], steps=1, tasks_per_step=1)  # type: ignore[arg-type]


@pytest.mark.parametrize(("method", "judged"), [("grpo", False), ("prm_outcome", True)])
def test_runtime_gives_harness_mode_a_judge_only_for_prm_outcome(tmp_path, tiny, method, judged):
    from clawrl.config import Config
    from clawrl.runtime import JudgeBundle, build_runtime

    bundle = JudgeBundle(_judge_by_command, description="scripted")
    config = Config.model_validate({"trainer": {"method": method, "output_dir": str(tmp_path)}})
    runtime = build_runtime(config, policy=tiny, store=tmp_path / "s.db", judge=bundle,
                            online=False)  # fmt: skip
    try:
        assert runtime.trainer is not None and runtime.service is None
        assert (runtime.judge is bundle) is judged and (runtime.judge is None) is not judged
    finally:
        runtime.close()
