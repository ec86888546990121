"""Cross-check: our PPO/GRPO loss equals TRL 1.16 ``GRPOTrainer._compute_loss`` on the same tensors.

We call TRL's real ``_compute_loss`` on a bare ``GRPOTrainer`` (``object.__new__``, no model, no
accelerator) whose ``_get_per_token_logps_and_entropies`` returns our ``policy_logprobs``, and
compare the loss, its gradient with respect to ``policy_logprobs``, and the logged clip fractions,
KL and entropy. The only TRL code transcribed here is the vLLM importance-sampling ratio, which TRL
computes inside ``_generate_and_score_completions`` (trl/trainer/grpo_trainer.py, the block under
"Compute the importance sampling ratio when using vLLM", token_truncate / token_mask modes).

Mapping (clawrl -> TRL):

- ``eps_low``, ``eps_high``                     -> ``epsilon``, ``epsilon_high``
- ``dual_clip = c``                             -> ``delta = c`` (equal loss for c > 1 + eps_high)
- ``KLPenalty(beta=β, estimator=K3)``           -> ``beta = β``, ``use_bias_correction_kl = False``
- ``TokenMean()``                               -> ``loss_type = "bnpo"``
- ``TokenMean()`` + ``Normalizers(num_tokens=N)`` -> ``loss_type = "dapo"``, ``num_items_in_batch = N``
- ``SequenceMeanTokenMean()``                   -> ``loss_type = "grpo"``
- ``SequenceMeanTokenSumNorm(max_tokens=L)``    -> ``loss_type = "dr_grpo"``, ``max_completion_length = L``
- ``SamplingRatio()``                           -> ``old_per_token_logps = sampling_logprobs``
- ``OldRatio()``                                -> ``old_per_token_logps = old_logprobs``
- ``TruncatedIS(cap=C)``                        -> vLLM IS ``token_truncate``, ``clip_max = C``
- ``MaskedIS(low=a, high=b)``                   -> vLLM IS ``token_mask``, ``clip_min = a``, ``clip_max = b``
- ``mask_truncated=True``                       -> ``mask_truncated_completions=True`` (TRL zeroes
  ``completion_mask``); equal for bnpo/dapo; grpo/dr_grpo divide by all B rows, we by the
  non-empty ones (pinned below as a documented difference).
- ``GRPOAdvantage(eps=1e-4)``                   -> ``scale_rewards = "group"`` (TRL's ``nanstd``)
- ``GRPOAdvantage(normalize_std=False)``        -> ``scale_rewards = "none"``
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from trl.trainer.grpo_trainer import GRPOTrainer
from trl.trainer.utils import nanstd

from clawrl.algorithms import (
    AggregationConfig,
    KLPenalty,
    LossInputs,
    MaskedIS,
    Normalizers,
    OldRatio,
    PPOClipLoss,
    RatioConfig,
    SamplingRatio,
    SequenceMeanTokenMean,
    SequenceMeanTokenSumNorm,
    TokenMean,
    TruncatedIS,
    grpo_advantages,
    ppo_clip_loss,
)

F64 = torch.float64
B, T = 8, 6


class _Accelerator:
    num_processes = 1

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def gather_for_metrics(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def reduce(self, x: torch.Tensor, reduction: str = "sum") -> torch.Tensor:
        return x


def _data(seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=gen)
    lengths[0] = T
    sampling = -torch.rand(B, T, generator=gen, dtype=F64) * 3
    old = sampling + 0.2 * torch.randn(B, T, generator=gen, dtype=F64)
    return {
        "mask": torch.arange(T)[None, :] < lengths[:, None],
        "sampling": sampling,
        "old": old,
        "policy": old + 0.4 * torch.randn(B, T, generator=gen, dtype=F64),
        "ref": old + 0.3 * torch.randn(B, T, generator=gen, dtype=F64),
        "entropy": torch.rand(B, T, generator=gen, dtype=F64),
        "adv": torch.randn(B, generator=gen, dtype=F64),
        "truncated": torch.tensor([False, True, False, False, True, False, False, False]),
    }


@dataclass(frozen=True)
class Case:
    """One of our configs and the TRL settings that should reproduce it."""

    name: str
    beta: float = 0.0
    dual_clip: float | None = None
    ratio: RatioConfig = field(default_factory=SamplingRatio)
    trl_is_mode: str | None = None
    trl_clip_min: float | None = None
    trl_clip_max: float | None = None


CASES = [
    Case("plain"),
    Case("kl_k3", beta=0.04),
    Case("dual_clip", dual_clip=1.5),
    Case("old_ratio", ratio=OldRatio(), beta=0.04),
    Case("tis", ratio=TruncatedIS(cap=1.1), trl_is_mode="token_truncate", trl_clip_max=1.1),
    Case(
        "mis",
        ratio=MaskedIS(low=0.9, high=1.1),
        beta=0.04,
        trl_is_mode="token_mask",
        trl_clip_min=0.9,
        trl_clip_max=1.1,
    ),
]

LOSS_TYPES: dict[str, AggregationConfig] = {
    "bnpo": TokenMean(),
    "dapo": TokenMean(),
    "grpo": SequenceMeanTokenMean(),
    "dr_grpo": SequenceMeanTokenSumNorm(max_tokens=T),
}


def _trl_is_ratio(
    case: Case, old: torch.Tensor, sampling: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Transcribed from TRL ``_generate_and_score_completions`` (token_* vLLM IS modes)."""
    ratio = torch.exp((old - sampling) * mask)
    if case.trl_is_mode == "token_truncate":
        return torch.clamp(ratio, min=case.trl_clip_min, max=case.trl_clip_max)
    low = case.trl_clip_min if case.trl_clip_min is not None else -float("inf")
    high = case.trl_clip_max if case.trl_clip_max is not None else float("inf")
    return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)


