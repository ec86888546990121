"""Rollouts -> :class:`clawrl.trainer.TrainSample`, one per trainable turn, reward attached.

A rollout's turns are rebuilt into its prefix tree from the store
(:func:`clawrl.trajectory.load_tree`); :func:`clawrl.trajectory.training_rows` decides which turns
are trained (each sampled token in exactly one row); each trained turn becomes one sample
``prompt_ids -> completion_ids`` (its own sampled tokens only, so environment tokens and context
copies are never trained). So retries and subagent branches of one rollout share their common
prefix as context, each sampled token is trained once, failed and dead retry leaves
(``abandoned_retry``) and side calls (``side_call``: titles, compaction) are counted by reason
and never trained (:mod:`clawrl.trajectory.tree`; ``tests/harness/test_prefix_credit.py``).

How the rollout's outcome reaches the shared trainer: each sample's ``reward`` holds the
rollout's verifier reward, ``group_id`` its group and ``episode_id`` the rollout id; the trainer's
GRPO method (:class:`clawrl.config.GRPOMethod`) normalises the rewards over the rollouts of each
group, once per batch, and broadcasts each rollout's advantage to every sampled token of its
samples (:func:`clawrl.algorithms.grpo_advantages` with ``episode_ids``).

Each sample also carries its ``step_index``: its rank among the rollout's trained turns in the
order they were created (0 first; retries, side calls and empty completions take no step). With
``step_scores`` (integrated PRM + outcome, :class:`clawrl.config.PRMOutcomeMethod`) it carries the
judge's stored score of its next state as ``step_score`` (:mod:`clawrl.harness.judging`; ``None``
for the last turn, which has no next state, and for a judge failure).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from clawrl.harness.judging import step_judgment
from clawrl.store import Store
from clawrl.trainer.types import TrainSample
from clawrl.trajectory import load_tree, training_rows


@dataclass
class RolloutSamples:
    """The samples of one step and the turns not trained, by reason."""

    samples: list[TrainSample] = field(default_factory=list)
    untrained: Counter[str] = field(default_factory=Counter)
    rollouts_without_turns: int = 0


def rollout_samples(
    store: Store,
    rollout_id: str,
    reward: float,
    group_id: int,
    meta: Mapping[str, object],
    *,
    step_scores: bool = False,
) -> tuple[list[TrainSample], Counter[str]]:
    """One sample per trained turn of rollout ``rollout_id``, each carrying the rollout's
    ``reward``, ``group_id``, the rollout as its episode and its step index; with
    ``step_scores``, the judge's stored score of the turn as ``step_score``.

    Returns:
        ``(samples, untrained)``: the samples, and the turns not trained counted by reason.

    Raises:
        StoreError: the rollout's session is not in the store.
    """
    tree = load_tree(store, rollout_id)
    rows = training_rows(tree)
    untrained: Counter[str] = Counter()
    trained: list[str] = []
    for row in rows:
        untrained.update(row.untrained.values())
        for turn_id in row.trained_turn_ids:
            if tree.node(turn_id).turn.completion_ids:
                trained.append(turn_id)
            else:
                untrained["empty_completion"] += 1
    steps = step_indices(list(tree.nodes), trained)
    samples: list[TrainSample] = []
    for turn_id in trained:
        turn = tree.node(turn_id).turn
        score = step_judgment(store.get_judgment(turn_id))[0] if step_scores else None
        lps = [float(x) for x in turn.sampling_logprobs]
        samples.append(
            TrainSample(
                prompt_ids=list(turn.prompt_ids),
                completion_ids=list(turn.completion_ids),
                sampling_logprobs=lps,
                temperature=float(turn.sampling_params.get("temperature", 1.0)),
                reward=reward,
                policy_version=turn.policy_version,
                truncated=turn.finish_reason == "length",
                turn_id=turn.id,
                group_id=group_id,
                episode_id=rollout_id,
                step_index=steps[turn_id],
                step_score=score,
                meta={**meta, "rollout": rollout_id},
            )
        )
    return samples, untrained


def step_indices(creation_order: Sequence[str], trained: Iterable[str]) -> dict[str, int]:
    """Each trained turn's step: its rank among ``trained`` in ``creation_order`` (all turn ids
    of the rollout, oldest first), 0 first."""
    position = {turn_id: i for i, turn_id in enumerate(creation_order)}
    ranked = sorted(set(trained), key=position.__getitem__)
    return {turn_id: step for step, turn_id in enumerate(ranked)}


def step_samples(
    store: Store,
    rewards: dict[str, float],
    groups: dict[str, str],
    harness: dict[str, str],
    *,
    step_scores: bool = False,
) -> RolloutSamples:
    """Samples of every rollout in ``rewards`` (rollout -> reward; ``groups``/``harness``:
    rollout -> key); ``step_scores``: see :func:`rollout_samples`."""
    out = RolloutSamples()
    group_ids = {key: i for i, key in enumerate(sorted(set(groups.values())))}
    for rollout_id, reward in rewards.items():
        meta = {"harness": harness[rollout_id], "group": groups[rollout_id]}
        samples, untrained = rollout_samples(
            store, rollout_id, reward, group_ids[groups[rollout_id]], meta,
            step_scores=step_scores,
        )  # fmt: skip
        out.samples.extend(samples)
        out.untrained.update(untrained)
        out.rollouts_without_turns += not samples
    return out
