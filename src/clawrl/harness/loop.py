"""Harness-mode training and evaluation, top to bottom with plain calls.

One process holds the policy, the engine, the gateway (a live server on ``127.0.0.1`` and an
ephemeral port) and the store, all built by :func:`clawrl.runtime.build_runtime`. Each training
step:

1. picks ``tasks_per_step`` train tasks (round-robin) and runs ``group_size`` rollouts of each
   task with each harness (in parallel threads; the engine batches their calls);
2. keeps the groups with signal (:mod:`clawrl.harness.groups`), counting the others;
3. rebuilds each kept rollout's prefix tree and turns its trained turns into samples carrying the
   rollout's reward, group and episode (:mod:`clawrl.harness.samples`);
4. takes one optimizer step with the shared :class:`clawrl.trainer.Trainer` — its GRPO method
   computes the group-relative advantages over the rollouts — and publishes the new version to
   the engine (swapped in between requests, as the online loop does), waiting until it serves
   so the next step's rollouts are on-policy.

Rollouts go to ``OUT/rollouts.jsonl``, step metrics (with ``harness/NAME/*`` keys per harness)
to ``OUT/metrics.jsonl``, policy versions to ``OUT/policies/vN``.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from clawrl.engine import Engine
from clawrl.harness.adapters import Adapter, get_adapter
from clawrl.harness.groups import select_groups
from clawrl.harness.passk import mean_pass_at_k
from clawrl.harness.rollout import Rollout, RolloutStatus, run_rollout
from clawrl.harness.samples import step_samples
from clawrl.harness.sandbox import Isolation, choose_isolation
from clawrl.harness.tasks import BUILTIN_TASKS, Task

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
    """

    harnesses: list[str]
    group_size: int = 4
    parallel: int = 4
    isolation: str = "auto"
    options: dict[str, Any] = field(default_factory=dict)
    model_name: str = "policy"


class HarnessRunner:
    """Serves the gateway ``app`` on loopback and runs rollouts against it.

    Args:
        app: the gateway app (:attr:`clawrl.runtime.Runtime.app`), recording into ``store``.
        store: the store the app records into (rollouts' turns are read back from it).
        settings: see :class:`HarnessSettings`.
        out_dir: where ``rollouts.jsonl`` goes.
    """

    def __init__(self, app: Any, store: Any, settings: HarnessSettings, out_dir: Path) -> None:
        from clawrl.gateway.server import LiveServer

        self.store, self.settings = store, settings
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.adapters: list[Adapter] = [get_adapter(h) for h in settings.harnesses]
        self.isolation: Isolation = choose_isolation(settings.isolation)
        self.server = LiveServer(app).start()
        url = urlparse(self.server.url)
        self.gateway = (url.hostname or "127.0.0.1", int(url.port or 80))

    def close(self) -> None:
        """Stop the gateway server (the engine and store belong to the caller)."""
        self.server.stop()

    def run(self, jobs: Sequence[tuple[Task, Adapter, str]]) -> list[Rollout]:
        """Run ``(task, adapter, group_key)`` jobs in parallel; append each to rollouts.jsonl."""

        def one(job: tuple[Task, Adapter, str]) -> Rollout:
            task, adapter, group = job
            return run_rollout(
                task, adapter, store=self.store, gateway=self.gateway,
                model=self.settings.model_name, isolation=self.isolation, group=group,
                options=self.settings.options, hidden=[str(BUILTIN_TASKS)],
            )  # fmt: skip

        with ThreadPoolExecutor(max(1, self.settings.parallel)) as pool:
            rollouts = list(pool.map(one, jobs))
        with (self.out_dir / "rollouts.jsonl").open("a") as f:
            for r in rollouts:
                f.write(json.dumps(r.to_json()) + "\n")
        return rollouts


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


def wait_for_version(engine: Engine, version: int, timeout_s: float = 120.0) -> None:
    """Block until ``engine`` serves ``version`` (a published version is swapped in async)."""
    deadline = time.monotonic() + timeout_s
    while engine.policy_version < version and time.monotonic() < deadline:
        time.sleep(0.05)


