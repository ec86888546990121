"""Harness-mode training and evaluation, top to bottom with plain calls.

One process holds the policy, the engine, the gateway (a live server on ``127.0.0.1`` and an
ephemeral port) and the store, all built by :func:`clawrl.runtime.build_runtime`. Each training
step:

1. picks ``tasks_per_step`` train tasks (round-robin) and runs ``group_size`` rollouts of each
   task with each harness (in parallel threads; the engine batches their calls);
2. keeps the groups with signal (:mod:`clawrl.harness.groups`), counting the others;
3. rebuilds each kept rollout's prefix tree and turns its trained turns into samples carrying the
   rollout's reward, group, episode and step (:mod:`clawrl.harness.samples`); with integrated
   PRM + outcome (method ``prm_outcome``) the judge first scores each turn's next state and the
   judgments are stored (:mod:`clawrl.harness.judging`), each sample carrying its turn's score;
4. takes one step with the one learner (:class:`clawrl.trainer.learner.Learner`, as every mode
   does): the trainer's GRPO method computes the group-relative advantages over the rollouts
   (``prm_outcome``: over the (group, step) cells of ``PRM + outcome``); the learner checkpoints
   (with the harness step and the task cursor), writes the trained turns' ``samples`` rows,
   records the version in ``policy_versions`` and publishes it to the engine (swapped in
   between requests, as the online loop does); the loop waits until it serves so the next
   step's rollouts are on-policy.

Resuming: :func:`train` with ``start`` (from :func:`resume_point` of the learner's restored
checkpoint) continues at the next step with the same task order, so a run killed at any point
and started again trains no group twice (a step whose checkpoint was not written is run again
from its rollouts' tasks; its earlier rollouts stay in the store, never trained).

Rollouts, their verifier results and their groups (with the decision of step 2) go to the store
(:mod:`clawrl.store.rollouts`; ``clawrl sessions`` shows them, ``clawrl export`` exports them),
step metrics (with ``harness/NAME/*`` keys per harness, and ``prm/*`` keys when judging) to
``OUT/metrics.jsonl``, policy versions to ``OUT/policies/vN``; judgments (``prm_outcome``) go to
the store's ``judgments`` table. Evaluation reads the rollouts it ran back from the store.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from clawrl.engine import Engine
from clawrl.engine.threads import call_in_transient_thread
from clawrl.errors import ConfigError, EngineError
from clawrl.harness.adapters import Adapter, get_adapter
from clawrl.harness.groups import GroupSelection, select_groups
from clawrl.harness.judging import StepJudge, prm_metrics
from clawrl.harness.passk import (
    TaskCount,
    describe_gain,
    family_pass_at_1,
    mean_pass_at_k,
    pass_at_1_ci,
    task_counts,
)
from clawrl.harness.rollout import Rollout, RolloutStatus, run_rollout
from clawrl.harness.samples import step_samples
from clawrl.harness.sandbox import Isolation, choose_isolation
from clawrl.harness.tasks import BUILTIN_TASKS, Task
from clawrl.judge.worker import JudgeFn
from clawrl.store import (
    GroupDecision,
    RolloutGroupRecord,
    RolloutPurpose,
    RolloutResult,
    Store,
    new_id,
)
from clawrl.trainer.learner import Learner
from clawrl.trainer.types import TrainSample

if TYPE_CHECKING:
    from fastapi import FastAPI

log = logging.getLogger(__name__)


@dataclass
class HarnessSettings:
    """What a harness run needs besides the tasks.

    Attributes:
        harnesses: adapter names; several make a mixed-harness run.
        group_size: G, rollouts per task and harness in a group (train) or per task (eval: k).
        parallel: rollouts in flight at once.
        isolation: ``auto`` | ``bwrap`` | ``fallback``.
        options: options for every adapter (overriding the tasks' ``[harness]`` tables).
        model_name: the model name served and sent.
        seed: the run's sampling seed (:func:`rollout_seed`); ``None``: unseeded.
    """

    harnesses: list[str]
    group_size: int = 4
    parallel: int = 4
    isolation: str = "auto"
    options: dict[str, Any] = field(default_factory=dict)
    model_name: str = "policy"
    seed: int | None = 0


def rollout_seed(
    seed: int | None, purpose: RolloutPurpose, step: int | None, label: str, member: int
) -> int | None:
    """The sampling seed of the ``member``-th rollout (0, 1, ... in job order) of the group
    ``label`` run for ``purpose`` at ``step``, in a run seeded ``seed`` (``None``: unseeded).
    The gateway seeds each of the rollout's calls from it (:mod:`clawrl.gateway.seeding`), so
    the same run samples the same answers; members of a group, groups and steps differ."""
    if seed is None:
        return None
    key = f"{seed}:{purpose}:{step}:{label}:{member}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "big") % 2**31


class HarnessRunner:
    """Serves the gateway ``app`` on loopback and runs rollouts against it.

    Args:
        app: the gateway app (:attr:`clawrl.runtime.Runtime.app`), recording into ``store``.
        store: the store the app records into (rollouts' turns are read back from it, and
            rollouts, their groups and verifier results are recorded in it).
        settings: see :class:`HarnessSettings`.

    Attributes:
        run_id: this run's id (``rollout_groups.run_id`` of every group it runs).
        on_rollout: called with (``None``, 0, rollouts in the batch) as :meth:`run` starts,
            then with (the rollout, rollouts ended, rollouts in the batch) as each ends, from
            the thread that ran it, one call at a time (the CLI prints progress with it).
    """

    def __init__(self, app: FastAPI, store: Store, settings: HarnessSettings) -> None:
        from clawrl.gateway.server import LiveServer

        self.store, self.settings = store, settings
        self.run_id = new_id()
        self.on_rollout: Callable[[Rollout | None, int, int], None] | None = None
        self._ended_lock = threading.Lock()
        self.adapters: list[Adapter] = [get_adapter(h) for h in settings.harnesses]
        self.isolation: Isolation = choose_isolation(settings.isolation)
        self.server = LiveServer(app).start()
        url = urlparse(self.server.url)
        self.gateway = (url.hostname or "127.0.0.1", int(url.port or 80))

    def close(self) -> None:
        """Stop the gateway server (the engine and store belong to the caller)."""
        self.server.stop()

    def record_groups(
        self,
        jobs: Sequence[tuple[Task, Adapter, str]],
        *,
        purpose: RolloutPurpose,
        step: int | None,
        policy_version: int,
    ) -> dict[str, str]:
        """Record one ``rollout_groups`` row per distinct label of ``jobs``; label -> group id."""
        sizes = Counter(label for *_, label in jobs)
        firsts = {label: (task, adapter) for task, adapter, label in reversed(jobs)}
        groups = [
            RolloutGroupRecord(
                id=new_id(),
                run_id=self.run_id,
                label=label,
                task_id=firsts[label][0].id,
                harness=firsts[label][1].name,
                purpose=purpose,
                step=step,
                policy_version=policy_version,
                size=n,
            )
            for label, n in sizes.items()
        ]
        self.store.record_rollout_groups(groups)
        return {g.label: g.id for g in groups}

    def run(
        self,
        jobs: Sequence[tuple[Task, Adapter, str]],
        *,
        purpose: RolloutPurpose = RolloutPurpose.TRAIN,
        step: int | None = None,
        policy_version: int = 0,
    ) -> list[Rollout]:
        """Run ``(task, adapter, group_label)`` jobs in parallel, jobs of one label forming one
        group; each rollout is recorded in the store as it ends (:func:`run_rollout`).

        Args:
            purpose / step / policy_version: recorded on the groups (see
                :class:`clawrl.store.RolloutGroupRecord`).

        Raises:
            StoreError: the store refused a group or a rollout.
        """
        group_ids = self.record_groups(
            jobs, purpose=purpose, step=step, policy_version=policy_version
        )

        members: Counter[str] = Counter()
        seeds: list[int | None] = []
        for *_, label in jobs:
            seeds.append(rollout_seed(self.settings.seed, purpose, step, label, members[label]))
            members[label] += 1

        ended = [0]
        if self.on_rollout is not None:
            self.on_rollout(None, 0, len(jobs))

        def one(job: tuple[Task, Adapter, str], seed: int | None) -> Rollout:
            task, adapter, label = job
            rollout = run_rollout(
                task, adapter, store=self.store, gateway=self.gateway,
                model=self.settings.model_name, isolation=self.isolation,
                group=group_ids[label], options=self.settings.options,
                hidden=[str(BUILTIN_TASKS)], sampling_seed=seed,
            )  # fmt: skip
            if self.on_rollout is not None:
                with self._ended_lock:
                    ended[0] += 1
                    try:
                        self.on_rollout(rollout, ended[0], len(jobs))
                    except Exception:  # progress is advisory: the rollout is recorded
                        log.exception("harness progress callback failed")
            return rollout

        with ThreadPoolExecutor(max(1, self.settings.parallel)) as pool:
            return list(pool.map(one, jobs, seeds))


def harness_metrics(rollouts: Sequence[Rollout]) -> dict[str, float]:
    """Per-harness ``harness/NAME/*`` metrics: rollouts, reward mean, errors by status, time."""
    out: dict[str, float] = {}
    for name in sorted({r.harness for r in rollouts}):
        rs = [r for r in rollouts if r.harness == name]
        rewards = [r.reward for r in rs if r.reward is not None]
        out[f"harness/{name}/rollouts"] = float(len(rs))
        out[f"harness/{name}/reward_mean"] = sum(rewards) / len(rewards) if rewards else 0.0
        for status, n in Counter(str(r.status) for r in rs).items():
            out[f"harness/{name}/status/{status}"] = float(n)
        out[f"harness/{name}/timed_out"] = float(sum(r.timed_out for r in rs))
        out[f"harness/{name}/wall_s_mean"] = sum(r.wall_s for r in rs) / len(rs)
    return out


def group_decisions(
    selection: GroupSelection, group_ids: Iterable[str]
) -> dict[str, tuple[GroupDecision, float | None]]:
    """Per group id of a step: the trainer's decision and the group's mean reward, for
    :meth:`clawrl.store.Store.decide_rollout_groups`. A group :func:`select_groups` never saw
    (no rollout with a reward and a trainable turn) is ``too_small`` without a mean."""
    out: dict[str, tuple[GroupDecision, float | None]] = {}
    for group_id in group_ids:
        decision = selection.decisions.get(group_id, GroupDecision.TOO_SMALL)
        out[group_id] = (decision, selection.group_means.get(group_id))
    return out


def sample_step_scores(samples: Iterable[TrainSample]) -> dict[str, dict[int, float]]:
    """Rollout id -> step index -> step score (0 for a step without one) of ``samples``, for
    :func:`clawrl.harness.groups.select_groups`."""
    out: dict[str, dict[int, float]] = {}
    for s in samples:
        out.setdefault(str(s.meta["rollout"]), {})[s.step_index] = s.step_score or 0.0
    return out


def wait_for_version(engine: Engine, version: int, timeout_s: float = 120.0) -> None:
    """Block until ``engine`` serves ``version`` (a published version is swapped in async).

    Raises:
        EngineError: it does not within ``timeout_s`` seconds (the swap failed: the engine's log
            says why): rollouts would otherwise run on the old weights under the new version.
    """
    deadline = time.monotonic() + timeout_s
    while engine.policy_version < version and time.monotonic() < deadline:
        time.sleep(0.05)
    if engine.policy_version < version:
        raise EngineError(
            f"the engine did not serve policy version {version} within {timeout_s:.0f}s (it "
            f"serves {engine.policy_version}): loading the weights failed or is stuck; the log "
            "above says why"
        )


@dataclass(frozen=True)
class ResumePoint:
    """Where a harness run goes on: ``step`` steps done, the next task at ``cursor``."""

    step: int = 0
    cursor: int = 0


PROGRESS_FILE = "harness_progress.json"
"""In the trainer's output directory: the last harness step that ended, trained or not
(``{"harness_step", "harness_cursor", "policy_version"}``), so that steps without signal, which
publish no version and so write no checkpoint, are not run again on a resume."""


def write_progress(out_dir: str | Path, point: ResumePoint, policy_version: int) -> None:
    """Record that the steps up to ``point`` ended, on ``policy_version`` (atomic: a crash
    leaves the previous record or this one)."""
    path = Path(out_dir) / PROGRESS_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"harness_step": point.step, "harness_cursor": point.cursor,
                               "policy_version": policy_version}))  # fmt: skip
    os.replace(tmp, path)


def read_progress(out_dir: str | Path) -> dict[str, int] | None:
    """The record :func:`write_progress` left in ``out_dir`` (``None``: none)."""
    path = Path(out_dir) / PROGRESS_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        return {k: int(data[k]) for k in ("harness_step", "harness_cursor", "policy_version")}
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(
            f"{path} is not a harness progress record ({type(e).__name__}: {e}): not a clawrl "
            "harness run, or a damaged one; start a new --out"
        ) from e


def resume_point(
    meta: dict[str, Any] | None,
    progress: dict[str, int] | None = None,
    policy_version: int = 0,
) -> ResumePoint:
    """The point after the checkpoint whose ``meta`` a learner restored (``None``: the start),
    or after the later steps that trained nothing: ``progress`` (:func:`read_progress`) when it
    is further on the same ``policy_version`` the learner restored. A checkpoint the warm start
    wrote (no ``harness_step``) is the start of the RL steps."""
    point = ResumePoint()
    if meta is not None and "harness_step" in meta:
        point = ResumePoint(int(meta["harness_step"]), int(meta["harness_cursor"]))
    if (
        progress is not None
        and progress["policy_version"] == policy_version
        and progress["harness_step"] > point.step
    ):
        point = ResumePoint(progress["harness_step"], progress["harness_cursor"])
    return point


def train(
    runner: HarnessRunner,
    learner: Learner,
    engine: Engine,
    tasks: Sequence[Task],
    *,
    steps: int,
    tasks_per_step: int,
    judge: JudgeFn | None = None,
    judge_timeout_s: float = 150.0,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
    start: ResumePoint = ResumePoint(),
) -> list[dict[str, float]]:
    """Run harness RL steps ``start.step + 1 .. steps`` (see the module docstring); returns each
    step's metrics.

    Args:
        learner: the one learner over the run's trainer (its method says whether turns are
            judged: ``needs.step_scores``), publishing to ``engine``; each step's metrics row
            (rollouts, groups, drops and the trainer's numbers) goes to its sinks.
        judge: ``async (JudgeInput) -> Judgment`` scoring each turn's next state; required by a
            method with step scores (``prm_outcome``), unused otherwise.
        judge_timeout_s: the most seconds one judgment may take.
        on_step: called with (step, its metrics) as each step ends (the CLI prints a line).
        start: where a resumed run goes on (:func:`resume_point`).

    Raises:
        ConfigError: the method needs step scores and no judge was given.
        EngineError: the engine did not serve a published version (:func:`wait_for_version`).
    """
    method = learner.trainer.method
    judged = bool(method.needs.step_scores)
    if judged and judge is None:
        raise ConfigError(f"method {method.kind!r} judges each turn: it needs a judge")
    step_judge = None
    if judged and judge is not None:
        step_judge = StepJudge(runner.store, judge, timeout_s=judge_timeout_s,
                               concurrency=runner.settings.parallel)  # fmt: skip
    try:
        return _train_steps(runner, learner, engine, tasks, steps=steps,
                            tasks_per_step=tasks_per_step,
                            step_judge=step_judge, on_step=on_step, start=start)  # fmt: skip
    finally:
        if step_judge is not None:
            step_judge.close()


def _train_steps(
    runner: HarnessRunner,
    learner: Learner,
    engine: Engine,
    tasks: Sequence[Task],
    *,
    steps: int,
    tasks_per_step: int,
    step_judge: StepJudge | None,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
    start: ResumePoint = ResumePoint(),
) -> list[dict[str, float]]:
    """The steps of :func:`train`; ``step_judge`` scores each step's turns (``prm_outcome``)."""
    judged = step_judge is not None
    history: list[dict[str, float]] = []
    cursor = start.cursor
    for step in range(start.step, steps):
        t0 = time.perf_counter()
        chosen = [tasks[(cursor + i) % len(tasks)] for i in range(min(tasks_per_step, len(tasks)))]
        cursor += len(chosen)
        jobs = [
            (task, adapter, f"{task.id}/{adapter.name}/{step + 1}")
            for task in chosen
            for adapter in runner.adapters
            for _ in range(runner.settings.group_size)
        ]
        rollouts = runner.run(
            jobs, purpose=RolloutPurpose.TRAIN, step=step + 1,
            policy_version=engine.policy_version,
        )  # fmt: skip
        t_rollouts = time.perf_counter() - t0
        rewarded = [(r.id, r.group, r.reward) for r in rollouts if r.reward is not None]
        groups = {r.id: r.group for r in rollouts}
        t_judge = time.perf_counter()
        if step_judge is not None:  # before the samples, which read the judgments
            step_judge.judge_rollouts(rid for rid, *_ in rewarded)
        t_judge = time.perf_counter() - t_judge
        built = step_samples(
            runner.store, {rid: rw for rid, _, rw in rewarded}, groups,
            {r.id: r.harness for r in rollouts}, step_scores=judged,
        )  # fmt: skip
        # A group's statistics are those of the rollouts the trainer sees: a rollout without a
        # trainable turn leaves its group, as a verifier error does.
        with_samples = {str(s.meta["rollout"]) for s in built.samples}
        chosen_groups = select_groups(
            [t for t in rewarded if t[0] in with_samples],
            step_scores=sample_step_scores(built.samples) if judged else None,
        )
        judged_samples = built.samples  # every trained turn of the step, for prm/* metrics
        built.samples = [s for s in built.samples if str(s.meta["rollout"]) in chosen_groups.kept]
        runner.store.decide_rollout_groups(group_decisions(chosen_groups, groups.values()))
        metrics: dict[str, float] = {
            **harness_metrics(rollouts),
            "group/count": float(len(chosen_groups.group_means)),
            "group/skipped_zero_variance": float(chosen_groups.skipped_zero_variance),
            "group/skipped_too_small": float(chosen_groups.skipped_too_small),
            "rollout/reward_mean": (
                sum(r for *_, r in rewarded) / len(rewarded) if rewarded else 0.0
            ),
            "drop/verifier_error": float(
                sum(r.status is RolloutStatus.VERIFIER_ERROR for r in rollouts)
            ),
            "drop/harness_error": float(
                sum(r.status is RolloutStatus.HARNESS_ERROR for r in rollouts)
            ),
            "drop/rollout_without_turns": float(built.rollouts_without_turns),
            "time/rollouts": t_rollouts,
        }
        for reason, n in built.untrained.items():
            metrics[f"drop/turn_{reason}"] = float(n)
        if judged:
            metrics.update(prm_metrics(runner.store, judged_samples))
            metrics["group/kept_by_step_scores"] = float(chosen_groups.kept_by_step_scores)
            metrics["time/judge"] = t_judge
        if built.samples:
            # in threads that end with the call: the main thread would keep an OpenMP team that
            # slows the engine's rollouts (clawrl.engine.threads)
            turn_ids = list(dict.fromkeys(s.turn_id for s in built.samples if s.turn_id))
            meta = {"harness_step": step + 1, "harness_cursor": cursor}
            trained = call_in_transient_thread(
                functools.partial(learner.step, built.samples, turn_ids, meta=meta, record=False)
            )
            trained["trainer/step"] = trained.pop("step", 0.0)  # the row's "step" is the loop's
            metrics.update(trained)
            wait_for_version(engine, learner.policy_version)
        else:
            metrics["step/skipped_no_signal"] = 1.0
            metrics["policy/version"] = float(learner.policy_version)
        metrics["time/harness_step"] = time.perf_counter() - t0
        if learner.writer:  # before the row: a step that ended is never run again
            write_progress(learner.trainer.output_dir, ResumePoint(step + 1, cursor),
                           learner.policy_version)  # fmt: skip
        learner.record(step + 1, metrics)  # the step's row, once (the learner's sinks)
        log.info("harness step %d: %s", step + 1, metrics)
        history.append(metrics)
        if on_step is not None:
            on_step(step + 1, metrics)
    return history


@dataclass
class EvalRow:
    """Pass@1 and Pass@k of one harness over the evaluated tasks.

    Attributes:
        pass_at_1_low / pass_at_1_high: the 95 % interval of Pass@1 (a bootstrap over
            families, tasks and rollouts: :func:`clawrl.harness.passk.pass_at_1_ci`); ``nan``
            without a task.
        families: task family -> its Pass@1 (:func:`clawrl.harness.passk.family_pass_at_1`).
        counts: per task, rollouts with a reward (n) and passes (c): what a paired comparison of
            two evaluations needs (:func:`clawrl.harness.passk.paired_gain`).
    """

    harness: str
    tasks: int
    rollouts: int
    verifier_errors: int
    harness_errors: int
    pass_at_1: float
    pass_at_k: float
    k: int
    reward_mean: float
    wall_s: float
    pass_at_1_low: float = math.nan
    pass_at_1_high: float = math.nan
    families: dict[str, float] = field(default_factory=dict)
    counts: list[TaskCount] = field(default_factory=list)


def evaluate(
    runner: HarnessRunner,
    tasks: Sequence[Task],
    *,
    k: int,
    pass_threshold: float = 1.0,
    policy_version: int = 0,
) -> list[EvalRow]:
    """k rollouts per task and harness; unbiased Pass@1 / Pass@k (Chen et al. 2021), computed
    from the rollouts as recorded in the store (:func:`eval_row`).

    Args:
        policy_version: the version the engine serves (recorded on the groups).
    """
    rows: list[EvalRow] = []
    for adapter in runner.adapters:
        t0 = time.perf_counter()
        jobs = [(t, adapter, f"eval/{t.id}/{adapter.name}") for t in tasks for _ in range(k)]
        ran = runner.run(jobs, purpose=RolloutPurpose.EVAL, policy_version=policy_version)
        recorded = runner.store.rollout_results(group_ids={r.group for r in ran})
        rows.append(
            eval_row(adapter.name, recorded, k=k, pass_threshold=pass_threshold,
                     wall_s=time.perf_counter() - t0)
        )  # fmt: skip
    return rows


def eval_row(
    harness: str,
    results: Sequence[RolloutResult],
    *,
    k: int,
    pass_threshold: float = 1.0,
    wall_s: float = 0.0,
) -> EvalRow:
    """Pass@1 and Pass@k of ``harness`` over recorded rollouts (of one evaluation).

    A rollout passes when its reward is at least ``pass_threshold``. Rollouts without a reward
    (a verifier or harness error) are left out of each task's ``n`` and counted; a task with no
    rewarded rollout is left out of the mean; ``k`` is lowered to the smallest ``n`` of a task.

    Args:
        results: the recorded rollouts (:meth:`clawrl.store.Store.rollout_results`); those of
            other harnesses are ignored.
        wall_s: seconds the evaluation took (reported as is).
    """
    mine = [r for r in results if r.harness == harness]
    per_task = task_counts(mine, harness=harness, pass_threshold=pass_threshold)
    counts = [(t.n, t.c) for t in per_task]
    rewards = [r.reward for r in mine if r.reward is not None]
    kk = min([k, *(n for n, _ in counts)]) if counts else k
    statuses = Counter(r.rollout.status for r in mine)
    _, low, high = pass_at_1_ci(per_task)
    return EvalRow(
        harness=harness,
        tasks=len(counts),
        rollouts=len(mine),
        verifier_errors=statuses[RolloutStatus.VERIFIER_ERROR],
        harness_errors=statuses[RolloutStatus.HARNESS_ERROR],
        pass_at_1=mean_pass_at_k(counts, 1) if counts else 0.0,
        pass_at_k=mean_pass_at_k(counts, kk) if counts else 0.0,
        k=kk,
        reward_mean=sum(rewards) / len(rewards) if rewards else 0.0,
        wall_s=wall_s,
        pass_at_1_low=low,
        pass_at_1_high=high,
        families={f: p for f, (p, _) in family_pass_at_1(per_task).items()},
        counts=per_task,
    )


def format_eval(runs: Sequence[tuple[int, Sequence[EvalRow]]]) -> str:
    """The eval table as printed by ``clawrl harness eval``: one line per (version, harness)
    with Pass@1 and its 95 % interval over tasks; then, with several versions, each later
    version's paired gain over the first (:func:`clawrl.harness.passk.paired_gain`); then
    Pass@1 per task family and version.

    Args:
        runs: ``(policy version, rows of that version's evaluation)``, in evaluation order.
    """
    head = f"{'harness':<16} {'version':>7} {'tasks':>5} {'rollouts':>8} {'errors':>6} "
    head += f"{'pass@1 [95% CI]':>22} {'pass@k':>12} {'reward':>7} {'wall_s':>7}"
    lines = [head]
    for version, rows in runs:
        for r in rows:
            ci = f"{r.pass_at_1:.3f} [{r.pass_at_1_low:.3f}, {r.pass_at_1_high:.3f}]"
            ci = ci if r.tasks else "n/a (no task scored)"
            lines.append(
                f"{r.harness:<16} {version:>7} {r.tasks:>5} {r.rollouts:>8} "
                f"{r.verifier_errors + r.harness_errors:>6} {ci:>22} "
                f"{f'{r.pass_at_k:.3f} (k={r.k})':>12} {r.reward_mean:>7.3f} {r.wall_s:>7.1f}"
            )
    if len(runs) > 1:
        first_version, first = runs[0]
        base = {r.harness: r for r in first}
        for version, rows in runs[1:]:
            for r in rows:
                if r.harness not in base:
                    continue
                lines.append(
                    f"gain v{version} - v{first_version} ({r.harness}, paired): "
                    + describe_gain(base[r.harness].counts, r.counts)
                )
    families = sorted({f for _, rows in runs for r in rows for f in r.families})
    if families:
        cols = [(v, r) for v, rows in runs for r in rows]
        lines.append("pass@1 per task family: " + "  ".join(f"{r.harness}@v{v}" for v, r in cols))
        for f in families:
            cells = "  ".join(
                f"{r.families[f]:>{len(r.harness) + len(str(v)) + 2}.2f}"
                if f in r.families else " " * (len(r.harness) + len(str(v)) + 2)
                for v, r in cols
            )  # fmt: skip
            lines.append(f"  {f:<21} {cells}")
    return "\n".join(lines)
