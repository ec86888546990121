"""Advantage estimators against hand-computed values (float64, CPU)."""

from __future__ import annotations

import math

import pytest
import torch

from clawrl.algorithms import (
    AdvantageInputs,
    BinaryRLAdvantage,
    CombinedAdvantage,
    GRPOAdvantage,
    OPDAdvantage,
    PRMOutcomeAdvantage,
    binary_rl_advantages,
    combined_advantages,
    compute_advantages,
    grpo_advantages,
    opd_advantages,
    prm_outcome_advantages,
)

F64 = torch.float64


def _mask(lengths: list[int], width: int) -> torch.Tensor:
    return torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]


def test_binary_rl_broadcasts_the_judge_reward_to_every_sampled_token() -> None:
    mask = _mask([2, 3, 1], 3)
    adv = binary_rl_advantages(torch.tensor([1.0, -1.0, 0.0], dtype=F64), mask)
    expected = torch.tensor([[1, 1, 0], [-1, -1, -1], [0, 0, 0]], dtype=F64)
    assert torch.equal(adv, expected)


def test_binary_rl_rejects_non_ternary_rewards() -> None:
    with pytest.raises(ValueError, match="must be"):
        binary_rl_advantages(torch.tensor([0.5]), _mask([1], 1))


def test_grpo_hand_computed_with_uneven_groups() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 3.0, 1.0], dtype=F64)
    groups = torch.tensor([5, 5, 5, 5, 9, 2, 2])
    mask = _mask([1, 2, 1, 1, 1, 3, 1], 3)
    adv = grpo_advantages(rewards, groups, mask, eps=0.0)
    # group 5: mean 1/2, Bessel std sqrt(1/3); group 9 alone: 0; group 2: mean 2, std sqrt(2)
    a = 0.5 / math.sqrt(1 / 3)
    b = 1 / math.sqrt(2)
    per_seq = torch.tensor([a, -a, -a, a, 0.0, b, -b], dtype=F64)
    torch.testing.assert_close(adv, per_seq[:, None] * mask, rtol=0, atol=1e-14)

    dr = grpo_advantages(rewards, groups, mask, normalize_std=False)
    per_seq = torch.tensor([0.5, -0.5, -0.5, 0.5, 0.0, 1.0, -1.0], dtype=F64)
    torch.testing.assert_close(dr, per_seq[:, None] * mask, rtol=0, atol=1e-15)

    eps = grpo_advantages(rewards, groups, mask, eps=0.1)
    assert eps[0, 0].item() == pytest.approx(0.5 / (math.sqrt(1 / 3) + 0.1), abs=1e-14)


def test_grpo_group_with_equal_rewards_gets_zero_advantage() -> None:
    adv = grpo_advantages(torch.tensor([1.0, 1.0, 1.0]), torch.zeros(3), _mask([2, 2, 2], 2))
    assert torch.equal(adv, torch.zeros(3, 2))


def test_opd_is_teacher_minus_old_clipped_and_only_on_hinted_turns() -> None:
    teacher = torch.tensor([[-1.0, -2.0, -0.5], [-0.1, -0.2, float("nan")]], dtype=F64)
    old = torch.tensor([[-2.0, -2.0, -3.0], [-3.0, -0.2, 0.0]], dtype=F64)
    mask = _mask([3, 2], 3)
    torch.testing.assert_close(
        opd_advantages(teacher, old, mask),
        torch.tensor([[1.0, 0.0, 2.5], [2.9, 0.0, 0.0]], dtype=F64),
    )
    torch.testing.assert_close(
        opd_advantages(teacher, old, mask, clip=2.0),
        torch.tensor([[1.0, 0.0, 2.0], [2.0, 0.0, 0.0]], dtype=F64),
    )
    no_hint = opd_advantages(teacher, old, mask, has_hint=torch.tensor([True, False]))
    torch.testing.assert_close(no_hint, torch.tensor([[1.0, 0.0, 2.5], [0.0, 0.0, 0.0]], dtype=F64))


def test_combined_is_weighted_sum_of_reward_and_opd() -> None:
    teacher = torch.tensor([[-1.0, -2.0], [-0.5, -4.0]], dtype=F64)
    old = torch.tensor([[-2.0, -1.0], [-0.5, -1.0]], dtype=F64)
    mask = _mask([2, 1], 2)
    rewards = torch.tensor([1.0, -1.0], dtype=F64)
    adv = combined_advantages(rewards, teacher, old, mask, w_rl=0.5, w_opd=2.0, opd_clip=1.5)
    # row 0: 0.5·1 + 2·clip([1, -1]); row 1: 0.5·(-1) + 2·0 on its one token
    expected = torch.tensor([[0.5 + 2.0, 0.5 - 2.0], [-0.5, 0.0]], dtype=F64)
    torch.testing.assert_close(adv, expected, rtol=0, atol=1e-15)
    default = combined_advantages(rewards, teacher, old, mask)
    torch.testing.assert_close(default, torch.tensor([[2.0, 0.0], [-1.0, 0.0]], dtype=F64))


