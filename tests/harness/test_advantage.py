"""Rollout-level group advantages, hand-computed, and their exact delivery to the trainer."""

from __future__ import annotations

import math

import pytest
import torch

from clawrl.algorithms import AdvantageInputs, PrecomputedAdvantage, compute_advantages
from clawrl.harness.advantage import group_advantages
from clawrl.trainer.batch import collate
from clawrl.trainer.types import TrainSample


def test_grpo_hand_computed():
    # group g: rewards 1, 0, 0, 1 -> mean 0.5, Bessel std sqrt(1/3)
    out = group_advantages([("a", "g", 1.0), ("b", "g", 0.0), ("c", "g", 0.0), ("d", "g", 1.0)])
    a = 0.5 / (math.sqrt(1 / 3) + 1e-4)
    assert out.advantages == pytest.approx({"a": a, "b": -a, "c": -a, "d": a})
    assert out.skipped_zero_variance == 0 and out.group_means == {"g": 0.5}


def test_ppo_is_mean_centred_and_partial_rewards_count():
    out = group_advantages([("a", "g", 1.0), ("b", "g", 0.5), ("c", "g", 0.0)], normalize_std=False)
    assert out.advantages == pytest.approx({"a": 0.5, "b": 0.0, "c": -0.5})


def test_groups_without_signal_are_skipped_and_counted():
    out = group_advantages(
        [("a", "same", 1.0), ("b", "same", 1.0), ("c", "zero", 0.0), ("d", "zero", 0.0),
         ("e", "alone", 1.0), ("f", "ok", 0.0), ("g", "ok", 1.0)]
    )  # fmt: skip
    assert set(out.advantages) == {"f", "g"}
    assert out.skipped_zero_variance == 2 and out.skipped_too_small == 1
    assert out.advantages["g"] == pytest.approx(-out.advantages["f"])


def test_groups_are_independent():
    rewards = [("a", "g1", 1.0), ("b", "g1", 0.0), ("c", "g2", 0.5), ("d", "g2", 0.0)]
    out = group_advantages(rewards, eps=0.0)
    # each group is normalised alone: both give +-1/sqrt(2)
    assert out.advantages["a"] == pytest.approx(out.advantages["c"]) == pytest.approx(0.5**0.5)


def test_precomputed_advantage_reaches_every_sampled_token_exactly():
    """reward = A_i with PrecomputedAdvantage gives A_t = A_i on each sampled token, 0 elsewhere."""
    samples = []
    for adv, n in [(0.866, 3), (-0.866, 5), (0.25, 1)]:
        lps = [-0.1 * (i + 1) for i in range(n)]
        samples.append(
            TrainSample(
                prompt_ids=[1, 2, 3],
                completion_ids=list(range(10, 10 + n)),
                sampling_logprobs=lps,
                reward=adv,
            )
        )
    batch = collate(samples)
    out = compute_advantages(
        PrecomputedAdvantage(), AdvantageInputs(loss_mask=batch.loss_mask, rewards=batch.rewards)
    )
    for i, s in enumerate(samples):
        row = out.advantages[i][batch.loss_mask[i]]
        assert row.numel() == len(s.completion_ids)
        assert torch.allclose(row.double(), torch.full_like(row.double(), s.reward), atol=1e-6)
    assert bool((out.advantages[~batch.loss_mask] == 0).all())


def test_precomputed_advantage_rejects_non_finite():
    mask = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="finite"):
        compute_advantages(
            PrecomputedAdvantage(),
            AdvantageInputs(loss_mask=mask, rewards=torch.tensor([1.0, float("nan")])),
        )
