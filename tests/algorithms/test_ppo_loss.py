"""PPO clipped surrogate: hand-computed values and gradient identities (float64, CPU)."""

from __future__ import annotations

import math

import pytest
import torch

from clawrl.algorithms import (
    KLEstimator,
    KLPenalty,
    LossInputs,
    Normalizers,
    PPOClipLoss,
    SequenceMeanTokenMean,
    SequenceMeanTokenSumNorm,
    TokenMean,
    aggregate,
    compute_loss,
    count_normalizers,
    effective_mask,
    ppo_clip_loss,
)

F64 = torch.float64
NO_KL = KLPenalty(beta=0.0)
AGGREGATIONS = [TokenMean(), SequenceMeanTokenMean(), SequenceMeanTokenSumNorm(max_tokens=7)]


def _inputs_from_ratios(
    ratios: list[list[float]], advantages: list[list[float]], **kwargs: object
) -> tuple[LossInputs, torch.Tensor]:
    """Inputs whose ratio π_θ/π_sampling is ``ratios``; returns them and the leaf policy log-probs."""
    sampling = torch.tensor([[-1.3, -0.2, -2.5, -0.7, -1.1, -0.4]], dtype=F64)[:, : len(ratios[0])]
    sampling = sampling.expand(len(ratios), -1).clone()
    policy = (sampling + torch.tensor(ratios, dtype=F64).log()).requires_grad_(True)
    mask = torch.ones_like(sampling, dtype=torch.bool)
    inputs = LossInputs(
        policy_logprobs=policy,
        sampling_logprobs=sampling,
        advantages=torch.tensor(advantages, dtype=F64),
        loss_mask=mask,
        **kwargs,  # type: ignore[arg-type]
    )
    return inputs, policy


def test_hand_computed_clipped_surrogate_and_clip_fractions() -> None:
    # (ρ, A): unclipped, clipped high (A>0), clipped low (A<0), unclipped (A<0)
    inputs, _ = _inputs_from_ratios([[1.0, 1.5, 0.5, 1.1]], [[1.0, 1.0, -1.0, -1.0]])
    out = ppo_clip_loss(inputs, PPOClipLoss(kl=NO_KL))
    # per-token: -min(ρA, clip(ρ)A): -1, -1.28, +0.8, +1.1
    expected = (-1.0 - 1.28 + 0.8 + 1.1) / 4
    assert out.loss.item() == pytest.approx(expected, abs=1e-12)
    assert out.metrics["clip/low_frac"] == 0.25
    assert out.metrics["clip/high_frac"] == 0.25
    assert out.metrics["tokens/count"] == 4
    assert out.metrics["adv/mean"] == 0.0
    assert out.metrics["ratio/max"] == pytest.approx(1.5)
    # kl/approx = mean k3(log ρ) = mean(ρ - 1 - log ρ)
    k3 = [r - 1 - math.log(r) for r in (1.0, 1.5, 0.5, 1.1)]
    assert out.metrics["kl/approx"] == pytest.approx(sum(k3) / 4, abs=1e-12)


def test_hand_computed_kl_penalty_k1_k2_k3() -> None:
    inputs, policy = _inputs_from_ratios([[1.0, 1.0]], [[0.0, 0.0]])
    ref = policy.detach() + torch.tensor([[math.log(2.0), 0.0]], dtype=F64)
    inputs = LossInputs(**{**inputs.__dict__, "ref_logprobs": ref})
    d = math.log(2.0)  # log π_ref/π_θ on token 0; 0 on token 1
    expected = {
        KLEstimator.K1: -d / 2,
        KLEstimator.K2: (0.5 * d * d) / 2,
        KLEstimator.K3: (2.0 - 1.0 - d) / 2,
    }
    for estimator, kl_mean in expected.items():
        config = PPOClipLoss(kl=KLPenalty(beta=0.5, estimator=estimator))
        out = ppo_clip_loss(inputs, config)
        assert out.loss.item() == pytest.approx(0.5 * kl_mean, abs=1e-12)
        assert out.metrics["kl/ref"] == pytest.approx(kl_mean, abs=1e-12)
        assert out.metrics["loss/kl"] == pytest.approx(0.5 * kl_mean, abs=1e-12)