def _prm_example() -> dict[str, torch.Tensor]:
    return {
        "step_scores": torch.tensor(
            [[1.0, -1.0, 0.0], [-1.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 1.0, 1.0]], dtype=F64
        ),
        "step_mask": torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]], dtype=torch.bool),
        "outcome": torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=F64),
        "group_ids": torch.tensor([0, 0, 0, 1]),
        "token_steps": torch.tensor(
            [[0, 0, 1, 1, -1], [0, 1, 1, 2, 2], [0, 0, 0, -1, -1], [0, 1, 1, 1, -1]]
        ),
        "loss_mask": _mask([4, 5, 3, 4], 5),
    }


def test_prm_outcome_normalises_per_group_and_step() -> None:
    ex = _prm_example()
    adv = prm_outcome_advantages(**ex, eps=0.0)
    # R = PRM + outcome: row0 [2, 0], row1 [-1, 1, 0], row2 [1], row3 [1, 1] (group 1).
    # (g0, s0): [2, -1, 1], mean 2/3, std sqrt(7/3); (g0, s1): [0, 1], mean 1/2, std sqrt(1/2);
    # (g0, s2), (g1, s0), (g1, s1) have one rollout each -> 0.
    s0 = math.sqrt(7 / 3)
    s1 = math.sqrt(1 / 2)
    a00, a10, a20 = (4 / 3) / s0, (-5 / 3) / s0, (1 / 3) / s0
    a01, a11 = -0.5 / s1, 0.5 / s1
    expected = torch.tensor(
        [
            [a00, a00, a01, a01, 0.0],
            [a10, a11, a11, 0.0, 0.0],
            [a20, a20, a20, 0.0, 0.0],
            [0.0, 0.0, 0.0, 0.0, 0.0],
        ],
        dtype=F64,
    )
    torch.testing.assert_close(adv, expected, rtol=0, atol=1e-14)

    centered = prm_outcome_advantages(**ex, normalize_std=False)
    assert centered[0, 0].item() == pytest.approx(4 / 3, abs=1e-14)
    assert centered[1, 1].item() == pytest.approx(0.5, abs=1e-14)


def test_prm_outcome_rejects_tokens_without_a_valid_step() -> None:
    ex = _prm_example()
    ex["token_steps"] = ex["token_steps"].clone()
    ex["token_steps"][2, 1] = 1  # row 2 has no step 1
    with pytest.raises(ValueError, match="valid step"):
        prm_outcome_advantages(**ex)


def test_compute_advantages_dispatches_by_config_type() -> None:
    ex = _prm_example()
    mask = ex["loss_mask"]
    rewards = torch.tensor([1.0, -1.0, 0.0, 1.0], dtype=F64)
    teacher = torch.randn(4, 5, dtype=F64, generator=torch.Generator().manual_seed(0))
    old = torch.zeros(4, 5, dtype=F64)
    inputs = AdvantageInputs(
        loss_mask=mask,
        rewards=rewards,
        group_ids=ex["group_ids"],
        teacher_logprobs=teacher,
        old_logprobs=old,
    )
    cases = [
        (BinaryRLAdvantage(), binary_rl_advantages(rewards, mask)),
        (
            GRPOAdvantage(normalize_std=False),
            grpo_advantages(rewards, ex["group_ids"], mask, normalize_std=False),
        ),
        (OPDAdvantage(clip=0.5), opd_advantages(teacher, old, mask, clip=0.5)),
        (CombinedAdvantage(w_opd=0.3), combined_advantages(rewards, teacher, old, mask, w_opd=0.3)),
    ]
    for config, expected in cases:
        out = compute_advantages(config, inputs)
        assert torch.equal(out.advantages, expected), config
        assert out.metrics["adv/mean"] == pytest.approx(expected[mask].mean().item())

    prm_inputs = AdvantageInputs(
        loss_mask=mask,
        rewards=ex["outcome"],
        group_ids=ex["group_ids"],
        step_scores=ex["step_scores"],
        step_mask=ex["step_mask"],
        token_steps=ex["token_steps"],
    )
    out = compute_advantages(PRMOutcomeAdvantage(), prm_inputs)
    assert torch.equal(out.advantages, prm_outcome_advantages(**ex))


def test_compute_advantages_names_missing_inputs() -> None:
    with pytest.raises(ValueError, match="group_ids"):
        compute_advantages(GRPOAdvantage(), AdvantageInputs(_mask([1], 1), rewards=torch.ones(1)))
    with pytest.raises(ValueError, match="teacher_logprobs"):
        compute_advantages(OPDAdvantage(), AdvantageInputs(_mask([1], 1)))
