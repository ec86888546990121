"""The importance ratio's denominator and the trainer-versus-engine mismatch weight.

The engine that samples (vLLM, SGLang, or the in-process engine in another precision) and the
trainer do not compute identical log-probs. Two ways to handle it:

- ``SamplingRatio`` (default): ``ρ_t = π_θ / π_sampling``; PPO clipping absorbs the mismatch.
- ``OldRatio``: ``ρ_t = π_θ / π_old`` with trainer-recomputed ``old_logprobs``; mismatch ignored.
- ``TruncatedIS`` / ``MaskedIS``: ``ρ_t = π_θ / π_old`` and the per-token policy loss is weighted
  by the detached ``w_t = π_old(a_t) / π_sampling(a_t)``, truncated at ``cap`` (TIS) or set to 0
  outside ``[low, high]`` (MIS). When ``old_logprobs == sampling_logprobs``, ``w_t = 1`` and both
  reduce exactly to ``OldRatio``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from clawrl.algorithms.config import MaskedIS, OldRatio, RatioConfig, SamplingRatio, TruncatedIS
from clawrl.algorithms.metrics import masked_mean
from clawrl.algorithms.types import LossInputs


@dataclass(frozen=True)
class RatioTerms:
    """What the PPO loss needs from the ratio config."""

    baseline_logprobs: Tensor
    """``[B, T]`` log-probs in the ratio's denominator (no gradient)."""
    is_weight: Tensor | None
    """``[B, T]`` detached mismatch weight on the per-token policy loss, or None (weight 1)."""
    metrics: dict[str, Tensor]
    """``is/*`` metrics as ``[]`` tensors."""


def _require_old(inputs: LossInputs, config: RatioConfig) -> Tensor:
    if inputs.old_logprobs is None:
        raise ValueError(f"{type(config).__name__} needs LossInputs.old_logprobs")
    return inputs.old_logprobs.detach()


def _mismatch_log_weight(inputs: LossInputs, old: Tensor, mask: Tensor) -> Tensor:
    """``log(π_old / π_sampling)`` on masked tokens, 0 elsewhere."""
    diff = old - inputs.sampling_logprobs.detach()
    return torch.where(mask, diff, torch.zeros_like(diff))


def _sampling(config: SamplingRatio, inputs: LossInputs, mask: Tensor) -> RatioTerms:
    del config, mask
    return RatioTerms(inputs.sampling_logprobs.detach(), None, {})


def _old(config: OldRatio, inputs: LossInputs, mask: Tensor) -> RatioTerms:
    del mask
    return RatioTerms(_require_old(inputs, config), None, {})


def _truncated_is(config: TruncatedIS, inputs: LossInputs, mask: Tensor) -> RatioTerms:
    old = _require_old(inputs, config)
    raw = torch.exp(_mismatch_log_weight(inputs, old, mask))
    weight = raw.clamp(max=config.cap)
    metrics = {
        "is/weight_mean": masked_mean(weight, mask),
        "is/truncated_frac": masked_mean((raw > config.cap).to(raw.dtype), mask),
    }
    return RatioTerms(old, weight, metrics)


def _masked_is(config: MaskedIS, inputs: LossInputs, mask: Tensor) -> RatioTerms:
    old = _require_old(inputs, config)
    raw = torch.exp(_mismatch_log_weight(inputs, old, mask))
    rejected = (raw < config.low) | (raw > config.high)
    weight = torch.where(rejected, torch.zeros_like(raw), raw)
    metrics = {
        "is/weight_mean": masked_mean(weight, mask),
        "is/masked_frac": masked_mean(rejected.to(raw.dtype), mask),
    }
    return RatioTerms(old, weight, metrics)


_RESOLVERS: dict[type, Callable[..., RatioTerms]] = {
    SamplingRatio: _sampling,
    OldRatio: _old,
    TruncatedIS: _truncated_is,
    MaskedIS: _masked_is,
}


def ratio_terms(config: RatioConfig, inputs: LossInputs, mask: Tensor) -> RatioTerms:
    """The ratio's denominator log-probs and the mismatch weight for ``config``.

    Args:
        config: which ratio and correction.
        inputs: the loss inputs (``sampling_logprobs``, and ``old_logprobs`` except for
            ``SamplingRatio``).
        mask: ``[B, T]`` bool, the tokens that count.

    Raises:
        ValueError: the config needs ``old_logprobs`` and they are missing.
    """
    return _RESOLVERS[type(config)](config, inputs, mask)
