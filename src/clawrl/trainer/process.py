"""``clawrl train``: the trainer as its own process (or N torchrun ranks), coordinating with the
gateway and the judge worker only through the store.

Rank 0 reads the store: every judged turn without a ``samples`` row is decided by the rules of
:mod:`clawrl.trainer.samples` (drops are written at once); when ``batch_size`` samples are
ready it broadcasts a :class:`StepOrder` (the samples and, for hinted turns, the hint-enhanced
prompt ids) and every rank takes the step together:

1. the OPD teacher's log-probs of each hinted turn, computed here with the trainer's own
   weights (:meth:`clawrl.trainer.Trainer.teacher_logprobs`: the current policy, or the base
   weights with ``teacher = "base"``, at the turn's sampling temperature) — the in-process learner
   asks its serving engine instead;
2. :meth:`~clawrl.trainer.Trainer.train_step` (FSDP2 over the ranks: :mod:`clawrl.trainer.fsdp`);
3. the weights saved as policy version v+1 under ``OUTPUT_DIR/policies/vN`` (rank 0 writes);
4. a checkpoint whose meta holds the step's turn ids;
5. rank 0 writes the ``samples`` rows, then records v+1 in the store's ``policy_versions``
   table, from which every gateway loads it (:class:`clawrl.gateway.versions.VersionFollower`).

Rank 0 first takes the store's trainer lease (:mod:`clawrl.store.leases`) and renews it while
it runs, checking it before each write, so a second trainer on the same store waits instead of
training beside it (a lease whose holder was killed on this host is taken over at once; one on
another host lapses after :data:`LEASE_TTL_S`).

So a ``kill -9`` of any rank at any point loses nothing and trains nothing twice: a step whose
checkpoint was not committed never happened: its turns have no rows and are taken again; a
committed one is kept, and :meth:`TrainerProcess.resume` writes the rows and publishes the
version a crash left out. Rank 0 sends the other ranks an order every poll interval (``None``:
nothing to do yet), so they never wait long in a collective; a ``stop`` order ends every rank.
Rank 0 prints one line per step and one per published version.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from clawrl.config import SampleNeeds, TrainerConfig
from clawrl.errors import ClawrlError, ConfigError, TrainerError
from clawrl.store import (
    DropReason,
    PolicyVersionRecord,
    SampleRecord,
    Store,
    WeightsKind,
)
from clawrl.store.leases import TRAINER_LEASE, Lease, holder_is_dead_here, lease_holder
from clawrl.trainer.distributed import DistEnv, broadcast_object
from clawrl.trainer.fsdp import ShardedTrainer
from clawrl.trainer.learner import Learner
from clawrl.trainer.metrics import MetricsWriter
from clawrl.trainer.samples import (
    Distillation,
    decide,
    distillation,
    drop_record,
    make_sample,
    record_gaps,
    scored,
    stale_ids,
    teacher_prompt_ids,
    with_distillation,
    with_teacher,
)
from clawrl.trainer.types import TrainSample

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from clawrl.memory import MemoryKeeper

log = logging.getLogger(__name__)

STOP = "stop"
"""The order that ends every rank."""


LEASE_TTL_S = 60.0
"""Seconds the trainer lease lasts unless renewed (renewed every quarter of it)."""


class TrainerLease:
    """Rank 0's hold on the store's trainer lease (module docstring).

    Args:
        store: the trajectory store.
        ttl_s: how long the lease lasts unless renewed.
        out: where the one "waiting for the lease" line goes.
        poll_s: seconds between tries while another trainer holds it.
    """

    def __init__(
        self,
        store: Store,
        *,
        ttl_s: float = LEASE_TTL_S,
        out: Callable[[str], None] = print,
        poll_s: float = 1.0,
    ) -> None:
        self.store = store
        self.ttl_s = ttl_s
        self.out = out
        self.poll_s = poll_s
        self.holder = lease_holder()
        """This trainer's name in the lease (host:pid:nonce)."""
        self.lost: Lease | None = None
        """Set by the renewing thread when another holder has the lease."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def take(self, should_stop: Callable[[], bool] = lambda: False) -> None:
        """Block until the lease is this trainer's, then renew it in a thread.

        Args:
            should_stop: polled while waiting; True gives up (a signal asked to stop).

        Raises:
            StoreError: the store cannot be reached.
            TrainerError: ``should_stop`` said to stop before the lease was had.
        """
        said = False
        while True:
            if should_stop():
                raise TrainerError("stopped while waiting for the store's trainer lease")
            other = self.store.acquire_lease(TRAINER_LEASE, self.holder, self.ttl_s)
            if other is None:
                break
            if holder_is_dead_here(other.holder):
                log.warning("taking over the trainer lease of %s (dead)", other.holder)
                self.store.acquire_lease(TRAINER_LEASE, self.holder, self.ttl_s, force=True)
                continue
            if not said:
                until = time.strftime("%H:%M:%S", time.localtime(other.expires_at))
                self.out(f"clawrl train: another trainer ({other.holder}) holds this store's "
                         f"trainer lease (until {until} unless renewed): waiting")  # fmt: skip
                said = True
            time.sleep(self.poll_s)
        self._thread = threading.Thread(target=self._renew, name="trainer-lease", daemon=True)
        self._thread.start()

    def _renew(self) -> None:
        while not self._stop.wait(self.ttl_s / 4):
            try:
                other = self.store.acquire_lease(TRAINER_LEASE, self.holder, self.ttl_s)
            except ClawrlError as e:  # the store is away: try again, check() decides at writes
                log.warning("renewing the trainer lease: %s", e)
                continue
            if other is not None:
                self.lost = other
                return

    def check(self) -> None:
        """Renew the lease now; call before each write to the store (fencing).

        Raises:
            TrainerError: another trainer has the lease (this one must stop).
        """
        other = self.lost or self.store.acquire_lease(TRAINER_LEASE, self.holder, self.ttl_s)
        if other is not None:
            self.lost = other
            raise TrainerError(
                f"this trainer lost the store's trainer lease to {other.holder}: another "
                "trainer runs on this store; stopping without writing"
            )

    def release(self) -> None:
        """Stop renewing and give the lease up (the next trainer starts at once)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        if self.lost is None:
            with contextlib.suppress(ClawrlError):
                self.store.release_lease(TRAINER_LEASE, self.holder)


