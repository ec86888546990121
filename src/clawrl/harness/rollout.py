"""One rollout: a fresh sandbox, the harness run against the gateway, then the verifier.

The rollout's id is its gateway session (``/s/{rollout_id}/...``), created in the store before
the harness starts (source ``harness``, metadata: task, harness, group, isolation), so every
call the harness makes is attributed to it exactly. The verifier runs after the harness has
exited, in the same work dir; the harness never sees it (bwrap hides the task suite). When the
rollout ends, however it ends, it is recorded in the store with its verifier result
(:meth:`clawrl.store.Store.record_rollout`: the ``rollouts`` and ``verifier_results`` tables).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from clawrl.errors import HarnessError, VerifierError
from clawrl.gateway.seeding import SESSION_SEED_KEY
from clawrl.harness.adapters import Adapter, RolloutContext
from clawrl.harness.sandbox import Isolation, RunResult, Sandbox
from clawrl.harness.tasks import Task
from clawrl.harness.verify import run_verifier
from clawrl.store import (
    RolloutRecord,
    RolloutStatus,
    SessionSource,
    Store,
    VerifierResultRecord,
)

__all__ = ["Rollout", "RolloutStatus", "kill_reason", "run_rollout"]


@dataclass
class Rollout:
    """One rollout as it ran (what :meth:`to_records` writes to the store).

    Attributes:
        id: rollout id = gateway session id.
        task_id / harness: what ran.
        group: the id of its rollout group (``rollout_groups`` row), its GRPO group.
        isolation: the sandbox kind actually used (``bwrap`` or ``fallback``).
        status: see :class:`RolloutStatus`.
        reward: the verifier's reward (None unless ``ok``); scores: its sub-scores.
        reason: the harness or verifier error, or the limit that killed the harness.
        harness_exit: the harness's exit status; timed_out: it hit the task's time limit.
        wall_s: seconds for harness + verifier.
        harness_tail: the last lines of the harness's stdout/stderr (for debugging).
        verified: the verifier ran (with a verdict, or with the error in ``reason``).
    """

    id: str
    task_id: str
    harness: str
    group: str
    isolation: str
    status: RolloutStatus = RolloutStatus.OK
    reward: float | None = None
    scores: dict[str, float] = field(default_factory=dict)
    reason: str | None = None
    harness_exit: int | None = None
    timed_out: bool = False
    wall_s: float = 0.0
    harness_tail: str = ""
    verified: bool = False

    def to_records(self) -> tuple[RolloutRecord, VerifierResultRecord | None]:
        """The store rows of this rollout: its ``rollouts`` row and, when the verifier ran,
        its ``verifier_results`` row (a reward, or the verifier's error)."""
        record = RolloutRecord(
            id=self.id, group_id=self.group, isolation=self.isolation, status=self.status,
            reason=self.reason, harness_exit=self.harness_exit, timed_out=self.timed_out,
            wall_s=self.wall_s, harness_tail=self.harness_tail,
        )  # fmt: skip
        if not self.verified:
            return record, None
        if self.status is RolloutStatus.VERIFIER_ERROR:
            return record, VerifierResultRecord(self.id, None, error=self.reason or "failed")
        return record, VerifierResultRecord(self.id, self.reward, scores=dict(self.scores))


def kill_reason(run: RunResult, time_limit_s: float) -> str | None:
    """Why the sandbox killed the harness (``None``: it was not killed), in words."""
    if run.killed_for == "disk":
        return "harness killed: disk limit"
    if run.timed_out or run.killed_for == "time":
        return f"harness killed: time limit ({time_limit_s:g} s)"
    return None


def run_rollout(
    task: Task,
    adapter: Adapter,
    *,
    store: Store,
    gateway: tuple[str, int],
    model: str,
    isolation: Isolation,
    group: str,
    options: dict[str, Any] | None = None,
    hidden: list[str] | None = None,
    sampling_seed: int | None = None,
) -> Rollout:
    """Run ``adapter`` on ``task`` once in a fresh sandbox, verify the result and record the
    rollout in ``store`` (durable when this returns).

    Args:
        group: the id of the rollout's group, recorded in ``store`` already.
        sampling_seed: recorded in the rollout's session metadata, where the gateway seeds
            each of its calls from it (:mod:`clawrl.gateway.seeding`); ``None``: unseeded.

    Never raises for a bad rollout: harness and verifier failures and time-outs are recorded
    with their status and reason.

    Raises:
        StoreError: the store refused the session or the rollout (e.g. an unknown group).
        Exception: anything unexpected from the sandbox is raised again once the rollout is
            recorded as a ``harness_error`` whose reason names it.
    """
    t0 = time.monotonic()
    rollout_id = uuid.uuid4().hex
    rollout = Rollout(rollout_id, task.id, adapter.name, group, str(isolation))
    store.get_or_create_session(
        rollout_id,
        SessionSource.HARNESS,
        client=f"harness:{adapter.name}",
        metadata={"task": task.id, "harness": adapter.name, "group": group,
                  "isolation": str(isolation),
                  **({} if sampling_seed is None else {SESSION_SEED_KEY: sampling_seed})},
    )  # fmt: skip
    try:
        _run_and_verify(rollout, task, adapter, gateway, model, isolation, options, hidden)
    except BaseException as exc:  # recorded below, then raised again
        rollout.status = RolloutStatus.HARNESS_ERROR
        rollout.reason = f"rollout aborted: {type(exc).__name__}: {exc}"
        raise
    finally:
        store.end_session(rollout_id)
        rollout.wall_s = time.monotonic() - t0
        store.record_rollout(*rollout.to_records())
    return rollout


def _run_and_verify(
    rollout: Rollout,
    task: Task,
    adapter: Adapter,
    gateway: tuple[str, int],
    model: str,
    isolation: Isolation,
    options: dict[str, Any] | None,
    hidden: list[str] | None,
) -> None:
    """The sandboxed harness run and the verifier, their outcome written on ``rollout``."""
    hidden = [str(task.path.resolve().parent), *(hidden or [])]
    box = Sandbox.create(isolation, files=task.files, gateway=gateway, hidden=hidden)
    try:
        ctx = RolloutContext(
            rollout.id, model, task.instruction, task.time_limit_s,
            {**task.options, **(options or {})},
        )  # fmt: skip
        try:
            launch = adapter.prepare(box, ctx)
        except (HarnessError, OSError) as e:
            rollout.status, rollout.reason = RolloutStatus.HARNESS_ERROR, str(e)
            return
        box.read_only.extend(launch.read_only)
        run = box.run(launch.argv, env=launch.env, limits=launch.limits)
        rollout.harness_exit, rollout.timed_out = run.returncode, run.timed_out
        rollout.reason = kill_reason(run, launch.limits.time_s)
        rollout.harness_tail = (run.stdout[-600:] + "\n" + run.stderr[-600:]).strip()
        rollout.verified = True
        try:
            verdict = run_verifier(task, box)
            rollout.reward, rollout.scores = verdict.reward, verdict.scores
        except VerifierError as e:
            rollout.status, rollout.reason = RolloutStatus.VERIFIER_ERROR, str(e)
    finally:
        box.close()
