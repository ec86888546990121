"""Masked statistics for metrics. Reductions over no element return 0 (``tokens/count`` says so)."""

from __future__ import annotations

import torch
from torch import Tensor


def masked_sum(values: Tensor, mask: Tensor) -> Tensor:
    """``Σ values[mask]`` as a ``[]`` tensor; positions outside ``mask`` may hold NaN."""
    return torch.where(mask, values, torch.zeros_like(values)).sum()


def masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """``Σ values[mask] / |mask|``, 0 when the mask is empty. Same shape for values and mask."""
    count = mask.sum().clamp(min=1).to(values.dtype)
    return masked_sum(values, mask) / count


def masked_std(values: Tensor, mask: Tensor) -> Tensor:
    """Population standard deviation over ``values[mask]``, 0 when the mask is empty."""
    mean = masked_mean(values, mask)
    return masked_mean((values - mean) ** 2, mask).sqrt()


def masked_min(values: Tensor, mask: Tensor) -> Tensor:
    """``min values[mask]``, 0 when the mask is empty."""
    smallest = torch.where(mask, values, torch.full_like(values, float("inf"))).min()
    return torch.where(mask.any(), smallest, torch.zeros_like(smallest))


def masked_max(values: Tensor, mask: Tensor) -> Tensor:
    """``max values[mask]``, 0 when the mask is empty."""
    largest = torch.where(mask, values, torch.full_like(values, float("-inf"))).max()
    return torch.where(mask.any(), largest, torch.zeros_like(largest))


def advantage_stats(advantages: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """``adv/mean``, ``adv/std``, ``adv/min``, ``adv/max`` over the masked tokens."""
    return {
        "adv/mean": masked_mean(advantages, mask),
        "adv/std": masked_std(advantages, mask),
        "adv/min": masked_min(advantages, mask),
        "adv/max": masked_max(advantages, mask),
    }


def to_floats(metrics: dict[str, Tensor]) -> dict[str, float]:
    """Detach and convert ``[]`` tensors to floats with one device sync."""
    if not metrics:
        return {}
    values = torch.stack([v.detach().to(torch.float64).reshape(()) for v in metrics.values()])
    return dict(zip(metrics.keys(), values.tolist(), strict=True))
