"""Rollout-level group advantages, hand-computed, and their exact delivery to the trainer."""

from __future__ import annotations

import math

import pytest
import torch

from clawrl.algorithms import AdvantageInputs, OPDAdvantage, compute_advantages
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


def test_opd_delivery_gives_exactly_the_rollout_advantage_on_every_token():
    """teacher = sampling + A makes the trainer's OPD estimator return A on each sampled token."""
    samples = []
    for adv, n in [(0.866, 3), (-0.866, 5), (0.25, 1)]:
        lps = [-0.1 * (i + 1) for i in range(n)]
        samples.append(
            TrainSample(
                prompt_ids=[1, 2, 3],
                completion_ids=list(range(10, 10 + n)),
                sampling_logprobs=lps,
                reward=adv,
                teacher_logprobs=[x + adv for x in lps],
            )
        )
    batch = collate(samples)
    out = compute_advantages(
        OPDAdvantage(clip=None),
        AdvantageInputs(
            loss_mask=batch.loss_mask, teacher_logprobs=batch.teacher_logprobs,
            old_logprobs=batch.sampling_logprobs, has_hint=batch.has_hint,
        ),
    )  # fmt: skip
    for i, s in enumerate(samples):
        row = out.advantages[i][batch.loss_mask[i]]
        assert row.numel() == len(s.completion_ids)
        assert torch.allclose(row.double(), torch.full_like(row.double(), s.reward), atol=1e-6)
    assert bool((out.advantages[~batch.loss_mask] == 0).all())