def test_default_config_requires_ref_logprobs() -> None:
    inputs, _ = _inputs_from_ratios([[1.0]], [[1.0]])
    with pytest.raises(ValueError, match="ref_logprobs"):
        ppo_clip_loss(inputs, PPOClipLoss())


def test_ratio_one_gives_reinforce_gradient_through_a_model() -> None:
    """With ρ = 1 and no KL, ∇L = -(1/N) Σ_t A_t ∇log π_θ(a_t) for the model's parameters."""
    gen = torch.Generator().manual_seed(0)
    features = torch.randn(3, 5, 4, generator=gen, dtype=F64)  # [B, T, d]
    weight = torch.randn(4, 6, generator=gen, dtype=F64, requires_grad=True)  # vocab 6
    actions = torch.randint(0, 6, (3, 5), generator=gen)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 1, 1, 1, 0]], dtype=torch.bool)
    advantages = torch.randn(3, 5, generator=gen, dtype=F64)

    def logprobs() -> torch.Tensor:
        return torch.log_softmax(features @ weight, -1).gather(-1, actions[..., None])[..., 0]

    policy = logprobs()
    out = ppo_clip_loss(
        LossInputs(policy, policy.detach(), advantages, mask), PPOClipLoss(kl=NO_KL)
    )
    (ppo_grad,) = torch.autograd.grad(out.loss, weight)
    reinforce = -(advantages * logprobs() * mask).sum() / mask.sum()
    (reinforce_grad,) = torch.autograd.grad(reinforce, weight)
    torch.testing.assert_close(ppo_grad, reinforce_grad, rtol=0, atol=1e-14)
    assert ppo_grad.abs().sum() > 0


@pytest.mark.parametrize("aggregation", AGGREGATIONS, ids=lambda a: a.kind)
def test_ratio_one_gradient_per_token_weights(aggregation: object) -> None:
    """∂L/∂logπ_t = -A_t · weight_t, weight_t = 1/N, 1/(S·len_i), 1/(S·L_max) per mode."""
    policy = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.9, -4.0]], dtype=F64, requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    adv = torch.tensor([[0.5, -1.5, 9.0], [2.0, 1.0, -1.0]], dtype=F64)
    out = ppo_clip_loss(
        LossInputs(policy, policy.detach(), adv, mask),
        PPOClipLoss(kl=NO_KL, aggregation=aggregation),  # type: ignore[arg-type]
    )
    (grad,) = torch.autograd.grad(out.loss, policy)
    lengths = torch.tensor([[2.0], [3.0]], dtype=F64)
    weight = {
        "token_mean": torch.full_like(adv, 1 / 5),
        "seq_mean_token_mean": (1 / (2 * lengths)).expand_as(adv),
        "seq_mean_token_sum_norm": torch.full_like(adv, 1 / (2 * 7)),
    }[aggregation.kind]  # type: ignore[attr-defined]
    torch.testing.assert_close(grad, -adv * weight * mask, rtol=0, atol=1e-15)


def test_clipped_tokens_get_exactly_zero_gradient_on_the_sign_dependent_side() -> None:
    ratios = [[1.5, 0.5, 0.5, 1.5, 1.0, 1.1]]
    advantages = [[1.0, 1.0, -1.0, -1.0, 1.0, -1.0]]
    inputs, policy = _inputs_from_ratios(ratios, advantages)
    out = ppo_clip_loss(inputs, PPOClipLoss(kl=NO_KL))
    (grad,) = torch.autograd.grad(out.loss, policy)
    n = 6
    # A>0, ρ>1+ε_high: clipped, zero. A>0, ρ<1-ε_low: not clipped, -Aρ/N.
    # A<0, ρ<1-ε_low: clipped, zero. A<0, ρ>1+ε_high: not clipped, -Aρ/N.
    expected = torch.tensor([[0.0, -0.5 / n, 0.0, 1.5 / n, -1.0 / n, 1.1 / n]], dtype=F64)
    torch.testing.assert_close(grad, expected, rtol=0, atol=1e-15)
    assert grad[0, 0].item() == 0.0 and grad[0, 2].item() == 0.0


