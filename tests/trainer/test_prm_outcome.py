"""Integrated PRM + outcome in the trainer: each sample is one step of its rollout, and the
trainer's advantages are :func:`clawrl.algorithms.prm_outcome_advantages` over those steps.

Hand-computed case, one group of two rollouts (eps = 1e-4 throughout):

* rollout a, outcome 1: step 0 judged -1, step 1 (its last turn, no next state) unscored;
* rollout b, outcome 0: step 0 judged +1, step 1 judged -1, step 2 (last) unscored.

``R = PRM + outcome``: a = [0, 1], b = [1, -1, 0]. Cell (g, 0) = [0, 1]: mean 1/2, std sqrt(1/2),
so a0 = -0.5 / (sqrt(1/2) + eps), b0 = +0.5 / (sqrt(1/2) + eps). Cell (g, 1) = [1, -1]: mean 0,
std sqrt(2): a1 = 1 / (sqrt(2) + eps), b1 = -a1. Cell (g, 2) holds b alone: 0. Outcome-only GRPO
gives every turn of a +0.5 / (sqrt(1/2) + eps) and every turn of b its negative, so a's first step
flips sign: the judge's -1 outweighs the outcome there.
"""

from __future__ import annotations

import math

import pytest
import torch

import clawrl.trainer.trainer as trainer_module
from clawrl.algorithms import prm_outcome_advantages
from clawrl.config import TrainerConfig
from clawrl.errors import TrainerError
from clawrl.trainer import Trainer, TrainSample, collate
from clawrl.trainer.batch import step_reward_inputs

EPS = 1e-4
CELL0 = 0.5 / (math.sqrt(0.5) + EPS)
CELL1 = 1.0 / (math.sqrt(2.0) + EPS)
# (episode, outcome, step, step score)
STEPS = [("a", 1.0, 0, -1.0), ("a", 1.0, 1, None), ("b", 0.0, 0, 1.0), ("b", 0.0, 1, -1.0),
         ("b", 0.0, 2, None)]  # fmt: skip
PRM_EXPECTED = [-CELL0, CELL1, CELL0, -CELL1, 0.0]
OUTCOME_EXPECTED = [CELL0, CELL0, -CELL0, -CELL0, -CELL0]


def _samples() -> list[TrainSample]:
    gen = torch.Generator().manual_seed(0)
    out = []
    for i, (episode, outcome, step, score) in enumerate(STEPS):
        prompt = torch.randint(5, 900, (4 + i,), generator=gen).tolist()
        completion = torch.randint(5, 900, (2 + i % 3,), generator=gen).tolist()
        out.append(
            TrainSample(
                prompt, completion, [-10.8] * len(completion), reward=outcome, turn_id=f"t{i}",
                group_id=0, episode_id=episode, step_index=step, step_score=score,
            )
        )  # fmt: skip
    return out


def _advantages_of_a_step(tiny, tmp_path, method, monkeypatch) -> torch.Tensor:
    """The ``[B, T]`` advantages the trainer hands the loss in one step (captured on the way)."""
    seen: list[torch.Tensor] = []
    real = trainer_module.compute_loss

    def capture(config, inputs):
        seen.append(inputs.advantages.detach().clone())
        return real(config, inputs)

    monkeypatch.setattr(trainer_module, "compute_loss", capture)
    config = TrainerConfig(method=method, micro_batch_size=8, lr=0.0)
    Trainer(tiny.model, config, tmp_path / "run").train_step(_samples())
    (advantages,) = seen
    return advantages


def _per_row(advantages: torch.Tensor, mask: torch.Tensor) -> list[float]:
    """Each row's advantage, checking it is the same on every trained token of the row."""
    rows = []
    for i in range(mask.shape[0]):
        values = advantages[i][mask[i]]
        assert torch.allclose(values, values[0].expand_as(values)), i
        rows.append(float(values[0]))
    return rows


def test_step_reward_inputs_give_each_row_its_own_step() -> None:
    batch = collate(_samples())
    step_scores, step_mask, token_steps = step_reward_inputs(batch)
    assert step_mask.tolist() == [
        [True, False, False], [False, True, False], [True, False, False],
        [False, True, False], [False, False, True],
    ]  # fmt: skip
    # an unscored step (a's and b's last turns) has a PRM term of 0: the outcome alone
    assert step_scores.tolist() == [
        [-1.0, 0, 0], [0, 0.0, 0], [1.0, 0, 0], [0, -1.0, 0], [0, 0, 0.0]
    ]  # fmt: skip
    assert batch.has_step_score.tolist() == [True, False, True, True, False]
    assert token_steps.shape == batch.loss_mask.shape
    assert token_steps[:, 0].tolist() == [0, 1, 0, 1, 2]


def test_two_samples_of_one_episode_at_one_step_are_refused(tiny, tmp_path) -> None:
    samples = _samples()
    samples[1].step_index = 0  # a's second turn claims a's first step
    with pytest.raises(ValueError, match="same step_index"):
        step_reward_inputs(collate(samples))
    trainer = Trainer(tiny.model, TrainerConfig(method="prm_outcome"), tmp_path)
    with pytest.raises(TrainerError, match="prm_outcome"):
        trainer.train_step(samples)


def test_trainer_gives_the_prm_outcome_advantages(tiny, tmp_path, monkeypatch) -> None:
    advantages = _advantages_of_a_step(tiny, tmp_path, "prm_outcome", monkeypatch)
    batch = collate(_samples())
    assert _per_row(advantages, batch.loss_mask) == pytest.approx(PRM_EXPECTED, abs=1e-6)
    # ... which is exactly the algorithms' formula on the rollouts written as [rollout, step]
    formula = prm_outcome_advantages(
        step_scores=torch.tensor([[-1.0, 0.0, 0.0], [1.0, -1.0, 0.0]]),
        step_mask=torch.tensor([[True, True, False], [True, True, True]]),
        outcome=torch.tensor([1.0, 0.0]),
        group_ids=torch.tensor([0, 0]),
        token_steps=torch.tensor([[0, 1, 2], [0, 1, 2]]),
        loss_mask=torch.tensor([[True, True, False], [True, True, True]]),
    )
    by_row = [formula[0, 0], formula[0, 1], formula[1, 0], formula[1, 1], formula[1, 2]]
    assert _per_row(advantages, batch.loss_mask) == pytest.approx(
        [float(x) for x in by_row], abs=1e-6
    )


def test_outcome_only_ignores_step_scores(tiny, tmp_path, monkeypatch) -> None:
    advantages = _advantages_of_a_step(tiny, tmp_path, "grpo", monkeypatch)
    rows = _per_row(advantages, collate(_samples()).loss_mask)
    assert rows == pytest.approx(OUTCOME_EXPECTED, abs=1e-6)
    assert rows[0] > 0 > PRM_EXPECTED[0]  # the two methods disagree on a's first step
