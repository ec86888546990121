"""A two-armed bandit with known rewards converges under Binary RL and under GRPO."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from clawrl.algorithms import (
    KLPenalty,
    LossInputs,
    PPOClipLoss,
    binary_rl_advantages,
    grpo_advantages,
    ppo_clip_loss,
)

F64 = torch.float64
REWARD_BINARY = torch.tensor([1.0, -1.0], dtype=F64)  # judge: arm 0 good, arm 1 bad
REWARD_OUTCOME = torch.tensor([1.0, 0.0], dtype=F64)  # verifier: arm 0 passes


def _binary(actions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return binary_rl_advantages(REWARD_BINARY[actions], mask)


def _grpo(actions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    groups = torch.arange(actions.numel()) // 8  # 8 groups of 8 samples of one prompt
    return grpo_advantages(REWARD_OUTCOME[actions], groups, mask)


def _train(
    advantage_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], epochs: int
) -> float:
    gen = torch.Generator().manual_seed(0)
    logits = torch.zeros(2, dtype=F64, requires_grad=True)
    optimizer = torch.optim.SGD([logits], lr=0.5)
    config = PPOClipLoss(kl=KLPenalty(beta=0.0))
    for _ in range(40):
        with torch.no_grad():
            probs = torch.softmax(logits, -1)
            actions = torch.multinomial(probs, 64, replacement=True, generator=gen)
            sampling_logprobs = probs.log()[actions].unsqueeze(-1)  # [B, T=1]
        mask = torch.ones(64, 1, dtype=torch.bool)
        advantages = advantage_fn(actions, mask)
        for _ in range(epochs):  # > 1: later epochs are off-policy and exercise the clip
            policy_logprobs = torch.log_softmax(logits, -1)[actions].unsqueeze(-1)
            loss = ppo_clip_loss(
                LossInputs(policy_logprobs, sampling_logprobs, advantages, mask), config
            ).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return torch.softmax(logits, -1)[0].item()


@pytest.mark.parametrize("epochs", [1, 3])
@pytest.mark.parametrize("advantage_fn", [_binary, _grpo], ids=["binary_rl", "grpo"])
def test_two_armed_bandit_converges_to_the_better_arm(
    advantage_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], epochs: int
) -> None:
    assert _train(advantage_fn, epochs) > 0.95


def test_bandit_with_inverted_rewards_converges_to_the_other_arm() -> None:
    """Guards the sign: the same loop with advantages negated picks arm 1."""
    p0 = _train(lambda actions, mask: -_binary(actions, mask), epochs=1)
    assert p0 < 0.05
