"""Credit assignment: per-token advantages ``A [B, T]``, separate from the loss.

Every function returns ``[B, T]`` advantages that are exactly 0 where ``loss_mask`` is False and
never reads inputs there (padding may hold NaN). Outputs carry no gradient. ``compute_advantages``
picks the estimator by the type of its config.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from clawrl.algorithms.config import (
    AdvantageConfig,
    BinaryRLAdvantage,
    CombinedAdvantage,
    GRPOAdvantage,
    OPDAdvantage,
    PrecomputedAdvantage,
    PRMOutcomeAdvantage,
)
from clawrl.algorithms.metrics import advantage_stats, to_floats
from clawrl.algorithms.types import as_bool_mask


def _float(values: Tensor) -> Tensor:
    return values if values.is_floating_point() else values.to(torch.get_default_dtype())


def _check_rows(name: str, values: Tensor, mask: Tensor) -> None:
    if values.shape != mask.shape[:1]:
        raise ValueError(
            f"{name} must have shape [B]={list(mask.shape[:1])}, got {list(values.shape)}"
        )


def _check_same(name: str, values: Tensor, mask: Tensor) -> None:
    if values.shape != mask.shape:
        raise ValueError(f"{name} must have shape {list(mask.shape)}, got {list(values.shape)}")


def _broadcast(per_sequence: Tensor, mask: Tensor) -> Tensor:
    """``[B] -> [B, T]``: the sequence's value on its masked tokens, 0 elsewhere."""
    values = per_sequence.unsqueeze(-1).expand(mask.shape)
    return torch.where(mask, values, torch.zeros_like(values))


@torch.no_grad()
def normalize_by_key(values: Tensor, keys: Tensor, *, normalize_std: bool, eps: float) -> Tensor:
    """Subtract the mean of each key's values and optionally divide by their std.

    ``out_j = (v_j - mean_{k: key_k = key_j} v_k) / (std_{key_j} + eps)``, the std Bessel-corrected
    (``torch.std``, TRL ``nanstd``); a key whose std is 0 (one value, or all values equal) gets 0.

    Args:
        values: ``[N]`` float.
        keys: ``[N]`` integer group keys.
        normalize_std: divide by ``std + eps``.
        eps: added to the std.

    Returns:
        ``[N]`` normalised values.
    """
    values = _float(values)
    unique: tuple[Tensor, Tensor, Tensor] = torch.unique(
        keys, return_inverse=True, return_counts=True
    )
    _, inverse, counts = unique
    counts = counts.to(values.dtype)
    sums = values.new_zeros(counts.shape).index_add_(0, inverse, values)
    centered = values - (sums / counts)[inverse]
    if not normalize_std:
        return centered
    squares = values.new_zeros(counts.shape).index_add_(0, inverse, centered.square())
    std = (squares / (counts - 1).clamp(min=1)).sqrt()[inverse]
    # A key with std 0 (one value, or all equal) gets 0, also when eps = 0.
    return torch.where(std > 0, centered / (std + eps), torch.zeros_like(centered))


@torch.no_grad()
def binary_rl_advantages(rewards: Tensor, loss_mask: Tensor) -> Tensor:
    """Binary RL: ``A_{i,t} = r_i`` for every sampled token of turn ``i``.

    Source: OpenClaw-RL (Wang et al. 2026, arXiv:2603.10165), "Binary RL": the PRM judge's majority
    vote ``r ∈ {+1, -1, 0}`` broadcast to the turn's response tokens, no baseline, no
    normalisation.

    Args:
        rewards: ``[B]`` judge rewards, each in {+1, -1, 0}.
        loss_mask: ``[B, T]`` tokens to train on.

    Returns:
        ``[B, T]`` advantages.

    Raises:
        ValueError: a reward is not in {+1, -1, 0}, or shapes disagree.
    """
    mask = as_bool_mask(loss_mask)
    _check_rows("rewards", rewards, mask)
    rewards = _float(rewards)
    if not bool(((rewards == 1) | (rewards == -1) | (rewards == 0)).all()):
        raise ValueError(f"binary RL rewards must be +1, -1 or 0, got {rewards.tolist()}")
    return _broadcast(rewards, mask)


