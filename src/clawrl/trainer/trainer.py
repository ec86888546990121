"""The policy trainer: LoRA (or full) fine-tuning with clawrl's RL losses, saving versions.

One :meth:`Trainer.train_step` = one optimizer step over a batch of :class:`TrainSample`:

1. drop samples whose policy version lags the trainer's by more than ``max_staleness``
   (:func:`clawrl.algorithms.drop_stale`), and check each has what the method needs
   (:attr:`clawrl.config.TrainedMethod.needs`);
2. collate the whole batch once and compute the advantages over all of it
   (:func:`clawrl.algorithms.compute_advantages` with the method's advantage config) — group
   statistics (GRPO) therefore see every group whole, whatever the micro-batch size — together
   with the full-batch loss normalisers;
3. per micro-batch: recompute the policy's log-probs at each sample's sampling temperature and
   the reference log-probs when the KL penalty is on (LoRA: the same model with the adapter
   disabled, so no second model is held in memory; full fine-tuning: a frozen copy), slice the
   micro-batch's rows out of the full-batch advantages, and take the loss
   (:func:`clawrl.algorithms.compute_loss` with the method's loss config and the full-batch
   normalisers), so that gradient accumulation over micro-batches equals one full-batch step;
4. clip the gradient norm, step AdamW and the warmup schedule.

:meth:`Trainer.save_weights` saves the weights as a policy version; numbering it, the
checkpoint, the store's records and publishing are the learner's
(:class:`clawrl.trainer.learner.Learner`).

``old_logprobs`` (the policy before this optimizer step) are the trainer's own log-probs without
gradient: one optimizer step is taken per batch, so the weights do not change between the
micro-batches of a step. The importance ratios ``old`` / ``tis`` / ``mis`` use them. The OPD
advantage's ``log π_old`` is the engine's sampling log-probs of the same turn (the student at
sampling time), as in OpenClaw-RL; for a turn distilled out of its memory, whose tokens were
sampled with a memory block the student no longer sees, it is the student's own log-probs
without the block (``TrainSample.student_logprobs``), and the importance options
(``tis`` / ``mis``) weigh the sampling mismatch.
"""

from __future__ import annotations

import copy
import functools
import json
import logging
import os
import random
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from clawrl.algorithms import (
    AdvantageInputs,
    LossInputs,
    compute_advantages,
    compute_loss,
    count_normalizers,
    drop_stale,
)
from clawrl.config import TrainedMethod, TrainerConfig
from clawrl.errors import ConfigError, TrainerError
from clawrl.trainer.batch import Batch, TokenLogprobs, collate, step_reward_inputs
from clawrl.trainer.types import TrainSample

log = logging.getLogger(__name__)


def release_free_memory() -> bool:
    """Return the C heap's free pages to the OS (glibc ``malloc_trim(0)``); True if it ran.

    A training step allocates gigabytes of short-lived ``[B, K, vocab]`` tensors on CPU; glibc
    keeps the freed heap mapped, so a long-running server's RSS climbs step after step although
    nothing leaks. Measured on SmolLM2-135M, 4 samples of up to 764 tokens: 8.2 GB resident
    between steps without it, 1.6 GB with it (``benchmarks/trainer_memory.py``). A no-op
    (False) off glibc.
    """
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


