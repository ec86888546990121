"""When a judged turn becomes a training sample: the rules both online trainers share.

The in-process learner (:mod:`clawrl.trainer.online`, ``clawrl serve --method ...``) and the
trainer process (:mod:`clawrl.trainer.process`, ``clawrl train``) read the same store rows and
decide the same way:

- not ok / not trainable (incomplete stream, error, untrainable ids) -> ``drop/untrainable``;
- older than ``max_staleness`` versions -> ``drop/stale``;
- no judgment (all votes abstained, no next state) and no hint -> ``drop/no_judgment`` or
  ``drop/no_next_state``;
- it lacks every piece of evidence the method accepts (:attr:`clawrl.config.SampleNeeds.any_of`:
  ``rl`` a non-zero score, unless ``train_on_zero``; ``opd`` a hint; ``combine`` either) ->
  ``drop/no_hint`` when only a hint would do, ``drop/zero_score`` for a score of 0, else
  ``drop/no_judgment``;
- otherwise it becomes a :class:`TrainSample` carrying what the method uses (the score as
  reward, the hint's teacher log-probs).

**Where the hint goes (OPD teacher).** The teacher is the policy itself on a hint-enhanced
prompt (:func:`hinted_messages`): the turn's own messages with the hint where the method's
``hint_placement`` says, rendered with the same chat template and tools
(:func:`teacher_prompt_ids`). Its log-probs of the turn's sampled ids are taken at the turn's own
sampling temperature; ``teacher="base"`` scores with the frozen base weights.

**Context distillation (preference memory).** A turn sampled with a memory block in its system
message (``TurnRecord.memory``, ``clawrl serve --memory``) is, with ``memory.distill``, trained
*without* it (:func:`distillation`): the sample's prompt is the client's own messages
(:func:`clawrl.memory.without_memory`), the teacher is the policy on what the turn was shown
(its ``prompt_ids``; with a hint, those messages plus the hint), and the OPD advantage's student
term is the policy's log-probs on the prompt without the block at step time
(``TrainSample.student_logprobs``, :func:`with_distillation`), not the sampling log-probs,
which had the block. Such a turn teaches even without a hint or a score (the memory is its
teacher). The tokens were sampled with the block, so the PPO ratio (default ``sampling``) or the
``tis`` / ``mis`` weights see the mismatch between the two prompts.

**Exactly once.** A step's turn ids are written into its checkpoint's meta before the
``samples`` rows; after a crash :func:`record_checkpoint_samples` re-records the ids the crash
left out, so no sample is trained twice and none is lost.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clawrl.chat import ChatMessage, ToolSpec, render_prompt
from clawrl.config import HintPlacement, SampleNeeds
from clawrl.memory.prompt import without_memory
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
from clawrl.trainer.types import TrainSample

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from transformers import PreTrainedTokenizerBase

    from clawrl.memory import MemoryKeeper
    from clawrl.store import MemoryEntryRecord
    from clawrl.trainer.trainer import Trainer

log = logging.getLogger(__name__)

HINT_TEMPLATE = "\n\n[Hint: {hint}]"
SYSTEM_HINT_TEMPLATE = "Keep in mind what the user asked for: {hint}"


def hinted_messages(
    messages: list[ChatMessage], hint: str, placement: HintPlacement = "user"
) -> list[ChatMessage]:
    """The turn's messages with the hint where ``placement`` says.

    * ``user``: appended to the last non-assistant message (``\\n\\n[Hint: HINT]``);
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


def teacher_prompt_ids(
    tokenizer: PreTrainedTokenizerBase, turn: TurnRecord, hint: str, placement: HintPlacement
) -> list[int]:
    """``[p']`` token ids of the turn's hint-enhanced prompt (the OPD teacher's context)."""
    messages = [ChatMessage.model_validate(m) for m in turn.request_messages]
    tools = [ToolSpec.model_validate(t) for t in (turn.tools or [])] or None
    return render_prompt(tokenizer, hinted_messages(messages, hint, placement), tools).token_ids


