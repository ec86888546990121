"""Warm start: supervised fine-tuning on successful rollouts, replayed in each harness's format.

A small model may never act in a harness's format (the embedded 135M model and mini-swe-agent's
action format), so RL through that harness has no reward to learn from. The warm start gives it
that format from the model's own successes elsewhere:

1. :func:`collect_demonstrations`: from a store of earlier harness rollouts (``clawrl harness
   eval --split train`` or a ``harness train`` run), the *passed* rollouts (reward 1) of the run's
   tasks, each as the shell commands it ran (parsed from its turns as the reference agent parses
   them; mini-swe-agent's submit command left out); a task of the held-out split is never used,
   whatever the run trains on. At most ``max_per_task`` distinct command lists per task.
2. :func:`replay_demonstrations`: each demonstration is replayed through the *target* harness,
   unmodified, in the sandbox, against a gateway whose engine answers with the demonstration's
   commands in that harness's reply format (:data:`DEMO_FORMATS`) and then its finishing reply.
   The gateway records the calls token-exactly as it records any rollout, so the training
   prompts are exactly what the harness sends (its system prompt, templates, observations). A
   replay is kept only if the task's verifier passes it again.
3. :func:`warm_start`: the replayed turns become samples
   (:func:`clawrl.harness.samples.rollout_samples`: the prefix tree's trained turns, each
   sampled token once) with advantage
   1 and are trained with the method ``precomputed`` and the ``old`` importance ratio (the
   policy before each optimizer step): at ratio 1 the PPO-clip gradient is ``∇ log π(a_t|s)``
   per completion token, i.e. the supervised (negative log-likelihood) gradient, token-mean
   aggregated. No KL term. Rejection-sampling fine-tuning on the model's own successes (RFT,
   Yuan et al. 2023, "Scaling Relationship on Learning Mathematical Reasoning with LLMs"), with
   the harness's format supplied by the replay. One policy version is published at the end
   (:meth:`clawrl.trainer.learner.Learner.commit`: checkpointed, the replayed turns'
   ``samples`` rows written, recorded in ``policy_versions``), and the optimizer and its
   schedule start afresh for the RL steps that follow.

After the warm start, a KL penalty of the RL method would anchor to the *base* weights (the
LoRA adapter disabled), pulling the policy away from what the warm start taught: ``clawrl
harness train`` refuses ``--warm-start`` with RL steps and a KL penalty (``loss.kl.beta > 0``).

Demonstration rollouts are recorded in the run's store like any rollout (group label
``warm-start/TASK/HARNESS``, purpose ``warm_start``), so ``clawrl sessions`` shows them.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import random
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from clawrl.algorithms.config import KLPenalty, OldRatio, PPOClipLoss
from clawrl.config.method import PrecomputedMethod
from clawrl.engine import Engine
from clawrl.engine.threads import call_in_transient_thread
from clawrl.errors import ConfigError
from clawrl.harness.adapters.reference_agent import extract_command
from clawrl.harness.samples import rollout_samples
from clawrl.harness.tasks import Task
from clawrl.store import RolloutPurpose, Store
from clawrl.trainer.learner import Learner
from clawrl.trainer.types import TrainSample

if TYPE_CHECKING:
    from clawrl.engine.scripted import ScriptedEngine
    from clawrl.harness.loop import HarnessRunner

log = logging.getLogger(__name__)

MINI_SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
"""mini-swe-agent's submit command: the first line of a command's output ends its run."""

DEMO_FORMATS: dict[str, tuple[str, str]] = {
    "reference": ("```bash\n{command}\n```", "DONE"),
    "mini-swe-agent-text": ("```bash\n{command}\n```", f"```bash\n{MINI_SUBMIT}\n```"),
}
"""Per harness: how one command is written as a model reply (``{command}``), and the reply that
finishes the task — the formats the harness's own prompt asks for (the reference agent's
:data:`~clawrl.harness.adapters.reference_agent.SYSTEM`, mini-swe-agent-text's
:data:`~clawrl.harness.adapters.external.MINI_TEXT_CONFIG`)."""


@dataclass(frozen=True)
class Demonstration:
    """One successful rollout's commands, to be replayed.

    Attributes:
        task_id: the (training) task it solved.
        commands: the shell commands it ran, in order.
        source: the rollout it came from (a session id of the source store).
        harness: the harness it ran through.
    """

    task_id: str
    commands: tuple[str, ...]
    source: str
    harness: str


@dataclass
class WarmStartReport:
    """What a warm start used and did.

    Attributes:
        demonstrations: distinct demonstrations collected (task, commands).
        skipped: source rollouts not used, by reason (``not_passed``, ``not_in_this_run`` (a
            task the run does not train on), ``heldout_task``, ``no_command``,
            ``code_fence_in_command``, ``duplicate``, ``over_max_per_task``).
        replays: replay rollouts run per harness.
        replays_passed: replays the verifier passed again, per harness (only these train).
        samples: samples trained (one per replayed model turn).
        steps: optimizer steps taken.
        version: the policy version published (``None``: nothing to train).
        losses: each step's supervised loss: the mean negative log-likelihood of the trained
            tokens before the step (nats per token; ``-logprob/mean``).
        wall_s: seconds for the whole warm start.
    """

    demonstrations: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    replays: Counter[str] = field(default_factory=Counter)
    replays_passed: Counter[str] = field(default_factory=Counter)
    samples: int = 0
    steps: int = 0
    version: int | None = None
    losses: list[float] = field(default_factory=list)
    wall_s: float = 0.0

    def line(self) -> str:
        """One line for the console."""
        replays = ", ".join(
            f"{h} {self.replays_passed[h]}/{n} passed" for h, n in sorted(self.replays.items())
        )
        skipped = _counts(self.skipped)
        loss = (
            f"NLL {self.losses[0]:.3f} -> {self.losses[-1]:.3f} nats/token"
            if self.losses
            else "no step"
        )
        return (
            f"warm start: {self.demonstrations} demonstrations (source rollouts skipped: "
            f"{skipped}); replays: {replays or 'none'}; {self.samples} samples, "
            f"{self.steps} steps, {loss}; version {self.version}; {self.wall_s:.0f}s"
        )


def _counts(counter: Mapping[str, int]) -> str:
    """``not_passed 138, duplicate 10`` (``none`` when empty)."""
    return ", ".join(f"{k} {v}" for k, v in sorted(counter.items())) or "none"


def rollout_commands(store: Store, rollout_id: str) -> tuple[str, ...] | None:
    """The shell commands a rollout's model turns asked for, oldest first (side calls, failed
    calls and mini-swe-agent's submit command left out), parsed as the reference agent parses a
    reply (:func:`~clawrl.harness.adapters.reference_agent.extract_command`).

    Returns:
        The commands, or ``None`` when one holds a code fence (it cannot be replayed inside one).

    Raises:
        StoreError: the store cannot be read.
    """
    commands: list[str] = []
    for turn in store.session_turns(rollout_id):
        if turn.kind != "main" or turn.status != "ok" or not isinstance(turn.output, dict):
            continue
        message = {"content": turn.output.get("content") or "",
                   "tool_calls": turn.output.get("tool_calls") or []}  # fmt: skip
        command, _ = extract_command(message)
        if command is None or command.strip() == MINI_SUBMIT:
            continue
        if "```" in command:
            return None
        commands.append(command)
    return tuple(commands)


def collect_demonstrations(
    store: Store, tasks: Mapping[str, Task], *, max_per_task: int = 2
) -> tuple[list[Demonstration], Counter[str]]:
    """Distinct demonstrations from the passed rollouts (reward 1.0) in ``store`` of the tasks in
    ``tasks`` (pass the *training* tasks: a rollout of any other task is skipped), at most
    ``max_per_task`` per task, oldest first.

    Returns:
        ``(demonstrations, skipped)``: skipped source rollouts counted by reason.

    Raises:
        StoreError: the store cannot be read.
    """
    skipped: Counter[str] = Counter()
    seen: set[tuple[str, tuple[str, ...]]] = set()
    per_task: Counter[str] = Counter()
    demos: list[Demonstration] = []
    for result in store.rollout_results():
        if result.group.purpose == RolloutPurpose.WARM_START:
            continue  # a replay is not a source
        task = tasks.get(result.task_id)
        if task is None:
            skipped["not_in_this_run"] += 1
            continue
        if task.split == "heldout":
            skipped["heldout_task"] += 1
            continue
        if result.reward is None or result.reward < 1.0:
            skipped["not_passed"] += 1
            continue
        commands = rollout_commands(store, result.rollout.id)
        if commands is None:
            skipped["code_fence_in_command"] += 1
            continue
        if not commands:
            skipped["no_command"] += 1
            continue
        key = (result.task_id, commands)
        if key in seen:
            skipped["duplicate"] += 1
            continue
        if per_task[result.task_id] >= max_per_task:
            skipped["over_max_per_task"] += 1
            continue
        seen.add(key)
        per_task[result.task_id] += 1
        demos.append(Demonstration(result.task_id, commands, result.rollout.id, result.harness))
    return demos, skipped


def demo_replies(harness: str, commands: Sequence[str]) -> list[str]:
    """The scripted model replies that replay ``commands`` through ``harness``, finish last.

    Raises:
        ConfigError: the harness has no demonstration format (:data:`DEMO_FORMATS`).
    """
    if harness not in DEMO_FORMATS:
        raise ConfigError(
            f"harness {harness!r} has no warm-start reply format (supported: "
            f"{', '.join(sorted(DEMO_FORMATS))})"
        )
    command_format, finish = DEMO_FORMATS[harness]
    return [command_format.format(command=c) for c in commands] + [finish]


def replay_demonstrations(
    runner: HarnessRunner,
    engine: ScriptedEngine,
    demos: Sequence[Demonstration],
    tasks: Mapping[str, Task],
    report: WarmStartReport,
    *,
    on_replay: Callable[[int, int], None] | None = None,
) -> list[str]:
    """Replay each demonstration through each of ``runner``'s harnesses, one at a time.

    Args:
        runner: a :class:`clawrl.harness.loop.HarnessRunner` whose gateway app serves
            ``engine`` and records into the run's store (``parallel = 1``: the engine's replies
            are one replay's at a time).
        engine: a :class:`clawrl.engine.scripted.ScriptedEngine` on the policy's tokenizer; its
            replies are set per replay.
        demos: the demonstrations; each one's task must be in ``tasks`` (task id -> task).
        report: counts ``replays`` and ``replays_passed`` per harness.
        on_replay: called with (replays done, replays in all).

    Returns:
        The ids of the replay rollouts the verifier passed (reward 1.0).

    Raises:
        ConfigError: a harness has no demonstration format.
        StoreError: the store refused a group or a rollout.
    """
    for adapter in runner.adapters:
        demo_replies(adapter.name, ())  # fail before any replay
    passed: list[str] = []
    total = len(demos) * len(runner.adapters)
    done = 0
    for demo in demos:
        for adapter in runner.adapters:
            replies = demo_replies(adapter.name, demo.commands)
            engine.replies = list(replies)
            engine.default_reply = replies[-1]
            label = f"warm-start/{demo.task_id}/{adapter.name}"
            (rollout,) = runner.run(
                [(tasks[demo.task_id], adapter, label)], purpose=RolloutPurpose.WARM_START
            )
            report.replays[adapter.name] += 1
            if rollout.reward is not None and rollout.reward >= 1.0:
                report.replays_passed[adapter.name] += 1
                passed.append(rollout.id)
            else:
                log.info("warm start: replay of %s through %s did not pass (%s): %s",
                         demo.source, adapter.name, rollout.reward, rollout.reason)  # fmt: skip
            done += 1
            if on_replay is not None:
                on_replay(done, total)
    return passed


SFT_METHOD = PrecomputedMethod(
    loss=PPOClipLoss(ratio=OldRatio(), kl=KLPenalty(beta=0.0)),
)
"""The warm start's method: each sample's advantage is its ``reward`` (1.0), the ratio is
``π_θ / π_old`` with ``π_old`` the policy before the step (1 at the step), no KL: the gradient
of the token-mean negative log-likelihood of the completion tokens."""


def warm_start_samples(store: Store, rollout_ids: Sequence[str]) -> list[TrainSample]:
    """One sample per trained turn of each replay rollout, advantage (``reward``) 1.0, trained
    at temperature 1 (the supervised likelihood, whatever temperature the harness asked for)."""
    samples: list[TrainSample] = []
    for i, rid in enumerate(rollout_ids):
        built, _ = rollout_samples(store, rid, 1.0, i, {"warm_start": True})
        samples += [dataclasses.replace(s, temperature=1.0) for s in built]
    return samples


def warm_start(
    learner: Learner,
    engine: Engine,
    samples: Sequence[TrainSample],
    report: WarmStartReport,
    *,
    epochs: int,
    batch_size: int,
    seed: int = 0,
    on_step: Callable[[int, int, dict[str, float]], None] | None = None,
) -> int | None:
    """Supervised steps on ``samples`` (``epochs`` passes, shuffled, ``batch_size`` samples per
    optimizer step) with :data:`SFT_METHOD`, then publish one version to ``engine`` and wait
    until it serves.

    Args:
        learner: the run's learner (:class:`clawrl.trainer.learner.Learner`; its trainer's
            LoRA carries on into the RL steps after, its own method is restored, its optimizer
            and schedule reset); it checkpoints the version (meta ``warm_start``), writes the
            replayed turns' ``samples`` rows and publishes it to ``engine``.
        engine: the engine serving the policy.
        samples: from :func:`warm_start_samples`; each trained with advantage 1.
        report: records ``samples``, ``steps``, ``losses`` and ``version``.
        epochs: passes over ``samples``.
        batch_size: samples per optimizer step (the last of an epoch may hold fewer).
        seed: the shuffle's seed.
        on_step: called with (step, steps in all, the step's metrics).

    Returns:
        The published version, or ``None`` when there is no sample.

    Raises:
        ValueError: ``epochs`` or ``batch_size`` below 1.
        EngineError: the engine did not serve the published version.
    """
    from clawrl.harness.loop import wait_for_version

    if epochs < 1 or batch_size < 1:
        raise ValueError(f"epochs and batch_size must be >= 1, got {epochs} and {batch_size}")
    report.samples = len(samples)
    if not samples:
        return None
    rng = random.Random(seed)
    order = list(samples)
    batches: list[list[TrainSample]] = []
    for _ in range(epochs):
        rng.shuffle(order)
        batches += [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    trainer = learner.trainer
    start = trainer.policy_version
    for step, batch in enumerate(batches, 1):
        # every sample is on the version the trainer holds: no staleness drop
        batch = [dataclasses.replace(s, policy_version=trainer.policy_version) for s in batch]
        train = functools.partial(learner.train_only, batch, method=SFT_METHOD)
        metrics = call_in_transient_thread(train)  # clawrl.engine.threads
        report.steps += 1
        report.losses.append(-float(metrics.get("logprob/mean", float("nan"))))
        if on_step is not None:
            on_step(step, len(batches), metrics)
    trainer.reset_optimizer()  # RL starts with fresh Adam moments and its own warm-up
    turn_ids = list(dict.fromkeys(s.turn_id for s in samples if s.turn_id))
    # no metrics row: the harness steps' rows are numbered by harness step from 1 (W&B wants
    # them increasing); the warm start reports through on_step and its report
    commit = functools.partial(learner.commit, turn_ids, meta={"warm_start": True}, record=False)
    version = int(call_in_transient_thread(commit)["policy/version"])
    wait_for_version(engine, version)
    report.version = version
    log.info("warm start: %d samples, %d steps, published v%d (from v%d)", len(samples),
             report.steps, version, start)  # fmt: skip
    return version


def run_warm_start(
    source: Store,
    runner: HarnessRunner,
    scripted_engine: ScriptedEngine,
    learner: Learner,
    engine: Engine,
    tasks: Sequence[Task],
    *,
    epochs: int = 2,
    batch_size: int = 16,
    max_per_task: int = 2,
    seed: int = 0,
    on_replay: Callable[[int, int], None] | None = None,
    on_step: Callable[[int, int, dict[str, float]], None] | None = None,
) -> WarmStartReport:
    """The whole warm start: collect from ``source``, replay through ``runner``'s harnesses
    (served by ``scripted_engine``), train through ``learner`` and publish to ``engine``.

    Args:
        source: the store holding the source rollouts (may be the run's own store).
        runner: a :class:`~clawrl.harness.loop.HarnessRunner` on a gateway app over
            ``scripted_engine`` recording into the run's store.
        tasks: the training tasks; rollouts of other tasks are not used.

    Raises:
        ConfigError: no demonstration was found, none passed its replay, or a harness has no
            demonstration format.
        ValueError: ``epochs`` or ``batch_size`` below 1.
        EngineError: the engine did not serve the published version.
        StoreError: a store cannot be read or written.
    """
    t0 = time.perf_counter()
    report = WarmStartReport()
    by_id = {t.id: t for t in tasks}
    demos, report.skipped = collect_demonstrations(source, by_id, max_per_task=max_per_task)
    report.demonstrations = len(demos)
    if not demos:
        ours = sum(n for k, n in report.skipped.items() if k != "not_in_this_run")
        raise ConfigError(
            f"warm start: no demonstration in {source.target}: of its "
            f"{sum(report.skipped.values())} rollouts, {ours} are of this run's "
            f"{len(by_id)} tasks and none of those passed with a replayable command (skipped: "
            f"{_counts(report.skipped)}). The warm start needs the model's successes (reward 1) "
            "on this run's tasks: more rollouts per task (--k), more tasks, or rollouts of this "
            "run's tasks (--split/--match) in SRC"
        )
    passed = replay_demonstrations(runner, scripted_engine, demos, by_id, report,
                                   on_replay=on_replay)  # fmt: skip
    if not passed:
        raise ConfigError(
            f"warm start: none of {len(demos)} demonstrations passed its replay through "
            f"{', '.join(a.name for a in runner.adapters)} (see clawrl sessions list --store "
            f"{runner.store.target})"
        )
    samples = warm_start_samples(runner.store, passed)
    warm_start(learner, engine, samples, report, epochs=epochs, batch_size=batch_size,
               seed=seed, on_step=on_step)  # fmt: skip
    report.wall_s = time.perf_counter() - t0
    return report
