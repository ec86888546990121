"""The online loop in one object: judge worker + online learner beside a serving engine.

``clawrl serve --method rl|opd|combine`` builds an :class:`OnlineService` and runs it as
asyncio tasks in the server's event loop (the gateway keeps serving; training steps run in a
worker thread; the engine swaps versions between requests). On a GPU box the same objects run
unchanged; only the engine's device differs.

Two schedules decide when the learner steps:

- ``async`` (live serving, the default): the judge worker and the learner poll the store as
  tasks beside the gateway; a step is taken whenever ``batch_size`` samples are ready, so which
  samples share a step depends on timing.
- ``fixed`` (the demo): nothing runs in the background. The driver runs a set of sessions to
  their end, then calls :meth:`OnlineService.settle` with their ids: their turns are judged,
  decided, and the learner takes every full step it can (up to ``step_limit``) with its samples
  in a fixed order (:func:`clawrl.trainer.online.sample_key`). With seeded sampling (each
  request's ``seed``) the same seed gives the same steps, versions and scores on one machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from clawrl.config import TrainerConfig
from clawrl.engine import Engine
from clawrl.judge.worker import JudgeFn, JudgeWorker
from clawrl.store import Store
from clawrl.trainer.metrics import MetricsWriter
from clawrl.trainer.online import OnlineLearner
from clawrl.trainer.trainer import Trainer

if TYPE_CHECKING:
    from clawrl.memory import MemoryKeeper
    from clawrl.models import Policy

log = logging.getLogger(__name__)


@dataclass
class ServiceStatus:
    """A snapshot for the live display and ``/metrics``."""

    policy_version: int
    steps: int
    ready: int
    trained: int
    judged: int
    drops: dict[str, int]
    last_step_s: float


class OnlineService:
    """Runs the judge worker and the online learner until stopped.

    Args:
        store: the trajectory store shared with the gateway.
        engine: the serving engine.
        policy: the loaded policy (its base weights seed the trainer's copy; its tokenizer
            renders teacher prompts).
        judge: ``async (JudgeInput) -> Judgment``.
        config: the method, batching and optimisation settings; policies, checkpoints and
            metrics go to ``config.output_dir`` (a restart with the same directory resumes from
            the latest checkpoint).
        judge_timeout_s: most seconds one judgment may take.
        schedule: ``async`` or ``fixed`` (see the module docstring).
        metrics: the step metrics' sinks (default: JSONL and TensorBoard in ``output_dir``).
        memory: the preference memory to distil into the weights (``memory.distill``; the
            learner's ``memory``, :class:`clawrl.trainer.online.OnlineLearner`).
        per_user: train each user's own adapter instead of the shared policy
            (``server.per_user_adapters``; the learner's ``per_user``), at most ``max_users``
            of them in memory.
    """

    def __init__(
        self,
        store: Store,
        engine: Engine,
        policy: Policy,
        judge: JudgeFn,
        config: TrainerConfig,
        *,
        judge_timeout_s: float = 120.0,
        schedule: Literal["async", "fixed"] = "async",
        metrics: MetricsWriter | None = None,
        memory: MemoryKeeper | None = None,
        per_user: bool = False,
        max_users: int = 8,
    ) -> None:
        self.output_dir = Path(config.output_dir)
        self.engine = engine
        from clawrl.trainer.online import teacher_on_trainer

        self.trainer = Trainer(
            policy.model, config, self.output_dir, policy_version=engine.policy_version,
            computes_teacher=teacher_on_trainer(config.teacher_scoring, engine)
            or memory is not None,
        )  # fmt: skip
        self.metrics = metrics if metrics is not None else MetricsWriter(self.output_dir)
        self.learner = OnlineLearner(store, engine, policy.tokenizer, self.trainer, self.metrics,
                                     memory=memory, per_user=per_user,
                                     max_users=max_users)  # fmt: skip
        # the judge keeps its own deadline; the worker's is a guard for judges that do not
        self.worker = JudgeWorker(store, judge, timeout_s=judge_timeout_s + 30.0)
        self.schedule = schedule
        self.learner.fixed_order = schedule == "fixed"
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    def resume(self) -> int:
        """Restore the latest checkpoint (if any); returns the policy version served."""
        return self.learner.resume()

    @property
    def step_limit(self) -> int | None:
        """No step past this one is taken (``None``: no limit); the demo evaluates at fixed
        steps by raising it."""
        return self.learner.step_limit

    @step_limit.setter
    def step_limit(self, value: int | None) -> None:
        self.learner.step_limit = value

    def on_step(self, callback: Callable[[dict[str, float]], None] | None) -> None:
        """Call ``callback`` with each training step's metrics (``clawrl serve`` prints one
        line per step)."""
        self.learner.on_step = callback

    def serving_version(self, version: int) -> bool:
        """Whether the engine serves ``version`` (or newer) yet (swaps are asynchronous)."""
        return self.engine.policy_version >= version

    def start(self) -> None:
        """Start both workers as tasks of the running event loop (the ``fixed`` schedule starts
        none: :meth:`settle` does their work)."""
        self._stop.clear()
        self._loop = asyncio.get_running_loop()
        if self.schedule == "fixed":
            return
        self._tasks = [
            asyncio.create_task(self.worker.run(self._stop), name="clawrl-judge"),
            asyncio.create_task(self.learner.run(self._stop), name="clawrl-learner"),
        ]

    async def stop(self, grace_s: float = 5.0) -> None:
        """Stop both workers: ask them, wait up to ``grace_s`` seconds, then cancel them.

        Cancelling is safe at any point: a judgment not yet stored is redone on restart, and a
        training step whose checkpoint was not written is redone from the same samples (their
        ``samples`` rows are only written after the checkpoint).
        """
        self._stop.set()
        if self._tasks:
            _, pending = await asyncio.wait(self._tasks, timeout=grace_s)
            for t in pending:
                t.cancel()
            for t in self._tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await t
        self._tasks = []
        self._loop = None
        self.metrics.close()

    async def settle(self, sessions: Sequence[str]) -> int:
        """The fixed schedule's step: judge the unjudged turns of ``sessions`` (ended ones: a
        turn without a next state is recorded as such), decide every judged turn, then train
        while ``batch_size`` samples are ready and ``step_limit`` allows, each step's samples
        in :func:`clawrl.trainer.online.sample_key` order.

        Returns:
            The steps taken.

        Raises:
            RuntimeError: the service runs the ``async`` schedule (its tasks step on their own).
            ClawrlError: a step failed (reported, not retried: the driver decides).
        """
        if self.schedule != "fixed":
            raise RuntimeError("settle() drives the fixed schedule; this service runs 'async'")
        await self.worker.judge_sessions(sessions)
        await self.learner.collect()
        steps = 0
        while await self.learner.step_if_ready() is not None:
            steps += 1
        return steps

    def settle_from_thread(self, sessions: Sequence[str]) -> int:
        """:meth:`settle` on the server's event loop, called from another thread (the demo's
        driver); blocks until it is done (a step is never cut short: its checkpoint and rows
        are written or it failed).

        Raises:
            RuntimeError: the service is not running, or runs the ``async`` schedule.
            ClawrlError: as :meth:`settle`.
        """
        loop = self._loop
        if loop is None:
            raise RuntimeError("the service is not running: start the server first")
        return asyncio.run_coroutine_threadsafe(self.settle(list(sessions)), loop).result()

    @contextlib.asynccontextmanager
    async def lifespan(self, app: object) -> AsyncIterator[None]:
        """An ASGI lifespan: the loop runs while the server runs (``clawrl serve``)."""
        self.start()
        try:
            yield
        finally:
            await self.stop()

    def step_line(self, m: dict[str, float]) -> str:
        """One line per training step for the server's console."""
        drops = sum(self.learner.state.drops.values())
        distilled = ""
        if "distill/samples" in m:  # memory.distill: turns trained without their memory
            distilled = (f" | distilled {int(m['distill/samples'])} gap "
                         f"{m.get('distill/gap', 0.0):.3f}")  # fmt: skip
            if m.get("memory/retired"):
                distilled += f" retired {int(m['memory/retired'])}"
        user = self.learner.state.last_user
        version = (
            f"policy v{int(m['policy/version'])}" if user is None
            else f"user {user} adapter v{int(m['policy/version'])}"
        )  # fmt: skip
        return (
            f"step {int(m['step'])}: {version} | "
            f"loss {m.get('loss', 0.0):+.4f} | reward {m.get('reward/mean', 0.0):+.2f} | "
            f"hint rate {m.get('hint/rate', 0.0):.2f} | clip {m.get('clip/high_frac', 0.0):.3f}"
            f"/{m.get('clip/low_frac', 0.0):.3f} | kl {m.get('kl/ref', 0.0):.4f}{distilled} | "
            f"{m.get('time/step_total', 0.0):.1f} s | judged {self.worker.judged} | "
            f"dropped {drops}"
        )

    def status(self) -> ServiceStatus:
        """Counters for displays."""
        s = self.learner.state
        return ServiceStatus(
            policy_version=self.trainer.policy_version,
            steps=s.steps,
            ready=s.ready,
            trained=s.trained,
            judged=self.worker.judged,
            drops=dict(s.drops),
            last_step_s=s.last_step_s,
        )
