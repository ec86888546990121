"""Typed configs that pick the advantage estimator and the policy loss.

Every config is a frozen, keyword-only stdlib dataclass with a ``kind`` literal tag, so that a
union of them is a *discriminated union*: ``clawrl.config`` (pydantic) can embed these types
directly (pydantic validates stdlib dataclasses and picks a union member by its ``kind``) and
load them from TOML, while this module imports nothing but the standard library. Bounds are
checked in ``__post_init__`` and raise ``ValueError``.

The method is chosen by the *type* of the config object (each consuming module keeps a
``{config type: function}`` table), never by comparing strings.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Literal


def _check_kind(obj: object, expected: str) -> None:
    kind = getattr(obj, "kind", None)
    if kind != expected:
        raise ValueError(f"{type(obj).__name__}.kind must be {expected!r}, got {kind!r}")


def _check_finite_nonneg(name: str, value: float) -> None:
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


def _check_positive(name: str, value: float) -> None:
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


# --------------------------------------------------------------------------------------------
# Advantages (credit assignment)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class BinaryRLAdvantage:
    """Binary RL (OpenClaw-RL): ``A_t = r`` for every sampled token of the turn, ``r ∈ {+1,-1,0}``.

    No baseline and no normalisation (OpenClaw-RL runs slime with rewards normalisation off).
    """

    kind: Literal["binary_rl"] = "binary_rl"

    def __post_init__(self) -> None:
        _check_kind(self, "binary_rl")


@dataclass(frozen=True, kw_only=True)
class PrecomputedAdvantage:
    """An advantage computed outside the trainer, one per sequence: ``A_{i,t} = a_i``.

    For credit computed by the caller over several sequences, e.g. a rollout-level advantage
    attached to every trained turn of that rollout (harness mode itself uses the trainer's GRPO
    over rollouts, :func:`clawrl.algorithms.grpo_advantages` with ``episode_ids``). ``a_i`` is
    read from the sample's ``reward`` field and may be any finite real; it is broadcast to the
    sequence's sampled tokens unchanged.
    """

    kind: Literal["precomputed"] = "precomputed"

    def __post_init__(self) -> None:
        _check_kind(self, "precomputed")


@dataclass(frozen=True, kw_only=True)
class GRPOAdvantage:
    """GRPO group-relative outcome advantage (DeepSeekMath, Shao et al. 2024).

    ``A_i = (r_i - mean_g(r)) / (std_g(r) + eps)`` when ``normalize_std`` else ``r_i - mean_g(r)``.
    ``normalize_std=False`` is the Dr. GRPO advantage (Liu et al. 2025); pair it with the
    ``SequenceMeanTokenSumNorm`` aggregation for the full Dr. GRPO objective.
    """

    kind: Literal["grpo"] = "grpo"
    normalize_std: bool = True
    """Divide by the group's (Bessel-corrected) standard deviation; False gives Dr. GRPO."""
    eps: float = 1e-4
    """Added to the standard deviation (TRL uses 1e-4)."""

    def __post_init__(self) -> None:
        _check_kind(self, "grpo")
        _check_finite_nonneg("eps", self.eps)


@dataclass(frozen=True, kw_only=True)
class OPDAdvantage:
    """Hindsight-guided on-policy distillation (OpenClaw-RL).

    ``A_t = log π_teacher(a_t | s + hint) - log π_old(a_t | s)``, optionally clipped to ``[-c, c]``.
    """

    kind: Literal["opd"] = "opd"
    clip: float | None = None
    """Clip ``A_t`` to ``[-clip, clip]``; None disables clipping."""

    def __post_init__(self) -> None:
        _check_kind(self, "opd")
        if self.clip is not None:
            _check_positive("clip", self.clip)


@dataclass(frozen=True, kw_only=True)
class CombinedAdvantage:
    """Binary RL + OPD (OpenClaw-RL "combined"): ``A_t = w_rl * r + w_opd * OPD_t``."""

    kind: Literal["combined"] = "combined"
    w_rl: float = 1.0
    """Weight of the binary judge reward ``r``."""
    w_opd: float = 1.0
    """Weight of the OPD token advantage."""
    opd_clip: float | None = None
    """Clip of the OPD term before weighting; None disables clipping."""

    def __post_init__(self) -> None:
        _check_kind(self, "combined")
        _check_finite_nonneg("w_rl", self.w_rl)
        _check_finite_nonneg("w_opd", self.w_opd)
        if self.opd_clip is not None:
            _check_positive("opd_clip", self.opd_clip)


