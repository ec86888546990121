"""Rollout groups with signal, and GRPO over rollouts (episodes) delivered exactly to tokens."""

from __future__ import annotations

import math

import pytest
import torch

from clawrl.algorithms import (
    AdvantageInputs,
    GRPOAdvantage,
    PrecomputedAdvantage,
    compute_advantages,
)
from clawrl.harness.groups import select_groups
from clawrl.store import GroupDecision
from clawrl.trainer.batch import collate
from clawrl.trainer.types import TrainSample


def test_groups_without_signal_are_skipped_and_counted():
    out = select_groups(
        [("a", "same", 1.0), ("b", "same", 1.0), ("c", "zero", 0.0), ("d", "zero", 0.0),
         ("e", "alone", 1.0), ("f", "ok", 0.0), ("g", "ok", 1.0)]
    )  # fmt: skip
    assert out.kept == {"f": 0.0, "g": 1.0}
    assert out.skipped_zero_variance == 2 and out.skipped_too_small == 1
    assert out.group_means == {"same": 1.0, "zero": 0.0, "alone": 1.0, "ok": 0.5}


def test_prm_outcome_keeps_equal_outcome_groups_whose_step_scores_differ():
    rewards = [("a", "steps", 0.0), ("b", "steps", 0.0), ("c", "flat", 1.0), ("d", "flat", 1.0),
               ("e", "ok", 0.0), ("f", "ok", 1.0)]  # fmt: skip
    # "steps": step 1 scores differ (a +1, b -1); "flat": d's extra step 2 has no partner
    step_scores = {"a": {0: 1.0, 1: 1.0}, "b": {0: 1.0, 1: -1.0},
                   "c": {0: 0.0}, "d": {0: 0.0, 2: -1.0}}  # fmt: skip
    out = select_groups(rewards, step_scores=step_scores)
    assert set(out.kept) == {"a", "b", "e", "f"}
    assert out.decisions["steps"] is GroupDecision.KEPT and out.kept_by_step_scores == 1
    assert out.decisions["flat"] is GroupDecision.ZERO_VARIANCE and out.skipped_zero_variance == 1
    # outcome only (GRPO): the step scores are not looked at
    plain = select_groups(rewards)
    assert set(plain.kept) == {"e", "f"} and plain.kept_by_step_scores == 0


def _samples(rollouts):
    """Turn samples of rollouts ``[(rollout id, group, reward, [turn lengths])]``."""
    out = []
    for rid, group, reward, lengths in rollouts:
        for k, n in enumerate(lengths):
            out.append(
                TrainSample(
                    prompt_ids=[1, 2, 3 + k],
                    completion_ids=list(range(10, 10 + n)),
                    sampling_logprobs=[-0.1] * n,
                    reward=reward,
                    group_id=group,
                    episode_id=rid,
                    turn_id=f"{rid}-{k}",
                )
            )
    return out


def test_grpo_over_rollouts_counts_each_rollout_once():
    """Rewards 1, 0, 0, 1 over four rollouts, the first with three turns: mean 0.5 and Bessel
    std sqrt(1/3) over the *rollouts* (a turn-level mean would be 0.6), on every token."""
    samples = _samples([("a", 0, 1.0, [2, 3, 1]), ("b", 0, 0.0, [4]), ("c", 0, 0.0, [2]),
                        ("d", 0, 1.0, [5])])  # fmt: skip
    batch = collate(samples)
    out = compute_advantages(
        GRPOAdvantage(),
        AdvantageInputs(
            loss_mask=batch.loss_mask, rewards=batch.rewards, group_ids=batch.group_ids,
            episode_ids=batch.episode_ids,
        ),
    )  # fmt: skip
    a = 0.5 / (math.sqrt(1 / 3) + 1e-4)
    for i, s in enumerate(samples):
        row = out.advantages[i][batch.loss_mask[i]]
        assert row.numel() == len(s.completion_ids)
        want = a if s.reward == 1.0 else -a
        assert torch.allclose(row.double(), torch.full_like(row.double(), want), atol=1e-6)
    assert bool((out.advantages[~batch.loss_mask] == 0).all())


def test_dr_grpo_is_mean_centred_and_groups_are_independent():
    samples = _samples([("a", 0, 1.0, [1]), ("b", 0, 0.5, [1]), ("c", 0, 0.0, [1]),
                        ("d", 1, 0.5, [1, 1]), ("e", 1, 0.0, [1])])  # fmt: skip
    batch = collate(samples)
    out = compute_advantages(
        GRPOAdvantage(normalize_std=False),
        AdvantageInputs(
            loss_mask=batch.loss_mask, rewards=batch.rewards, group_ids=batch.group_ids,
            episode_ids=batch.episode_ids,
        ),
    )  # fmt: skip
    got = out.advantages[batch.loss_mask].tolist()
    assert got == pytest.approx([0.5, 0.0, -0.5, 0.25, 0.25, -0.25])


def test_an_episode_with_two_rewards_is_refused():
    samples = _samples([("a", 0, 1.0, [1]), ("a", 0, 0.0, [1]), ("b", 0, 0.0, [1])])
    batch = collate(samples)
    with pytest.raises(ValueError, match="episode"):
        compute_advantages(
            GRPOAdvantage(),
            AdvantageInputs(
                loss_mask=batch.loss_mask, rewards=batch.rewards, group_ids=batch.group_ids,
                episode_ids=batch.episode_ids,
            ),
        )  # fmt: skip


def test_precomputed_advantage_rejects_non_finite():
    mask = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="finite"):
        compute_advantages(
            PrecomputedAdvantage(),
            AdvantageInputs(loss_mask=mask, rewards=torch.tensor([1.0, float("nan")])),
        )


def test_each_group_gets_its_decision():
    from clawrl.store import GroupDecision

    out = select_groups([("a", "same", 1.0), ("b", "same", 1.0), ("e", "alone", 1.0),
                         ("f", "ok", 0.0), ("g", "ok", 1.0)])  # fmt: skip
    assert out.decisions == {
        "same": GroupDecision.ZERO_VARIANCE, "alone": GroupDecision.TOO_SMALL,
        "ok": GroupDecision.KEPT,
    }  # fmt: skip