def test_dual_clip_bounds_negative_advantage_loss_and_zeroes_its_gradient() -> None:
    ratios = [[4.0, 2.0, 4.0]]
    advantages = [[-1.0, -1.0, 1.0]]
    inputs, policy = _inputs_from_ratios(ratios, advantages)
    plain = ppo_clip_loss(inputs, PPOClipLoss(kl=NO_KL))
    dual = ppo_clip_loss(inputs, PPOClipLoss(kl=NO_KL, dual_clip=3.0))
    # token 0: -min(-4, -1.28) = 4, dual clip -> min(4, 3) = 3; token 1: 2 (< c); token 2: -1.28
    assert plain.loss.item() == pytest.approx((4.0 + 2.0 - 1.28) / 3, abs=1e-12)
    assert dual.loss.item() == pytest.approx((3.0 + 2.0 - 1.28) / 3, abs=1e-12)
    assert dual.metrics["clip/dual_frac"] == pytest.approx(1 / 3)
    (grad,) = torch.autograd.grad(dual.loss, policy)
    expected = torch.tensor([[0.0, 2.0 / 3, 0.0]], dtype=F64)
    torch.testing.assert_close(grad, expected, rtol=0, atol=1e-15)


def _random_batch(seed: int, batch: int = 6, length: int = 7) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, length + 1, (batch,), generator=gen)
    mask = torch.arange(length)[None, :] < lengths[:, None]
    sampling = -torch.rand(batch, length, generator=gen, dtype=F64) * 3
    return {
        "policy": sampling + 0.4 * torch.randn(batch, length, generator=gen, dtype=F64),
        "sampling": sampling,
        "old": sampling + 0.05 * torch.randn(batch, length, generator=gen, dtype=F64),
        "ref": sampling + 0.3 * torch.randn(batch, length, generator=gen, dtype=F64),
        "adv": torch.randn(batch, length, generator=gen, dtype=F64),
        "entropy": torch.rand(batch, length, generator=gen, dtype=F64),
        "mask": mask,
        "truncated": torch.rand(batch, generator=gen) < 0.4,
    }


def _loss_and_grad(
    data: dict[str, torch.Tensor], config: PPOClipLoss, rows: slice = slice(None), **kwargs: object
) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    policy = data["policy"].clone().requires_grad_(True)
    inputs = LossInputs(
        policy_logprobs=policy[rows],
        sampling_logprobs=data["sampling"][rows],
        advantages=data["adv"][rows],
        loss_mask=data["mask"][rows],
        old_logprobs=data["old"][rows],
        ref_logprobs=data["ref"][rows],
        entropy=data["entropy"][rows],
        truncated=data["truncated"][rows],
        **kwargs,  # type: ignore[arg-type]
    )
    out = compute_loss(config, inputs)
    (grad,) = torch.autograd.grad(out.loss, policy)
    return out.loss.detach(), grad, out.metrics


@pytest.mark.parametrize("aggregation", AGGREGATIONS, ids=lambda a: a.kind)
def test_padding_and_masked_tokens_change_nothing(aggregation: object) -> None:
    data = _random_batch(seed=1)
    config = PPOClipLoss(aggregation=aggregation, dual_clip=2.5)  # type: ignore[arg-type]
    loss, grad, metrics = _loss_and_grad(data, config)

    # 1. Garbage (NaN, inf, huge) at masked positions of every input.
    dirty = dict(data)
    for key in ("policy", "sampling", "old", "ref", "adv", "entropy"):
        junk = torch.full_like(data[key], float("nan"))
        junk[:, ::2] = 1e30
        dirty[key] = torch.where(data["mask"], data[key], junk)
    loss_d, grad_d, metrics_d = _loss_and_grad(dirty, config)
    assert loss_d.item() == loss.item()
    assert torch.equal(grad_d, grad)
    assert metrics_d == metrics
    assert torch.all(grad[~data["mask"]] == 0)

    # 2. More padding columns and an all-padding row.
    padded = {}
    for key, value in data.items():
        if value.dim() == 2:
            value = torch.cat([value, torch.full((value.shape[0], 3), 7.0, dtype=value.dtype)], 1)
            value = torch.cat([value, torch.full((1, value.shape[1]), 5.0, dtype=value.dtype)], 0)
        else:
            value = torch.cat([value, value[:1]])
        padded[key] = value
    padded["mask"] = padded["mask"].clone()
    padded["mask"][:, -3:] = False
    padded["mask"][-1] = False
    loss_p, grad_p, metrics_p = _loss_and_grad(padded, config)
    torch.testing.assert_close(loss_p, loss, rtol=0, atol=1e-15)
    torch.testing.assert_close(grad_p[:-1, :-3], grad, rtol=0, atol=1e-15)
    assert torch.all(grad_p[-1] == 0) and torch.all(grad_p[:, -3:] == 0)
    assert metrics_p["tokens/count"] == metrics["tokens/count"]