def turn_temperature(turn: TurnRecord) -> float:
    """The temperature the turn was sampled at (1.0 when the request did not say)."""
    return float(turn.sampling_params.get("temperature", 1.0))


@dataclass(frozen=True)
class Distillation:
    """A turn trained without the memory block it was sampled with (context distillation).

    Attributes:
        student_prompt: ``[p_s]`` the client's messages alone, rendered: the sample's prompt.
        memory_prompt: ``[p]`` what the policy was shown (the turn's ``prompt_ids``).
        teacher_prompt: ``[p_t]`` the OPD teacher's context: ``memory_prompt``, or with a hint
            the recorded messages (block included) plus the hint (:func:`teacher_prompt_ids`).
        entries: the memory entry ids the block held.
        hinted: the teacher has the turn's hint besides the memory.
    """

    student_prompt: list[int]
    memory_prompt: list[int]
    teacher_prompt: list[int]
    entries: tuple[str, ...]
    hinted: bool = False


def distillation(
    tokenizer: PreTrainedTokenizerBase,
    turn: TurnRecord,
    hint: str | None,
    placement: HintPlacement,
    *,
    max_context: int | None = None,
) -> Distillation | None:
    """The :class:`Distillation` of a turn sampled with a memory block (``None``: the turn had
    none, or the block cannot be cut out of its ids, logged).

    The student's prompt is the turn's own ``prompt_ids`` with only the block's tokens
    replaced: the recorded messages and the client's are rendered (same tools), their common
    token prefix and suffix bracket the block, and the turn's ids must hold the rendered
    prefix and block exactly; what follows (spliced history ids, a tool-call prefill) is kept
    as sampled. With ``max_context``, a hinted teacher prompt that with the completion would
    not fit leaves the hint out (logged): the memory alone teaches.
    """
    if not turn.memory:
        return None
    messages = [ChatMessage.model_validate(m) for m in turn.request_messages]
    try:
        client = without_memory(messages, turn.memory)
    except ValueError as e:
        log.warning("turn %s: not distilled: %s", turn.id, e)
        return None
    tools = [ToolSpec.model_validate(t) for t in (turn.tools or [])] or None
    student = cut_block(
        turn.prompt_ids,
        render_prompt(tokenizer, messages, tools).token_ids,
        render_prompt(tokenizer, client, tools).token_ids,
    )
    if student is None:
        log.warning("turn %s: not distilled: its prompt ids do not start as its messages "
                    "render", turn.id)  # fmt: skip
        return None
    memory_prompt = list(turn.prompt_ids)
    teacher = teacher_prompt_ids(tokenizer, turn, hint, placement) if hint else memory_prompt
    if hint and max_context is not None and len(teacher) + len(turn.completion_ids) > max_context:
        # what the turn was shown always fits: the memory alone teaches
        log.warning("hinted memory prompt of %s is too long to score: the memory alone "
                    "teaches", turn.id)  # fmt: skip
        teacher, hint = memory_prompt, None
    return Distillation(
        student_prompt=student,
        memory_prompt=memory_prompt,
        teacher_prompt=teacher,
        entries=tuple(str(e) for e in turn.memory.get("entries") or ()),
        hinted=bool(hint),
    )


def cut_block(prompt_ids: list[int], shown: list[int], client: list[int]) -> list[int] | None:
    """``prompt_ids`` with the memory block's tokens replaced by the client's.

    Args:
        prompt_ids: ``[p]`` what the engine was given (the render of ``shown``'s messages,
            possibly with spliced history ids and a prefill after the block).
        shown: ``[n]`` the render of the messages with the block.
        client: ``[m]`` the render of the client's messages.

    Returns:
        The student's ids, or ``None`` when ``prompt_ids`` does not begin with ``shown``'s
        ids up to the end of the block.
    """
    a = 0
    while a < min(len(shown), len(client)) and shown[a] == client[a]:
        a += 1
    c = 0
    while c < min(len(shown), len(client)) - a and shown[-1 - c] == client[-1 - c]:
        c += 1
    end = len(shown) - c  # the block is shown[a:end], the client's text there client[a:-c]
    if prompt_ids[:end] != shown[:end]:
        return None
    return [*prompt_ids[:a], *client[a : len(client) - c], *prompt_ids[end:]]


