"""Per-token KL estimators (Schulman 2020, "Approximating KL Divergence", joschu.net/blog/kl-approx).

For a token ``x ~ p`` and ``log_ratio = log q(x) - log p(x)``, estimators of ``KL(p || q)``:

- ``k1 = -log_ratio``                         unbiased, can be negative, high variance;
- ``k2 = log_ratio² / 2``                     biased (exact to second order), >= 0;
- ``k3 = exp(log_ratio) - 1 - log_ratio``     unbiased, >= 0 (GRPO's KL term, DeepSeekMath eq. 4).

For the KL penalty to the reference, ``p = π_θ`` and ``q = π_ref``. The same formulas estimate the
trainer-versus-engine mismatch ``KL(π_sampling || π_trainer)`` with ``p = π_sampling``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from clawrl.algorithms.config import KLEstimator


def kl_k1(log_ratio: Tensor) -> Tensor:
    """``k1 = -log(q/p)``; any shape, elementwise."""
    return -log_ratio


def kl_k2(log_ratio: Tensor) -> Tensor:
    """``k2 = ½ log(q/p)²``; any shape, elementwise."""
    return 0.5 * log_ratio.square()


def kl_k3(log_ratio: Tensor) -> Tensor:
    """``k3 = q/p - 1 - log(q/p)``; any shape, elementwise, >= 0."""
    return torch.expm1(log_ratio) - log_ratio


_ESTIMATORS: dict[KLEstimator, Callable[[Tensor], Tensor]] = {
    KLEstimator.K1: kl_k1,
    KLEstimator.K2: kl_k2,
    KLEstimator.K3: kl_k3,
}


def kl_estimate(sample_logprobs: Tensor, other_logprobs: Tensor, estimator: KLEstimator) -> Tensor:
    """Per-token estimate of ``KL(p || q)`` for tokens sampled from ``p``.

    Args:
        sample_logprobs: ``[...]`` log p(x) of the distribution the tokens were drawn from
            (e.g. ``policy_logprobs`` for the KL penalty).
        other_logprobs: ``[...]`` log q(x) (e.g. ``ref_logprobs``).
        estimator: k1, k2 or k3.

    Returns:
        ``[...]`` the per-token estimator; gradients flow to both inputs.
    """
    return _ESTIMATORS[KLEstimator(estimator)](other_logprobs - sample_logprobs)