@pytest.mark.parametrize("mask_truncated", [False, True])
@pytest.mark.parametrize("aggregation", AGGREGATIONS, ids=lambda a: a.kind)
def test_micro_batches_with_global_normalizers_sum_to_the_full_batch(
    aggregation: object, mask_truncated: bool
) -> None:
    data = _random_batch(seed=2, batch=7)
    config = PPOClipLoss(aggregation=aggregation, mask_truncated=mask_truncated)  # type: ignore[arg-type]
    full_loss, full_grad, _ = _loss_and_grad(data, config)
    norms = count_normalizers(data["mask"], data["truncated"], mask_truncated=mask_truncated)
    assert norms.num_tokens > 0

    total_loss = torch.zeros((), dtype=F64)
    total_grad = torch.zeros_like(full_grad)
    for rows in (slice(0, 2), slice(2, 5), slice(5, 7)):
        loss, grad, _ = _loss_and_grad(data, config, rows, normalizers=norms)
        total_loss += loss
        total_grad += grad  # gradient accumulation
    torch.testing.assert_close(total_loss, full_loss, rtol=0, atol=1e-14)
    torch.testing.assert_close(total_grad, full_grad, rtol=0, atol=1e-15)


def test_micro_batches_without_global_normalizers_differ() -> None:
    """Guards the test above: per-micro-batch denominators do not add up to the full batch."""
    data = _random_batch(seed=2, batch=7)
    config = PPOClipLoss()
    full_loss, _, _ = _loss_and_grad(data, config)
    parts = [_loss_and_grad(data, config, rows)[0] for rows in (slice(0, 2), slice(2, 7))]
    assert abs(sum(parts).item() - full_loss.item()) > 1e-3


def _unit_loss_batch(lengths: list[int], truncated: list[bool]) -> LossInputs:
    """Every per-token loss is exactly 1: ρ = 1 and A = -1."""
    width = max(lengths) + 2
    mask = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]
    sampling = torch.full(mask.shape, -1.7, dtype=F64)
    return LossInputs(
        policy_logprobs=sampling.clone().requires_grad_(True),
        sampling_logprobs=sampling,
        advantages=torch.full(mask.shape, -1.0, dtype=F64),
        loss_mask=mask,
        truncated=torch.tensor(truncated),
    )


@pytest.mark.parametrize("aggregation", AGGREGATIONS[:2], ids=lambda a: a.kind)
def test_two_truncated_completions_with_unit_losses_give_exactly_one(aggregation: object) -> None:
    inputs = _unit_loss_batch([3, 5, 2, 4], truncated=[False, True, False, True])
    config = PPOClipLoss(kl=NO_KL, aggregation=aggregation, mask_truncated=True)  # type: ignore[arg-type]
    out = ppo_clip_loss(inputs, config)
    assert out.loss.item() == 1.0
    assert out.metrics["tokens/count"] == 5
    assert out.metrics["tokens/masked_truncated"] == 9
    assert out.metrics["seqs/count"] == 2
    # The bug this guards against (numerator masked, denominator not) would give 5 / 14.
    unmasked = ppo_clip_loss(inputs, PPOClipLoss(kl=NO_KL, aggregation=aggregation))  # type: ignore[arg-type]
    assert unmasked.loss.item() == 1.0 and unmasked.metrics["tokens/count"] == 14
    (grad,) = torch.autograd.grad(out.loss, inputs.policy_logprobs)
    assert torch.all(grad[1] == 0) and torch.all(grad[3] == 0) and torch.all(grad[0, :3] != 0)


