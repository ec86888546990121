"""Which rollout groups carry a learning signal; the credit itself is GRPO in the trainer.

A group is the rollouts of one task by one harness in one step. Only rollouts whose verifier gave
a reward and that produced at least one trainable turn count (verifier and harness errors, and
rollouts without a trainable turn, are dropped with their reason). A group with fewer
than two rewarded rollouts, or whose rewards are all equal, has zero GRPO advantage everywhere:
it is left out of the step and counted (``group/skipped_too_small``,
``group/skipped_zero_variance``; DAPO's dynamic sampling filter). The rest go to the trainer as
samples carrying their rollout's reward, group and episode (the rollout id), and the trainer's
:class:`~clawrl.config.GRPOMethod` computes ``A_i = (r_i - mean_g r) / (std_g r + eps)`` over the
*rollouts* of each group (:func:`clawrl.algorithms.grpo_advantages` with ``episode_ids``: a
rollout counts once, however many turns it trains), or ``r_i - mean_g r`` for Dr. GRPO.

Integrated PRM + outcome (:class:`~clawrl.config.PRMOutcomeMethod`) normalises
``R_{i,s} = PRM_{i,s} + outcome_i`` per (group, step): a group whose outcomes are all equal still
has signal when the step scores of some step differ between its rollouts, so with ``step_scores``
such a group is kept (``group/kept_by_step_scores``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from clawrl.store import GroupDecision


@dataclass(frozen=True)
class GroupSelection:
    """The rollouts of groups with signal, and counts of the groups left out.

    Attributes:
        kept: rollout id -> its reward, for rollouts of groups with signal.
        skipped_zero_variance: groups whose rewards were all equal.
        skipped_too_small: groups with fewer than two rewarded rollouts.
        group_means: group key -> mean reward (every group with a reward).
        decisions: group key -> kept or why not (every group with a reward).
        kept_by_step_scores: groups kept only because their step scores vary (equal outcomes).
    """

    kept: dict[str, float] = field(default_factory=dict)
    skipped_zero_variance: int = 0
    skipped_too_small: int = 0
    group_means: dict[str, float] = field(default_factory=dict)
    decisions: dict[str, GroupDecision] = field(default_factory=dict)
    kept_by_step_scores: int = 0


def select_groups(
    rewards: Sequence[tuple[str, str, float]],
    *,
    step_scores: Mapping[str, Mapping[int, float]] | None = None,
) -> GroupSelection:
    """Group ``(rollout_id, group_key, reward)`` triples and keep the groups with signal.

    Args:
        rewards: one triple per rewarded rollout.
        step_scores: integrated PRM + outcome: rollout id -> step index -> its step score (0 for
            a step without one). A group with equal outcomes is kept when some step's scores
            differ between the group's rollouts that have it (:func:`steps_vary`); None: outcome
            variance alone decides (GRPO).
    """
    groups: dict[str, list[tuple[str, float]]] = {}
    for rollout_id, key, reward in rewards:
        groups.setdefault(key, []).append((rollout_id, reward))
    kept: dict[str, float] = {}
    means: dict[str, float] = {}
    decisions: dict[str, GroupDecision] = {}
    by_steps = 0
    for key, members in groups.items():
        values = [r for _, r in members]
        means[key] = sum(values) / len(values)
        if len(members) < 2:
            decisions[key] = GroupDecision.TOO_SMALL
        elif max(values) == min(values) and not (
            step_scores is not None and steps_vary([step_scores.get(r, {}) for r, _ in members])
        ):
            decisions[key] = GroupDecision.ZERO_VARIANCE
        else:
            decisions[key] = GroupDecision.KEPT
            kept.update(members)
            by_steps += max(values) == min(values)
    zero = sum(d is GroupDecision.ZERO_VARIANCE for d in decisions.values())
    small = sum(d is GroupDecision.TOO_SMALL for d in decisions.values())
    return GroupSelection(kept, zero, small, means, decisions, by_steps)


def steps_vary(rollouts: Sequence[Mapping[int, float]]) -> bool:
    """True when some step index has at least two of ``rollouts`` (step -> score each) with
    different scores, i.e. a (group, step) cell of PRM + outcome with a non-zero advantage."""
    cells: dict[int, set[float]] = {}
    for steps in rollouts:
        for step, score in steps.items():
            cells.setdefault(step, set()).add(score)
    return any(len(scores) > 1 for scores in cells.values())
