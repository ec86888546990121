"""Pure tensor functions for RL on agent policies: advantages, policy losses, staleness.

No I/O; imports only torch and the standard library. Shapes: ``B`` sequences, ``T`` token
positions, ``S`` steps. Every ``[B, T]`` tensor is read only where ``loss_mask`` is set.

Typical use::

    adv = compute_advantages(GRPOAdvantage(), AdvantageInputs(loss_mask, rewards, group_ids))
    out = compute_loss(PPOClipLoss(), LossInputs(policy_logprobs, sampling_logprobs,
                                                 adv.advantages, loss_mask, ref_logprobs=ref))
    out.loss.backward()

Functions and equations (details and sources in each docstring):

- ``binary_rl_advantages``: ``A_t = r``, r ∈ {+1, -1, 0} (OpenClaw-RL Binary RL).
- ``grpo_advantages``: ``A_i = (r_i - mean_g r) / (std_g r + eps)``; ``normalize_std=False`` is
  Dr. GRPO (DeepSeekMath; Liu et al. 2025).
- ``opd_advantages``: ``A_t = log π_teacher(a_t|s+hint) - log π_old(a_t|s)``, clip to [-c, c].
- ``combined_advantages``: ``A_t = w_rl r + w_opd OPD_t``.
- ``prm_outcome_advantages``: ``R_{i,s} = PRM_{i,s} + outcome_i`` normalised per (group, step).
- ``ppo_clip_loss``: ``ℓ_t = w_t · -min(ρA, clip(ρ, 1-ε_low, 1+ε_high) A)`` (dual clip
  ``min(·, -cA)`` for A < 0) ``+ β k(π_θ, π_ref)``, aggregated by token-mean,
  sequence-mean-token-mean or sequence-mean-token-sum-norm.
- ``kl_k1``, ``kl_k2``, ``kl_k3``, ``kl_estimate``: Schulman's KL estimators.
- ``drop_stale``: keep samples with ``trainer_version - version <= K``.

Mapping to TRL 1.16 ``GRPOTrainer`` (checked in ``tests/algorithms/test_trl_crosscheck.py``, which
calls TRL's own ``GRPOTrainer._compute_loss``; equal loss, gradient and clip fractions):

====================================================  ==================================================
clawrl (``PPOClipLoss``, ``LossInputs``)               TRL (``GRPOConfig`` / ``_compute_loss`` inputs)
====================================================  ==================================================
``eps_low``, ``eps_high``                              ``epsilon``, ``epsilon_high``
``dual_clip = c``                                      ``delta = c`` (same loss when c > 1 + eps_high)
``kl = KLPenalty(beta=β, estimator=K3)``               ``beta = β``, ``use_bias_correction_kl=False``
``aggregation = TokenMean()``                          ``loss_type="bnpo"``
``TokenMean()`` + ``Normalizers(num_tokens=N)``        ``loss_type="dapo"``, ``num_items_in_batch = N``
``SequenceMeanTokenMean()``                            ``loss_type="grpo"``
``SequenceMeanTokenSumNorm(max_tokens=L)``             ``loss_type="dr_grpo"``, ``max_completion_length=L``
``ratio = SamplingRatio()``                            ``old_per_token_logps = sampling_logprobs``
``ratio = OldRatio()``                                 ``old_per_token_logps = old_logprobs``, no vLLM IS
``ratio = TruncatedIS(cap=C)``                         ``vllm_importance_sampling_mode="token_truncate"``,
                                                       ``vllm_importance_sampling_clip_max=C``
``ratio = MaskedIS(low=a, high=b)``                    ``vllm_importance_sampling_mode="token_mask"``,
                                                       ``..._clip_min=a``, ``..._clip_max=b``
``mask_truncated=True``                                ``mask_truncated_completions=True`` (equal for
                                                       bnpo/dapo; see Differences)
``GRPOAdvantage(normalize_std=True, eps=1e-4)``        ``scale_rewards="group"``
``GRPOAdvantage(normalize_std=False)``                 ``scale_rewards="none"``
====================================================  ==================================================

Differences: the sequence-level modes count only sequences with at least one unmasked token
(TRL's grpo/dr_grpo divide by the batch size, so they differ once truncation masking empties a
row); TRL's ``nanstd`` computes its Bessel factor in float32 (advantages agree to ~1e-8
relative); TRL's default ``use_bias_correction_kl=True`` multiplies the KL term by the ratio,
which we do not; TRL's defaults are ``loss_type="dapo"`` and ``beta=0``, ours token-mean and
β = 0.02; TRL's ``delta`` acts on every token but only changes the loss of A < 0 tokens, as the
dual clip does.
"""

