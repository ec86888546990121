"""The online loop in one object: judge worker + online learner beside a serving engine.

``clawrl serve --method rl|opd|combine`` builds an :class:`OnlineService` and runs it as
asyncio tasks in the server's event loop (the gateway keeps serving; training steps run in a
worker thread; the engine swaps versions between requests). On a GPU box the same objects run
unchanged; only the engine's device differs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clawrl.config import TrainerConfig
from clawrl.engine import Engine
from clawrl.judge.worker import JudgeFn, JudgeWorker
from clawrl.store import Store
from clawrl.trainer.metrics import MetricsWriter
from clawrl.trainer.online import OnlineLearner
from clawrl.trainer.trainer import Trainer

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
    """

    def __init__(
        self,
        store: Store,
        engine: Engine,
        policy: Any,
        judge: JudgeFn,
        config: TrainerConfig,
        *,
        judge_timeout_s: float = 120.0,
    ) -> None:
        self.output_dir = Path(config.output_dir)
        self.engine = engine
        self.trainer = Trainer(
            policy.model, config, self.output_dir, policy_version=engine.policy_version
        )
        self.metrics = MetricsWriter(self.output_dir)
        self.learner = OnlineLearner(store, engine, policy.tokenizer, self.trainer, self.metrics)
        # the judge keeps its own deadline; the worker's is a guard for judges that do not
        self.worker = JudgeWorker(store, judge, timeout_s=judge_timeout_s + 30.0)
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

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
        """Start both workers as tasks of the running event loop."""
        self._stop.clear()
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
        self.metrics.close()

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
        return (
            f"step {int(m['step'])}: policy v{int(m['policy/version'])} | "
            f"loss {m.get('loss', 0.0):+.4f} | reward {m.get('reward/mean', 0.0):+.2f} | "
            f"hint rate {m.get('hint/rate', 0.0):.2f} | clip {m.get('clip/high_frac', 0.0):.3f}"
            f"/{m.get('clip/low_frac', 0.0):.3f} | kl {m.get('kl/ref', 0.0):.4f} | "
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
