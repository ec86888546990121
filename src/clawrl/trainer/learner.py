"""The one learner: a training step end to end, for every way clawrl trains.

Four sources feed it samples and differ only in where the samples come from and in what they wait
for: the online loop in the gateway (:mod:`clawrl.trainer.online`: judged turns of live
traffic), ``clawrl train`` (:mod:`clawrl.trainer.process`: the same turns read from the store, on
one process or torchrun ranks), harness RL (:mod:`clawrl.harness.loop`: rollout groups with
verifier rewards) and the warm start (:mod:`clawrl.harness.warmstart`: replayed demonstrations).
Each calls :meth:`Learner.step` with a batch and the turn ids it holds; the learner then, in this
order:

1. takes the optimizer step (:meth:`clawrl.trainer.Trainer.train_step`);
2. numbers the new version: one past the newest in the store's ``policy_versions``, the one
   record of which versions exist (:meth:`Learner.next_version`, the only place a policy version
   is incremented); a store that does not end at the trainer's own version is refused (another
   trainer published there, or a crash left a version unrecorded and :meth:`Learner.resume` was
   not called);
3. saves the weights as ``OUTPUT_DIR/policies/vN``;
4. writes a checkpoint holding the step's turn ids (and what the source adds: the harness step);
5. writes the turns' ``samples`` rows (after the checkpoint: a crash before it redoes the step
   from the same turns, a crash after it re-records the rows from the checkpoint on
   :meth:`Learner.resume`; so every turn is trained exactly once);
6. records vN in ``policy_versions`` (every gateway replica loads it from there) and queues it on
   the engines it serves (requests in flight finish on the old version);
7. writes the step's metrics once.

Every step is checkpointed: ``trainer.checkpoint_every`` other than 1 is refused here, the one
place (a step not in a checkpoint would either lose its turns on a crash or train them twice).
A step whose writes (3-7) failed part-way in a live process (a locked store, an engine refusing
the version) is finished by :meth:`Learner.finish_pending` (the online loop calls it before it
evicts or chooses anything) or by a retry of :meth:`Learner.step` with the same turn ids: the
writes not done yet are done then, none twice, and no second optimizer step is taken; a step
with other turn ids is refused until then.

One user's adapter (``clawrl serve --per-user-adapters``, :mod:`clawrl.trainer.users`) is
trained by a learner built with ``user``: its versions are numbered and recorded in the store's
``user_adapters`` table (that user's rows) instead of ``policy_versions``, and no engine is told:
the gateway loads a user's newest version on their next request
(:mod:`clawrl.gateway.user_adapters`), on every replica alike.

With several ranks (FSDP2), every rank calls :meth:`step` (steps 1, 3 and 4 are collective) and
only the writer (rank 0) touches the store, the engines and the metrics.
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clawrl.config import TrainedMethod
from clawrl.engine import Engine
from clawrl.errors import ConfigError, TrainerError
from clawrl.store import PolicyVersionRecord, Store, UserAdapterRecord
from clawrl.trainer.metrics import MetricsWriter
from clawrl.trainer.samples import published, record_checkpoint_samples, trained_records
from clawrl.trainer.trainer import Trainer
from clawrl.trainer.types import TrainSample

log = logging.getLogger(__name__)


def _report_publish(version: int, fut: concurrent.futures.Future[int]) -> None:
    """Log a version the engine refused (e.g. no vLLM replica up): the trainer goes on, and
    the next step's version replaces it (the engine serves the last version it took)."""
    if fut.cancelled():
        return
    error = fut.exception()
    if error is not None:
        log.error("policy v%d was not published to the engine: %s (the next step's version "
                  "replaces it)", version, error)  # fmt: skip


@dataclass
class _Commit:
    """A step's commit (module docstring, 3-7) from its version on, and which of its writes
    are done: a commit that failed part-way is finished, not redone (:meth:`Learner.step`)."""

    version: int
    weights: Any
    turn_ids: list[str]
    meta: dict[str, Any]
    out: dict[str, float]
    metrics_step: int | None
    started: float | None
    record: bool
    checkpointed: bool = False
    samples_recorded: bool = False
    queued: set[int] = field(default_factory=set)
    version_recorded: bool = False