@dataclass
class StepOrder:
    """One training step, decided by rank 0 and broadcast to every rank.

    Attributes:
        turn_ids: the step's turns, in batch order.
        samples: their :class:`TrainSample` (teacher log-probs not yet computed).
        teacher_prompts: per sample, the hint-enhanced prompt ids whose teacher log-probs the
            ranks compute (``None``: no hint, or a method without OPD).
        distill: per sample, its :class:`~clawrl.trainer.samples.Distillation` when it is
            trained without the memory block it was sampled with (``memory.distill``; the
            ranks compute its teacher and student log-probs); empty: none is.
    """

    turn_ids: list[str]
    samples: list[TrainSample]
    teacher_prompts: list[list[int] | None]
    distill: list[Distillation | None] = field(default_factory=list)


def step_line(m: dict[str, float], ranks: int, dropped: int) -> str:
    """One console line per training step."""
    return (
        f"{time.strftime('%H:%M:%S')} step {int(m['step'])}: {int(m['samples/trained'])} samples "
        f"{int(m.get('tokens/count', 0))} tokens | loss {m.get('loss', 0.0):+.4f} | "
        f"reward {m.get('reward/mean', 0.0):+.2f} | hint rate {m.get('hint/rate', 0.0):.2f} | "
        f"grad norm {m.get('grad/norm', 0.0):.3f} | {m.get('time/step_total', 0.0):.2f} s "
        f"on {ranks} rank{'s' if ranks > 1 else ''} | dropped {dropped}"
        + (f" | distilled {int(m['distill/samples'])} gap {m.get('distill/gap', 0.0):.3f} "
           f"retired {int(m.get('memory/retired', 0))}" if "distill/samples" in m else "")
    )  # fmt: skip