def precomputed_advantages(advantages: Tensor, loss_mask: Tensor) -> Tensor:
    """Broadcast per-sequence advantages computed elsewhere: ``A_{i,t} = a_i``.

    For advantages the caller computed over several sequences, e.g. per rollout of several
    trained turns (harness mode itself uses :func:`grpo_advantages` with ``episode_ids``).

    Args:
        advantages: ``[B]`` one advantage per sequence (any finite real).
        loss_mask: ``[B, T]`` tokens to train on.

    Returns:
        ``[B, T]`` advantages (0 off the mask).

    Raises:
        ValueError: an advantage is not finite, or shapes disagree.
    """
    mask = as_bool_mask(loss_mask)
    _check_rows("advantages", advantages, mask)
    advantages = _float(advantages)
    if not bool(torch.isfinite(advantages).all()):
        raise ValueError(f"precomputed advantages must be finite, got {advantages.tolist()}")
    return _broadcast(advantages, mask)


@torch.no_grad()
def grpo_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    loss_mask: Tensor,
    *,
    normalize_std: bool = True,
    eps: float = 1e-4,
    episode_ids: Tensor | None = None,
) -> Tensor:
    """GRPO outcome advantage, group-normalised and broadcast to the completion's tokens.

    ``A_{i,t} = (r_i - mean_{g(i)} r) / (std_{g(i)} r + eps)`` (DeepSeekMath, Shao et al. 2024,
    arXiv:2402.03300, §4.1.2), or ``r_i - mean_{g(i)} r`` with ``normalize_std=False`` (Dr. GRPO,
    Liu et al. 2025, arXiv:2503.20783). Groups are the completions sharing a prompt and may have
    different sizes; the std is Bessel-corrected (as TRL's), and a group of one gives A = 0.

    Episodes: an agent rollout (an episode) may be trained as several sequences (its turns). With
    ``episode_ids``, the group statistics are taken over *episodes*, each counted once with its
    one outcome reward, and every sequence of episode e gets ``A_e`` — so a rollout with many
    turns weighs no more in its group's mean and std than a rollout with one. Without it every
    sequence is its own episode.

    Args:
        rewards: ``[B]`` outcome rewards (equal for the sequences of one episode).
        group_ids: ``[B]`` integer id of each completion's group.
        loss_mask: ``[B, T]`` tokens to train on.
        normalize_std: divide by the group std (False: Dr. GRPO).
        eps: added to the std.
        episode_ids: ``[B]`` integer episode of each sequence, or None.

    Returns:
        ``[B, T]`` advantages.

    Raises:
        ValueError: shapes disagree, or the sequences of one episode differ in reward or group.
    """
    mask = as_bool_mask(loss_mask)
    _check_rows("rewards", rewards, mask)
    _check_rows("group_ids", group_ids, mask)
    if episode_ids is None:
        per_sequence = normalize_by_key(rewards, group_ids, normalize_std=normalize_std, eps=eps)
        return _broadcast(per_sequence, mask)
    _check_rows("episode_ids", episode_ids, mask)
    rewards = _float(rewards)
    _, episode = torch.unique(episode_ids, return_inverse=True)
    n = int(episode.max()) + 1 if episode.numel() else 0
    first = torch.full((n,), len(episode), dtype=torch.long).scatter_reduce(
        0, episode, torch.arange(len(episode)), reduce="amin"
    )
    if bool((rewards != rewards[first][episode]).any()) or bool(
        (group_ids != group_ids[first][episode]).any()
    ):
        raise ValueError("the sequences of one episode must share its reward and its group")
    per_episode = normalize_by_key(
        rewards[first], group_ids[first], normalize_std=normalize_std, eps=eps
    )
    return _broadcast(per_episode[episode], mask)