def scored(j: JudgmentRecord, needs: SampleNeeds) -> bool:
    """The judgment has a score the method counts as a reward."""
    return j.score is not None and (j.score != 0 or needs.zero_is_reward)


def decide(
    turn: TurnRecord,
    j: JudgmentRecord,
    needs: SampleNeeds,
    *,
    lag: int,
    max_staleness: int,
    distilled: bool = False,
    own_adapter: bool = False,
) -> DropReason | None:
    """Why this judged turn is not a sample (``None``: it is one); see the module docstring.

    Args:
        lag: the trainer's policy version minus the turn's.
        max_staleness: the most versions a sample may lag.
        distilled: the turn is distilled out of its memory block (:func:`distillation`): the
            memory is a teacher, as a hint is, for a method that uses one.
        own_adapter: the learner trains the turn's user's own adapter (a turn sampled with
            that adapter is on its policy); otherwise such a turn is untrainable (its
            log-probs are not the shared policy's).
    """
    if turn.status != TurnStatus.OK or not turn.trainable or not turn.completion_ids:
        return DropReason.UNTRAINABLE
    if turn.adapter_version is not None and not own_adapter:
        return DropReason.UNTRAINABLE
    if lag > max_staleness:
        return DropReason.STALE
    has_hint = bool(j.hint) or (distilled and needs.uses_hint)
    if j.score is None and not has_hint:
        if j.reason == DropReason.NO_NEXT_STATE:
            return DropReason.NO_NEXT_STATE
        return DropReason.NO_JUDGMENT
    offers = {"reward": scored(j, needs), "hint": has_hint}
    if any(offers[e] for e in needs.any_of):
        return None
    if needs.any_of == ("hint",):
        return DropReason.NO_HINT
    return DropReason.ZERO_SCORE if j.score == 0 else DropReason.NO_JUDGMENT


def make_sample(
    turn: TurnRecord,
    j: JudgmentRecord,
    needs: SampleNeeds,
    teacher_logprobs: list[float] | None,
    distill: Distillation | None = None,
) -> TrainSample:
    """The :class:`TrainSample` of a turn :func:`decide` accepted (with ``distill``: its prompt
    is the one without the memory block; the teacher and student log-probs come at step time,
    :func:`with_distillation`).

    The reward is the judge's score when the method uses rewards and counts it; a hint-only turn
    of a method that also uses rewards gets reward 0 (OPD alone: A = 0·w_rl + OPD).
    """
    reward = None
    if j.score is not None and needs.uses_reward and scored(j, needs):
        reward = float(j.score)
    return TrainSample(
        prompt_ids=distill.student_prompt if distill is not None else turn.prompt_ids,
        completion_ids=turn.completion_ids,
        sampling_logprobs=turn.sampling_logprobs,
        temperature=turn_temperature(turn),
        reward=reward if reward is not None or not needs.uses_reward else 0.0,
        teacher_logprobs=teacher_logprobs,
        policy_version=turn.policy_version,
        truncated=turn.finish_reason == "length",
        turn_id=turn.id,
    )


def stale_ids(ready: dict[str, TrainSample], version: int, max_staleness: int) -> list[str]:
    """Ready samples that went stale while they waited: a sample is checked when collected, but
    steps taken since may have pushed it past ``max_staleness`` (e.g. samples left over when
    training paused). A learner that kept them would retry a batch the trainer refuses,
    forever."""
    return [t for t, s in ready.items() if version - s.policy_version > max_staleness]