from typing import TYPE_CHECKING, Any

from clawrl.algorithms.config import (
    AdvantageConfig,
    AggregationConfig,
    BinaryRLAdvantage,
    CombinedAdvantage,
    GRPOAdvantage,
    KLEstimator,
    KLPenalty,
    LossConfig,
    MaskedIS,
    OldRatio,
    OPDAdvantage,
    PPOClipLoss,
    PrecomputedAdvantage,
    PRMOutcomeAdvantage,
    RatioConfig,
    SamplingRatio,
    SequenceMeanTokenMean,
    SequenceMeanTokenSumNorm,
    TokenMean,
    TruncatedIS,
)

if TYPE_CHECKING:  # the tensor functions import torch: loaded on first use (see __getattr__)
    from clawrl.algorithms.advantages import (
        AdvantageInputs,
        AdvantageOutputs,
        binary_rl_advantages,
        combined_advantages,
        compute_advantages,
        grpo_advantages,
        normalize_by_key,
        opd_advantages,
        precomputed_advantages,
        prm_outcome_advantages,
    )
    from clawrl.algorithms.aggregation import aggregate
    from clawrl.algorithms.kl import kl_estimate, kl_k1, kl_k2, kl_k3
    from clawrl.algorithms.losses import compute_loss, ppo_clip_loss, validate_loss_inputs
    from clawrl.algorithms.staleness import StalenessResult, drop_stale
    from clawrl.algorithms.types import (
        LossInputs,
        LossOutputs,
        Normalizers,
        count_normalizers,
        effective_mask,
    )

_LAZY = {
    "clawrl.algorithms.advantages": (
        "AdvantageInputs AdvantageOutputs binary_rl_advantages combined_advantages "
        "compute_advantages grpo_advantages normalize_by_key opd_advantages "
        "precomputed_advantages prm_outcome_advantages"
    ),
    "clawrl.algorithms.aggregation": "aggregate",
    "clawrl.algorithms.kl": "kl_estimate kl_k1 kl_k2 kl_k3",
    "clawrl.algorithms.losses": "compute_loss ppo_clip_loss validate_loss_inputs",
    "clawrl.algorithms.staleness": "StalenessResult drop_stale",
    "clawrl.algorithms.types": (
        "LossInputs LossOutputs Normalizers count_normalizers effective_mask"
    ),
}
_WHERE = {name: module for module, names in _LAZY.items() for name in names.split()}


def __getattr__(name: str) -> Any:
    """Import the torch-backed functions on first use, so that the configs (stdlib only) can be
    embedded by :mod:`clawrl.config` without importing torch."""
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'clawrl.algorithms' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "AdvantageConfig",
    "AdvantageInputs",
    "AdvantageOutputs",
    "AggregationConfig",
    "BinaryRLAdvantage",
    "CombinedAdvantage",
    "GRPOAdvantage",
    "KLEstimator",
    "KLPenalty",
    "LossConfig",
    "LossInputs",
    "LossOutputs",
    "MaskedIS",
    "Normalizers",
    "OPDAdvantage",
    "OldRatio",
    "PPOClipLoss",
    "PRMOutcomeAdvantage",
    "PrecomputedAdvantage",
    "RatioConfig",
    "SamplingRatio",
    "SequenceMeanTokenMean",
    "SequenceMeanTokenSumNorm",
    "StalenessResult",
    "TokenMean",
    "TruncatedIS",
    "aggregate",
    "binary_rl_advantages",
    "combined_advantages",
    "compute_advantages",
    "compute_loss",
    "count_normalizers",
    "drop_stale",
    "effective_mask",
    "grpo_advantages",
    "kl_estimate",
    "kl_k1",
    "kl_k2",
    "kl_k3",
    "normalize_by_key",
    "opd_advantages",
    "ppo_clip_loss",
    "precomputed_advantages",
    "prm_outcome_advantages",
    "validate_loss_inputs",
]
