"""Typed inputs and outputs of the losses.

Shape letters: ``B`` sequences (completions / turns) in the (micro-)batch, ``T`` token positions
(right-padded). Every ``[B, T]`` tensor is aligned so that position ``(i, t)`` is the same sampled
token ``a_{i,t}`` in all of them; only positions with ``loss_mask`` set are ever read.

Log-probs are named by the policy that produced them:

- ``sampling_logprobs``: the engine, at sampling time (after temperature);
- ``policy_logprobs``: the trainer now, with gradient;
- ``old_logprobs``: the trainer before this optimizer step (no gradient);
- ``teacher_logprobs``: the hint-enhanced teacher (OPD);
- ``ref_logprobs``: the frozen reference policy (KL penalty).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Normalizers:
    """Denominators of the loss aggregation for the *whole* batch.

    Pass the full batch's counts to every micro-batch's loss so that the sum of micro-batch losses
    equals the full-batch loss (and gradients add up under gradient accumulation). Build it with
    ``clawrl.algorithms.count_normalizers``.
    """

    num_tokens: float
    """Σ m over the full batch, after truncation masking."""
    num_sequences: float
    """Number of sequences in the full batch with at least one token left after masking."""


@dataclass(frozen=True)
class LossInputs:
    """Inputs of a policy loss. All ``[B, T]`` tensors share one shape.

    Values at positions where ``loss_mask`` is False (padding, prompt, tool output) are never
    read: they may hold anything, NaN included, and change neither loss nor gradient.
    """

    policy_logprobs: Tensor
    """``[B, T]`` float, log π_θ(a_t | s_t) from the trainer now, with gradient."""
    sampling_logprobs: Tensor
    """``[B, T]`` float, log-probs of the engine at sampling time (after temperature)."""
    advantages: Tensor
    """``[B, T]`` float, per-token advantages (``clawrl.algorithms.advantages``); no gradient."""
    loss_mask: Tensor
    """``[B, T]`` bool, True for sampled tokens to train on (other dtypes are read as ``!= 0``)."""
    old_logprobs: Tensor | None = None
    """``[B, T]`` float, trainer log-probs before the update; needed by OldRatio/TIS/MIS."""
    ref_logprobs: Tensor | None = None
    """``[B, T]`` float, reference-policy log-probs; needed when the KL penalty β > 0."""
    entropy: Tensor | None = None
    """``[B, T]`` float, the trainer's per-token entropy; only reported (``entropy/mean``)."""
    truncated: Tensor | None = None
    """``[B]`` bool, the completion hit the length limit; used when ``mask_truncated``."""
    normalizers: Normalizers | None = None
    """Full-batch denominators for micro-batching; None: computed from this batch."""


@dataclass(frozen=True)
class LossOutputs:
    """A scalar loss to call ``backward()`` on and ``/``-namespaced float metrics."""

    loss: Tensor
    """``[]`` scalar with gradient to ``policy_logprobs``."""
    metrics: dict[str, float]
    """e.g. ``clip/low_frac``, ``kl/approx``, ``kl/mismatch``, ``adv/mean``, ``tokens/count``."""


def as_bool_mask(mask: Tensor) -> Tensor:
    """Read a mask of any dtype as bool (``!= 0``)."""
    return mask if mask.dtype == torch.bool else mask != 0


def effective_mask(loss_mask: Tensor, truncated: Tensor | None, mask_truncated: bool) -> Tensor:
    """``[B, T]`` bool: ``loss_mask`` with truncated sequences removed when ``mask_truncated``.

    Args:
        loss_mask: ``[B, T]`` tokens to train on.
        truncated: ``[B]`` bool, the completion was cut at the length limit; may be None.
        mask_truncated: remove every token of truncated sequences (DAPO overlong filtering).
    """
    mask = as_bool_mask(loss_mask)
    if not mask_truncated or truncated is None:
        return mask
    truncated = as_bool_mask(truncated)
    if truncated.shape != mask.shape[:1]:
        raise ValueError(
            f"truncated must have shape [B]={list(mask.shape[:1])}, got {list(truncated.shape)}"
        )
    return mask & ~truncated.unsqueeze(-1)


def count_normalizers(
    loss_mask: Tensor, truncated: Tensor | None = None, *, mask_truncated: bool = False
) -> Normalizers:
    """Denominators for the full batch: tokens and non-empty sequences left after masking.

    Args:
        loss_mask: ``[B, T]`` of the full (not micro-) batch.
        truncated: ``[B]`` bool or None.
        mask_truncated: the loss config's ``mask_truncated``.
    """
    mask = effective_mask(loss_mask, truncated, mask_truncated)
    return Normalizers(
        num_tokens=float(mask.sum().item()),
        num_sequences=float(mask.any(dim=-1).sum().item()),
    )