class TrainerProcess:
    """The loop of ``clawrl train`` on one rank (module docstring).

    Args:
        trainer: this rank's part of the sharded trainer (built the same on every rank).
        env: this rank's place in the process group.
        config: the training settings (method, batch size, staleness, poll interval).
        store: the trajectory store (rank 0 only; ``None`` on the others).
        tokenizer: the policy's tokenizer (renders the hint-enhanced teacher prompts; rank 0).
        max_context: the policy's context window: a hinted prompt plus the turn's completion
            longer than this cannot be scored (``drop/teacher_failed``, unless the turn's reward
            alone trains it).
        metrics: where step metrics go (rank 0).
        out: where the console lines go (rank 0).
        memory: with ``memory.distill``, the preference memory whose turns are distilled
            (rank 0; as the in-process learner does, :class:`clawrl.trainer.online.
            OnlineLearner`): a turn sampled with a memory block is trained without it, the
            policy with the block (plus the turn's hint) its teacher, and each step's gaps may
            retire entries (:meth:`clawrl.memory.MemoryKeeper.record_distillation`; gateways
            read retirements from the store).

    :meth:`close` closes the store and the metrics writer it was given.

    Raises:
        ConfigError: ``checkpoint_every`` is not 1 (a step's turn ids must be in a checkpoint
            before their ``samples`` rows are written), rank 0 has no store, or ``memory``
            with a method that has no teacher.
    """

    def __init__(
        self,
        trainer: ShardedTrainer,
        env: DistEnv,
        config: TrainerConfig,
        *,
        store: Store | None = None,
        tokenizer: PreTrainedTokenizerBase | None = None,
        max_context: int = 2048,
        metrics: MetricsWriter | None = None,
        out: Callable[[str], None] = print,
        memory: MemoryKeeper | None = None,
    ) -> None:
        if env.is_main and (store is None or tokenizer is None):
            raise ConfigError("rank 0 of clawrl train needs the store and the tokenizer")
        if memory is not None and not trainer.method.needs.uses_hint:
            raise ConfigError(f"memory.distill needs a method with a teacher (opd or combine), "
                              f"not {trainer.method.kind!r}")  # fmt: skip
        self.trainer = trainer
        self.env = env
        self.config = config
        self.needs: SampleNeeds = trainer.method.needs
        self.store = store
        self.tokenizer = tokenizer
        self.max_context = max_context
        self.metrics = metrics
        self.out = out
        self.drops: dict[str, int] = {}
        self.stop_requested = False
        """Set by a signal handler; rank 0 then sends every rank the ``stop`` order."""
        self.step_limit: int | None = None
        """When set, rank 0 stops every rank after this step (tests, benchmarks)."""
        self.memory = memory
        """The memory distilled into the weights (rank 0; ``None``: turns train as sampled)."""
        self._ready: dict[str, tuple[TrainSample, list[int] | None, Distillation | None]] = {}
        self.lease = TrainerLease(store, out=out) if env.is_main and store is not None else None
        """Rank 0's hold on the store's trainer lease (taken by :meth:`resume`)."""
        self.learner = Learner(
            trainer,
            store,
            writer=env.is_main,
            metrics=metrics,
            guard=self.lease.check if self.lease is not None else None,
            on_publish=self._published_line,
            check_store=env.world_size == 1,
        )
        """The one learner (:mod:`clawrl.trainer.learner`): every rank steps through it; rank 0
        writes the samples rows, records the version and the metrics."""

    # ---------------------------------------------------------------- resume

    def resume(self) -> int:
        """Restore the latest checkpoint on every rank; rank 0 re-records the ``samples`` rows
        of its step and publishes its version when a crash left either out. Collective.

        Returns:
            The policy version the trainer's weights are (0 without a checkpoint).

        Raises:
            ConfigError: no checkpoint here but the store has versions another trainer
                published (they would collide with this trainer's).
            TrainerError: a checkpoint that does not fit (see ``load_checkpoint``).
        """
        if self.lease is not None:
            # the other ranks wait in load_checkpoint's collectives meanwhile
            self.lease.take(lambda: self.stop_requested)
        meta = self.learner.restore()
        problem, publish = None, False
        if self.env.is_main:
            try:
                publish = self.learner.reconcile(meta)
            except ConfigError as e:
                problem = str(e)
        problem, publish = broadcast_object((problem, publish), self.env)
        if problem is not None:
            raise ConfigError(problem)
        if publish:
            self.learner.republish()
        return self.trainer.policy_version

    # ---------------------------------------------------------------- rank 0: deciding

    def collect(self) -> int:
        """Rank 0: decide every judged, undecided turn; returns how many samples are ready."""
        assert self.store is not None
        drops: list[SampleRecord] = []
        for turn_id in self.store.judged_untrained_turns(1000):
            if turn_id in self._ready:
                continue
            turn, j = self.store.get_turn(turn_id), self.store.get_judgment(turn_id)
            if turn is None or j is None:
                continue
            lag = self.trainer.policy_version - turn.policy_version
            distilled = self.memory is not None and bool(turn.memory)
            reason = decide(turn, j, self.needs, lag=lag, max_staleness=self.config.max_staleness,
                            distilled=distilled)  # fmt: skip
            distill = None
            if reason is None and distilled:
                assert self.tokenizer is not None, "the rank that reads the store has it"
                distill = distillation(self.tokenizer, turn, j.hint or None,
                                       self.needs.hint_placement,
                                       max_context=self.max_context)  # fmt: skip
            if reason is None and distilled and distill is None:  # the block cannot be cut out
                reason = decide(turn, j, self.needs, lag=lag,
                                max_staleness=self.config.max_staleness)  # fmt: skip
            if reason is not None:
                drops.append(drop_record(turn_id, reason, self.drops))
                continue
            prompt = None
            # a distilled turn's teacher and student are scored by the ranks at step time
            if distill is None and j.hint and self.needs.uses_hint:
                assert self.tokenizer is not None, "the rank that reads the store has it"
                hinted = teacher_prompt_ids(self.tokenizer, turn, j.hint, self.needs.hint_placement)
                if len(hinted) + len(turn.completion_ids) <= self.max_context:
                    prompt = hinted
                elif not (self.needs.uses_reward and scored(j, self.needs)):
                    drops.append(drop_record(turn_id, DropReason.TEACHER_FAILED, self.drops))
                    continue
                else:
                    log.warning("hinted prompt of %s is too long to score: reward only", turn_id)
            self._ready[turn_id] = (make_sample(turn, j, self.needs, None, distill), prompt,
                                    distill)  # fmt: skip
        stale = stale_ids(
            {t: s for t, (s, _, _) in self._ready.items()},
            self.trainer.policy_version,
            self.config.max_staleness,
        )
        for t in stale:
            drops.append(drop_record(t, DropReason.STALE, self.drops))
            del self._ready[t]
        if drops:
            self.store.record_samples(drops)
        return len(self._ready)

    def next_order(self) -> StepOrder | str | None:
        """Rank 0: ``stop``, the next step's order, or ``None`` (not enough samples yet)."""
        if self.stop_requested or (
            self.step_limit is not None and self.trainer.step >= self.step_limit
        ):
            return STOP
        try:
            ready = self.collect()
        except ClawrlError as e:  # the store is away: say so, keep polling
            log.error("reading the store: %s", e)
            return None
        if ready < self.config.batch_size:
            return None
        turn_ids = list(self._ready)[: self.config.batch_size]
        picked = [self._ready[t] for t in turn_ids]
        distill = [d for _, _, d in picked]
        return StepOrder(turn_ids, [s for s, _, _ in picked], [p for _, p, _ in picked],
                         distill if any(d is not None for d in distill) else [])  # fmt: skip

    # ---------------------------------------------------------------- every rank

    def run(self) -> int:
        """Take steps as rank 0 orders them until the ``stop`` order; returns steps taken."""
        taken = 0
        while True:
            order = self.next_order() if self.env.is_main else None
            order = broadcast_object(order, self.env)
            if order == STOP:
                return taken
            if isinstance(order, StepOrder):
                self.step(order)
                taken += 1
            elif self.env.is_main:
                time.sleep(self.config.poll_interval_s)

    def step(self, order: StepOrder) -> dict[str, float]:
        """One step on every rank (module docstring); returns its metrics. Collective."""
        t0 = time.perf_counter()
        base = self.needs.teacher == "base"
        samples = with_teacher(self.trainer, list(order.samples), list(order.teacher_prompts),
                               base=base)  # fmt: skip
        drops = {k: float(v) for k, v in self.drops.items()}
        if order.distill:  # every rank: the forward passes are collective
            samples, gaps = with_distillation(self.trainer, samples, list(order.distill),
                                              base=base)  # fmt: skip
            drops.update(self._record_gaps(order, gaps))
        metrics = self.learner.step(samples, order.turn_ids, metrics=drops)
        if self.env.is_main:
            for t in order.turn_ids:
                del self._ready[t]
            metrics["time/step_total"] = time.perf_counter() - t0
            self.out(step_line(metrics, self.env.world_size, sum(self.drops.values())))
        return metrics

    def _record_gaps(self, order: StepOrder, gaps: list[float | None]) -> dict[str, float]:
        """The step's distillation metrics; rank 0 records each distilled turn's gap in the
        memory before the step (the gaps of the weights it starts from), which may retire
        entries. The memory's bookkeeping never stops training, but a trainer that lost the
        store's lease stops before it writes (:meth:`TrainerLease.check`)."""
        metrics, retired = record_gaps(
            self.memory, order.turn_ids, list(order.distill), gaps, step=self.trainer.step + 1,
            before_write=self.lease.check if self.lease is not None else None,
        )  # fmt: skip
        for e in retired:
            self.out(f"{time.strftime('%H:%M:%S')} memory: retired {e.id[:8]} {e.text!r}: "
                     f"{e.end_reason}")  # fmt: skip
        return metrics

    def _published_line(self, record: PolicyVersionRecord) -> None:
        """Rank 0: the console line of a version recorded in the store."""
        kind = "full weights" if record.weights_kind == WeightsKind.FULL else "LoRA adapter"
        self.out(f"{time.strftime('%H:%M:%S')} published policy v{record.version} "
                 f"({kind} {record.weights}, step {record.step})")  # fmt: skip

    def close(self) -> None:
        """Give the trainer lease up; close the metrics writer and the store this process was
        given (rank 0)."""
        if self.lease is not None:
            self.lease.release()
        if self.metrics is not None:
            self.metrics.close()
        if self.store is not None:
            self.store.close()

    def start_line(self) -> str:
        """This rank's first console line."""
        line = (
            f"clawrl train: rank {self.env.rank}/{self.env.world_size} pid {os.getpid()} on "
            f"{self.env.device} ({self.env.backend})"
        )
        if not self.env.is_main:
            return line
        return (
            f"{line}, method {self.trainer.method.kind}, batch {self.config.batch_size}, "
            f"policy v{self.trainer.policy_version} (output: {self.trainer.output_dir})"
        )