@torch.no_grad()
def opd_advantages(
    teacher_logprobs: Tensor,
    old_logprobs: Tensor,
    loss_mask: Tensor,
    *,
    clip: float | None = None,
    has_hint: Tensor | None = None,
) -> Tensor:
    """Hindsight-guided on-policy distillation: a token-level teacher-minus-student advantage.

    ``A_t = log π_teacher(a_t | s + hint) - log π_old(a_t | s)``, clipped to ``[-c, c]`` when
    ``clip = c`` is set (OpenClaw-RL, Wang et al. 2026, arXiv:2603.10165, "Hindsight-guided OPD";
    the paper writes π_θ, the policy that sampled; here it is whatever the caller passes as
    ``old_logprobs``: the trainer's recompute, or ``sampling_logprobs`` when there is none).

    Args:
        teacher_logprobs: ``[B, T]`` log-probs of the sampled tokens under the policy prompted with
            the hindsight hint (the teacher), aligned with the student's tokens.
        old_logprobs: ``[B, T]`` log-probs of the same tokens without the hint.
        loss_mask: ``[B, T]`` tokens to train on.
        clip: symmetric clip c of A_t; None: no clip.
        has_hint: ``[B]`` bool, False for turns without a hint (their A_t is 0); None: all have one.

    Returns:
        ``[B, T]`` advantages.
    """
    mask = as_bool_mask(loss_mask)
    _check_same("teacher_logprobs", teacher_logprobs, mask)
    _check_same("old_logprobs", old_logprobs, mask)
    if has_hint is not None:
        _check_rows("has_hint", has_hint, mask)
        mask = mask & as_bool_mask(has_hint).unsqueeze(-1)
    diff = torch.where(mask, teacher_logprobs - old_logprobs, torch.zeros_like(teacher_logprobs))
    if clip is not None:
        diff = diff.clamp(-clip, clip)
    return diff


@torch.no_grad()
def combined_advantages(
    rewards: Tensor,
    teacher_logprobs: Tensor,
    old_logprobs: Tensor,
    loss_mask: Tensor,
    *,
    w_rl: float = 1.0,
    w_opd: float = 1.0,
    opd_clip: float | None = None,
    has_hint: Tensor | None = None,
) -> Tensor:
    """Binary RL plus OPD: ``A_t = w_rl · r + w_opd · OPD_t``.

    Source: OpenClaw-RL (arXiv:2603.10165), "combined" method: both branches share the PPO loss
    and only the advantage differs; turns without a hint get ``OPD_t = 0`` (``has_hint``).

    Args:
        rewards: ``[B]`` judge rewards in {+1, -1, 0}.
        teacher_logprobs: ``[B, T]`` see ``opd_advantages``.
        old_logprobs: ``[B, T]`` see ``opd_advantages``.
        loss_mask: ``[B, T]`` tokens to train on.
        w_rl: weight of the reward term.
        w_opd: weight of the OPD term.
        opd_clip: clip of the OPD term before weighting.
        has_hint: ``[B]`` bool; None: every turn has a hint.

    Returns:
        ``[B, T]`` advantages.
    """
    binary = binary_rl_advantages(rewards, loss_mask)
    opd = opd_advantages(
        teacher_logprobs, old_logprobs, loss_mask, clip=opd_clip, has_hint=has_hint
    )
    return w_rl * binary + w_opd * opd.to(binary.dtype)