@dataclass(frozen=True, kw_only=True)
class PRMOutcomeAdvantage:
    """Integrated PRM + outcome: per-step reward ``PRM_{i,s} + outcome_i``, normalised per group and step.

    ``A_{i,s} = (R_{i,s} - mean_{(g,s)} R) / (std_{(g,s)} R + eps)`` over the rollouts of group ``g``
    that have a step ``s`` (OpenClaw-RL, general agents).
    """

    kind: Literal["prm_outcome"] = "prm_outcome"
    normalize_std: bool = True
    """Divide by the (group, step) cell's Bessel-corrected standard deviation."""
    eps: float = 1e-4
    """Added to the standard deviation."""

    def __post_init__(self) -> None:
        _check_kind(self, "prm_outcome")
        _check_finite_nonneg("eps", self.eps)


AdvantageConfig = (
    BinaryRLAdvantage
    | GRPOAdvantage
    | OPDAdvantage
    | CombinedAdvantage
    | PRMOutcomeAdvantage
    | PrecomputedAdvantage
)
"""Discriminated union (by ``kind``) of the advantage estimators."""


# --------------------------------------------------------------------------------------------
# Importance ratio and trainer-versus-engine mismatch correction
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class SamplingRatio:
    """Default. ``ρ_t = π_θ(a_t) / π_sampling(a_t)``: the ratio against the engine's log-probs.

    No separate mismatch correction: PPO clipping absorbs both policy drift and mismatch.
    """

    kind: Literal["sampling"] = "sampling"

    def __post_init__(self) -> None:
        _check_kind(self, "sampling")


@dataclass(frozen=True, kw_only=True)
class OldRatio:
    """``ρ_t = π_θ(a_t) / π_old(a_t)`` with trainer-recomputed ``old_logprobs``; mismatch ignored."""

    kind: Literal["old"] = "old"

    def __post_init__(self) -> None:
        _check_kind(self, "old")


@dataclass(frozen=True, kw_only=True)
class TruncatedIS:
    """Truncated importance sampling (TIS; Yao et al. 2025, "Your Efficient RL Framework Secretly
    Brings You Off-Policy RL Training").

    ``ρ_t = π_θ / π_old``; the per-token PPO loss is multiplied by the detached weight
    ``w_t = min(π_old(a_t) / π_sampling(a_t), cap)``.
    """

    kind: Literal["tis"] = "tis"
    cap: float = 2.0
    """Upper truncation C of the trainer/engine weight."""

    def __post_init__(self) -> None:
        _check_kind(self, "tis")
        _check_positive("cap", self.cap)


@dataclass(frozen=True, kw_only=True)
class MaskedIS:
    """Masked importance sampling (MIS; Liu et al. 2025, "When Speed Kills Stability").

    ``ρ_t = π_θ / π_old``; the per-token PPO loss is multiplied by the detached weight
    ``w_t = π_old/π_sampling if low <= π_old/π_sampling <= high else 0``. Tokens whose weight is
    zeroed stay in the aggregation denominators (they are a zero-weight IS sample, not a masked
    token); ``is/masked_frac`` reports how many there were.
    """

    kind: Literal["mis"] = "mis"
    low: float = 0.5
    """Lower bound of the accepted weight."""
    high: float = 2.0
    """Upper bound of the accepted weight."""

    def __post_init__(self) -> None:
        _check_kind(self, "mis")
        _check_finite_nonneg("low", self.low)
        _check_positive("high", self.high)
        if self.low >= self.high:
            raise ValueError(f"low ({self.low}) must be < high ({self.high})")


RatioConfig = SamplingRatio | OldRatio | TruncatedIS | MaskedIS
"""Discriminated union (by ``kind``) of importance-ratio choices."""


# --------------------------------------------------------------------------------------------
# KL penalty
# --------------------------------------------------------------------------------------------


class KLEstimator(enum.StrEnum):
    """Per-token estimators of KL(π_θ || π_ref) from samples (Schulman 2020, "Approximating KL")."""

    K1 = "k1"
    K2 = "k2"
    K3 = "k3"