@functools.cache
def _malloc_trim() -> Any:
    """glibc's ``malloc_trim``, looked up once (``find_library`` runs ``ldconfig``), or None."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None


def attach_lora(model: torch.nn.Module, s: TrainerConfig) -> torch.nn.Module:
    """Wrap ``model`` with a fresh LoRA adapter on all linear layers (PEFT)."""
    from peft import LoraConfig, get_peft_model

    cfg = LoraConfig(
        r=s.lora_rank,
        lora_alpha=s.lora_alpha,
        lora_dropout=s.lora_dropout,
        target_modules="all-linear",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, cfg)


class Trainer:
    """Trains a private copy of the policy and publishes new versions.

    Args:
        base_model: the policy's base weights; the trainer deep-copies it (unless
            ``copy_model`` is False), so the engine may keep serving the original.
        config: the training settings, the method among them (:class:`clawrl.config.TrainerConfig`).
        output_dir: where versions (``policies/vN``) and checkpoints (``checkpoints/``) go;
            default ``config.output_dir``.
        policy_version: the version the engine serves now (resume sets it from a checkpoint).
        copy_model: deep-copy ``base_model`` (default) or train it in place (a trainer process
            that loaded the weights for itself).
        computes_teacher: the trainer computes OPD teacher log-probs itself
            (:meth:`teacher_logprobs`; ``clawrl train``), so full fine-tuning with the ``base``
            teacher keeps a frozen copy of the base weights even without a KL penalty.

    Raises:
        ConfigError: the method trains nothing (``off``).
    """

    def __init__(
        self,
        base_model: torch.nn.Module,
        config: TrainerConfig,
        output_dir: str | Path | None = None,
        *,
        policy_version: int = 0,
        copy_model: bool = True,
        computes_teacher: bool = False,
    ) -> None:
        if not config.method.trains:
            raise ConfigError("the trainer needs a training method (trainer.method is 'off')")
        self.config = config
        self.method: TrainedMethod = config.method  # type: ignore[assignment]
        self.output_dir = Path(output_dir if output_dir is not None else config.output_dir)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(config.seed)
        needs_base = self.method.loss.kl.beta > 0 or (
            computes_teacher and self.method.needs.teacher == "base"
        )
        self.ref_model: torch.nn.Module | None = None
        if config.full_finetune and needs_base:
            self.ref_model = copy.deepcopy(base_model).eval().requires_grad_(False)
        model = copy.deepcopy(base_model) if copy_model else base_model
        model.train()
        self.model = model if config.full_finetune else attach_lora(model, config)
        self.device = next(self.model.parameters()).device
        self.policy_logprobs = TokenLogprobs(self.model)
        """The policy's log-probs (:class:`TokenLogprobs`); FSDP2 shards through it."""
        self.ref_logprobs = None if self.ref_model is None else TokenLogprobs(self.ref_model)
        self._shard()
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.reset_optimizer()
        self.step = 0
        self.policy_version = policy_version

    def fork(self, output_dir: str | Path) -> Trainer:
        """A trainer over this one's model (no copy: the same parameters, reference and
        devices) with its own optimizer, warm-up schedule, step, version (0) and output
        directory: one user's adapter (:class:`clawrl.trainer.users.UserTrainers` swaps each
        user's weights into the shared parameters before their step).

        Raises:
            ConfigError: full fine-tuning (a fork would share every weight).
        """
        if self.config.full_finetune:
            raise ConfigError("only a LoRA trainer can be forked (full fine-tuning shares "
                              "every weight)")  # fmt: skip
        other = copy.copy(self)
        other.output_dir = Path(output_dir)
        other.output_dir.mkdir(parents=True, exist_ok=True)
        other.step = 0
        other.policy_version = 0
        other.reset_optimizer()
        return other

    def reset_optimizer(self) -> None:
        """A fresh AdamW (no moments) and warm-up schedule over the trainable parameters, the
        weights kept: what a new phase of training starts with (after a supervised warm start,
        :mod:`clawrl.harness.warmstart`)."""
        config = self.config
        self.optimizer = torch.optim.AdamW(
            self.params, lr=config.lr, weight_decay=config.weight_decay
        )
        warm = max(0, config.warmup_steps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: min(1.0, (step + 1) / warm) if warm else 1.0
        )

    # ----------------------------------------------------------------- data parallelism

    def _shard(self) -> None:
        """Shard the model across ranks before the optimizer sees its parameters (FSDP2:
        :class:`clawrl.trainer.fsdp.ShardedTrainer`); one process shards nothing."""

    def _rank_rows(self, n: int) -> range:
        """The rows of an ``n``-sample batch this rank computes (one process: all)."""
        return range(n)

    def _passes(self, n: int, micro_batch: int) -> int:
        """Forward passes every rank makes for an ``n``-sample batch: the most any rank needs
        (FSDP2's collectives need the same count on every rank; a rank with fewer rows makes
        passes that weigh nothing)."""
        return -(-n // micro_batch)

    def _gather(self, parts: list[Any]) -> list[Any]:
        """Every rank's ``parts``, in rank order (one process: its own)."""
        return parts

    def _before_backward(self, index: int, passes: int) -> None:
        """Called before the backward pass ``index`` of ``passes`` in a step (FSDP2 reduces
        gradients over ranks only at the last: :class:`clawrl.trainer.fsdp.ShardedTrainer`);
        one process does nothing."""

    def _micro_batches(self, n: int) -> list[tuple[int, int] | None]:
        """This rank's ``(start, stop)`` row ranges of an ``n``-sample batch, padded with
        ``None`` (a pass that weighs nothing) to :meth:`_passes`."""
        mb = max(1, self.config.micro_batch_size)
        rows = self._rank_rows(n)
        out: list[tuple[int, int] | None] = [
            (s, min(s + mb, rows.stop)) for s in range(rows.start, rows.stop, mb)
        ]
        return out + [None] * (self._passes(n, mb) - len(out))

    # ----------------------------------------------------------------- training

    def _ref_logprobs(self, batch: Batch, method: TrainedMethod) -> torch.Tensor | None:
        if method.loss.kl.beta <= 0:
            return None
        return self._base_logprobs(batch)

    def _base_logprobs(self, batch: Batch) -> torch.Tensor:
        """``[B, L-1]`` log-probs under the frozen base weights, without gradient."""
        with torch.no_grad():
            if self.ref_logprobs is not None:
                return self.ref_logprobs(batch)[0]
            with self.model.disable_adapter():  # type: ignore[operator]
                return self.policy_logprobs(batch)[0]

    def teacher_logprobs(
        self, requests: list[TrainSample], *, base: bool = False
    ) -> list[list[float]]:
        """OPD teacher log-probs computed by the trainer itself (``clawrl train``).

        Each request is a hint-enhanced prompt with the turn's sampled ids (``prompt_ids`` the
        hinted prompt, ``completion_ids`` the turn's, ``temperature`` the turn's; its
        ``sampling_logprobs`` are ignored). The teacher is the current policy, or the frozen base
        weights with ``base`` (a LoRA adapter disabled; full fine-tuning: the frozen copy), as
        ``engine.score`` of the in-process learner (:mod:`clawrl.trainer.online`) computes
        them: ``log softmax(logits / T)`` of each sampled id, temperature 1 for greedy turns.

        Returns:
            Per request, ``[c]`` log π_teacher(a_t | s + hint), in request order.

        Raises:
            TrainerError: ``base`` without base weights to score with (full fine-tuning built
                without ``computes_teacher``).
        """
        if base and self.ref_logprobs is None and not hasattr(self.model, "disable_adapter"):
            raise TrainerError("the base teacher needs the frozen base weights "
                               "(build the trainer with computes_teacher=True)")  # fmt: skip
        self.model.eval()
        parts: list[tuple[int, list[list[float]]]] = []
        for rows in self._micro_batches(len(requests)):
            start, stop = rows or (0, 1)
            batch = collate(requests[start:stop]).to(self.device)
            if base:
                lp = self._base_logprobs(batch)
            else:
                with torch.no_grad():
                    lp = self.policy_logprobs(batch)[0]
            if rows is not None:
                mask = batch.loss_mask.cpu()
                values = lp.detach().cpu().double()
                parts += [(start + i, values[i][mask[i]].tolist()) for i in range(stop - start)]
        out = dict(x for rank_parts in self._gather([parts]) for x in rank_parts)
        return [out[i] for i in range(len(requests))]

    def train_step(
        self, samples: list[TrainSample], *, method: TrainedMethod | None = None
    ) -> dict[str, float]:
        """One optimizer step over ``samples``; returns ``/``-namespaced metrics.

        Args:
            samples: the batch, in the order the loss sums it.
            method: this step's method (advantage, loss, what a sample needs) instead of the
                trainer's own (``config.method``): the harness warm start's supervised steps.
                A KL penalty needs the reference model the trainer was built with.

        Raises:
            TrainerError: no sample survives the staleness filter, or a sample lacks what the
                method needs (a reward for ``rl``, ``grpo``, ``prm_outcome`` and
                ``precomputed``, a teacher for ``opd``; ``prm_outcome``: one sample per step of
                an episode).
        """
        t0 = time.perf_counter()
        stale = drop_stale(
            [s.policy_version for s in samples],
            self.policy_version,
            max_lag=self.config.max_staleness,
        )
        kept = [samples[i] for i in stale.kept]
        if not kept:
            raise TrainerError(f"all {len(samples)} samples are stale")
        method = self.method if method is None else method
        if method.loss.kl.beta > 0 and self.ref_logprobs is None and self.config.full_finetune:
            raise TrainerError(
                f"method {method.kind!r} has a KL penalty but this trainer was built without a "
                "reference model (its own method has none): full fine-tuning has no adapter "
                "to disable for the base weights"
            )
        self._check_method_inputs(kept, method)
        full = collate(kept)
        loss_config = method.loss
        normalizers = count_normalizers(
            full.loss_mask, full.truncated, mask_truncated=loss_config.mask_truncated
        )
        # Credit once over the whole batch (GRPO groups whole), sliced per micro-batch below.
        advantages = compute_advantages(method.advantage, self._advantage_inputs(full, method))
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        parts: list[tuple[float, dict[str, float]]] = []
        passes = self._micro_batches(len(kept))
        for index, rows in enumerate(passes):
            start, stop = rows or (0, 1)  # a pass that weighs nothing: row 0 again, loss x 0
            batch = collate(kept[start:stop]).to(self.device)
            width = batch.loss_mask.shape[1]  # right padding: a row's positions do not move
            policy_lp, entropy = self.policy_logprobs(batch)
            out = compute_loss(
                loss_config,
                LossInputs(
                    policy_logprobs=policy_lp,
                    sampling_logprobs=batch.sampling_logprobs,
                    advantages=advantages.advantages[start:stop, :width].to(self.device),
                    loss_mask=batch.loss_mask,
                    old_logprobs=policy_lp.detach(),
                    ref_logprobs=self._ref_logprobs(batch, method),
                    entropy=entropy,
                    truncated=batch.truncated,
                    normalizers=normalizers,
                ),
            )
            self._before_backward(index, len(passes))
            if rows is None:
                (out.loss * 0.0).backward()  # FSDP2's gradient reduction runs on every rank
                continue
            out.loss.backward()
            parts.append((float(out.loss.detach()), out.metrics))
        total_loss, totals = merge_micro_metrics(
            [p for rank_parts in self._gather([parts]) for p in rank_parts],
            normalizers.num_tokens,
        )
        grad_norm = self._clip_gradients()
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        release_free_memory()
        dt = time.perf_counter() - t0
        rewards = [s.reward for s in kept if s.reward is not None]
        metrics = {
            **totals,
            **advantages.metrics,
            "loss": total_loss,
            "grad/norm": grad_norm,
            "optim/lr": float(self.scheduler.get_last_lr()[0]),
            "samples/trained": float(len(kept)),
            "drop/stale": float(stale.num_dropped),
            "reward/mean": sum(rewards) / len(rewards) if rewards else 0.0,
            "hint/rate": sum(s.teacher_logprobs is not None for s in kept) / len(kept),
            "time/step": dt,
            "throughput/tokens_per_s": normalizers.num_tokens / dt if dt > 0 else 0.0,
            "step": float(self.step),
        }
        return metrics

    def _advantage_inputs(self, full: Batch, method: TrainedMethod) -> AdvantageInputs:
        """What the method's advantage estimator reads from the full batch (the step tensors
        only for a method whose samples carry step scores: :func:`step_reward_inputs`).

        Raises:
            TrainerError: two samples of one episode claim the same step.
        """
        step_scores = step_mask = token_steps = None
        if method.needs.step_scores:
            try:
                step_scores, step_mask, token_steps = step_reward_inputs(full)
            except ValueError as e:
                raise TrainerError(f"method {method.kind!r}: {e}") from e
        return AdvantageInputs(
            loss_mask=full.loss_mask,
            rewards=full.rewards,
            group_ids=full.group_ids,
            episode_ids=full.episode_ids,
            teacher_logprobs=full.teacher_logprobs,
            old_logprobs=full.student_logprobs,
            has_hint=full.has_hint,
            step_scores=step_scores,
            step_mask=step_mask,
            token_steps=token_steps,
        )

    def _clip_gradients(self) -> float:
        """The global L2 norm of the gradients, clipped to ``grad_clip`` when it is > 0.

        Sharded (DTensor) gradients give a norm over every rank's shards (``full_tensor``), so
        every rank clips by the same factor."""
        grads = [p.grad for p in self.params if p.grad is not None]
        total = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
        full_tensor = getattr(total, "full_tensor", None)
        if callable(full_tensor):
            total = full_tensor()
        if self.config.grad_clip > 0:
            torch.nn.utils.clip_grads_with_norm_(self.params, self.config.grad_clip, total)
        return float(total)

    def _check_method_inputs(self, samples: list[TrainSample], method: TrainedMethod) -> None:
        needs = method.needs
        kind = method.kind
        if needs.any_of == ("reward",) and any(s.reward is None for s in samples):
            raise TrainerError(f"method {kind!r} needs a reward on every sample")
        if needs.any_of == ("hint",) and any(s.teacher_logprobs is None for s in samples):
            raise TrainerError(f"method {kind!r} needs teacher log-probs (a hint) on every sample")

    # ----------------------------------------------------------------- publishing

    def save_weights(self, version: int) -> Path | dict[str, torch.Tensor]:
        """Save the current weights as ``version``: a LoRA adapter dir, or a state dict."""
        if self.config.full_finetune:
            return {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        target = self.output_dir / "policies" / f"v{version}"
        tmp = fresh_dir(target.with_name(target.name + ".tmp"))
        self.model.save_pretrained(str(tmp))  # type: ignore[operator]
        replace_dir(tmp, target)
        return target

    # ----------------------------------------------------------------- checkpoints

    def save_checkpoint(self, extra: dict[str, Any] | None = None) -> Path:
        """Atomically write adapter/weights, optimizer, scheduler, RNG, step and version."""
        ckpt_root = self.output_dir / "checkpoints"
        ckpt_root.mkdir(parents=True, exist_ok=True)
        target = ckpt_root / f"step-{self.step:06d}"
        tmp = ckpt_root / f".tmp-step-{self.step:06d}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        trainable = {
            n: p.detach().clone() for n, p in self.model.named_parameters() if p.requires_grad
        }
        torch.save(
            {
                "trainable": trainable,
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "rng_torch": torch.get_rng_state(),
                "rng_python": random.getstate(),
            },
            tmp / "state.pt",
        )
        meta = {"step": self.step, "policy_version": self.policy_version, **(extra or {})}
        commit_checkpoint(tmp, target, meta, keep=self.config.keep_checkpoints)
        return target

    def load_checkpoint(self, path: str | Path | None = None) -> dict[str, Any] | None:
        """Restore the latest (or given) checkpoint; returns its meta, or None if there is none.

        Raises:
            TrainerError: the checkpoint's parameter names do not match this model (lists the
                missing and unexpected names) — never a silent fresh start.
        """
        path = checkpoint_path(self.output_dir, path)
        if path is None:
            return None
        state = torch.load(path / "state.pt", weights_only=False)
        names = {n for n, p in self.model.named_parameters() if p.requires_grad}
        saved = set(state["trainable"])
        if names != saved:
            raise TrainerError(
                f"checkpoint {path} does not match the model: missing "
                f"{sorted(names - saved)[:10]}, unexpected {sorted(saved - names)[:10]}"
            )
        with torch.no_grad():
            params = dict(self.model.named_parameters())
            for n, v in state["trainable"].items():
                params[n].copy_(v)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["rng_torch"])
        random.setstate(state["rng_python"])
        meta = json.loads((path / "meta.json").read_text())
        self.step = int(meta["step"])
        self.policy_version = int(meta["policy_version"])
        return meta


