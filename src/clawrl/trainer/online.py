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
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from clawrl.config import SampleNeeds, TrainerConfig
from clawrl.engine import Engine
from clawrl.engine.threads import in_transient_thread
from clawrl.errors import ClawrlError, ConfigError
from clawrl.store import DropReason, JudgmentRecord, SampleRecord, Store, TurnRecord
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

    Raises:
        ConfigError: ``memory`` with a method that has no teacher, or a teacher this trainer
            cannot score.
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

    # ---------------------------------------------------------------- resume

    def resume(self) -> int:
        """Restore the latest checkpoint, re-record its samples, republish its version
        (:meth:`clawrl.trainer.learner.Learner.resume`).

        Returns:
            The policy version now served (0 when there was no checkpoint).

        Raises:
            ConfigError: no checkpoint, but the store holds versions another trainer published.
        """
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
        lag = self.trainer.policy_version - turn.policy_version
        return decide(turn, j, self.needs, lag=lag, max_staleness=self.config.max_staleness,
                      distilled=distilled)  # fmt: skip

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
            self._ready[turn_id] = make_sample(turn, j, self.needs, teacher, distill)
            self._keys[turn_id] = sample_key(turn)
        if drops:
            await asyncio.to_thread(self.store.record_samples, drops)
        self.state.ready = len(self._ready)
        return len(self._ready)

    # ---------------------------------------------------------------- stepping

    async def evict_stale(self) -> int:
        """Drop ready samples that went stale while they waited (``drop/stale``,
        :func:`clawrl.trainer.samples.stale_ids`). Returns how many went."""
        stale = stale_ids(self._ready, self.trainer.policy_version, self.config.max_staleness)
        if stale:
            drops = [self._drop(t, DropReason.STALE) for t in stale]
            await asyncio.to_thread(self.store.record_samples, drops)
            for t in stale:
                del self._ready[t]
                self._keys.pop(t, None)
                self._teacher_prompts.pop(t, None)
                self._distill.pop(t, None)
            self.state.ready = len(self._ready)
        return len(stale)

    async def step_if_ready(self) -> dict[str, float] | None:
        """Train one step when ``batch_size`` samples are ready; returns its metrics. A step
        whose writes failed part-way is finished first, before anything is evicted or chosen
        (its turns are trained: they leave the ready samples)."""
        if self.learner.pending_turn_ids is not None:
            async with self._step_lock:
                pending = self.learner.pending_turn_ids or []
                finished = await in_transient_thread(self.learner.finish_pending,
                                                     finish_on_cancel=True)  # fmt: skip
                if finished is not None:
                    return self._stepped(pending, finished)
        await self.evict_stale()
        if len(self._ready) < self.config.batch_size:
            return None
        if self.step_limit is not None and self.trainer.step >= self.step_limit:
            return None
        async with self._step_lock:
            order = (
                sorted(self._ready, key=self._keys.__getitem__) if self.fixed_order else self._ready
            )
            turn_ids = list(order)[: self.config.batch_size]
            samples = [self._ready[t] for t in turn_ids]
            # the whole step (torch work, checkpoint, store records, publishing) in a thread that
            # ends with it: a live one keeps an OpenMP team that slows the serving engine's
            # thread between steps too (clawrl.engine.threads)
            drops = {k: float(v) for k, v in self.state.drops.items()}
            step = functools.partial(self._train, samples, turn_ids, drops)
            metrics = await in_transient_thread(step, finish_on_cancel=True)
            return self._stepped(turn_ids, metrics)

    def _train(
        self, samples: list[TrainSample], turn_ids: list[str], drops: dict[str, float]
    ) -> dict[str, float]:
        """One learner step (in a transient thread); with :attr:`teacher_on_trainer`, the
        hinted samples' teacher log-probs are computed first, by the trainer, with the weights
        this step starts from (as ``clawrl train`` does, :mod:`clawrl.trainer.process`)."""
        t0 = time.perf_counter()
        base = self.needs.teacher == "base"
        prompts = [self._teacher_prompts.get(t) for t in turn_ids]
        parts = [self._distill.get(t) for t in turn_ids]
        hinted = any(p is not None for p in prompts) or any(p is not None for p in parts)
        gaps: list[float | None] = []
        if hinted:
            samples = with_teacher(self.trainer, samples, prompts, base=base)
            samples, gaps = with_distillation(self.trainer, samples, parts, base=base)
            drops = {**drops, "time/teacher_scoring": time.perf_counter() - t0}
        gap_metrics, _ = record_gaps(self.memory, turn_ids, parts, gaps,
                                     step=self.trainer.step + 1)  # fmt: skip
        drops = {**drops, **gap_metrics}
        metrics = self.learner.step(samples, turn_ids, metrics=drops)
        if hinted:  # the step's time includes its teacher's
            metrics["time/step_total"] = time.perf_counter() - t0
        return metrics

    def _stepped(self, turn_ids: list[str], metrics: dict[str, float]) -> dict[str, float]:
        """Bookkeeping after a step trained ``turn_ids``: they leave the ready samples."""
        for t in turn_ids:
            self._ready.pop(t, None)
            self._keys.pop(t, None)
            self._teacher_prompts.pop(t, None)
            self._distill.pop(t, None)
        self.state.steps = self.trainer.step
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