def drop_record(turn_id: str, reason: DropReason, drops: dict[str, int]) -> SampleRecord:
    """The ``samples`` row of a dropped turn; counts it in ``drops`` (``drop/<reason>``)."""
    key = f"drop/{reason}"
    drops[key] = drops.get(key, 0) + 1
    return SampleRecord(turn_id, SampleStatus.DROPPED, reason=str(reason))


def trained_records(turn_ids: list[str], step: int, version: int) -> list[SampleRecord]:
    """The ``samples`` rows of one step's turns (trained at ``step``, producing ``version``)."""
    return [SampleRecord(t, SampleStatus.TRAINED, step=step, policy_version=version)
            for t in turn_ids]  # fmt: skip


def record_checkpoint_samples(store: Store, meta: dict[str, Any]) -> int:
    """Re-record the turns a checkpoint trained whose ``samples`` rows a crash left out;
    returns how many (exactly once: the meta's ``turn_ids`` were written before the rows).
    Turns no longer in the store (a user forgotten since, ``clawrl users forget``) are
    skipped."""
    missing = [t for t in meta.get("turn_ids", [])
               if store.get_sample(t) is None and store.get_turn(t) is not None]  # fmt: skip
    if missing:
        store.record_samples(
            trained_records(missing, int(meta["step"]), int(meta["policy_version"]))
        )
    return len(missing)


def published(version: int, weights: Any, step: int, *, full: bool = False) -> PolicyVersionRecord:
    """The store's record of a version the trainer saved.

    Args:
        version: the new policy version.
        weights: a directory (a LoRA adapter, or with ``full`` a directory holding
            ``model.safetensors``: every replica on this filesystem loads it), or full weights
            held in memory (not loadable by another process: recorded without a path).
        step: the training step that produced it.
        full: the weights are the whole model (full fine-tuning), not a LoRA adapter.
    """
    path = str(Path(weights).resolve()) if isinstance(weights, str | Path) else None
    if full or path is None:
        return PolicyVersionRecord(version, WeightsKind.FULL, path, step)
    return PolicyVersionRecord(version, WeightsKind.LORA, path, step)


def with_teacher(
    trainer: Trainer, samples: list[TrainSample], prompts: list[list[int] | None], *, base: bool
) -> list[TrainSample]:
    """``samples`` with the OPD teacher log-probs the trainer computes for each one whose hinted
    prompt (``prompts[i]``) is given (:meth:`clawrl.trainer.Trainer.teacher_logprobs`, with the
    weights it holds now; ``base``: the frozen base weights); the others as they are. Used at
    step time by ``clawrl train`` and by the online learner with ``teacher_scoring=trainer``."""
    hinted = [i for i, p in enumerate(prompts) if p is not None]
    if not hinted:
        return list(samples)
    requests = [
        TrainSample(prompts[i] or [], samples[i].completion_ids,
                    [0.0] * len(samples[i].completion_ids), temperature=samples[i].temperature)
        for i in hinted
    ]  # fmt: skip
    out = list(samples)
    for i, lp in zip(hinted, trainer.teacher_logprobs(requests, base=base), strict=True):
        out[i] = dataclasses.replace(out[i], teacher_logprobs=lp)
    return out


def mean_gap(memory: list[float], student: list[float]) -> float:
    """The memory's teacher-student gap on one turn: the mean over its sampled tokens of
    ``log π(a_t | s + memory) - log π(a_t | s)`` (nats per token). The tokens were sampled with
    the memory, so this estimates KL(π(·|s + memory) || π(·|s)) per token: near 0 when the
    weights alone do what the memory made them do."""
    if len(memory) != len(student) or not memory:
        raise ValueError("the gap needs two aligned, non-empty log-prob lists")
    return sum(m - s for m, s in zip(memory, student, strict=True)) / len(memory)


