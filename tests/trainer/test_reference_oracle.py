"""The trainer's first step equals the reference loop's (examples/reference_loop.py)."""

from __future__ import annotations

import copy
import importlib.util
import pathlib
import sys

import pytest
import torch

from clawrl.config import TrainerConfig
from clawrl.trainer import Trainer, TrainSample

PATH = pathlib.Path(__file__).resolve().parents[2] / "examples" / "reference_loop.py"


@pytest.fixture(scope="module")
def loop():
    spec = importlib.util.spec_from_file_location("clawrl_reference_loop_oracle", PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("micro_batch_size", [16, 3])
def test_first_step_loss_and_gradient_match_reference(loop, tmp_path, micro_batch_size):
    model = loop.tiny_policy(seed=0)
    batch = loop.judge(loop.sample(model, loop.PROMPTS, group_size=4, max_new_tokens=6, seed=0))
    ref_policy = copy.deepcopy(model)
    ref = loop.run_reference_step(ref_policy, batch, ref_model=copy.deepcopy(model).eval())
    samples = [
        TrainSample(p, c, lp, temperature=1.0, reward=r, truncated=t)
        for p, c, lp, r, t in zip(
            batch.prompt_ids, batch.completion_ids, batch.sampling_logprobs, batch.rewards,
            batch.truncated, strict=True,
        )
    ]  # fmt: skip
    settings = TrainerConfig(
        method={"kind": "rl", "loss": {"kl": {"beta": 0.02}}}, full_finetune=True,
        grad_clip=1e9, lr=0.0, micro_batch_size=micro_batch_size,
    )  # fmt: skip
    trainer = Trainer(model, settings, tmp_path)
    trainer.optimizer.zero_grad = lambda set_to_none=True: None  # keep .grad for comparison
    ours = trainer.train_step(samples)
    assert ours["loss"] == pytest.approx(ref["loss"], rel=1e-5, abs=1e-7)
    assert ours["grad/norm"] == pytest.approx(ref["grad_norm"], rel=1e-4)
    assert ours["kl/mismatch"] == pytest.approx(0.0, abs=1e-6)
    theirs = dict(ref_policy.named_parameters())
    for name, p in trainer.model.named_parameters():
        assert torch.allclose(p.grad, theirs[name].grad, rtol=1e-4, atol=1e-7), name