def _trl_loss(
    case: Case,
    loss_type: str,
    data: dict[str, torch.Tensor],
    mask: torch.Tensor,
    num_items_in_batch: float,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, list[float]]]:
    policy = data["policy"].clone().requires_grad_(True)
    rows = policy.shape[0]
    trainer: Any = object.__new__(GRPOTrainer)
    use_is = case.trl_is_mode is not None
    settings: dict[str, Any] = {
        "aux_loss_enabled": False,
        "top_entropy_quantile": 1.0,
        "off_policy_mask_threshold": None,
        "importance_sampling_level": "token",
        "beta": case.beta,
        "loss_type": loss_type,
        "epsilon_low": 0.2,
        "epsilon_high": 0.28,
        "use_vllm": use_is,
        "vllm_importance_sampling_correction": use_is,
        "model": SimpleNamespace(training=True),
        "current_gradient_accumulation_steps": 1,
        "accelerator": _Accelerator(),
        "max_completion_length": T,
        "_entropy_bonus_enabled": False,
        "_metrics": {"train": defaultdict(list), "eval": defaultdict(list)},
        "args": SimpleNamespace(
            use_bias_correction_kl=False, delta=case.dual_clip, steps_per_generation=1
        ),
        "_get_per_token_logps_and_entropies": lambda *a, **k: (policy, data["entropy"], None),
    }
    for name, value in settings.items():
        setattr(trainer, name, value)

    uses_old = not isinstance(case.ratio, SamplingRatio)
    inputs: dict[str, Any] = {
        "prompt_ids": torch.zeros(rows, 1, dtype=torch.long),
        "prompt_mask": torch.ones(rows, 1, dtype=torch.long),
        "completion_ids": torch.zeros(rows, T, dtype=torch.long),
        "completion_mask": mask.long(),
        "advantages": data["adv"],
        "old_per_token_logps": data["old"] if uses_old else data["sampling"],
        "num_items_in_batch": torch.tensor(num_items_in_batch),
    }
    if case.beta:
        inputs["ref_per_token_logps"] = data["ref"]
    if use_is:
        inputs["importance_sampling_ratio"] = _trl_is_ratio(
            case, data["old"], data["sampling"], mask
        )
    loss = trainer._compute_loss(None, inputs)
    (grad,) = torch.autograd.grad(loss, policy)
    return loss.detach(), grad, trainer._metrics["train"]


