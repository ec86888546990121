"""The policy trainer: LoRA (or full) fine-tuning with clawrl's RL losses, publishing versions.

One :meth:`Trainer.train_step` = one optimizer step over a batch of :class:`TrainSample`:

1. drop samples whose policy version lags the trainer's by more than ``max_staleness``
   (:func:`clawrl.algorithms.drop_stale`);
2. per micro-batch: recompute the policy's log-probs at each sample's sampling temperature,
   the reference log-probs (LoRA: the same model with the adapter disabled, so no second model
   is held in memory; full fine-tuning: a frozen copy), the advantages
   (:func:`clawrl.algorithms.compute_advantages`) and the loss
   (:func:`clawrl.algorithms.compute_loss`) with full-batch normalisers, so that gradient
   accumulation over micro-batches equals one full-batch step;
3. clip the gradient norm, step AdamW and the warmup schedule.

:meth:`Trainer.publish` then saves the weights as policy version v+1 and hands them to the
engine, which swaps them in between requests.

The OPD advantage uses ``log π_old`` = the engine's sampling log-probs of the same turn (the
student at sampling time), as in OpenClaw-RL.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from clawrl.algorithms import (
    AdvantageInputs,
    BinaryRLAdvantage,
    CombinedAdvantage,
    GRPOAdvantage,
    KLPenalty,
    LossInputs,
    OPDAdvantage,
    PPOClipLoss,
    PrecomputedAdvantage,
    compute_advantages,
    compute_loss,
    count_normalizers,
    drop_stale,
)
from clawrl.errors import TrainerError
from clawrl.trainer.batch import collate, token_logprobs
from clawrl.trainer.types import TrainSample

log = logging.getLogger(__name__)

Method = Literal["rl", "opd", "combine", "grpo", "precomputed"]


@dataclass(frozen=True)
class TrainerSettings:
    """Optimisation settings (the CLI fills these from ``clawrl.config.TrainerConfig``).

    Attributes:
        method: ``rl`` (Binary RL), ``opd`` (hindsight OPD), ``combine`` (both), ``grpo``,
            ``precomputed`` (each sample's ``reward`` is its advantage; harness mode).
        lr: AdamW learning rate. weight_decay: AdamW weight decay.
        grad_clip: max global gradient L2 norm (0 disables).
        warmup_steps: linear warmup from 0 to ``lr`` over this many optimizer steps.
        lora_rank / lora_alpha / lora_dropout: LoRA on all linear layers; ignored when
            ``full_finetune``.
        micro_batch_size: samples per forward/backward pass (gradient accumulation). The
            online loop's default is 1 (``clawrl.config``): rows are padded to the longest.
        max_staleness: K, the most policy versions a sample may lag.
        kl_beta: β of the k3 KL penalty to the reference policy (0 disables).
        eps_low / eps_high: asymmetric PPO clip.
        w_rl / w_opd / opd_clip: the combined advantage's weights and OPD clip.
    """

    method: Method = "combine"
    lr: float = 1e-4
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    warmup_steps: int = 0
    full_finetune: bool = False
    lora_rank: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    micro_batch_size: int = 4
    max_staleness: int = 4
    kl_beta: float = 0.02
    eps_low: float = 0.2
    eps_high: float = 0.28
    w_rl: float = 1.0
    w_opd: float = 1.0
    opd_clip: float | None = None
    seed: int = 0


def advantage_config(s: TrainerSettings) -> Any:
    """The typed advantage config for a method (no string dispatch in the math)."""
    table: dict[str, Any] = {
        "rl": BinaryRLAdvantage(),
        "opd": OPDAdvantage(clip=s.opd_clip),
        "combine": CombinedAdvantage(w_rl=s.w_rl, w_opd=s.w_opd, opd_clip=s.opd_clip),
        "grpo": GRPOAdvantage(),
        "precomputed": PrecomputedAdvantage(),
    }
    return table[s.method]


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


def attach_lora(model: torch.nn.Module, s: TrainerSettings) -> torch.nn.Module:
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
        settings: see :class:`TrainerSettings`.
        output_dir: where versions (``policies/vN``) and checkpoints (``checkpoints/``) go.
        policy_version: the version the engine serves now (resume sets it from a checkpoint).
    """

    def __init__(
        self,
        base_model: torch.nn.Module,
        settings: TrainerSettings,
        output_dir: str | Path,
        *,
        policy_version: int = 0,
    ) -> None:
        self.settings = settings
        self.output_dir = Path(output_dir)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(settings.seed)
        model = copy.deepcopy(base_model)
        model.train()
        self.ref_model: torch.nn.Module | None = None
        if settings.full_finetune:
            self.model = model
            if settings.kl_beta > 0:
                self.ref_model = copy.deepcopy(base_model).eval().requires_grad_(False)
        else:
            self.model = attach_lora(model, settings)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            self.params, lr=settings.lr, weight_decay=settings.weight_decay
        )
        warm = max(0, settings.warmup_steps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: min(1.0, (step + 1) / warm) if warm else 1.0
        )
        self.step = 0
        self.policy_version = policy_version
        self.loss_config = PPOClipLoss(
            eps_low=settings.eps_low,
            eps_high=settings.eps_high,
            kl=KLPenalty(beta=settings.kl_beta),
        )
        self.advantage_config = advantage_config(settings)

    # ----------------------------------------------------------------- training

    def _ref_logprobs(self, batch: Any) -> torch.Tensor | None:
        if self.settings.kl_beta <= 0:
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
                method needs (a reward for ``rl``, a teacher for ``opd``).
        """
        t0 = time.perf_counter()
        stale = drop_stale(
            [s.policy_version for s in samples],
            self.policy_version,
            max_lag=self.settings.max_staleness,
        )
        kept = [samples[i] for i in stale.kept]
        if not kept:
            raise TrainerError(f"all {len(samples)} samples are stale")
        self._check_method_inputs(kept)
        full = collate(kept)
        normalizers = count_normalizers(full.loss_mask)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        totals: dict[str, float] = {}
        total_loss = 0.0
        mb = max(1, self.settings.micro_batch_size)
        for start in range(0, len(kept), mb):
            batch = collate(kept[start : start + mb])
            policy_lp, entropy = token_logprobs(self.model, batch)
            ref_lp = self._ref_logprobs(batch)
            adv = compute_advantages(
                self.advantage_config,
                AdvantageInputs(
                    loss_mask=batch.loss_mask,
                    rewards=batch.rewards,
                    group_ids=batch.group_ids,
                    teacher_logprobs=batch.teacher_logprobs,
                    old_logprobs=batch.sampling_logprobs,
                    has_hint=batch.has_hint,
                ),
            )
            out = compute_loss(
                self.loss_config,
                LossInputs(
                    policy_logprobs=policy_lp,
                    sampling_logprobs=batch.sampling_logprobs,
                    advantages=adv.advantages,
                    loss_mask=batch.loss_mask,
                    ref_logprobs=ref_lp,
                    entropy=entropy,
                    truncated=batch.truncated,
                    normalizers=normalizers,
                ),
            )
            out.loss.backward()
            total_loss += float(out.loss.detach())
            weight = float(batch.loss_mask.sum()) / max(1.0, normalizers.num_tokens)
            for k, v in {**adv.metrics, **out.metrics}.items():
                if k.startswith("tokens/"):
                    totals[k] = totals.get(k, 0.0) + v
                else:
                    totals[k] = totals.get(k, 0.0) + v * weight
        grad_norm = (
            float(torch.nn.utils.clip_grad_norm_(self.params, self.settings.grad_clip))
            if self.settings.grad_clip > 0
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
        m = self.settings.method
        if m in ("rl", "grpo", "precomputed") and any(s.reward is None for s in samples):
            raise TrainerError(f"method {m!r} needs a reward on every sample")
        if m == "opd" and any(s.teacher_logprobs is None for s in samples):
            raise TrainerError("method 'opd' needs teacher log-probs (a hint) on every sample")

    # ----------------------------------------------------------------- publishing

    def save_weights(self, version: int) -> Path | dict[str, torch.Tensor]:
        """Save the current weights as ``version``: a LoRA adapter dir, or a state dict."""
        if self.settings.full_finetune:
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

    def publish(self, engine: Any) -> int:
        """Save weights as version v+1 and queue them on ``engine``; returns v+1.

        The engine swaps them in between requests (requests in flight finish on v)."""
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
