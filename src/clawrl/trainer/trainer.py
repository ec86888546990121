"""The policy trainer: LoRA (or full) fine-tuning with clawrl's RL losses, publishing versions.

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

:meth:`Trainer.publish` then saves the weights as policy version v+1 and hands them to the
engine, which swaps them in between requests.

``old_logprobs`` (the policy before this optimizer step) are the trainer's own log-probs without
gradient: one optimizer step is taken per batch, so the weights do not change between the
micro-batches of a step. The importance ratios ``old`` / ``tis`` / ``mis`` use them. The OPD
advantage's ``log π_old`` is the engine's sampling log-probs of the same turn (the student at
sampling time), as in OpenClaw-RL.
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
from clawrl.engine import Engine
from clawrl.errors import ConfigError, TrainerError
from clawrl.trainer.batch import Batch, collate, token_logprobs
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
        base_model: the policy's base weights; the trainer deep-copies it, so the engine may
            keep serving the original.
        config: the training settings, the method among them (:class:`clawrl.config.TrainerConfig`).
        output_dir: where versions (``policies/vN``) and checkpoints (``checkpoints/``) go;
            default ``config.output_dir``.
        policy_version: the version the engine serves now (resume sets it from a checkpoint).

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
    ) -> None:
        if not config.method.trains:
            raise ConfigError("the trainer needs a training method (trainer.method is 'off')")
        self.config = config
        self.method: TrainedMethod = config.method  # type: ignore[assignment]
        self.output_dir = Path(output_dir if output_dir is not None else config.output_dir)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(config.seed)
        model = copy.deepcopy(base_model)
        model.train()
        self.ref_model: torch.nn.Module | None = None
        if config.full_finetune:
            self.model = model
            if self.method.loss.kl.beta > 0:
                self.ref_model = copy.deepcopy(base_model).eval().requires_grad_(False)
        else:
            self.model = attach_lora(model, config)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            self.params, lr=config.lr, weight_decay=config.weight_decay
        )
        warm = max(0, config.warmup_steps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: min(1.0, (step + 1) / warm) if warm else 1.0
        )
        self.step = 0
        self.policy_version = policy_version

    # ----------------------------------------------------------------- training

    def _ref_logprobs(self, batch: Batch) -> torch.Tensor | None:
        if self.method.loss.kl.beta <= 0:
            return None
        with torch.no_grad():
            if self.ref_model is not None:
                return token_logprobs(self.ref_model, batch)[0]
            with self.model.disable_adapter():  # type: ignore[operator]
                return token_logprobs(self.model, batch)[0]

    def train_step(self, samples: list[TrainSample]) -> dict[str, float]:
        """One optimizer step over ``samples``; returns ``/``-namespaced metrics.

        Raises:
            TrainerError: no sample survives the staleness filter, or a sample lacks what the
                method needs (a reward for ``rl``, ``grpo`` and ``precomputed``, a teacher for
                ``opd``).
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
        self._check_method_inputs(kept)
        full = collate(kept)
        loss_config = self.method.loss
        normalizers = count_normalizers(
            full.loss_mask, full.truncated, mask_truncated=loss_config.mask_truncated
        )
        # Credit once over the whole batch (GRPO groups whole), sliced per micro-batch below.
        advantages = compute_advantages(
            self.method.advantage,
            AdvantageInputs(
                loss_mask=full.loss_mask,
                rewards=full.rewards,
                group_ids=full.group_ids,
                episode_ids=full.episode_ids,
                teacher_logprobs=full.teacher_logprobs,
                old_logprobs=full.sampling_logprobs,
                has_hint=full.has_hint,
            ),
        )
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        totals: dict[str, float] = {}
        total_loss = 0.0
        mb = max(1, self.config.micro_batch_size)
        for start in range(0, len(kept), mb):
            batch = collate(kept[start : start + mb])
            width = batch.loss_mask.shape[1]  # right padding: a row's positions do not move
            policy_lp, entropy = token_logprobs(self.model, batch)
            out = compute_loss(
                loss_config,
                LossInputs(
                    policy_logprobs=policy_lp,
                    sampling_logprobs=batch.sampling_logprobs,
                    advantages=advantages.advantages[start : start + mb, :width],
                    loss_mask=batch.loss_mask,
                    old_logprobs=policy_lp.detach(),
                    ref_logprobs=self._ref_logprobs(batch),
                    entropy=entropy,
                    truncated=batch.truncated,
                    normalizers=normalizers,
                ),
            )
            out.loss.backward()
            total_loss += float(out.loss.detach())
            # token-mean metrics weigh each micro-batch by its share of the tokens trained
            weight = out.metrics.get("tokens/count", 0.0) / max(1.0, normalizers.num_tokens)
            for k, v in out.metrics.items():
                if k.startswith(("tokens/", "seqs/", "loss/")):  # counts; shares of the loss
                    totals[k] = totals.get(k, 0.0) + v
                elif k.endswith(("/min", "/max")):
                    if weight > 0:  # a micro-batch without trained tokens has no extremes
                        pick = min if k.endswith("/min") else max
                        totals[k] = pick(totals.get(k, v), v)
                elif not k.startswith("adv/"):  # advantages: full-batch metrics below
                    totals[k] = totals.get(k, 0.0) + v * weight
        grad_norm = (
            float(torch.nn.utils.clip_grad_norm_(self.params, self.config.grad_clip))
            if self.config.grad_clip > 0
            else float(
                torch.linalg.vector_norm(
                    torch.stack([p.grad.norm() for p in self.params if p.grad is not None])
                )
            )
        )
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

    def _check_method_inputs(self, samples: list[TrainSample]) -> None:
        needs = self.method.needs
        kind = self.method.kind
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
        tmp = target.with_name(target.name + ".tmp")
        if tmp.exists():
            shutil.rmtree(tmp)
        self.model.save_pretrained(str(tmp))  # type: ignore[operator]
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
        return target

    def publish(self, engine: Engine) -> int:
        """Save weights as version v+1 and queue them on ``engine``; returns v+1.

        The engine swaps them in between requests (requests in flight finish on v); the future
        :meth:`clawrl.engine.Engine.load_policy` returns is not awaited here."""
        version = self.policy_version + 1
        weights = self.save_weights(version)
        engine.load_policy(version, weights)
        self.policy_version = version
        return version

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
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
        (ckpt_root / "latest.tmp").write_text(target.name)
        os.replace(ckpt_root / "latest.tmp", ckpt_root / "latest")
        keep = self.config.keep_checkpoints
        if keep:  # the newest ``keep`` survive; ``latest`` already points past the others
            for old in sorted(ckpt_root.glob("step-*"))[:-keep]:
                shutil.rmtree(old, ignore_errors=True)
        return target

    def load_checkpoint(self, path: str | Path | None = None) -> dict[str, Any] | None:
        """Restore the latest (or given) checkpoint; returns its meta, or None if there is none.

        Raises:
            TrainerError: the checkpoint's parameter names do not match this model (lists the
                missing and unexpected names) — never a silent fresh start.
        """
        root = self.output_dir / "checkpoints"
        if path is None:
            latest = root / "latest"
            if not latest.is_file():
                return None
            path = root / latest.read_text().strip()
        path = Path(path)
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