class Learner:
    """Owns a training step end to end (module docstring).

    Args:
        trainer: the trainable policy (:class:`Trainer`, or a
            :class:`clawrl.trainer.fsdp.ShardedTrainer` on each rank).
        store: the trajectory store (``None`` only on a rank that does not write).
        engines: engines to queue each new version on (none for ``clawrl train``: gateways load
            versions from ``policy_versions``).
        writer: whether this process writes the store, the metrics and publishes (rank 0).
        metrics: where each step's metrics go (``None``: the source writes none).
        guard: called before every store write (``clawrl train``: checks the trainer lease).
        on_publish: called with each version recorded (``clawrl train`` prints a line).
        check_store: whether :meth:`next_version` reads the store before each step's collective
            save (``False`` on torchrun ranks, where rank 0 raising there would leave the others
            waiting in the collective; the trainer lease keeps a second trainer off the store).
        user: the user whose own adapter ``trainer`` trains (module docstring); ``None``: the
            shared policy.

    Raises:
        ConfigError: ``trainer.config.checkpoint_every`` is not 1, or a writer has no store.
    """

    def __init__(
        self,
        trainer: Trainer,
        store: Store | None,
        *,
        engines: Sequence[Engine] = (),
        writer: bool = True,
        metrics: MetricsWriter | None = None,
        guard: Callable[[], None] | None = None,
        on_publish: Callable[[PolicyVersionRecord], None] | None = None,
        check_store: bool = True,
        user: str | None = None,
    ) -> None:
        if trainer.config.checkpoint_every != 1:
            raise ConfigError(
                f"trainer.checkpoint_every = {trainer.config.checkpoint_every}: clawrl "
                "checkpoints every training step (set it to 1): a step's turn ids are in its "
                "checkpoint before their samples rows are written, which is what makes a crash "
                "lose nothing and train nothing twice"
            )
        if writer and store is None:
            raise ConfigError("the learner that writes (rank 0) needs the store")
        self.trainer = trainer
        self.store = store
        self.engines = list(engines)
        self.writer = writer
        self.metrics = metrics
        self.guard = guard if guard is not None else (lambda: None)
        self.on_publish = on_publish
        self.check_store = check_store
        self.user = user
        self._pending: _Commit | None = None

    @property
    def policy_version(self) -> int:
        """The version the trainer's weights are (0 before the first step)."""
        return self.trainer.policy_version

    # ---------------------------------------------------------------- versions

    def stored_version(self) -> int:
        """The newest version in the store's ``policy_versions`` (0 before the first); for a
        user's learner, the newest of their ``user_adapters``."""
        assert self.store is not None
        if self.user is not None:
            mine = self.store.user_adapter_versions(self.user)
            return mine[-1].version if mine else 0
        latest = self.store.latest_policy_version()
        return latest.version if latest is not None else 0

    def next_version(self) -> int:
        """The number of the version the next step produces: one past the newest version in
        the store's ``policy_versions``. The only place a policy version is incremented.

        The writer reads the store; the other torchrun ranks (and a writer built with
        ``check_store=False``) count one past the trainer's version, which :meth:`resume`
        made equal to the store's on the writer.

        Raises:
            TrainerError: (writer) the store's newest version is not the trainer's: newer
                (another trainer published on this store) or older (a crash left the trainer's
                version unrecorded and :meth:`resume` was not called).
        """
        mine = self.trainer.policy_version
        if not (self.writer and self.check_store):
            return mine + 1
        stored = self.stored_version()
        if stored > mine:
            raise TrainerError(
                f"the store already holds policy v{stored} and this trainer is at v{mine}: "
                "another trainer published on this store (one trainer per store; resume with "
                "its output directory)"
            )
        if stored < mine:
            raise TrainerError(
                f"the trainer is at policy v{mine} but the store's newest version is "
                f"v{stored}: call Learner.resume() first, which records the missing version"
            )
        return stored + 1

    # ---------------------------------------------------------------- resume

    def resume(self) -> dict[str, Any] | None:
        """Restore the latest checkpoint; re-record the ``samples`` rows and republish the
        version a crash left out. One process; with several ranks call :meth:`restore`,
        :meth:`reconcile` (the writer) and :meth:`republish` (every rank, when it said so).

        Returns:
            The checkpoint's meta (``step``, ``policy_version``, ``turn_ids`` and what the
            source added), or ``None`` without one.

        Raises:
            ConfigError: no checkpoint here but the store holds versions another trainer
                published (they would collide with this trainer's).
            TrainerError: a checkpoint that does not fit the model.
        """
        meta = self.restore()
        behind = self.user is None and any(
            e.policy_version < self.trainer.policy_version for e in self.engines
        )
        if self.reconcile(meta) or (meta is not None and behind):
            self.republish()
        return meta

    def restore(self) -> dict[str, Any] | None:
        """Load the latest checkpoint into the trainer (collective); returns its meta."""
        return self.trainer.load_checkpoint()

    def reconcile(self, meta: dict[str, Any] | None) -> bool:
        """Writer: check the store against the restored checkpoint ``meta`` and re-record the
        ``samples`` rows of its step; returns whether its version must be published again
        (the crash came between the checkpoint and the store's record).

        Raises:
            ConfigError: no checkpoint but the store holds versions (see :meth:`resume`).
        """
        stored = self.stored_version()
        if meta is None:
            # a user's versions recorded by hand: the trainer starts from the newest one
            if stored > (0 if self.user is None else self.trainer.policy_version):
                raise ConfigError(
                    f"the store has policy versions up to v{stored}, published by another "
                    f"trainer, and {self.trainer.output_dir} has no checkpoint: resume with "
                    "that trainer's output directory (or use a new store)"
                )
            return False
        assert self.store is not None
        self.guard()
        record_checkpoint_samples(self.store, meta)
        return stored < self.trainer.policy_version

    def republish(self) -> None:
        """Save the restored version's weights again (collective) and, on the writer, record
        it (again: the store keeps one record of a version) and queue it on the engines;
        waits until they serve it."""
        version = self.trainer.policy_version
        weights = self.trainer.save_weights(version)
        if self.writer:
            self._publish(version, weights, wait=True)

    # ---------------------------------------------------------------- the step

    def step(
        self,
        samples: Sequence[TrainSample],
        turn_ids: Sequence[str],
        *,
        meta: Mapping[str, Any] | None = None,
        metrics: Mapping[str, float] | None = None,
        metrics_step: int | None = None,
        record: bool = True,
    ) -> dict[str, float]:
        """One step (module docstring, 1-7) on ``samples``, which train ``turn_ids``.

        Args:
            samples: the batch (:class:`TrainSample`, in the order the loss sums them).
            turn_ids: the turns the batch trains (their ``samples`` rows are written).
            meta: kept in the checkpoint beside the turn ids (e.g. ``{"harness_step": 3}``).
            metrics: the source's own metrics of this step, written with the trainer's.
            metrics_step: the index the metrics are written at (default: the trainer's step).
            record: write the metrics row now (``False``: the source adds its own numbers and
                writes the row with :meth:`record`, still once).

        Returns:
            The step's metrics (the trainer's, ``policy/version``, ``time/step_total`` and the
            source's).

        Raises:
            TrainerError: the step failed (nothing was written), or the store does not end at
                the trainer's version (:meth:`next_version`).
            StoreError: a write of the commit failed: the next call with the same ``turn_ids``
                (or :meth:`finish_pending`) finishes it instead of training them again; a call
                with other turn ids first is refused (TrainerError).
        """
        if self._pending is not None:
            if self._pending.turn_ids != list(turn_ids):
                raise TrainerError(
                    f"a step of {len(self._pending.turn_ids)} turns failed part-way and is not "
                    "finished: call finish_pending() first (its turns are trained; they must "
                    "not be in another batch)"
                )
            return self._finish()  # the retry of that step: it is done now
        t0 = time.perf_counter()
        trained = self.trainer.train_step(list(samples))
        return self.commit(turn_ids, meta=meta, metrics={**trained, **(metrics or {})},
                           metrics_step=metrics_step, started=t0, record=record)  # fmt: skip

    def commit(
        self,
        turn_ids: Sequence[str],
        *,
        meta: Mapping[str, Any] | None = None,
        metrics: Mapping[str, float] | None = None,
        metrics_step: int | None = None,
        started: float | None = None,
        record: bool = True,
    ) -> dict[str, float]:
        """Steps 2-7 of the module docstring for the weights the trainer holds now: number the
        version, save it, checkpoint (with ``turn_ids`` and ``meta``), write the ``samples``
        rows, record and publish it, write ``metrics``. :meth:`step` calls it after its
        optimizer step; the warm start after its :meth:`train_only` steps.

        Returns:
            ``metrics`` with ``policy/version`` (and ``time/step_total``, the seconds since
            ``started``, a ``time.perf_counter()`` value, when given).

        Raises:
            TrainerError: the store does not end at the trainer's version
                (:meth:`next_version`).
            StoreError: a write failed part-way (the next :meth:`step` finishes the commit).
        """
        version = self.next_version()
        weights = self.trainer.save_weights(version)
        self.trainer.policy_version = version
        self._pending = _Commit(
            version, weights, list(turn_ids), dict(meta or {}),
            {**(metrics or {}), "policy/version": float(version)},
            metrics_step, started, record,
        )  # fmt: skip
        return self._finish()

    @property
    def pending_turn_ids(self) -> list[str] | None:
        """The turn ids of a step whose writes failed part-way (``None``: none is pending)."""
        return None if self._pending is None else list(self._pending.turn_ids)

    def finish_pending(self) -> dict[str, float] | None:
        """Finish the step whose writes failed part-way (its metrics; ``None``: none was
        pending). A source that retries on its own (the online loop) calls this before it
        chooses another batch, since that step's turns are trained."""
        return None if self._pending is None else self._finish()

    def _finish(self) -> dict[str, float]:
        """The writes of the pending commit not done yet, in order (checkpoint, ``samples``
        rows, each engine, ``policy_versions``, metrics); each is marked done as it succeeds,
        so a commit that failed part-way is finished by the next call without redoing a write
        (:meth:`step`)."""
        c = self._pending
        assert c is not None
        if not c.checkpointed:
            self.trainer.save_checkpoint({"turn_ids": c.turn_ids, **c.meta})
            c.checkpointed = True
        if self.writer:
            assert self.store is not None
            if not c.samples_recorded:
                self.guard()
                self.store.record_samples(trained_records(c.turn_ids, self.trainer.step, c.version))
                c.samples_recorded = True
            for i, engine in enumerate(self.engines):
                if i not in c.queued:
                    self._queue(engine, c.version, c.weights)
                    c.queued.add(i)
            if not c.version_recorded:
                self._record_version(c.version, c.weights)
                c.version_recorded = True
            if c.started is not None and "time/step_total" not in c.out:
                c.out["time/step_total"] = time.perf_counter() - c.started
            if c.record:
                self.record(self.trainer.step if c.metrics_step is None else c.metrics_step, c.out)
                c.record = False
        self._pending = None
        return c.out

    def record(self, step: int, metrics: Mapping[str, float]) -> None:
        """Write one step's metrics row to the sinks (:class:`MetricsWriter`: JSONL,
        TensorBoard, W&B), on the writing rank; nothing without sinks. Every mode's rows go
        through here: the step's own (:meth:`commit`), or a source's step that trained nothing
        or added its numbers (harness RL)."""
        if self.writer and self.metrics is not None:
            self.metrics.write(step, metrics)

    def train_only(
        self, samples: Sequence[TrainSample], *, method: TrainedMethod | None = None
    ) -> dict[str, float]:
        """An optimizer step that publishes and records nothing: the warm start's inner steps
        (with its own ``method``; default the trainer's), whose weights the next
        :meth:`commit` publishes as one version."""
        return dict(self.trainer.train_step(list(samples), method=method))

    def _publish(self, version: int, weights: Any, *, wait: bool = False) -> None:
        """Queue ``version`` on the engines and record it in ``policy_versions``."""
        for engine in self.engines:
            self._queue(engine, version, weights, wait=wait)
        self._record_version(version, weights)

    def _queue(self, engine: Engine, version: int, weights: Any, *, wait: bool = False) -> None:
        """Queue ``version`` on ``engine`` (``wait``: until it serves it)."""
        fut = engine.load_policy(version, weights)
        if wait:
            fut.result(timeout=600)
        else:
            fut.add_done_callback(functools.partial(_report_publish, version))

    def _record_version(self, version: int, weights: Any) -> None:
        """Record ``version`` in ``policy_versions`` (every gateway replica loads it there)."""
        assert self.store is not None
        self.guard()
        if self.user is not None:
            self.store.publish_user_adapter(
                UserAdapterRecord(
                    self.user, version, str(Path(weights).resolve()), step=self.trainer.step
                )
            )
            return
        record = published(
            version, weights, self.trainer.step, full=self.trainer.config.full_finetune
        )
        self.store.publish_policy_version(record)
        if self.on_publish is not None:
            self.on_publish(record)