@torch.no_grad()
def prm_outcome_advantages(
    step_scores: Tensor,
    step_mask: Tensor,
    outcome: Tensor,
    group_ids: Tensor,
    token_steps: Tensor,
    loss_mask: Tensor,
    *,
    normalize_std: bool = True,
    eps: float = 1e-4,
) -> Tensor:
    """Integrated PRM + outcome: per-step reward normalised per group and step, on the step's tokens.

    ``R_{i,s} = PRM_{i,s} + outcome_i``;
    ``A_{i,s} = (R_{i,s} - mean_{j ∈ g(i), s} R_{j,s}) / (std_{j ∈ g(i), s} R_{j,s} + eps)``, the mean
    and std over the rollouts of the same group that have a step ``s``; ``A_{i,t} = A_{i,s(t)}``.
    Source: OpenClaw-RL (arXiv:2603.10165), general agents with process rewards. Our reading of
    "normalised per group and step": one normalisation cell per (group, step index); a cell with
    a single rollout gives A = 0 (as a GRPO group of one does).

    Args:
        step_scores: ``[B, S]`` PRM score of step s of rollout i.
        step_mask: ``[B, S]`` bool, rollout i has a step s.
        outcome: ``[B]`` the rollout's outcome reward (the verifier's).
        group_ids: ``[B]`` integer id of the rollout's group (same task).
        token_steps: ``[B, T]`` integer step index of each token (anything where ``loss_mask`` is
            False).
        loss_mask: ``[B, T]`` tokens to train on.
        normalize_std: divide by the cell std.
        eps: added to the std.

    Returns:
        ``[B, T]`` advantages.

    Raises:
        ValueError: a trained token points to no valid step, or shapes disagree.
    """
    mask = as_bool_mask(loss_mask)
    valid = as_bool_mask(step_mask)
    _check_rows("outcome", outcome, mask)
    _check_rows("group_ids", group_ids, mask)
    _check_same("token_steps", token_steps, mask)
    if step_scores.shape != valid.shape or step_scores.shape[:1] != mask.shape[:1]:
        raise ValueError(
            f"step_scores {list(step_scores.shape)} and step_mask {list(valid.shape)} must be [B, S]"
        )
    num_steps = step_scores.shape[1]
    in_range = (token_steps >= 0) & (token_steps < num_steps)
    safe_steps = torch.where(in_range, token_steps, torch.zeros_like(token_steps)).long()
    points_to_step = in_range & torch.gather(valid, 1, safe_steps)
    if bool((mask & ~points_to_step).any()):
        raise ValueError("every token in loss_mask must have a token_steps entry of a valid step")

    rewards = _float(step_scores) + _float(outcome).unsqueeze(-1)
    _, group_index = torch.unique(group_ids, return_inverse=True)
    cells = group_index.unsqueeze(-1) * num_steps + torch.arange(num_steps, device=rewards.device)
    step_advantages = torch.zeros_like(rewards)
    step_advantages[valid] = normalize_by_key(
        rewards[valid], cells[valid], normalize_std=normalize_std, eps=eps
    )
    per_token = torch.gather(step_advantages, 1, safe_steps)
    return torch.where(mask, per_token, torch.zeros_like(per_token))


# --------------------------------------------------------------------------------------------
# Dispatch by config type
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AdvantageInputs:
    """Everything any estimator may need; each estimator says which fields it requires."""

    loss_mask: Tensor
    """``[B, T]`` tokens to train on."""
    rewards: Tensor | None = None
    """``[B]`` judge reward (binary RL, combined) or outcome reward (GRPO, PRM + outcome)."""
    group_ids: Tensor | None = None
    """``[B]`` integer group id (GRPO, PRM + outcome)."""
    episode_ids: Tensor | None = None
    """``[B]`` integer episode (rollout) of each sequence (GRPO); None: one episode each."""
    teacher_logprobs: Tensor | None = None
    """``[B, T]`` hint-enhanced teacher log-probs (OPD, combined)."""
    old_logprobs: Tensor | None = None
    """``[B, T]`` student log-probs without the hint (OPD, combined)."""
    has_hint: Tensor | None = None
    """``[B]`` bool, the turn has a hindsight hint (OPD, combined); None: all do."""
    step_scores: Tensor | None = None
    """``[B, S]`` PRM step scores (PRM + outcome)."""
    step_mask: Tensor | None = None
    """``[B, S]`` bool, valid steps (PRM + outcome)."""
    token_steps: Tensor | None = None
    """``[B, T]`` step index of each token (PRM + outcome)."""