def _our_loss(
    case: Case,
    aggregation: AggregationConfig,
    data: dict[str, torch.Tensor],
    *,
    mask_truncated: bool = False,
    normalizers: Normalizers | None = None,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    policy = data["policy"].clone().requires_grad_(True)
    config = PPOClipLoss(
        eps_low=0.2,
        eps_high=0.28,
        dual_clip=case.dual_clip,
        ratio=case.ratio,
        kl=KLPenalty(beta=case.beta),
        aggregation=aggregation,
        mask_truncated=mask_truncated,
    )
    out = ppo_clip_loss(
        LossInputs(
            policy_logprobs=policy,
            sampling_logprobs=data["sampling"],
            advantages=data["adv"][:, None].expand_as(policy),
            loss_mask=data["mask"],
            old_logprobs=data["old"],
            ref_logprobs=data["ref"],
            entropy=data["entropy"],
            truncated=data["truncated"],
            normalizers=normalizers,
        ),
        config,
    )
    (grad,) = torch.autograd.grad(out.loss, policy)
    return out.loss.detach(), grad, out.metrics


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
@pytest.mark.parametrize("loss_type", list(LOSS_TYPES))
def test_loss_gradient_and_metrics_match_trl(case: Case, loss_type: str) -> None:
    data = _data(seed=len(case.name) + len(loss_type))
    mask = data["mask"]
    trl_loss, trl_grad, trl_metrics = _trl_loss(case, loss_type, data, mask, float(mask.sum()))
    loss, grad, metrics = _our_loss(case, LOSS_TYPES[loss_type], data)

    torch.testing.assert_close(loss, trl_loss, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(grad, trl_grad, rtol=1e-12, atol=1e-14)
    assert grad.abs().sum() > 0
    assert metrics["clip/low_frac"] == pytest.approx(trl_metrics["clip_ratio/low_mean"][0])
    assert metrics["clip/high_frac"] == pytest.approx(trl_metrics["clip_ratio/high_mean"][0])
    assert metrics["entropy/mean"] == pytest.approx(trl_metrics["entropy"][0])
    if case.beta:
        assert metrics["kl/ref"] == pytest.approx(trl_metrics["kl"][0])


def test_the_cases_exercise_clipping() -> None:
    """Guards the cross-check: the random data really hit both clip sides and the dual clip."""
    data = _data(seed=0)
    _, _, metrics = _our_loss(Case("x", dual_clip=1.5), TokenMean(), data)
    assert metrics["clip/low_frac"] > 0 and metrics["clip/high_frac"] > 0
    assert metrics["clip/dual_frac"] > 0


def test_dapo_micro_batch_with_global_token_count_matches_trl() -> None:
    data = _data(seed=3)
    total = float(data["mask"].sum())
    rows = slice(0, 3)
    micro = {k: v[rows] for k, v in data.items()}
    case = Case("kl", beta=0.04)
    trl_loss, trl_grad, _ = _trl_loss(case, "dapo", micro, micro["mask"], total)
    norms = Normalizers(num_tokens=total, num_sequences=float(B))
    loss, grad, _ = _our_loss(case, TokenMean(), micro, normalizers=norms)
    full_loss, _, _ = _our_loss(case, TokenMean(), data)
    assert abs(loss.item() - full_loss.item()) > 1e-6  # a micro-batch, not the whole batch
    torch.testing.assert_close(loss, trl_loss, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(grad, trl_grad, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("loss_type", ["bnpo", "dapo", "grpo", "dr_grpo"])
def test_mask_truncated_matches_trl_mask_truncated_completions(loss_type: str) -> None:
    data = _data(seed=4)
    truncated_mask = data["mask"] & ~data["truncated"][:, None]
    case = Case("plain")
    trl_loss, trl_grad, _ = _trl_loss(
        case, loss_type, data, truncated_mask, float(truncated_mask.sum())
    )
    loss, grad, _ = _our_loss(case, LOSS_TYPES[loss_type], data, mask_truncated=True)
    if loss_type in ("bnpo", "dapo"):
        torch.testing.assert_close(loss, trl_loss, rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(grad, trl_grad, rtol=1e-12, atol=1e-14)
    else:
        # Documented difference: TRL divides by all B rows, we by the S non-empty ones.
        kept = float((~data["truncated"]).sum())
        torch.testing.assert_close(loss * kept / B, trl_loss, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("scale_rewards", ["group", "none"])
def test_grpo_advantages_match_trl_group_scaling(scale_rewards: str) -> None:
    """Transcribed from TRL ``_generate_and_score_completions`` (sum_then_normalize branch)."""
    gen = torch.Generator().manual_seed(5)
    num_generations = 4
    rewards = torch.randint(0, 3, (12,), generator=gen).to(F64)
    rewards[:4] = 1.0  # one group with zero std
    grouped = rewards.view(-1, num_generations)
    trl = rewards - grouped.nanmean(dim=1).repeat_interleave(num_generations)
    if scale_rewards == "group":
        trl = trl / (nanstd(grouped, dim=1).repeat_interleave(num_generations) + 1e-4)

    groups = torch.arange(12) // num_generations
    ours = grpo_advantages(
        rewards, groups, torch.ones(12, 1, dtype=torch.bool), normalize_std=scale_rewards == "group"
    )
    # TRL's nanstd computes its Bessel factor count / (count - 1) from integer counts, i.e. in
    # float32, so it agrees with the exact value to ~1e-8 only; torch.std is the exact reference.
    torch.testing.assert_close(ours[:, 0], trl, rtol=1e-6, atol=1e-12)
    if scale_rewards == "group":
        exact = grouped.std(dim=1).repeat_interleave(num_generations)
        centered = rewards - grouped.mean(dim=1).repeat_interleave(num_generations)
        torch.testing.assert_close(ours[:, 0], centered / (exact + 1e-4), rtol=1e-14, atol=1e-15)
