"""One rollout: a fresh sandbox, the harness run against the gateway, then the verifier.

The rollout's id is its gateway session (``/s/{rollout_id}/...``), created in the store before
the harness starts (source ``harness``, metadata: task, harness, group, isolation), so every
call the harness makes is attributed to it exactly. The verifier runs after the harness has
exited, in the same work dir; the harness never sees it (bwrap hides the task suite).
"""

from __future__ import annotations

import enum
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

from clawrl.errors import HarnessError, VerifierError
from clawrl.harness.adapters import Adapter, RolloutContext
from clawrl.harness.sandbox import Isolation, Sandbox
from clawrl.harness.tasks import Task
from clawrl.harness.verify import run_verifier
from clawrl.store import SessionSource, Store


class RolloutStatus(enum.StrEnum):
    """How a rollout ended. Only ``ok`` rollouts have a reward; the others say why not."""

    OK = "ok"
    HARNESS_ERROR = "harness_error"  # the harness could not be prepared or started
    VERIFIER_ERROR = "verifier_error"  # the verifier crashed or printed no valid verdict


@dataclass
class Rollout:
    """The record of one rollout (one line of ``rollouts.jsonl``).

    Attributes:
        id: rollout id = gateway session id.
        task_id / harness: what ran.
        group: the GRPO group key (``task_id/harness/step``).
        isolation: the sandbox kind actually used (``bwrap`` or ``fallback``).
        status: see :class:`RolloutStatus`.
        reward: the verifier's reward (None unless ``ok``); scores: its sub-scores.
        error: the harness or verifier error message.
        harness_exit: the harness's exit status; timed_out: it hit the task's time limit.
        wall_s: seconds for harness + verifier.
        harness_tail: the last lines of the harness's stdout/stderr (for debugging).
    """

    id: str
    task_id: str
    harness: str
    group: str
    isolation: str
    status: RolloutStatus = RolloutStatus.OK
    reward: float | None = None
    scores: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    harness_exit: int | None = None
    timed_out: bool = False
    wall_s: float = 0.0
    harness_tail: str = ""

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {**asdict(self), "status": str(self.status)}


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
) -> Rollout:
    """Run ``adapter`` on ``task`` once in a fresh sandbox and verify the result.

    Never raises for a bad rollout: harness and verifier failures are recorded on it.
    """
    t0 = time.monotonic()
    rollout_id = uuid.uuid4().hex
    rollout = Rollout(rollout_id, task.id, adapter.name, group, str(isolation))
    store.get_or_create_session(
        rollout_id,
        SessionSource.HARNESS,
        client=f"harness:{adapter.name}",
        metadata={"task": task.id, "harness": adapter.name, "group": group,
                  "isolation": str(isolation)},
    )  # fmt: skip
    hidden = [str(task.path.resolve().parent), *(hidden or [])]
    box = Sandbox.create(isolation, files=task.files, gateway=gateway, hidden=hidden)
    try:
        ctx = RolloutContext(
            rollout_id, model, task.instruction, task.time_limit_s,
            {**task.options, **(options or {})},
        )  # fmt: skip
        try:
            launch = adapter.prepare(box, ctx)
        except (HarnessError, OSError) as e:
            rollout.status, rollout.error = RolloutStatus.HARNESS_ERROR, str(e)
            return rollout
        box.read_only.extend(launch.read_only)
        run = box.run(launch.argv, env=launch.env, limits=launch.limits)
        rollout.harness_exit, rollout.timed_out = run.returncode, run.timed_out
        rollout.harness_tail = (run.stdout[-600:] + "\n" + run.stderr[-600:]).strip()
        try:
            verdict = run_verifier(task, box)
            rollout.reward, rollout.scores = verdict.reward, verdict.scores
        except VerifierError as e:
            rollout.status, rollout.error = RolloutStatus.VERIFIER_ERROR, str(e)
        return rollout
    finally:
        box.close()
        store.end_session(rollout_id)
        rollout.wall_s = time.monotonic() - t0
