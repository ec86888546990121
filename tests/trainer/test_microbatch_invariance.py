"""Micro-batching changes nothing: for every method, micro-batches of 1, 2 and the full batch give
the same loss and the same gradients (after TRL's ``tests/invariant/``).

Advantages are computed once over the full batch and sliced per micro-batch; a trainer that
computed them per micro-batch would give GRPO's [1, 0, 1, 0] group ±0.866 in the full batch,
±0.707 in micro-batches of 2 and 0 in micro-batches of 1 — which these tests catch.
"""

from __future__ import annotations

import pytest
import torch

from clawrl.config import TrainerConfig
from clawrl.models import tiny_policy
from clawrl.trainer import Trainer, TrainSample

GRPO_REWARDS = [1.0, 0.0, 1.0, 0.0]
pytestmark = pytest.mark.filterwarnings(
    "ignore:Seems like `optimizer.step\\(\\)` has been overridden"
)


@pytest.fixture(scope="module")
def policy():
    """The tiny model in float64: float32 matmuls of differently padded batches differ by
    ~1e-7, which would hide a real difference of that size."""
    p = tiny_policy(seed=3, max_context=256)
    p.model.double()
    return p


def _samples(method: str) -> list[TrainSample]:
    """Four turns of different prompt and completion lengths (one truncated), with what each
    method needs: judge rewards, teacher log-probs (hints), one GRPO group [1, 0, 1, 0], or two
    rollouts of two steps with step scores (PRM + outcome)."""
    gen = torch.Generator().manual_seed(0)
    out = []
    for i, (p, c) in enumerate([(5, 3), (9, 6), (4, 2), (12, 5)]):
        prompt = torch.randint(5, 900, (p,), generator=gen).tolist()
        completion = torch.randint(5, 900, (c,), generator=gen).tolist()
        # near the tiny random model's own log-probs (about log 1/49152 = -10.8), so the
        # ratios stay inside the clip and IS ranges and every option changes the gradient
        sampling = (-10.6 - 0.4 * torch.rand(c, generator=gen)).tolist()
        teacher = (-10.2 - 0.8 * torch.rand(c, generator=gen)).tolist()
        reward: float | None = [1.0, -1.0, 0.0, 1.0][i]
        hint = teacher if method == "opd" or (method == "combine" and i % 2 == 0) else None
        if method == "opd":
            reward = None
        if method == "grpo":
            reward = GRPO_REWARDS[i]
        if method == "precomputed":
            reward = [0.866, -0.866, 0.25, -0.1][i]
        steps: dict[str, object] = {}
        if method == "prm_outcome":  # rollouts a (outcome 1) and b (0), two steps each
            reward = [1.0, 1.0, 0.0, 0.0][i]
            steps = {"episode_id": "ab"[i // 2], "step_index": i % 2,
                     "step_score": [-1.0, None, 1.0, -1.0][i]}  # fmt: skip
        out.append(
            TrainSample(
                prompt, completion, sampling, temperature=[1.0, 0.7, 1.0, 1.3][i],
                reward=reward, teacher_logprobs=hint, truncated=i == 3, turn_id=f"t{i}",
                **steps,  # type: ignore[arg-type]
            )
        )  # fmt: skip
    return out


def _step(policy, tmp_path, method: dict, samples, micro_batch: int):
    """One step with the optimizer disabled: (loss, flat gradient, metrics)."""
    config = TrainerConfig(method=method, micro_batch_size=micro_batch, lr=0.0, grad_clip=0.0)
    trainer = Trainer(policy.model, config, tmp_path / f"mb{micro_batch}")
    trainer.optimizer.step = lambda: None  # keep .grad for inspection
    trainer.optimizer.zero_grad = lambda set_to_none=True: None
    metrics = trainer.train_step(samples)
    grad = torch.cat([p.grad.flatten() for p in trainer.params if p.grad is not None])
    return metrics["loss"], grad, metrics


def _loss_options():
    yield {}
    yield {"aggregation": {"kind": "seq_mean_token_mean"}}
    yield {"aggregation": {"kind": "seq_mean_token_sum_norm", "max_tokens": 8}}
    yield {"ratio": {"kind": "tis", "cap": 1.5}, "mask_truncated": True}
    yield {"ratio": {"kind": "mis"}, "dual_clip": 3.0, "kl": {"beta": 0.0}}
    yield {"ratio": {"kind": "old"}, "kl": {"beta": 0.1, "estimator": "k1"}}


CASES = [
    (kind, loss)
    for kind in ("rl", "opd", "combine", "grpo", "prm_outcome", "precomputed")
    for loss in ([{}] if kind not in ("rl", "grpo") else list(_loss_options()))
]


@pytest.mark.parametrize(
    ("kind", "loss"), CASES, ids=[f"{k}-{i}" for i, (k, _) in enumerate(CASES)]
)
def test_micro_batches_of_1_2_and_4_give_one_step(policy, tmp_path, kind, loss):
    samples = _samples(kind)
    method = {"kind": kind, "loss": loss}
    full_loss, full_grad, full = _step(policy, tmp_path, method, samples, 4)
    assert full_grad.abs().sum() > 0
    for mb in (1, 2):
        loss_mb, grad_mb, metrics = _step(policy, tmp_path, method, samples, mb)
        assert loss_mb == pytest.approx(full_loss, rel=1e-9, abs=1e-12), (mb, loss)
        assert torch.allclose(grad_mb, full_grad, rtol=1e-7, atol=1e-12), (mb, loss)
        assert metrics["tokens/count"] == full["tokens/count"]
        for key in ("adv/mean", "entropy/mean", "ratio/mean", "ratio/max", "ratio/min",
                    "clip/high_frac", "kl/mismatch"):  # fmt: skip
            assert metrics[key] == pytest.approx(full[key], rel=1e-6, abs=1e-9), (key, mb, loss)


def test_grpo_group_advantages_are_those_of_the_whole_group(policy, tmp_path):
    """[1, 0, 1, 0] in one group: ±0.866 on every token whatever the micro-batch size."""
    samples = _samples("grpo")
    for mb in (1, 2, 4):
        _, _, m = _step(policy, tmp_path, {"kind": "grpo"}, samples, mb)
        a = 0.5 / ((1 / 3) ** 0.5 + 1e-4)
        assert m["adv/max"] == pytest.approx(a, rel=1e-5)
        assert m["adv/min"] == pytest.approx(-a, rel=1e-5)