def with_distillation(
    trainer: Trainer,
    samples: list[TrainSample],
    parts: list[Distillation | None],
    *,
    base: bool,
) -> tuple[list[TrainSample], list[float | None]]:
    """``samples`` with the teacher and student log-probs of each distilled one
    (``parts[i]`` given), computed by the trainer with the weights it holds now: the teacher
    on ``teacher_prompt`` (``base``: the frozen base weights), the student on the prompt
    without the memory (the sample's own, current weights). Also returns each distilled
    sample's :func:`mean_gap` (memory prompt vs none, both with the current weights; ``None``
    for the others). Three forward passes per distilled sample at most (two without a hint
    and the policy teacher)."""
    idx = [i for i, p in enumerate(parts) if p is not None]
    gaps: list[float | None] = [None] * len(samples)
    if not idx:
        return list(samples), gaps

    def request(prompt: list[int], s: TrainSample) -> TrainSample:
        return TrainSample(prompt, s.completion_ids, [0.0] * len(s.completion_ids),
                           temperature=s.temperature)  # fmt: skip

    dist = [p for p in parts if p is not None]
    student = trainer.teacher_logprobs([request(samples[i].prompt_ids, samples[i]) for i in idx])
    memory = trainer.teacher_logprobs(
        [request(p.memory_prompt, samples[i]) for i, p in zip(idx, dist, strict=True)]
    )
    same = [not p.hinted and not base for p in dist]  # the teacher is the memory prompt, now
    others = [(i, p) for i, p, s in zip(idx, dist, same, strict=True) if not s]
    scored_teacher = iter(
        trainer.teacher_logprobs([request(p.teacher_prompt, samples[i]) for i, p in others],
                                 base=base)
        if others else []
    )  # fmt: skip
    out = list(samples)
    for k, i in enumerate(idx):
        teacher = memory[k] if same[k] else next(scored_teacher)
        out[i] = dataclasses.replace(out[i], teacher_logprobs=teacher,
                                     student_logprobs=student[k])  # fmt: skip
        gaps[i] = mean_gap(memory[k], student[k])
    return out, gaps


def record_gaps(
    memory: MemoryKeeper | None,
    turn_ids: Sequence[str],
    parts: Sequence[Distillation | None],
    gaps: Sequence[float | None],
    *,
    step: int,
    before_write: Callable[[], None] | None = None,
) -> tuple[dict[str, float], list[MemoryEntryRecord]]:
    """A step's distillation metrics (``distill/samples``, ``distill/gap``: the mean of the
    :func:`mean_gap` of its distilled turns), and, with a ``memory``, each distilled turn's gap
    recorded there (:meth:`clawrl.memory.MemoryKeeper.record_distillation`), which may retire
    entries (``memory/retired``). Both learners call it before their step: the gaps are those of
    the weights the step starts from (a retried step records a turn once: the keeper skips the
    turns it has).

    Args:
        memory: the keeper that records, or None (a rank other than 0: metrics only).
        turn_ids, parts, gaps: aligned per sample (``parts[i]`` / ``gaps[i]`` None when sample
            ``i`` is not distilled).
        step: the step being trained (1-based).
        before_write: called before the store is written (``clawrl train``'s lease check); what
            it raises propagates (fencing: a trainer that lost the lease retires nothing).

    Returns:
        ``(metrics, retired entries)``; ``({}, [])`` when no sample was distilled. An error of
        the memory's bookkeeping is logged, never raised: it does not stop training.
    """
    measured = [g for g in gaps if g is not None]
    if not measured:
        return {}, []
    metrics = {"distill/samples": float(len(measured)),
               "distill/gap": sum(measured) / len(measured)}  # fmt: skip
    if memory is None:
        return metrics, []
    seen = [(t, p.entries, g) for t, p, g in zip(turn_ids, parts, gaps, strict=True)
            if p is not None and g is not None]  # fmt: skip
    if before_write is not None:
        before_write()
    try:
        retired = memory.record_distillation(seen, step=step)
    except Exception:
        log.exception("recording the memory's distillation gaps")
        return metrics, []
    metrics["memory/retired"] = float(len(retired))
    return metrics, retired
