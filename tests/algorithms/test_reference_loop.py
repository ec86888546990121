"""The reference loop (examples/reference_loop.py) runs one step on the tiny model and is exact."""

from __future__ import annotations

import copy
import importlib.util
import pathlib
import sys
from types import ModuleType

import pytest
import torch

from clawrl.algorithms import GRPOAdvantage, KLPenalty, PPOClipLoss

PATH = pathlib.Path(__file__).resolve().parents[2] / "examples" / "reference_loop.py"


@pytest.fixture(scope="module")
def loop() -> ModuleType:
    spec = importlib.util.spec_from_file_location("clawrl_reference_loop", PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def setup(loop: ModuleType) -> tuple[torch.nn.Module, object]:
    model = loop.tiny_policy(seed=0)
    batch = loop.judge(loop.sample(model, loop.PROMPTS, group_size=4, max_new_tokens=6, seed=0))
    return model, batch


def test_step_is_deterministic_and_consistent_with_sampling(
    loop: ModuleType, setup: tuple[torch.nn.Module, object]
) -> None:
    model, batch = setup
    no_kl = PPOClipLoss(kl=KLPenalty(beta=0.0))
    first = loop.run_reference_step(copy.deepcopy(model), batch, loss_config=no_kl)
    second = loop.run_reference_step(copy.deepcopy(model), batch, loss_config=no_kl)
    assert first["loss"] == second["loss"] and first["grad_norm"] == second["grad_norm"]
    assert first["num_samples"] == 16 and first["grad_norm"] > 0
    metrics = first["metrics"]
    # The trainer's log-probs reproduce the engine's at the right positions (ρ = 1 up to float32),
    # so the loss is -(1/N) Σ A_t, i.e. minus the advantage mean over tokens.
    assert metrics["kl/mismatch"] < 1e-8
    assert first["loss"] == pytest.approx(-metrics["adv/mean"], abs=1e-5)
    assert metrics["tokens/count"] == sum(len(c) for c in batch.completion_ids)
    assert any(batch.truncated) and not all(batch.truncated)  # lengths differ: padding is exercised


def test_default_config_with_reference_model_and_optimizer(
    loop: ModuleType, setup: tuple[torch.nn.Module, object]
) -> None:
    model, batch = setup
    policy = copy.deepcopy(model)
    ref = copy.deepcopy(model).requires_grad_(False)
    before = [p.detach().clone() for p in policy.parameters()]
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3)
    result = loop.run_reference_step(policy, batch, ref_model=ref, optimizer=optimizer)
    assert result["metrics"]["kl/ref"] == pytest.approx(0.0, abs=1e-8)  # policy == ref before step
    changed = [not torch.equal(b, p) for b, p in zip(before, policy.parameters(), strict=True)]
    assert any(changed)
    assert all(p.grad is None for p in policy.parameters())


def test_steps_raise_rewarded_and_lower_penalised_log_probs(
    loop: ModuleType, setup: tuple[torch.nn.Module, object]
) -> None:
    model, batch = setup
    policy = copy.deepcopy(model)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=3e-3)
    tensors = loop.collate(batch)
    rewards = tensors.rewards[:, None].expand_as(tensors.loss_mask)

    def mean_logprob(sign: float) -> float:
        with torch.no_grad():
            logprobs, _ = loop.token_logprobs(policy, tensors)
        selected = tensors.loss_mask & (rewards == sign)
        return logprobs[selected].mean().item()

    good, bad = mean_logprob(1.0), mean_logprob(-1.0)
    for _ in range(3):
        loop.run_reference_step(
            policy, batch, loss_config=PPOClipLoss(kl=KLPenalty(beta=0.0)), optimizer=optimizer
        )
    assert mean_logprob(1.0) > good + 0.1
    assert mean_logprob(-1.0) < bad - 0.1


def test_stale_samples_are_dropped_and_grpo_runs(
    loop: ModuleType, setup: tuple[torch.nn.Module, object]
) -> None:
    model, batch = setup
    versions = [0 if i % 2 else 9 for i in range(len(batch.completion_ids))]
    stale = loop.ReferenceBatch(**{**batch.__dict__, "policy_versions": versions})
    result = loop.run_reference_step(
        copy.deepcopy(model),
        stale,
        advantage_config=GRPOAdvantage(),
        loss_config=PPOClipLoss(kl=KLPenalty(beta=0.0)),
        trainer_version=10,
    )
    assert result["stale/dropped"] == 8 and result["num_samples"] == 8
