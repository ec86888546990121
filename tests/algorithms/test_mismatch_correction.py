"""Ratio baselines and TIS / MIS trainer-versus-engine corrections."""

from __future__ import annotations

import math

import pytest
import torch

from clawrl.algorithms import (
    KLPenalty,
    LossInputs,
    MaskedIS,
    OldRatio,
    PPOClipLoss,
    SamplingRatio,
    TruncatedIS,
    ppo_clip_loss,
)

F64 = torch.float64
NO_KL = KLPenalty(beta=0.0)


def _batch(seed: int, old_equals_sampling: bool) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    sampling = -torch.rand(4, 6, generator=gen, dtype=F64) * 3
    old = (
        sampling.clone()
        if old_equals_sampling
        else sampling + torch.randn(4, 6, generator=gen, dtype=F64)
    )
    return {
        "sampling": sampling,
        "old": old,
        "policy": old + 0.3 * torch.randn(4, 6, generator=gen, dtype=F64),
        "adv": torch.randn(4, 6, generator=gen, dtype=F64),
        "mask": torch.rand(4, 6, generator=gen) < 0.8,
        "ref": sampling + 0.1,
    }


def _run(
    data: dict[str, torch.Tensor], config: PPOClipLoss
) -> tuple[float, torch.Tensor, dict[str, float]]:
    policy = data["policy"].clone().requires_grad_(True)
    out = ppo_clip_loss(
        LossInputs(
            policy,
            data["sampling"],
            data["adv"],
            data["mask"],
            old_logprobs=data["old"],
            ref_logprobs=data["ref"],
        ),
        config,
    )
    (grad,) = torch.autograd.grad(out.loss, policy)
    return out.loss.item(), grad, out.metrics


@pytest.mark.parametrize("correction", [TruncatedIS(cap=2.0), MaskedIS(low=0.5, high=2.0)])
def test_tis_and_mis_change_nothing_when_sampling_and_old_agree(correction: object) -> None:
    data = _batch(seed=0, old_equals_sampling=True)
    loss_old, grad_old, _ = _run(data, PPOClipLoss(ratio=OldRatio()))
    loss_sampling, grad_sampling, _ = _run(data, PPOClipLoss(ratio=SamplingRatio()))
    loss, grad, metrics = _run(data, PPOClipLoss(ratio=correction))  # type: ignore[arg-type]
    assert loss == loss_old == loss_sampling
    assert torch.equal(grad, grad_old) and torch.equal(grad, grad_sampling)
    assert metrics["is/weight_mean"] == 1.0


@pytest.mark.parametrize("correction", [TruncatedIS(cap=2.0), MaskedIS(low=0.5, high=2.0)])
def test_tis_and_mis_change_the_loss_when_sampling_and_old_differ(correction: object) -> None:
    data = _batch(seed=0, old_equals_sampling=False)
    loss_old, _, _ = _run(data, PPOClipLoss(ratio=OldRatio()))
    loss, _, _ = _run(data, PPOClipLoss(ratio=correction))  # type: ignore[arg-type]
    assert abs(loss - loss_old) > 1e-6


def _single_token_weights(correction: object, mismatch_log_weights: list[float]) -> torch.Tensor:
    """Per-token loss with ρ = 1, A = -1 is w_t; returns the token-mean gradient × N = w_t."""
    n = len(mismatch_log_weights)
    sampling = torch.full((1, n), -1.0, dtype=F64)
    old = sampling + torch.tensor([mismatch_log_weights], dtype=F64)
    policy = old.clone().requires_grad_(True)
    inputs = LossInputs(
        policy,
        sampling,
        torch.full((1, n), -1.0, dtype=F64),
        torch.ones(1, n, dtype=torch.bool),
        old_logprobs=old,
    )
    out = ppo_clip_loss(inputs, PPOClipLoss(kl=NO_KL, ratio=correction))  # type: ignore[arg-type]
    (grad,) = torch.autograd.grad(out.loss, policy)
    return grad[0] * n  # = A · (-1) · w_t = w_t


def test_tis_truncates_the_weight_at_the_cap() -> None:
    logw = [math.log(0.25), 0.0, math.log(1.5), math.log(10.0)]
    weights = _single_token_weights(TruncatedIS(cap=2.0), logw)
    torch.testing.assert_close(weights, torch.tensor([0.25, 1.0, 1.5, 2.0], dtype=F64))


def test_mis_zeroes_the_weight_outside_the_bounds() -> None:
    logw = [math.log(0.25), 0.0, math.log(1.5), math.log(10.0)]
    weights = _single_token_weights(MaskedIS(low=0.5, high=2.0), logw)
    torch.testing.assert_close(weights, torch.tensor([0.0, 1.0, 1.5, 0.0], dtype=F64))


def test_default_ratio_is_against_sampling_logprobs() -> None:
    data = _batch(seed=1, old_equals_sampling=False)
    default = _run(data, PPOClipLoss())
    sampling = _run(data, PPOClipLoss(ratio=SamplingRatio()))
    old = _run(data, PPOClipLoss(ratio=OldRatio()))
    assert default[0] == sampling[0] != old[0]


@pytest.mark.parametrize("config", [OldRatio(), TruncatedIS(), MaskedIS()])
def test_old_logprobs_are_required(config: object) -> None:
    x = torch.zeros(1, 2, dtype=F64, requires_grad=True)
    inputs = LossInputs(x, x.detach(), x.detach(), torch.ones(1, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="old_logprobs"):
        ppo_clip_loss(inputs, PPOClipLoss(kl=NO_KL, ratio=config))  # type: ignore[arg-type]