def test_sum_norm_with_truncation_masking_uses_the_remaining_sequences() -> None:
    inputs = _unit_loss_batch([3, 5, 2, 4], truncated=[False, True, False, True])
    config = PPOClipLoss(
        kl=NO_KL, aggregation=SequenceMeanTokenSumNorm(max_tokens=8), mask_truncated=True
    )
    assert ppo_clip_loss(inputs, config).loss.item() == (3 + 2) / (2 * 8)


def test_only_truncated_completions_masked_give_zero_loss_not_nan() -> None:
    inputs = _unit_loss_batch([3, 5], truncated=[True, True])
    for aggregation in AGGREGATIONS:
        config = PPOClipLoss(kl=NO_KL, aggregation=aggregation, mask_truncated=True)
        out = ppo_clip_loss(inputs, config)
        assert out.loss.item() == 0.0
        assert out.metrics["tokens/count"] == 0
        (grad,) = torch.autograd.grad(out.loss, inputs.policy_logprobs)
        assert torch.all(grad == 0)
        assert all(math.isfinite(v) for v in out.metrics.values())


def test_entropy_and_mismatch_metrics() -> None:
    data = _random_batch(seed=3)
    _, _, metrics = _loss_and_grad(data, PPOClipLoss(kl=NO_KL))
    mask = data["mask"]
    assert metrics["entropy/mean"] == pytest.approx(data["entropy"][mask].mean().item())
    # kl/mismatch: k3 estimate of KL(π_sampling || π_trainer), trainer = old_logprobs here
    d = (data["old"] - data["sampling"])[mask]
    assert metrics["kl/mismatch"] == pytest.approx((d.exp() - 1 - d).mean().item())
    assert metrics["adv/mean"] == pytest.approx(data["adv"][mask].mean().item())
    assert metrics["adv/std"] == pytest.approx(data["adv"][mask].std(unbiased=False).item())


def test_shape_mismatch_is_rejected() -> None:
    inputs, _ = _inputs_from_ratios([[1.0, 1.0]], [[1.0, 1.0]])
    bad = LossInputs(**{**inputs.__dict__, "advantages": torch.zeros(1, 3, dtype=F64)})
    with pytest.raises(ValueError, match="advantages"):
        ppo_clip_loss(bad, PPOClipLoss(kl=NO_KL))


def test_aggregate_hand_computed() -> None:
    per_token = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]], dtype=torch.bool)
    assert aggregate(per_token, mask, TokenMean()).item() == pytest.approx(7 / 3, abs=1e-15)
    assert aggregate(per_token, mask, SequenceMeanTokenMean()).item() == pytest.approx(
        ((1 + 2) / 2 + 4 / 1) / 2, abs=1e-15
    )
    sum_norm = SequenceMeanTokenSumNorm(max_tokens=4)
    assert aggregate(per_token, mask, sum_norm).item() == pytest.approx(7 / 8, abs=1e-15)
    norms = Normalizers(num_tokens=10.0, num_sequences=5.0)
    assert aggregate(per_token, mask, TokenMean(), norms).item() == pytest.approx(7 / 10)
    assert aggregate(per_token, mask, sum_norm, norms).item() == pytest.approx(7 / 20)


def test_count_normalizers_and_effective_mask() -> None:
    mask = torch.arange(6)[None, :] < torch.tensor([3, 5, 2, 4])[:, None]
    truncated = torch.tensor([False, True, False, True])
    assert count_normalizers(mask, truncated) == Normalizers(num_tokens=14.0, num_sequences=4.0)
    assert count_normalizers(mask, truncated, mask_truncated=True) == Normalizers(5.0, 2.0)
    kept = effective_mask(mask, truncated, mask_truncated=True)
    assert kept.sum(-1).tolist() == [3, 0, 2, 0]
    assert torch.equal(effective_mask(mask.int(), truncated, mask_truncated=False), mask)
