"""The online learner: judged turns from the store -> samples -> training steps -> new versions.

Runs beside the gateway (an asyncio task in the server process) and never blocks serving:
training steps run in a worker thread, and the engine swaps the new weights in between
requests.

Decision rule for each judged turn (its ``samples`` row records the outcome):

- not ok / not trainable (incomplete stream, error, untrainable ids) -> ``drop/untrainable``;
- older than ``max_staleness`` versions -> ``drop/stale``;
- no judgment (all votes abstained, no next state) and no hint -> ``drop/no_judgment`` or
  ``drop/no_next_state``;
- it lacks every piece of evidence the method accepts (:attr:`clawrl.config.SampleNeeds.any_of`:
  ``rl`` a non-zero score, unless ``train_on_zero``; ``opd`` a hint; ``combine`` either) ->
  ``drop/no_hint`` when only a hint would do, ``drop/zero_score`` for a score of 0, else
  ``drop/no_judgment``;
- otherwise it becomes a :class:`TrainSample` carrying what the method uses (the score as
  reward, the hint's teacher log-probs); every ``batch_size`` samples make one step.

**Where the hint goes (OPD teacher).** The teacher is the policy itself on a hint-enhanced
prompt: the turn's own messages with ``\\n\\n[Hint: HINT]`` appended to the content of the last
non-assistant message (the user's request or the tool result the turn answered), rendered with
the same chat template and tools. Teacher log-probs of the turn's sampled ids come from
``engine.score`` at the turn's own sampling temperature; ``teacher="base"`` scores with the
LoRA adapter disabled (the frozen base weights).

Exactly once: a step's sample ids are written into its checkpoint's meta before the
``samples`` rows; on restart :meth:`OnlineLearner.resume` re-records any ids a crash left out,
so no sample is trained twice and none is lost.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clawrl.chat import ChatMessage, ToolSpec, render_prompt
from clawrl.config import HintPlacement, SampleNeeds, TrainerConfig
from clawrl.engine import Engine
from clawrl.errors import ClawrlError
from clawrl.store import (
    DropReason,
    JudgmentRecord,
    PolicyVersionRecord,
    SampleRecord,
    SampleStatus,
    Store,
    TurnRecord,
    TurnStatus,
    WeightsKind,
)
from clawrl.trainer.metrics import MetricsWriter
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


HINT_TEMPLATE = "\n\n[Hint: {hint}]"
SYSTEM_HINT_TEMPLATE = "Keep in mind what the user asked for: {hint}"


def hinted_messages(
    messages: list[ChatMessage], hint: str, placement: HintPlacement = "user"
) -> list[ChatMessage]:
    """The turn's messages with the hint where ``placement`` says.

    * ``user``: appended to the last non-assistant message (``\n\n[Hint: HINT]``);
    * ``system``: in the system message (appended to the first one, or a new one first):
      ``Keep in mind what the user asked for: HINT``.
    """
    out = list(messages)
    if placement == "system":
        text = SYSTEM_HINT_TEMPLATE.format(hint=hint.strip())
        for i, m in enumerate(out):
            if m.role == "system":
                out[i] = m.model_copy(update={"content": f"{m.content or ''}\n\n{text}".strip()})
                return out
        return [ChatMessage(role="system", content=text), *out]
    for i in range(len(out) - 1, -1, -1):
        m = out[i]
        if m.role != "assistant":
            out[i] = m.model_copy(
                update={"content": (m.content or "") + HINT_TEMPLATE.format(hint=hint.strip())}
            )
            return out
    return [*out, ChatMessage(role="user", content=HINT_TEMPLATE.format(hint=hint).strip())]


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


def published(version: int, weights: Any, step: int) -> PolicyVersionRecord:
    """The store's record of a version the trainer saved: a LoRA adapter directory (every
    replica on this filesystem loads it) or full weights held in memory (not loadable by
    another process: ``weights`` None)."""
    if isinstance(weights, str | Path):
        return PolicyVersionRecord(version, WeightsKind.LORA, str(Path(weights).resolve()), step)
    return PolicyVersionRecord(version, WeightsKind.FULL, None, step)


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
    """

    def __init__(
        self,
        store: Store,
        engine: Engine,
        tokenizer: Any,
        trainer: Trainer,
        metrics: MetricsWriter,
    ) -> None:
        self.store = store
        self.engine = engine
        self.tokenizer = tokenizer
        self.trainer = trainer
        self.config: TrainerConfig = trainer.config
        self.needs: SampleNeeds = trainer.method.needs
        self.metrics = metrics
        self.state = LearnerState()
        self._ready: dict[str, TrainSample] = {}
        self._step_lock = asyncio.Lock()
        self.on_step: Any = None
        """Called with each step's metrics (``clawrl serve`` prints a one-line summary)."""
        self.step_limit: int | None = None
        """When set, no step past this one is taken (the demo evaluates at fixed steps)."""

    # ---------------------------------------------------------------- resume

    def resume(self) -> int:
        """Restore the latest checkpoint, re-record its samples, republish its version.

        Returns:
            The policy version now served (0 when there was no checkpoint).
        """
        meta = self.trainer.load_checkpoint()
        if meta is None:
            return self.engine.policy_version
        missing = [t for t in meta.get("turn_ids", []) if self.store.get_sample(t) is None]
        if missing:
            self.store.record_samples(
                [
                    SampleRecord(
                        t,
                        SampleStatus.TRAINED,
                        step=meta["step"],
                        policy_version=meta["policy_version"],
                    )
                    for t in missing
                ]
            )
        version = self.trainer.policy_version
        if version > self.engine.policy_version:
            weights = self.trainer.save_weights(version)
            self.engine.load_policy(version, weights).result(timeout=600)
            self.store.publish_policy_version(published(version, weights, self.trainer.step))
        self.state.steps = self.trainer.step
        return version

    # ---------------------------------------------------------------- collecting

    def _drop(self, turn_id: str, reason: DropReason) -> SampleRecord:
        key = f"drop/{reason}"
        self.state.drops[key] = self.state.drops.get(key, 0) + 1
        return SampleRecord(turn_id, SampleStatus.DROPPED, reason=str(reason))

    def _decide(self, turn: TurnRecord, j: JudgmentRecord) -> DropReason | None:
        """Why this judged turn is not a sample (``None``: it is one); see the module docstring."""
        if turn.status != TurnStatus.OK or not turn.trainable or not turn.completion_ids:
            return DropReason.UNTRAINABLE
        lag = self.trainer.policy_version - turn.policy_version
        if lag > self.config.max_staleness:
            return DropReason.STALE
        has_hint = bool(j.hint)
        if j.score is None and not has_hint:
            if j.reason == DropReason.NO_NEXT_STATE:
                return DropReason.NO_NEXT_STATE
            return DropReason.NO_JUDGMENT
        offers = {"reward": self._scored(j), "hint": has_hint}
        if any(offers[e] for e in self.needs.any_of):
            return None
        if self.needs.any_of == ("hint",):
            return DropReason.NO_HINT
        return DropReason.ZERO_SCORE if j.score == 0 else DropReason.NO_JUDGMENT

    def _scored(self, j: JudgmentRecord) -> bool:
        """The judgment has a score the method counts as a reward."""
        return j.score is not None and (j.score != 0 or self.needs.zero_is_reward)

    async def _teacher_logprobs(self, turn: TurnRecord, hint: str) -> list[float]:
        messages = [ChatMessage.model_validate(m) for m in turn.request_messages]
        tools = [ToolSpec.model_validate(t) for t in (turn.tools or [])] or None
        placement = self.needs.hint_placement
        prompt = render_prompt(self.tokenizer, hinted_messages(messages, hint, placement), tools)
        temperature = float(turn.sampling_params.get("temperature", 1.0))
        return await self.engine.score(
            prompt.token_ids,
            turn.completion_ids,
            temperature=temperature,
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
            reason = self._decide(turn, j)
            if reason is not None:
                drops.append(self._drop(turn_id, reason))
                continue
            teacher = None
            if j.hint and self.needs.uses_hint:
                try:
                    teacher = await self._teacher_logprobs(turn, j.hint)
                except ClawrlError as e:
                    log.warning("teacher scoring failed for %s: %s", turn_id, e)
                    if not (self.needs.uses_reward and self._scored(j)):
                        drops.append(self._drop(turn_id, DropReason.TEACHER_FAILED))
                        continue
            reward = None
            if j.score is not None and self.needs.uses_reward and self._scored(j):
                reward = float(j.score)
            self._ready[turn_id] = TrainSample(
                prompt_ids=turn.prompt_ids,
                completion_ids=turn.completion_ids,
                sampling_logprobs=turn.sampling_logprobs,
                temperature=float(turn.sampling_params.get("temperature", 1.0)),
                # a hint-only turn of a method that also uses rewards: OPD alone (A = 0·w_rl + OPD)
                reward=reward if reward is not None or not self.needs.uses_reward else 0.0,
                teacher_logprobs=teacher,
                policy_version=turn.policy_version,
                truncated=turn.finish_reason == "length",
                turn_id=turn_id,
            )
        if drops:
            await asyncio.to_thread(self.store.record_samples, drops)
        self.state.ready = len(self._ready)
        return len(self._ready)

    # ---------------------------------------------------------------- stepping

    async def evict_stale(self) -> int:
        """Drop ready samples that went stale while they waited (``drop/stale``): a sample is
        checked when collected, but steps taken since may have pushed it past
        ``max_staleness`` (e.g. samples left over when training paused). Without this the
        learner would retry a batch the trainer refuses, forever. Returns how many went."""
        stale = [
            t
            for t, s in self._ready.items()
            if self.trainer.policy_version - s.policy_version > self.config.max_staleness
        ]
        if stale:
            drops = [self._drop(t, DropReason.STALE) for t in stale]
            await asyncio.to_thread(self.store.record_samples, drops)
            for t in stale:
                del self._ready[t]
            self.state.ready = len(self._ready)
        return len(stale)

    async def step_if_ready(self) -> dict[str, float] | None:
        """Train one step when ``batch_size`` samples are ready; returns its metrics."""
        await self.evict_stale()
        if len(self._ready) < self.config.batch_size:
            return None
        if self.step_limit is not None and self.trainer.step >= self.step_limit:
            return None
        async with self._step_lock:
            turn_ids = list(self._ready)[: self.config.batch_size]
            samples = [self._ready[t] for t in turn_ids]
            t0 = time.perf_counter()
            metrics = await asyncio.to_thread(self.trainer.train_step, samples)
            version = self.trainer.policy_version + 1
            weights = await asyncio.to_thread(self.trainer.save_weights, version)
            self.trainer.policy_version = version
            if self.trainer.step % max(1, self.config.checkpoint_every) == 0:
                await asyncio.to_thread(self.trainer.save_checkpoint, {"turn_ids": turn_ids})
            await asyncio.to_thread(
                self.store.record_samples,
                [
                    SampleRecord(
                        t, SampleStatus.TRAINED, step=self.trainer.step, policy_version=version
                    )
                    for t in turn_ids
                ],
            )
            self.engine.load_policy(version, weights).add_done_callback(
                functools.partial(_report_publish, version)
            )
            await asyncio.to_thread(
                self.store.publish_policy_version, published(version, weights, self.trainer.step)
            )
            for t in turn_ids:
                del self._ready[t]
            metrics = {
                **metrics,
                **{k: float(v) for k, v in self.state.drops.items()},
                "policy/version": float(version),
                "time/step_total": time.perf_counter() - t0,
            }
            self.metrics.write(self.trainer.step, metrics)
            self.state.steps = self.trainer.step
            self.state.trained += len(turn_ids)
            self.state.ready = len(self._ready)
            self.state.last_step_s = metrics["time/step_total"]
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