@dataclass(frozen=True, kw_only=True)
class KLPenalty:
    """``β · k(π_θ, π_ref)`` added to every token's loss; ``beta = 0`` disables it."""

    beta: float = 0.02
    """Coefficient β of the KL penalty; 0 disables it (then ref_logprobs is not needed)."""
    estimator: KLEstimator = KLEstimator.K3
    """Which per-token estimator (k1, k2, k3)."""

    def __post_init__(self) -> None:
        _check_finite_nonneg("beta", self.beta)
        # Accept the plain strings that TOML gives.
        object.__setattr__(self, "estimator", KLEstimator(self.estimator))


# --------------------------------------------------------------------------------------------
# Aggregation of per-token losses into one scalar
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class TokenMean:
    """Default. ``L = Σ_{i,t} m_{i,t} ℓ_{i,t} / Σ_{i,t} m_{i,t}`` (DAPO token-level loss)."""

    kind: Literal["token_mean"] = "token_mean"

    def __post_init__(self) -> None:
        _check_kind(self, "token_mean")


@dataclass(frozen=True, kw_only=True)
class SequenceMeanTokenMean:
    """``L = (1/S) Σ_i (Σ_t m ℓ / Σ_t m)`` over the S sequences with at least one token (GRPO)."""

    kind: Literal["seq_mean_token_mean"] = "seq_mean_token_mean"

    def __post_init__(self) -> None:
        _check_kind(self, "seq_mean_token_mean")


@dataclass(frozen=True, kw_only=True)
class SequenceMeanTokenSumNorm:
    """``L = (1/S) Σ_i Σ_t m ℓ / max_tokens`` (Dr. GRPO: a constant length normaliser)."""

    kind: Literal["seq_mean_token_sum_norm"] = "seq_mean_token_sum_norm"
    max_tokens: int
    """The constant normaliser, usually the maximum completion length."""

    def __post_init__(self) -> None:
        _check_kind(self, "seq_mean_token_sum_norm")
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int):
            raise ValueError(f"max_tokens must be an int, got {self.max_tokens!r}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")


AggregationConfig = TokenMean | SequenceMeanTokenMean | SequenceMeanTokenSumNorm
"""Discriminated union (by ``kind``) of loss aggregation modes."""


# --------------------------------------------------------------------------------------------
# Policy losses
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class PPOClipLoss:
    """PPO clipped surrogate with asymmetric clip, optional dual clip, mismatch correction, KL.

    See ``clawrl.algorithms.losses.ppo_clip_loss`` for the equation.
    """

    kind: Literal["ppo_clip"] = "ppo_clip"
    eps_low: float = 0.2
    """Lower clip: the ratio is clipped at ``1 - eps_low`` (PPO, Schulman et al. 2017)."""
    eps_high: float = 0.28
    """Upper clip: the ratio is clipped at ``1 + eps_high`` (DAPO clip-higher, Yu et al. 2025)."""
    dual_clip: float | None = None
    """Dual clip c > 1 bounding the loss of A < 0 tokens by ``-c·A`` (Ye et al. 2020); None: off."""
    ratio: RatioConfig = field(default_factory=SamplingRatio)
    """What the importance ratio is taken against, and the trainer/engine mismatch correction."""
    kl: KLPenalty = field(default_factory=KLPenalty)
    """KL penalty to the reference policy."""
    aggregation: AggregationConfig = field(default_factory=TokenMean)
    """How per-token losses become one scalar."""
    mask_truncated: bool = False
    """Leave truncated sequences (``LossInputs.truncated``) out of the loss entirely (DAPO)."""

    def __post_init__(self) -> None:
        _check_kind(self, "ppo_clip")
        if not (0.0 <= self.eps_low < 1.0):
            raise ValueError(f"eps_low must be in [0, 1), got {self.eps_low}")
        _check_finite_nonneg("eps_high", self.eps_high)
        if self.dual_clip is not None and not (
            math.isfinite(self.dual_clip) and self.dual_clip > 1.0
        ):
            raise ValueError(f"dual_clip must be a finite number > 1, got {self.dual_clip}")


LossConfig = PPOClipLoss
"""Discriminated union (by ``kind``) of policy losses; one member so far."""
