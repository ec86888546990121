"""Every rollout is recorded in the store as it ends: a time-out, a harness that cannot start,
a verifier without a verdict, each with its status and reason (the harness is the world's edge
here: a shell command stands in for it)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from clawrl.errors import HarnessError
from clawrl.harness.adapters import RolloutContext
from clawrl.harness.adapters.base import Launch
from clawrl.harness.rollout import RolloutStatus, run_rollout
from clawrl.harness.sandbox import Isolation, Limits, Sandbox
from clawrl.harness.tasks import BUILTIN_TASKS, load_task
from clawrl.store import RolloutGroupRecord, RolloutPurpose, Store


class Command:
    """A harness that runs ``argv`` under a ``time_s`` limit, or fails to prepare."""

    name = "command"

    def __init__(self, argv: list[str], time_s: float = 30.0, fail: str | None = None) -> None:
        self.argv, self.time_s, self.fail = argv, time_s, fail

    def missing(self) -> str | None:
        return None

    def prepare(self, sandbox: Sandbox, ctx: RolloutContext) -> Launch:
        if self.fail is not None:
            raise HarnessError(self.fail)
        return Launch(self.argv, limits=Limits(time_s=self.time_s))


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "s.db") as s:
        s.record_rollout_groups(
            [RolloutGroupRecord("g", "run", "create-file-0/command/1", "create-file-0",
                                "command", RolloutPurpose.TRAIN, 1, 0, 3)]
        )  # fmt: skip
        yield s


def _run(store: Store, adapter: Command, task_dir: Path = BUILTIN_TASKS / "create-file-0"):
    return run_rollout(
        load_task(task_dir), adapter, store=store, gateway=("127.0.0.1", 9), model="policy",
        isolation=Isolation.FALLBACK, group="g",
    )  # fmt: skip


def test_a_timed_out_harness_is_recorded_with_its_reason_and_still_verified(store) -> None:
    ran = _run(store, Command(["sleep", "30"], time_s=0.5))
    got = store.get_rollout(ran.id)
    assert got is not None and got.rollout.status is RolloutStatus.OK
    assert got.rollout.timed_out and got.rollout.reason == "harness killed: time limit (0.5 s)"
    assert got.reward == 0.0 and got.verifier is not None and got.verifier.reward == 0.0
    assert 0.5 <= got.rollout.wall_s < 20
    assert got.group.id == "g" and got.task_id == "create-file-0"
    session = store.get_session(ran.id)
    assert session is not None and session.ended_at is not None


def test_a_harness_that_cannot_start_is_recorded_without_a_verdict(store) -> None:
    ran = _run(store, Command([], fail="command is not installed"))
    got = store.get_rollout(ran.id)
    assert got is not None and got.rollout.status is RolloutStatus.HARNESS_ERROR
    assert got.rollout.reason == "command is not installed"
    assert got.verifier is None and got.reward is None and got.rollout.harness_exit is None


def test_a_verifier_without_a_verdict_is_recorded_with_its_error(store, tmp_path) -> None:
    task_dir = tmp_path / "broken"
    shutil.copytree(BUILTIN_TASKS / "create-file-0", task_dir)
    (task_dir / "verify").write_text("#!/bin/sh\necho 'no json here'\n")
    ran = _run(store, Command(["true"]), task_dir)
    got = store.get_rollout(ran.id)
    assert got is not None and got.rollout.status is RolloutStatus.VERIFIER_ERROR
    assert got.rollout.harness_exit == 0 and not got.rollout.timed_out
    assert got.verifier is not None and got.verifier.reward is None
    assert got.verifier.error == got.rollout.reason and got.reward is None
