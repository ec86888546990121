"""Serving the policy version the trainer published, on every gateway replica.

Several ``clawrl serve`` processes on one store (behind any HTTP load balancer) are one gateway.
One of them may train (``--method ...``; its engine gets each new version directly); the others
follow: :class:`VersionFollower` polls the store's ``policy_versions`` table
(:class:`clawrl.store.PolicyVersionRecord`) and queues a newer version's weights on this
replica's engine, which swaps them in between requests like a local training step would. The
store is the only channel (no RPC); the weights path must be readable here (one machine, or the
trainer's ``--output-dir`` on a shared filesystem).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from clawrl.engine import Engine
from clawrl.errors import ClawrlError
from clawrl.store import PolicyVersionRecord, Store

log = logging.getLogger(__name__)


class VersionFollower:
    """Loads the newest published policy version into ``engine`` (module docstring).

    Args:
        store: the shared store.
        engine: this replica's engine.
        interval_s: seconds between polls of the store.
    """

    def __init__(self, store: Store, engine: Engine, interval_s: float = 2.0) -> None:
        self.store = store
        self.engine = engine
        self.interval_s = interval_s
        self._queued = 0
        self._warned: set[int] = set()
        self.on_version: Callable[[int], None] | None = None  # called with each version loaded
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def check(self) -> int | None:
        """Load the newest published version if it is newer than the engine's; returns the
        version now served when one was loaded, else ``None``. A version whose weights this
        replica cannot read is logged once and skipped."""
        record: PolicyVersionRecord | None = await asyncio.to_thread(
            self.store.latest_policy_version
        )
        if record is None or record.version <= max(self.engine.policy_version, self._queued):
            return None
        if record.weights is None or not Path(record.weights).exists():
            if record.version not in self._warned:
                self._warned.add(record.version)
                log.warning(
                    "policy version %d was published with weights %s that this replica cannot "
                    "read (full fine-tuning keeps them in the trainer; LoRA needs its output "
                    "directory on a shared filesystem): still serving version %d",
                    record.version, record.weights, self.engine.policy_version,
                )  # fmt: skip
            return None
        self._queued = record.version
        await asyncio.wrap_future(self.engine.load_policy(record.version, Path(record.weights)))
        log.info("serving published policy version %d", record.version)
        if self.on_version is not None:
            self.on_version(record.version)
        return record.version

    async def run(self) -> None:
        """Poll until :meth:`stop`; store or engine errors are logged and retried."""
        while not self._stop.is_set():
            try:
                await self.check()
            except (ClawrlError, ValueError, OSError) as exc:
                log.error("following published policy versions: %s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.interval_s)

    def stop(self) -> None:
        """Ask :meth:`run` to end."""
        self._stop.set()

    @contextlib.asynccontextmanager
    async def lifespan(self, app: object) -> AsyncIterator[None]:
        """An ASGI lifespan: follow while the server runs (``clawrl serve`` without a method)."""
        self._stop.clear()
        await self.check_quietly()
        self._task = asyncio.create_task(self.run(), name="clawrl-version-follower")
        try:
            yield
        finally:
            self.stop()
            await self._task

    async def check_quietly(self) -> None:
        """:meth:`check`, with failures logged (a replica starts serving anyway)."""
        try:
            await self.check()
        except (ClawrlError, ValueError, OSError) as exc:
            log.error("loading the published policy version: %s", exc)
