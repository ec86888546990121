"""Reduce per-token losses ``ℓ [B, T]`` to one scalar under a mask ``m [B, T]``.

Masked positions are left out of numerators *and* denominators: a token with ``m = 0`` (padding,
prompt, tool output, or a truncated sequence under ``mask_truncated``) neither adds to a sum nor
counts in a token or sequence count, and a sequence with no token left is not counted as a
sequence. A batch with nothing left gives a loss of exactly 0 (no NaN) with zero gradient.

With ``normalizers`` (full-batch counts) the result is this micro-batch's share of the full-batch
loss, so micro-batch losses add up to the full-batch loss.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from clawrl.algorithms.config import (
    AggregationConfig,
    SequenceMeanTokenMean,
    SequenceMeanTokenSumNorm,
    TokenMean,
)
from clawrl.algorithms.types import Normalizers


def _masked(per_token: Tensor, mask: Tensor) -> Tensor:
    return torch.where(mask, per_token, torch.zeros_like(per_token))


def _denominator(global_count: float | None, local_count: Tensor, like: Tensor) -> Tensor | float:
    """The full-batch count when given, else this batch's; at least 1 (no device sync)."""
    if global_count is not None:
        return max(float(global_count), 1.0)
    return local_count.clamp(min=1).to(like.dtype)


def _token_mean(
    per_token: Tensor, mask: Tensor, config: TokenMean, normalizers: Normalizers | None
) -> Tensor:
    """``Σ_{i,t} m ℓ / N`` with ``N = Σ m`` (or ``normalizers.num_tokens``)."""
    del config
    global_count = normalizers.num_tokens if normalizers is not None else None
    return _masked(per_token, mask).sum() / _denominator(global_count, mask.sum(), per_token)


def _sequence_mean_token_mean(
    per_token: Tensor, mask: Tensor, config: SequenceMeanTokenMean, normalizers: Normalizers | None
) -> Tensor:
    """``(1/S) Σ_i Σ_t m ℓ / Σ_t m`` over the ``S`` sequences with ``Σ_t m > 0``."""
    del config
    lengths = mask.sum(dim=-1)
    per_sequence = _masked(per_token, mask).sum(dim=-1) / lengths.clamp(min=1).to(per_token.dtype)
    global_count = normalizers.num_sequences if normalizers is not None else None
    return per_sequence.sum() / _denominator(global_count, (lengths > 0).sum(), per_token)


def _sequence_mean_token_sum_norm(
    per_token: Tensor,
    mask: Tensor,
    config: SequenceMeanTokenSumNorm,
    normalizers: Normalizers | None,
) -> Tensor:
    """``(1/S) Σ_i Σ_t m ℓ / L`` with the constant ``L = max_tokens`` (Dr. GRPO)."""
    global_count = normalizers.num_sequences if normalizers is not None else None
    sequences = _denominator(global_count, mask.any(dim=-1).sum(), per_token)
    return _masked(per_token, mask).sum() / (sequences * config.max_tokens)


_AGGREGATORS: dict[type, Callable[..., Tensor]] = {
    TokenMean: _token_mean,
    SequenceMeanTokenMean: _sequence_mean_token_mean,
    SequenceMeanTokenSumNorm: _sequence_mean_token_sum_norm,
}


def aggregate(
    per_token: Tensor,
    mask: Tensor,
    config: AggregationConfig,
    normalizers: Normalizers | None = None,
) -> Tensor:
    """Reduce ``per_token`` ``[B, T]`` under bool ``mask`` ``[B, T]`` to a ``[]`` scalar.

    - ``TokenMean``: ``Σ_{i,t} m ℓ / Σ_{i,t} m`` (DAPO, Yu et al. 2025);
    - ``SequenceMeanTokenMean``: ``(1/S) Σ_i (Σ_t m ℓ / Σ_t m)`` (GRPO, Shao et al. 2024);
    - ``SequenceMeanTokenSumNorm``: ``(1/S) Σ_i Σ_t m ℓ / L`` (Dr. GRPO, Liu et al. 2025).

    ``S`` counts only sequences with at least one unmasked token. Denominators come from
    ``normalizers`` when given (full-batch counts for micro-batching), else from ``mask``; a zero
    denominator is replaced by 1 (the numerator is then 0).
    """
    return _AGGREGATORS[type(config)](per_token, mask, config, normalizers)
