"""Running a task's verifier on a finished work dir.

The verifier runs in the same sandbox kind as the harness did, after the harness has exited,
with the work dir as its cwd and the task folder readable at ``CLAWRL_TASK_DIR``. It must print
one JSON object whose ``reward`` is a number in [0, 1] (other numeric keys are sub-scores) as
the last non-empty line of its stdout. Anything else — a crash (non-zero exit), a timeout, no
JSON, a reward outside [0, 1] — raises :class:`VerifierError`: a verifier error is recorded as
such and is never a reward of 0.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from clawrl.errors import VerifierError
from clawrl.harness.sandbox import Limits, Sandbox
from clawrl.harness.tasks import Task

VERIFIER_LIMITS = Limits(time_s=60.0, cpu_s=60)


@dataclass(frozen=True)
class VerifierResult:
    """A valid verdict: ``reward`` in [0, 1] and optional numeric sub-scores."""

    reward: float
    scores: dict[str, float] = field(default_factory=dict)


def parse_verdict(stdout: str) -> VerifierResult:
    """Parse the verifier's stdout (its last non-empty line must be the JSON verdict).

    Raises:
        VerifierError: no line, invalid JSON, not an object, or no ``reward`` in [0, 1].
    """
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        raise VerifierError("verifier printed nothing")
    try:
        data = json.loads(lines[-1])
    except json.JSONDecodeError as e:
        raise VerifierError(f"verifier printed no valid JSON: {lines[-1][:200]!r}") from e
    if not isinstance(data, dict):
        raise VerifierError(f"verifier JSON is not an object: {lines[-1][:200]!r}")
    reward = data.get("reward")
    if isinstance(reward, bool) or not isinstance(reward, int | float):
        raise VerifierError(f"verifier JSON has no numeric 'reward': {lines[-1][:200]!r}")
    if not (math.isfinite(reward) and 0.0 <= reward <= 1.0):
        raise VerifierError(f"verifier reward {reward} is outside [0, 1]")
    scores = {
        k: float(v)
        for k, v in data.items()
        if k != "reward" and isinstance(v, int | float) and not isinstance(v, bool)
    }
    return VerifierResult(float(reward), scores)


def run_verifier(task: Task, sandbox: Sandbox, limits: Limits = VERIFIER_LIMITS) -> VerifierResult:
    """Run ``task``'s verifier in ``sandbox``'s work dir and parse its verdict.

    Raises:
        VerifierError: the verifier timed out, exited non-zero, or printed no valid verdict.
    """
    task_dir = sandbox.script_path(task.path)
    verify = f"{task_dir}/verify" if task_dir != str(task.path.resolve()) else str(task.verifier)
    result = sandbox.run([verify], env={"CLAWRL_TASK_DIR": task_dir}, limits=limits, gateway=False)
    if result.timed_out:
        raise VerifierError(f"verifier timed out after {limits.time_s:.0f}s")
    if result.returncode != 0:
        raise VerifierError(
            f"verifier exited with status {result.returncode}: {result.stderr.strip()[-300:]}"
        )
    return parse_verdict(result.stdout)
