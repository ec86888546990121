"""Serving each user with their own adapter (``clawrl serve --per-user-adapters``).

A user's adapter versions are recorded in the store (``user_adapters``,
:class:`clawrl.store.UserAdapterRecord`): by a trainer, or by hand with ``clawrl users adapter
USER DIR``. When a request's user (:mod:`clawrl.gateway.users`) has one, the request is served
with their newest version on top of the policy (``SamplingParams.adapter``; the engine holds
many adapters at once and batches different users together: :mod:`clawrl.engine.row_adapters`),
and the turn records that version (``TurnRecord.adapter_version``). Users without one get the
policy alone.

The store is read at most every ``refresh_s`` seconds (so every replica on one store picks up a
new version within that time) and an adapter is loaded into the engine on its user's first
request after it was published (only users who call are held; the engine drops the least
recently used past ``engine.max_adapters`` to its own spill folder and reads them back). A
version the engine refuses as invalid (``ValueError``: not a plain LoRA of this model, a version
that does not increase) is logged once and not tried again; other failures (a directory still
being written) are retried on a later request after ``refresh_s``. Meanwhile the user keeps the
version loaded before (or the policy alone), and the turn says which. A user whose versions left
the store (``clawrl users forget``) is unloaded from the engine at the next read.
"""

from __future__ import annotations

import asyncio
import logging
import time

from clawrl.engine import Engine
from clawrl.store import Store, UserAdapterRecord

log = logging.getLogger(__name__)


class UserAdapters:
    """Which adapter serves each user, loaded on demand (module docstring).

    Args:
        store: the store whose ``user_adapters`` table names the versions.
        engine: the serving engine (:meth:`clawrl.engine.Engine.load_adapter`).
        refresh_s: seconds a read of the table is reused.
        trained: this server's online learner trains the users' adapters
            (:mod:`clawrl.trainer.online`): turns sampled with one are recorded trainable.
    """

    def __init__(
        self, store: Store, engine: Engine, refresh_s: float = 2.0, *, trained: bool = False
    ) -> None:
        self.store = store
        self.engine = engine
        self.refresh_s = float(refresh_s)
        self.trained = trained
        self.loaded: dict[str, int] = {}  # user -> version the engine serves them
        self._latest: dict[str, UserAdapterRecord] = {}
        self._read_at = float("-inf")
        self._refused: set[tuple[str, int]] = set()
        self._retry_at: dict[tuple[str, int], float] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._names: dict[str, str] = {}  # user -> engine adapter name, after a forget
        self._forgotten = 0

    def refresh(self) -> None:
        """Read the table again on the next request (the demo, after a step it waited for)."""
        self._read_at = float("-inf")

    async def _newest(self) -> dict[str, UserAdapterRecord]:
        if time.monotonic() - self._read_at >= self.refresh_s:
            self._latest = await asyncio.to_thread(self.store.latest_user_adapters)
            self._read_at = time.monotonic()
            for user in [u for u in self.loaded if u not in self._latest]:
                await self._unload(user)  # forgotten (clawrl users forget)
        return self._latest

    async def _unload(self, user_id: str) -> None:
        """Drop a user whose versions left the store: the engine lets their adapter go."""
        if self.loaded.pop(user_id, None) is None:
            return  # another request's refresh did it
        self._refused = {k for k in self._refused if k[0] != user_id}
        self._retry_at = {k: v for k, v in self._retry_at.items() if k[0] != user_id}
        name = self._names.get(user_id, user_id)
        self._forgotten += 1  # the engine keeps a name's versions increasing: a new name
        # a control character: no user id can hold one (clawrl.store.users.user_id_problem)
        self._names[user_id] = f"{user_id}\x1fforgotten-{self._forgotten}"
        try:
            await asyncio.wrap_future(self.engine.unload_adapter(name))
        except Exception as e:  # keep serving
            log.error("the adapter of forgotten user %r was not unloaded: %s", user_id, e)
        else:
            log.info("user %r has no adapter version any more: unloaded", user_id)

    async def for_user(self, user_id: str) -> str | None:
        """The adapter name to serve ``user_id``'s request with (``None``: the policy alone),
        after loading their newest version into the engine if it is not there yet."""
        if not user_id:
            return None
        record = (await self._newest()).get(user_id)
        if record is not None and self.loaded.get(user_id, 0) < record.version:
            lock = self._locks.setdefault(user_id, asyncio.Lock())
            async with lock:
                if self.loaded.get(user_id, 0) < record.version:
                    await self._load(record)
        return self._names.get(user_id, user_id) if user_id in self.loaded else None

    async def _load(self, record: UserAdapterRecord) -> None:
        key = (record.user_id, record.version)
        if key in self._refused or time.monotonic() < self._retry_at.get(key, float("-inf")):
            return
        try:
            name = self._names.get(record.user_id, record.user_id)
            fut = self.engine.load_adapter(name, record.version, record.weights)
            await asyncio.wrap_future(fut)
        except Exception as e:  # keep serving: the version loaded before, or the policy alone
            invalid = isinstance(e, ValueError)
            first = key not in self._retry_at
            if invalid:
                self._refused.add(key)
            else:  # perhaps passing (files still being written): again after refresh_s
                self._retry_at[key] = time.monotonic() + self.refresh_s
            if invalid or first:
                before = self.loaded.get(record.user_id)
                log.error(
                    "adapter version %d of user %r (%s) was not loaded: %s; serving them %s%s",
                    record.version, record.user_id, record.weights, e,
                    f"their version {before}" if before else "the policy alone",
                    "" if invalid else " (tried again on a later request)",
                )  # fmt: skip
            return
        self.loaded[record.user_id] = record.version
        self._retry_at.pop(key, None)
        log.info("serving user %r with adapter version %d", record.user_id, record.version)
