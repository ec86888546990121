"""Policy losses: one pure function per loss, ``LossInputs -> LossOutputs``, picked by config type.

The losses only consume advantages; credit assignment lives in ``advantages.py``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from clawrl.algorithms.aggregation import aggregate
from clawrl.algorithms.config import LossConfig, PPOClipLoss
from clawrl.algorithms.importance import ratio_terms
from clawrl.algorithms.kl import kl_estimate, kl_k3
from clawrl.algorithms.metrics import (
    advantage_stats,
    masked_max,
    masked_mean,
    masked_min,
    to_floats,
)
from clawrl.algorithms.types import LossInputs, LossOutputs, as_bool_mask, effective_mask

_TOKEN_FIELDS = (
    "policy_logprobs",
    "sampling_logprobs",
    "advantages",
    "loss_mask",
    "old_logprobs",
    "ref_logprobs",
    "entropy",
)


def validate_loss_inputs(inputs: LossInputs) -> None:
    """Raise ``ValueError`` unless every ``[B, T]`` field shares one 2-D shape and ``truncated`` is ``[B]``."""
    shape = inputs.policy_logprobs.shape
    if len(shape) != 2:
        raise ValueError(f"policy_logprobs must be [B, T], got {list(shape)}")
    for name in _TOKEN_FIELDS:
        value = getattr(inputs, name)
        if value is not None and value.shape != shape:
            raise ValueError(f"{name} has shape {list(value.shape)}, expected {list(shape)}")
    if inputs.truncated is not None and inputs.truncated.shape != shape[:1]:
        raise ValueError(
            f"truncated has shape {list(inputs.truncated.shape)}, expected [{shape[0]}]"
        )


def _where(mask: Tensor, values: Tensor) -> Tensor:
    """``values`` on masked tokens, 0 elsewhere; gradients to unmasked positions are exactly 0."""
    return torch.where(mask, values, torch.zeros_like(values))


def ppo_clip_loss(inputs: LossInputs, config: PPOClipLoss) -> LossOutputs:
    """PPO clipped surrogate with asymmetric clip, dual clip, mismatch correction and KL penalty.

    Per masked token (``m_{i,t} = 1``)::

        ρ_t   = exp(log π_θ(a_t) - log π_base(a_t))            π_base: sampling (default) or old
        ℓ^PG  = -min(ρ_t A_t, clip(ρ_t, 1 - ε_low, 1 + ε_high) A_t)
        ℓ^PG  = min(ℓ^PG, -c A_t)              if A_t < 0 and dual clip c is set
        ℓ_t   = w_t ℓ^PG + β k(π_θ, π_ref)_t   w_t: detached TIS/MIS weight (1 without)
        L     = aggregate(ℓ, m)                 token-mean, seq-mean-token-mean, or seq-sum / L_max

    Sources: PPO (Schulman et al. 2017, arXiv:1707.06347); asymmetric "clip-higher" and
    token-mean (DAPO, Yu et al. 2025, arXiv:2503.14476); dual clip (Ye et al. 2020,
    arXiv:1912.09729); k3 KL penalty in the loss (GRPO, DeepSeekMath, Shao et al. 2024,
    arXiv:2402.03300); TIS (Yao et al. 2025); MIS (Liu et al. 2025). Deviations: the ratio's
    denominator is by default the engine's ``sampling_logprobs``, not a trainer recompute.

    Gradients: with ``ρ = 1`` and no KL the gradient is REINFORCE's ``-A_t ∇log π_θ(a_t) / N``;
    tokens whose ratio is clipped on the side set by the sign of ``A`` (``ρ > 1+ε_high, A > 0`` or
    ``ρ < 1-ε_low, A < 0``), and ``A < 0, ρ > c`` under dual clip, get exactly zero policy gradient.

    Masking: ``m = loss_mask``, minus every token of truncated sequences when
    ``config.mask_truncated`` (DAPO overlong filtering). Masked tokens are left out of numerators
    and denominators: a batch whose only sequences are truncated therefore has *no* tokens and a
    loss of exactly 0 with zero gradient (``tokens/count`` = 0 reports it), and in a batch that
    mixes truncated and complete sequences, per-token losses all equal to 1 give exactly 1.0 (the
    bug this guards against is dividing by the count before truncation masking). Values at masked
    positions are never read, so padding may hold anything.

    Args:
        inputs: ``[B, T]`` log-probs, advantages and mask (see ``LossInputs``).
        config: clip range, dual clip, ratio/mismatch correction, KL penalty, aggregation.

    Returns:
        ``LossOutputs`` with a ``[]`` loss and metrics ``loss/*``, ``clip/low_frac``,
        ``clip/high_frac``, ``clip/dual_frac``, ``ratio/*``, ``kl/approx`` (k3 estimate of
        KL(π_base || π_θ)), ``kl/mismatch`` (k3 estimate of KL(π_sampling || π_trainer), trainer =
        ``old_logprobs`` if given else ``policy_logprobs``), ``kl/ref`` (when ``ref_logprobs`` is
        given), ``is/*`` (TIS/MIS), ``logprob/mean`` (mean log π_θ of the trained tokens,
        nats), ``entropy/mean`` (when given), ``adv/*``, ``tokens/count``,
        ``tokens/masked_truncated``, ``seqs/count``.

    Raises:
        ValueError: shapes disagree, or a needed input (``old_logprobs``, ``ref_logprobs``) is None.
    """
    validate_loss_inputs(inputs)
    loss_mask = as_bool_mask(inputs.loss_mask)
    mask = effective_mask(loss_mask, inputs.truncated, config.mask_truncated)
    terms = ratio_terms(config.ratio, inputs, mask)

    policy = inputs.policy_logprobs
    log_ratio = _where(mask, policy - terms.baseline_logprobs)
    ratio = torch.exp(log_ratio)
    advantages = _where(mask, inputs.advantages.detach())

    clipped_ratio = ratio.clamp(1.0 - config.eps_low, 1.0 + config.eps_high)
    pg_loss = -torch.minimum(ratio * advantages, clipped_ratio * advantages)
    if config.dual_clip is not None:
        pg_loss = torch.where(
            advantages < 0, torch.minimum(pg_loss, -config.dual_clip * advantages), pg_loss
        )
    if terms.is_weight is not None:
        pg_loss = pg_loss * terms.is_weight

    metrics: dict[str, Tensor] = {}
    per_token = pg_loss
    kl_ref: Tensor | None = None
    if inputs.ref_logprobs is not None:
        kl_ref = kl_estimate(
            _where(mask, policy), _where(mask, inputs.ref_logprobs.detach()), config.kl.estimator
        )
        metrics["kl/ref"] = masked_mean(kl_ref.detach(), mask)
    if config.kl.beta > 0:
        if kl_ref is None:
            raise ValueError("the KL penalty (beta > 0) needs LossInputs.ref_logprobs")
        per_token = pg_loss + config.kl.beta * kl_ref

    loss = aggregate(per_token, mask, config.aggregation, inputs.normalizers)

    with torch.no_grad():
        metrics["loss/total"] = loss.detach()
        metrics["loss/policy"] = aggregate(pg_loss, mask, config.aggregation, inputs.normalizers)
        metrics["loss/kl"] = metrics["loss/total"] - metrics["loss/policy"]
        dtype = ratio.dtype
        low = (ratio < 1.0 - config.eps_low) & (advantages < 0)
        high = (ratio > 1.0 + config.eps_high) & (advantages > 0)
        metrics["clip/low_frac"] = masked_mean(low.to(dtype), mask)
        metrics["clip/high_frac"] = masked_mean(high.to(dtype), mask)
        if config.dual_clip is not None:
            dual = (ratio > config.dual_clip) & (advantages < 0)
            metrics["clip/dual_frac"] = masked_mean(dual.to(dtype), mask)
        metrics["ratio/mean"] = masked_mean(ratio, mask)
        metrics["ratio/min"] = masked_min(ratio, mask)
        metrics["ratio/max"] = masked_max(ratio, mask)
        # mean log π_θ(a_t|s) of the trained tokens (nats): minus the supervised NLL
        metrics["logprob/mean"] = masked_mean(policy.detach(), mask)
        # Tokens were drawn from (about) π_base, so k3(log π_θ/π_base) estimates KL(π_base || π_θ).
        metrics["kl/approx"] = masked_mean(kl_k3(log_ratio), mask)
        trainer = inputs.old_logprobs if inputs.old_logprobs is not None else policy
        mismatch = _where(mask, trainer.detach() - inputs.sampling_logprobs.detach())
        metrics["kl/mismatch"] = masked_mean(kl_k3(mismatch), mask)
        metrics.update(terms.metrics)
        if inputs.entropy is not None:
            metrics["entropy/mean"] = masked_mean(inputs.entropy.detach(), mask)
        metrics.update(advantage_stats(advantages, mask))
        metrics["tokens/count"] = mask.sum()
        metrics["tokens/masked_truncated"] = (loss_mask & ~mask).sum()
        metrics["seqs/count"] = mask.any(dim=-1).sum()

    return LossOutputs(loss=loss, metrics=to_floats(metrics))


_LOSSES: dict[type, Callable[[LossInputs, LossConfig], LossOutputs]] = {
    PPOClipLoss: ppo_clip_loss,
}


def compute_loss(config: LossConfig, inputs: LossInputs) -> LossOutputs:
    """Run the loss that ``config``'s type selects (``PPOClipLoss`` -> ``ppo_clip_loss``)."""
    return _LOSSES[type(config)](inputs, config)
