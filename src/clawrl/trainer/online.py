"""The online learner: judged turns from the store -> samples -> training steps -> new versions.

Runs beside the gateway (an asyncio task in the server process) and never blocks serving:
training steps run in a worker thread, and the engine swaps the new weights in between
requests.

Each judged turn is decided by the rules of :mod:`clawrl.trainer.samples` (its ``samples``
row records the outcome); every ``batch_size`` samples make one step. The OPD teacher's log-probs
of a hinted turn are those of the hint-enhanced prompt
(:func:`clawrl.trainer.samples.teacher_prompt_ids`) at the turn's own sampling temperature;
``teacher="base"`` scores with the LoRA adapter disabled (the frozen base weights). Where
(``trainer.teacher_scoring``, :func:`teacher_on_trainer`): ``engine.score`` when the turn is
collected, or the trainer's forward pass at step time, with the weights the step starts from
(the default on vLLM, where teacher prefills on the server would slow users' requests).

A step is the one learner's (:class:`clawrl.trainer.learner.Learner`: optimizer step, version,
checkpoint, ``samples`` rows exactly once, ``policy_versions``, publishing to the engine); this
module decides which turns feed it and when.

With ``per_user`` (``clawrl serve --per-user-adapters``) each judged turn trains its own user's
adapter only (:mod:`clawrl.trainer.users`): ready samples wait per user, and a user whose
``batch_size`` samples are ready gets a step of their learner (a :class:`Learner` built with
``user``: the version goes to ``user_adapters``; the gateway serves it from the user's next
request). The shared policy is not trained then (it stays what the engine serves, so every
user's adapter is trained on top of the weights it is served on top of); a turn that named no
user is dropped (``drop/no_user``). A turn's staleness counts its user's versions
(``TurnRecord.adapter_version``; 0: sampled without one). The OPD teacher is scored by the
trainer at step time, with the user's adapter (the engine's ``score`` takes no adapter).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from clawrl.config import SampleNeeds, TrainerConfig
from clawrl.engine import Engine
from clawrl.engine.threads import in_transient_thread
from clawrl.errors import ClawrlError, ConfigError
from clawrl.store import (
    DropReason,
    JudgmentRecord,
    SampleRecord,
    Store,
    TurnRecord,
    UntrainableReason,
)
from clawrl.trainer.learner import Learner
from clawrl.trainer.metrics import MetricsWriter
from clawrl.trainer.samples import (
    HINT_TEMPLATE,
    SYSTEM_HINT_TEMPLATE,
    Distillation,
    decide,
    distillation,
    drop_record,
    hinted_messages,
    make_sample,
    published,
    record_checkpoint_samples,
    record_gaps,
    scored,
    stale_ids,
    teacher_prompt_ids,
    turn_temperature,
    with_distillation,
    with_teacher,
)
from clawrl.trainer.trainer import Trainer
from clawrl.trainer.types import TrainSample
from clawrl.trainer.users import UserTrainers, load_user_adapter

__all__ = ["HINT_TEMPLATE", "SYSTEM_HINT_TEMPLATE", "LearnerState", "OnlineLearner",
           "hinted_messages", "published", "sample_key"]  # fmt: skip

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from clawrl.memory import MemoryKeeper

log = logging.getLogger(__name__)


@dataclass
class LearnerState:
    """Counters shown by the live display and ``/metrics``."""

    ready: int = 0
    steps: int = 0
    trained: int = 0
    drops: dict[str, int] = field(default_factory=dict)
    last_step_s: float = 0.0
    last_metrics: dict[str, float] = field(default_factory=dict)
    errors: int = 0
    last_user: str | None = None
    """The user whose adapter the last step trained (``None``: the shared policy)."""


def sample_key(turn: TurnRecord) -> tuple[str, int, int]:
    """Where a turn's sample goes in the fixed schedule's order: by session id, then by its
    place in the session (prompt length: each turn's prompt extends the one before), then
    choice. Independent of when it was sampled or judged, so runs that produce the same
    sessions train the same batches."""
    return (turn.session_id, len(turn.prompt_ids), turn.choice_index)


class OnlineLearner:
    """Turns judged turns into training steps and publishes each new version to the engine.

    The method, batch size, staleness and checkpoint cadence are those of the trainer's
    :class:`clawrl.config.TrainerConfig`.

    Args:
        store: the trajectory store (judgments written by the judge worker).
        engine: the serving engine (``score`` for the teacher, ``load_policy`` for versions).
        tokenizer: the policy's tokenizer (renders the hint-enhanced teacher prompt).
        trainer: a :class:`Trainer` holding the trainable copy of the policy.
        metrics: where step metrics go.
        memory: with ``memory.distill``, the preference memory whose turns are distilled
            (:func:`clawrl.trainer.samples.distillation`: trained without their memory block,
            teacher and student scored by the trainer at step time) and whose entries each
            step's gaps may retire (:meth:`clawrl.memory.MemoryKeeper.record_distillation`).
        per_user: train each user's own adapter on their turns (module docstring) instead of
            the shared policy; ``max_users`` of them stay in memory.

    Raises:
        ConfigError: ``memory`` with a method that has no teacher, or a teacher this trainer
            cannot score; ``per_user`` with ``memory`` or full fine-tuning.
    """

    def __init__(
        self,
        store: Store,
        engine: Engine,
        tokenizer: PreTrainedTokenizerBase,
        trainer: Trainer,
        metrics: MetricsWriter,
        *,
        memory: MemoryKeeper | None = None,
        per_user: bool = False,
        max_users: int = 8,
    ) -> None:
        self.store = store
        self.engine = engine
        self.tokenizer = tokenizer
        self.trainer = trainer
        self.config: TrainerConfig = trainer.config
        self.needs: SampleNeeds = trainer.method.needs
        self.metrics = metrics
        self.learner = Learner(trainer, store, engines=[engine], metrics=metrics)
        """The one learner (:mod:`clawrl.trainer.learner`): steps, checkpoints, records, publishes."""
        self.state = LearnerState()
        self._ready: dict[str, TrainSample] = {}
        self._step_lock = asyncio.Lock()
        self.on_step: Callable[[dict[str, float]], None] | None = None
        """Called with each step's metrics (``clawrl serve`` prints a one-line summary)."""
        self.step_limit: int | None = None
        """When set, no step past this one is taken (the demo evaluates at fixed steps)."""
        self.fixed_order = False
        """Take each step's samples in a fixed order (:func:`sample_key`: session, then turn)
        instead of the order they were judged in (the fixed schedule,
        :class:`clawrl.trainer.service.OnlineService`)."""
        self._keys: dict[str, tuple[str, int, int]] = {}
        self.teacher_on_trainer = teacher_on_trainer(self.config.teacher_scoring, engine)
        """The OPD teacher is scored by the trainer at step time, not by the engine."""
        if self.teacher_on_trainer and not trainer_can_score(trainer, self.needs):
            if self.config.teacher_scoring == "trainer":
                raise ConfigError(
                    "trainer.teacher_scoring=trainer with the base teacher needs the frozen base "
                    "weights, which this full fine-tuning trainer does not keep: set "
                    "trainer.teacher_scoring=engine (or auto)"
                )
            log.warning("the base teacher is scored on the engine: this full fine-tuning trainer "
                        "keeps no frozen base weights (trainer.teacher_scoring=auto)")  # fmt: skip
            self.teacher_on_trainer = False
        self._teacher_prompts: dict[str, list[int]] = {}  # turn -> hinted prompt (trainer scores)
        self.memory = memory
        """The memory distilled into the weights (``None``: turns are trained as sampled)."""
        if memory is not None and not self.needs.uses_hint:
            raise ConfigError(f"memory.distill needs a method with a teacher (opd or combine), "
                              f"not {trainer.method.kind!r}")  # fmt: skip
        if memory is not None and not trainer_can_score(trainer, self.needs):
            raise ConfigError("memory.distill with the base teacher needs the frozen base "
                              "weights, which this full fine-tuning trainer does not keep")  # fmt: skip
        self._distill: dict[str, Distillation] = {}  # turn -> its prompts without / with memory
        self.per_user = per_user
        """Each user's turns train their own adapter (module docstring)."""
        self.users: UserTrainers | None = None
        self._user_learners: dict[str, Learner] = {}
        self._user_of: dict[str, str] = {}  # ready turn -> its user
        self._user_versions: dict[str, int] = {}  # user -> their newest adapter version
        self._refused_users: dict[str, str] = {}  # user -> why their adapter cannot train
        self._user_steps = 0
        self._steps_of: dict[str, int] = {}  # user -> steps of their adapter
        self.user_step_limit: int | None = None
        """Per-user training: no user's adapter takes a step past this many (``None``: no
        cap); the demo gives every user the same number of steps."""
        self._tried_last: str | None = None
        if per_user:
            if memory is not None:
                raise ConfigError("memory.distill trains the shared policy: it cannot be on "
                                  "with server.per_user_adapters (yet)")  # fmt: skip
            self.users = UserTrainers(trainer, Path(trainer.output_dir) / "users", keep=max_users)
            self.teacher_on_trainer = True  # with the user's adapter: engine.score has none

    # ---------------------------------------------------------------- resume

    def resume(self) -> int:
        """Restore the latest checkpoint, re-record its samples, republish its version
        (:meth:`clawrl.trainer.learner.Learner.resume`).

        Returns:
            The policy version now served (0 when there was no checkpoint).

        Raises:
            ConfigError: no checkpoint, but the store holds versions another trainer published.
        """
        if self.per_user:  # users' trainers are rebuilt on their first step here
            for latest in sorted((Path(self.trainer.output_dir) / "users").glob(
                    "*/checkpoints/latest")):  # fmt: skip
                meta = json.loads((latest.parent / latest.read_text().strip() / "meta.json")
                                  .read_text())  # fmt: skip
                record_checkpoint_samples(self.store, meta)  # a crash left its rows out
            latest_versions = self.store.latest_user_adapters()
            self._user_versions = {u: r.version for u, r in latest_versions.items()}
            self._user_steps = self.state.steps = self.store.trained_user_adapter_versions()
            for user in latest_versions:
                self._steps_of[user] = sum(
                    1 for r in self.store.user_adapter_versions(user) if r.step is not None
                )
            return self.engine.policy_version
        if self.learner.resume() is None:
            return self.engine.policy_version
        self.state.steps = self.trainer.step
        return self.trainer.policy_version

    # ---------------------------------------------------------------- collecting

    def _drop(self, turn_id: str, reason: DropReason) -> SampleRecord:
        return drop_record(turn_id, reason, self.state.drops)

    def _decide(
        self, turn: TurnRecord, j: JudgmentRecord, *, distilled: bool = False
    ) -> DropReason | None:
        """Why this judged turn is not a sample (``None``: it is one): :func:`clawrl.trainer.
        samples.decide` at the trainer's policy version."""
        if self.per_user:
            if not turn.user_id:
                return DropReason.NO_USER
            if turn.user_id in self._refused_users:
                return DropReason.ADAPTER_REFUSED
            if turn.untrainable_reason == UntrainableReason.USER_ADAPTER.value:
                turn = replace(turn, trainable=True)  # sampled with this user's own adapter
            lag = self._user_versions.get(turn.user_id, 0) - (turn.adapter_version or 0)
        else:
            lag = self.trainer.policy_version - turn.policy_version
        return decide(turn, j, self.needs, lag=lag, max_staleness=self.config.max_staleness,
                      distilled=distilled, own_adapter=self.per_user)  # fmt: skip

    def _distillation(self, turn: TurnRecord, j: JudgmentRecord) -> Distillation | None:
        """The turn's :class:`Distillation` when the memory is distilled and the turn had a
        block (else ``None``: trained as sampled). A hinted teacher prompt too long for the
        context leaves the hint out: the memory alone is the teacher (what the turn was shown
        always fits)."""
        if self.memory is None or not turn.memory:
            return None
        return distillation(self.tokenizer, turn, j.hint or None, self.needs.hint_placement,
                            max_context=self.engine.max_context)  # fmt: skip

    async def _teacher_logprobs(self, turn: TurnRecord, hint: str) -> list[float]:
        prompt = teacher_prompt_ids(self.tokenizer, turn, hint, self.needs.hint_placement)
        return await self.engine.score(
            prompt,
            turn.completion_ids,
            temperature=turn_temperature(turn),
            base=self.needs.teacher == "base",
        )

    async def collect(self) -> int:
        """Decide every judged, undecided turn; returns how many samples are ready."""
        drops: list[SampleRecord] = []
        if self.per_user:
            latest = await asyncio.to_thread(self.store.latest_user_adapters)
            for user, record in latest.items():  # versions recorded by hand count too
                if record.version > self._user_versions.get(user, 0):
                    self._refused_users.pop(user, None)  # a new version: tried again
                self._user_versions[user] = max(self._user_versions.get(user, 0), record.version)
            async with self._step_lock:  # forgotten users (clawrl users forget): start afresh
                for user in [u for u in self._user_versions if u not in latest]:
                    self._forget_user(user)
        ids = await asyncio.to_thread(self.store.judged_untrained_turns, 1000)
        for turn_id in ids:
            if turn_id in self._ready:
                continue
            turn = await asyncio.to_thread(self.store.get_turn, turn_id)
            j = await asyncio.to_thread(self.store.get_judgment, turn_id)
            if turn is None or j is None:
                continue
            reason = self._decide(turn, j, distilled=self.memory is not None and bool(turn.memory))
            distill = self._distillation(turn, j) if reason is None else None
            if reason is None and distill is None and self.memory is not None and turn.memory:
                reason = self._decide(turn, j)  # its block cannot be cut out: as sampled
            if reason is not None:
                drops.append(self._drop(turn_id, reason))
                continue
            teacher = None
            if distill is not None:  # teacher and student scored by the trainer at step time
                self._distill[turn_id] = distill
            elif j.hint and self.needs.uses_hint and self.teacher_on_trainer:
                hinted = teacher_prompt_ids(self.tokenizer, turn, j.hint, self.needs.hint_placement)
                if len(hinted) + len(turn.completion_ids) <= self.engine.max_context:
                    self._teacher_prompts[turn_id] = hinted
                elif not (self.needs.uses_reward and scored(j, self.needs)):
                    drops.append(self._drop(turn_id, DropReason.TEACHER_FAILED))
                    continue
                else:
                    log.warning("hinted prompt of %s is too long to score: reward only", turn_id)
            elif j.hint and self.needs.uses_hint:
                try:
                    teacher = await self._teacher_logprobs(turn, j.hint)
                except ClawrlError as e:
                    log.warning("teacher scoring failed for %s: %s", turn_id, e)
                    if not (self.needs.uses_reward and scored(j, self.needs)):
                        drops.append(self._drop(turn_id, DropReason.TEACHER_FAILED))
                        continue
            sample = make_sample(turn, j, self.needs, teacher, distill)
            if self.per_user:  # its version is the user's adapter's (0: sampled without one)
                sample = replace(sample, policy_version=turn.adapter_version or 0)
                self._user_of[turn_id] = turn.user_id
            self._ready[turn_id] = sample
            self._keys[turn_id] = sample_key(turn)
        if drops:
            await asyncio.to_thread(self.store.record_samples, drops)
        self.state.ready = len(self._ready)
        return len(self._ready)

    # ---------------------------------------------------------------- stepping

    async def evict_stale(self) -> int:
        """Drop ready samples that went stale while they waited (``drop/stale``,
        :func:`clawrl.trainer.samples.stale_ids`). Returns how many went."""
        if self.per_user:
            stale = [
                t for t, s in self._ready.items()
                if self._user_versions.get(self._user_of[t], 0) - s.policy_version
                > self.config.max_staleness
            ]  # fmt: skip
        else:
            stale = stale_ids(self._ready, self.trainer.policy_version, self.config.max_staleness)
        if stale:
            drops = [self._drop(t, DropReason.STALE) for t in stale]
            await asyncio.to_thread(self.store.record_samples, drops)
            for t in stale:
                self._forget_ready(t)
            self.state.ready = len(self._ready)
        return len(stale)

    def _forget_ready(self, turn_id: str) -> None:
        self._ready.pop(turn_id, None)
        self._keys.pop(turn_id, None)
        self._teacher_prompts.pop(turn_id, None)
        self._distill.pop(turn_id, None)
        self._user_of.pop(turn_id, None)

    async def step_if_ready(self) -> dict[str, float] | None:
        """Train one step when ``batch_size`` samples are ready; returns its metrics. A step
        whose writes failed part-way is finished first, before anything is evicted or chosen
        (its turns are trained: they leave the ready samples)."""
        for user, learner in [(None, self.learner), *self._user_learners.items()]:
            if learner.pending_turn_ids is None:
                continue
            async with self._step_lock:
                pending = learner.pending_turn_ids or []
                finished = await in_transient_thread(learner.finish_pending,
                                                     finish_on_cancel=True)  # fmt: skip
                if finished is not None:
                    return self._stepped(pending, finished, user)
        await self.evict_stale()
        if len(self._ready) < self.config.batch_size:
            return None
        taken = self._user_steps if self.per_user else self.trainer.step
        if self.step_limit is not None and taken >= self.step_limit:
            return None
        async with self._step_lock:
            order = (
                sorted(self._ready, key=self._keys.__getitem__) if self.fixed_order else self._ready
            )
            user = None
            if self.per_user:  # the first user (in that order) with a batch ready
                user = self._user_with_batch(list(order))
                if user is None:
                    return None
                order = [t for t in order if self._user_of[t] == user]
            turn_ids = list(order)[: self.config.batch_size]
            samples = [self._ready[t] for t in turn_ids]
            # the whole step (torch work, checkpoint, store records, publishing) in a thread that
            # ends with it: a live one keeps an OpenMP team that slows the serving engine's
            # thread between steps too (clawrl.engine.threads)
            drops = {k: float(v) for k, v in self.state.drops.items()}
            if user is None:
                step = functools.partial(self._train, samples, turn_ids, drops)
            else:
                self._tried_last = user
                gone = await asyncio.to_thread(self._vanished, turn_ids)
                if gone:  # forgotten meanwhile (clawrl users forget): never trained
                    for t in gone:
                        self._forget_ready(t)
                    self.state.ready = len(self._ready)
                    return None
                step = functools.partial(self._train_user, user, samples, turn_ids, drops)
            try:
                metrics = await in_transient_thread(step, finish_on_cancel=True)
            except _AdapterRefused as e:
                await self._refuse_user(user or "", str(e))
                return None
            return self._stepped(turn_ids, metrics, user)

    def _forget_user(self, user: str) -> None:
        """Drop what this learner holds of ``user`` (their versions left the store)."""
        log.info("user %r has no adapter version any more: their trainer starts afresh", user)
        self._user_versions.pop(user, None)
        self._steps_of.pop(user, None)
        self._user_learners.pop(user, None)
        self._refused_users.pop(user, None)
        for t in [t for t, u in self._user_of.items() if u == user]:
            self._forget_ready(t)
        self.state.ready = len(self._ready)
        if self.users is not None:
            self.users.forget(user)

    def _user_with_batch(self, order: list[str]) -> str | None:
        """The user whose batch is full, first in ``order``, except the one tried last when
        another has one too (a user whose step fails does not hold up the others)."""
        counts: dict[str, int] = {}
        full: list[str] = []
        cap = self.user_step_limit
        for t in order:
            user = self._user_of[t]
            if cap is not None and self._steps_of.get(user, 0) >= cap:
                continue  # this user has had their steps
            counts[user] = counts.get(user, 0) + 1
            if counts[user] == self.config.batch_size:
                full.append(user)
        if len(full) > 1 and full[0] == self._tried_last:
            return full[1]
        return full[0] if full else None

    def _vanished(self, turn_ids: list[str]) -> list[str]:
        """The turns of ``turn_ids`` no longer in the store (their user was forgotten)."""
        return [t for t in turn_ids if self.store.get_turn(t) is None]

    async def _refuse_user(self, user: str, why: str) -> None:
        """``user``'s recorded adapter cannot be trained on: their turns are dropped
        (``drop/adapter_refused``) and the user keeps the versions they have."""
        log.error("user %r's adapter is not trained: %s (their turns are dropped; record a "
                  "fitting adapter with clawrl users adapter, or restart)", user, why)  # fmt: skip
        self._refused_users[user] = why
        theirs = [t for t, u in self._user_of.items() if u == user]
        drops = [self._drop(t, DropReason.ADAPTER_REFUSED) for t in theirs]
        await asyncio.to_thread(self.store.record_samples, drops)
        for t in theirs:
            self._forget_ready(t)
        self.state.ready = len(self._ready)
        self._user_learners.pop(user, None)
        if self.users is not None:
            self.users.forget(user)

    def _train_user(
        self, user: str, samples: list[TrainSample], turn_ids: list[str], drops: dict[str, float]
    ) -> dict[str, float]:
        """One step of ``user``'s adapter (in a transient thread): their weights go into the
        model (their trainer and learner are built, and their checkpoint restored, on their
        first step here), then :meth:`_train` with their learner.

        Raises:
            _AdapterRefused: their newest recorded version cannot be trained on (no checkpoint
                here, and :func:`clawrl.trainer.users.load_user_adapter` refused it).
        """
        assert self.users is not None
        trainer, created = self.users.activate(user)
        for other in [u for u in self._user_learners if not self.users.has(u)]:
            del self._user_learners[other]  # left memory: rebuilt from its checkpoint
        if created or user not in self._user_learners:
            learner = Learner(trainer, self.store, metrics=self.metrics, user=user)
            meta = learner.restore()
            if meta is None:  # versions recorded by hand: go on from the newest
                mine = self.store.user_adapter_versions(user)
                if mine:
                    try:
                        load_user_adapter(trainer, mine[-1].weights)
                    except ConfigError as e:
                        self.users.forget(user)
                        raise _AdapterRefused(
                            f"v{mine[-1].version} ({mine[-1].weights}): {e}"
                        ) from e
                    trainer.policy_version = mine[-1].version
            if learner.reconcile(meta):
                learner.republish()
            self._user_learners[user] = learner
        mine = self.store.user_adapter_versions(user)
        if mine and mine[-1].version > trainer.policy_version:  # recorded by hand since
            try:
                load_user_adapter(trainer, mine[-1].weights)
            except ConfigError as e:
                self.users.forget(user)
                self._user_learners.pop(user, None)
                raise _AdapterRefused(f"v{mine[-1].version} ({mine[-1].weights}): {e}") from e
            trainer.policy_version = mine[-1].version
            trainer.reset_optimizer()  # the moments were of other weights
            log.info("user %r trains on from their version %d recorded by hand", user,
                     mine[-1].version)  # fmt: skip
        metrics_step = self._user_steps + 1
        metrics = self._train(samples, turn_ids, drops, self._user_learners[user], metrics_step)
        return {**metrics, "step": float(metrics_step), "user/step": float(trainer.step)}

    def _train(
        self,
        samples: list[TrainSample],
        turn_ids: list[str],
        drops: dict[str, float],
        learner: Learner | None = None,
        metrics_step: int | None = None,
    ) -> dict[str, float]:
        """One learner step (in a transient thread; ``learner``: a user's, default the shared
        policy's); with :attr:`teacher_on_trainer`, the hinted samples' teacher log-probs are
        computed first, by the trainer, with the weights this step starts from (as ``clawrl
        train`` does, :mod:`clawrl.trainer.process`)."""
        learner = self.learner if learner is None else learner
        trainer = learner.trainer
        t0 = time.perf_counter()
        base = self.needs.teacher == "base"
        prompts = [self._teacher_prompts.get(t) for t in turn_ids]
        parts = [self._distill.get(t) for t in turn_ids]
        hinted = any(p is not None for p in prompts) or any(p is not None for p in parts)
        gaps: list[float | None] = []
        if hinted:
            samples = with_teacher(trainer, samples, prompts, base=base)
            samples, gaps = with_distillation(trainer, samples, parts, base=base)
            drops = {**drops, "time/teacher_scoring": time.perf_counter() - t0}
        gap_metrics, _ = record_gaps(self.memory, turn_ids, parts, gaps,
                                     step=trainer.step + 1)  # fmt: skip
        drops = {**drops, **gap_metrics}
        metrics = learner.step(samples, turn_ids, metrics=drops, metrics_step=metrics_step)
        if hinted:  # the step's time includes its teacher's
            metrics["time/step_total"] = time.perf_counter() - t0
        return metrics

    def _stepped(
        self, turn_ids: list[str], metrics: dict[str, float], user: str | None = None
    ) -> dict[str, float]:
        """Bookkeeping after a step trained ``turn_ids`` (``user``'s adapter, or the shared
        policy): they leave the ready samples."""
        for t in turn_ids:
            self._forget_ready(t)
        if user is not None:
            self._user_steps += 1
            self._steps_of[user] = self._steps_of.get(user, 0) + 1
            version = int(metrics.get("policy/version", 0))
            self._user_versions[user] = max(self._user_versions.get(user, 0), version)
        self.state.last_user = user
        self.state.steps = self._user_steps if self.per_user else self.trainer.step
        self.state.trained += len(turn_ids)
        self.state.ready = len(self._ready)
        self.state.last_step_s = metrics.get("time/step_total", 0.0)
        self.state.last_metrics = metrics
        if self.on_step is not None:
            self.on_step(metrics)
        return metrics

    async def run(self, stop: asyncio.Event) -> None:
        """Poll, collect and step until ``stop`` is set."""
        while not stop.is_set():
            try:
                await self.collect()
                stepped = await self.step_if_ready()
            except ClawrlError as e:
                log.error("online learner: %s", e)
                self.state.errors += 1
                stepped = None
            except Exception:  # keep serving; the step is retried from the same samples
                log.exception("online learner step failed")
                self.state.errors += 1
                stepped = None
            if stepped is None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.config.poll_interval_s)


def teacher_on_trainer(setting: str, engine: Engine) -> bool:
    """Whether the OPD teacher is scored by the trainer (``trainer.teacher_scoring``): always
    for ``trainer``, never for ``engine``; ``auto``: on a vLLM engine, whose teacher prefills
    would share the server with users' requests (``benchmarks/vllm_online.py --decompose``)."""
    if setting != "auto":
        return setting == "trainer"
    from clawrl.engine.vllm import VLLMEngine

    return isinstance(engine, VLLMEngine)


def trainer_can_score(trainer: Trainer, needs: SampleNeeds) -> bool:
    """Whether ``trainer`` can compute the teacher ``needs`` names: the current policy always;
    the base weights behind a LoRA adapter or in the frozen reference copy (full fine-tuning
    with a KL term), as :meth:`clawrl.trainer.Trainer.teacher_logprobs` requires."""
    if needs.teacher != "base":
        return True
    return trainer.ref_logprobs is not None or hasattr(trainer.model, "disable_adapter")


class _AdapterRefused(ClawrlError):
    """A user's recorded adapter cannot be trained on (:meth:`OnlineLearner._train_user`)."""