def train(
    runner: HarnessRunner,
    trainer: Any,
    engine: Engine,
    tasks: Sequence[Task],
    *,
    steps: int,
    tasks_per_step: int,
    metrics_writer: Any = None,
) -> list[dict[str, float]]:
    """Run ``steps`` harness RL steps (see the module docstring); returns each step's metrics."""
    history: list[dict[str, float]] = []
    cursor = 0
    for step in range(steps):
        t0 = time.perf_counter()
        chosen = [tasks[(cursor + i) % len(tasks)] for i in range(min(tasks_per_step, len(tasks)))]
        cursor += len(chosen)
        jobs = [
            (task, adapter, f"{task.id}/{adapter.name}/{step}")
            for task in chosen
            for adapter in runner.adapters
            for _ in range(runner.settings.group_size)
        ]
        rollouts = runner.run(jobs)
        t_rollouts = time.perf_counter() - t0
        rewarded = [(r.id, r.group, r.reward) for r in rollouts if r.reward is not None]
        groups = {r.id: r.group for r in rollouts}
        built = step_samples(
            runner.store, {rid: rw for rid, _, rw in rewarded}, groups,
            {r.id: r.harness for r in rollouts},
        )  # fmt: skip
        # A group's statistics are those of the rollouts the trainer sees: a rollout without a
        # trainable turn leaves its group, as a verifier error does.
        with_samples = {str(s.meta["rollout"]) for s in built.samples}
        chosen_groups = select_groups([t for t in rewarded if t[0] in with_samples])
        built.samples = [s for s in built.samples if str(s.meta["rollout"]) in chosen_groups.kept]
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
        if built.samples:
            trained = trainer.train_step(built.samples)
            trained["trainer/step"] = trained.pop("step", 0.0)  # the row's "step" is the loop's
            metrics.update(trained)
            version = trainer.publish(engine)
            wait_for_version(engine, version)
            metrics["policy/version"] = float(version)
        else:
            metrics["step/skipped_no_signal"] = 1.0
            metrics["policy/version"] = float(getattr(trainer, "policy_version", 0))
        metrics["time/harness_step"] = time.perf_counter() - t0
        if metrics_writer is not None:
            metrics_writer.write(step + 1, metrics)
        log.info("harness step %d: %s", step + 1, metrics)
        history.append(metrics)
    return history


@dataclass
class EvalRow:
    """Pass@1 and Pass@k of one harness over the evaluated tasks."""

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


def evaluate(
    runner: HarnessRunner, tasks: Sequence[Task], *, k: int, pass_threshold: float = 1.0
) -> list[EvalRow]:
    """k rollouts per task and harness; unbiased Pass@1 / Pass@k (Chen et al. 2021).

    A rollout passes when its reward is at least ``pass_threshold``. Rollouts with a verifier or
    harness error are excluded from ``n`` (and counted); a task with no valid rollout is left
    out of the mean.
    """
    rows: list[EvalRow] = []
    for adapter in runner.adapters:
        t0 = time.perf_counter()
        jobs = [(t, adapter, f"eval/{t.id}/{adapter.name}") for t in tasks for _ in range(k)]
        rollouts = runner.run(jobs)
        counts = []
        for task in tasks:
            valid = [r for r in rollouts if r.task_id == task.id and r.reward is not None]
            if valid:
                counts.append((len(valid), sum((r.reward or 0.0) >= pass_threshold for r in valid)))
        rewards = [r.reward for r in rollouts if r.reward is not None]
        kk = min([k, *(n for n, _ in counts)]) if counts else k
        rows.append(
            EvalRow(
                harness=adapter.name,
                tasks=len(counts),
                rollouts=len(rollouts),
                verifier_errors=sum(r.status is RolloutStatus.VERIFIER_ERROR for r in rollouts),
                harness_errors=sum(r.status is RolloutStatus.HARNESS_ERROR for r in rollouts),
                pass_at_1=mean_pass_at_k(counts, 1) if counts else 0.0,
                pass_at_k=mean_pass_at_k(counts, kk) if counts else 0.0,
                k=kk,
                reward_mean=sum(rewards) / len(rewards) if rewards else 0.0,
                wall_s=time.perf_counter() - t0,
            )
        )
    return rows


def format_eval(rows: Sequence[EvalRow], version: int) -> str:
    """The eval table as printed by ``clawrl harness eval``."""
    head = f"{'harness':<16} {'version':>7} {'tasks':>5} {'rollouts':>8} {'errors':>6} "
    head += f"{'pass@1':>7} {'pass@k':>10} {'reward':>7} {'wall_s':>7}"
    lines = [head]
    for r in rows:
        lines.append(
            f"{r.harness:<16} {version:>7} {r.tasks:>5} {r.rollouts:>8} "
            f"{r.verifier_errors + r.harness_errors:>6} {r.pass_at_1:>7.3f} "
            f"{f'{r.pass_at_k:.3f} (k={r.k})':>10} {r.reward_mean:>7.3f} {r.wall_s:>7.1f}"
        )
    return "\n".join(lines)
