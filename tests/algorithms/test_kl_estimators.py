"""KL estimators k1, k2, k3: hand values, non-negativity, unbiasedness by Monte Carlo."""

from __future__ import annotations

import math

import pytest
import torch

from clawrl.algorithms import KLEstimator, kl_estimate, kl_k1, kl_k2, kl_k3

F64 = torch.float64


def test_hand_computed_values() -> None:
    # p(x) = 1/2, q(x) = 1 -> log q/p = log 2
    log_p = torch.tensor([math.log(0.5)], dtype=F64)
    log_q = torch.tensor([0.0], dtype=F64)
    d = math.log(2.0)
    assert kl_estimate(log_p, log_q, KLEstimator.K1).item() == pytest.approx(-d, abs=1e-15)
    assert kl_estimate(log_p, log_q, KLEstimator.K2).item() == pytest.approx(d * d / 2, abs=1e-15)
    assert kl_estimate(log_p, log_q, KLEstimator.K3).item() == pytest.approx(1 - d, abs=1e-15)
    assert kl_estimate(log_p, log_q, "k3").item() == pytest.approx(1 - d, abs=1e-15)  # type: ignore[arg-type]


def test_k2_and_k3_are_non_negative_and_zero_only_at_equal_log_probs() -> None:
    log_ratio = torch.cat(
        [torch.linspace(-30, 30, 20001, dtype=F64), torch.tensor([0.0, 1e-12, -1e-12], dtype=F64)]
    )
    assert torch.all(kl_k3(log_ratio) >= 0)
    assert torch.all(kl_k2(log_ratio) >= 0)
    assert kl_k3(torch.zeros(1, dtype=F64)).item() == 0.0
    assert torch.all(kl_k3(log_ratio[log_ratio.abs() > 1e-3]) > 0)
    assert torch.any(kl_k1(log_ratio) < 0)  # k1 is not


@pytest.mark.parametrize("seed", [0, 1])
def test_k1_and_k3_are_unbiased_for_the_exact_kl(seed: int) -> None:
    vocab = 6
    gen = torch.Generator().manual_seed(seed)
    log_p = torch.log_softmax(torch.randn(vocab, generator=gen, dtype=F64), -1)
    log_q = torch.log_softmax(torch.randn(vocab, generator=gen, dtype=F64), -1)
    exact = (log_p.exp() * (log_p - log_q)).sum().item()

    samples = torch.multinomial(log_p.exp(), 400_000, replacement=True, generator=gen)
    for estimator in (KLEstimator.K1, KLEstimator.K3):
        values = kl_estimate(log_p[samples], log_q[samples], estimator)
        stderr = values.std().item() / math.sqrt(values.numel())
        assert abs(values.mean().item() - exact) < 5 * stderr, estimator
    # k1 and k3 are exactly unbiased: their expectations under p equal the exact KL.
    p = log_p.exp()
    for estimator in (KLEstimator.K1, KLEstimator.K3):
        expectation = (p * kl_estimate(log_p, log_q, estimator)).sum().item()
        assert expectation == pytest.approx(exact, abs=1e-12)
    k2_expectation = (p * kl_estimate(log_p, log_q, KLEstimator.K2)).sum().item()
    assert abs(k2_expectation - exact) > 1e-6  # k2 is biased