@dataclass(frozen=True)
class AdvantageOutputs:
    """``[B, T]`` advantages and ``adv/*`` metrics over the masked tokens."""

    advantages: Tensor
    metrics: dict[str, float]


def _need(inputs: AdvantageInputs, config: object, *names: str) -> list[Tensor]:
    missing = [name for name in names if getattr(inputs, name) is None]
    if missing:
        raise ValueError(f"{type(config).__name__} needs AdvantageInputs.{', '.join(missing)}")
    return [getattr(inputs, name) for name in names]


def _binary(config: BinaryRLAdvantage, inputs: AdvantageInputs) -> Tensor:
    (rewards,) = _need(inputs, config, "rewards")
    return binary_rl_advantages(rewards, inputs.loss_mask)


def _precomputed(config: PrecomputedAdvantage, inputs: AdvantageInputs) -> Tensor:
    (advantages,) = _need(inputs, config, "rewards")
    return precomputed_advantages(advantages, inputs.loss_mask)


def _grpo(config: GRPOAdvantage, inputs: AdvantageInputs) -> Tensor:
    rewards, group_ids = _need(inputs, config, "rewards", "group_ids")
    return grpo_advantages(
        rewards,
        group_ids,
        inputs.loss_mask,
        normalize_std=config.normalize_std,
        eps=config.eps,
        episode_ids=inputs.episode_ids,
    )


def _opd(config: OPDAdvantage, inputs: AdvantageInputs) -> Tensor:
    teacher, old = _need(inputs, config, "teacher_logprobs", "old_logprobs")
    return opd_advantages(
        teacher, old, inputs.loss_mask, clip=config.clip, has_hint=inputs.has_hint
    )


def _combined(config: CombinedAdvantage, inputs: AdvantageInputs) -> Tensor:
    rewards, teacher, old = _need(inputs, config, "rewards", "teacher_logprobs", "old_logprobs")
    return combined_advantages(
        rewards,
        teacher,
        old,
        inputs.loss_mask,
        w_rl=config.w_rl,
        w_opd=config.w_opd,
        opd_clip=config.opd_clip,
        has_hint=inputs.has_hint,
    )


def _prm_outcome(config: PRMOutcomeAdvantage, inputs: AdvantageInputs) -> Tensor:
    scores, step_mask, outcome, group_ids, token_steps = _need(
        inputs, config, "step_scores", "step_mask", "rewards", "group_ids", "token_steps"
    )
    return prm_outcome_advantages(
        scores,
        step_mask,
        outcome,
        group_ids,
        token_steps,
        inputs.loss_mask,
        normalize_std=config.normalize_std,
        eps=config.eps,
    )


_ESTIMATORS: dict[type, Callable[..., Tensor]] = {
    BinaryRLAdvantage: _binary,
    GRPOAdvantage: _grpo,
    OPDAdvantage: _opd,
    CombinedAdvantage: _combined,
    PRMOutcomeAdvantage: _prm_outcome,
    PrecomputedAdvantage: _precomputed,
}


def compute_advantages(config: AdvantageConfig, inputs: AdvantageInputs) -> AdvantageOutputs:
    """Run the estimator that ``config``'s type selects; metrics ``adv/*`` over masked tokens.

    Raises:
        ValueError: an input the estimator needs is None, or the estimator rejects its inputs.
    """
    advantages = _ESTIMATORS[type(config)](config, inputs)
    mask = as_bool_mask(inputs.loss_mask)
    return AdvantageOutputs(advantages, to_floats(advantage_stats(advantages, mask)))