def merge_micro_metrics(
    parts: list[tuple[float, dict[str, float]]], num_tokens: float
) -> tuple[float, dict[str, float]]:
    """One step's loss and metrics from its micro-batches' ``(loss, metrics)`` (every rank's).

    Losses, counts (``tokens/``, ``seqs/``) and shares of the loss (``loss/``) add up;
    ``/min`` and ``/max`` take the extreme over micro-batches that trained a token; every other
    metric is a token mean, so each micro-batch weighs by its share of the batch's
    ``num_tokens`` trained tokens. ``adv/`` metrics are left out (the caller has them for the
    whole batch)."""
    totals: dict[str, float] = {}
    total_loss = 0.0
    for loss, metrics in parts:
        total_loss += loss
        weight = metrics.get("tokens/count", 0.0) / max(1.0, num_tokens)
        for k, v in metrics.items():
            if k.startswith(("tokens/", "seqs/", "loss/")):  # counts; shares of the loss
                totals[k] = totals.get(k, 0.0) + v
            elif k.endswith(("/min", "/max")):
                if weight > 0:  # a micro-batch without trained tokens has no extremes
                    pick = min if k.endswith("/min") else max
                    totals[k] = pick(totals.get(k, v), v)
            elif not k.startswith("adv/"):  # advantages: full-batch metrics
                totals[k] = totals.get(k, 0.0) + v * weight
    return total_loss, totals


def fresh_dir(path: Path) -> Path:
    """``path`` emptied (what an interrupted write left there is removed); not created."""
    if path.exists():
        shutil.rmtree(path)
    return path


def replace_dir(tmp: Path, target: Path) -> None:
    """Put the finished directory ``tmp`` in ``target``'s place."""
    if target.exists():
        shutil.rmtree(target)
    os.replace(tmp, target)


def commit_checkpoint(tmp: Path, target: Path, meta: dict[str, Any], *, keep: int) -> None:
    """Finish a checkpoint written to ``tmp``: its ``meta.json``, the rename to ``target``,
    then ``latest`` pointing at it (atomic: a crash before leaves ``latest`` at the previous
    one); with ``keep`` > 0 only the newest ``keep`` checkpoints survive."""
    root = target.parent
    (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
    replace_dir(tmp, target)
    (root / "latest.tmp").write_text(target.name)
    os.replace(root / "latest.tmp", root / "latest")
    if keep:  # ``latest`` already points past the others
        for old in sorted(root.glob("step-*"))[:-keep]:
            shutil.rmtree(old, ignore_errors=True)


def checkpoint_path(output_dir: Path, path: str | Path | None = None) -> Path | None:
    """``path``, or the checkpoint ``output_dir/checkpoints/latest`` names (``None``: none)."""
    if path is not None:
        return Path(path)
    latest = output_dir / "checkpoints" / "latest"
    if not latest.is_file():
        return None
    return latest.parent / latest.read_text().strip()
