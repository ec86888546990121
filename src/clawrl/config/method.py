"""The training method: one discriminated union (by ``kind``), read by every part that trains.

A method config says how a sample is credited (an advantage config from
:mod:`clawrl.algorithms`), which loss it is trained with (:class:`~clawrl.algorithms.PPOClipLoss`
with its importance-ratio, KL, aggregation and truncation options) and what a sample needs
before it can be trained (:class:`SampleNeeds`): a judge reward, a hindsight hint, a group. The
online learner's sample decision, the trainer and harness mode all read that one object; nothing
else chooses by string.

======================  ==============================  =====================================
``kind`` (shorthand)    advantage                       a sample needs
======================  ==============================  =====================================
``off``                 — (serve and record only)       nothing is trained
``rl``                  Binary RL, ``A_t = r``          a judge score (non-zero, or any when
                                                        ``train_on_zero``)
``opd``                 hindsight OPD                   a hint (teacher log-probs)
``combine``             ``w_rl·r + w_opd·OPD_t``        a score or a hint
``grpo``                group-relative (GRPO/Dr. GRPO)  an outcome reward and its group
``prm_outcome``         PRM step score + outcome,       an outcome reward, its group, its step
                        normalised per (group, step)    (and the judge's score of the step)
``precomputed``         the sample's own advantage      an advantage (``reward`` field)
======================  ==============================  =====================================

Written in TOML either as a shorthand string or as a table::

    [trainer]
    method = "combine"                       # the shorthand

    [trainer.method]                         # or the full form
    kind = "combine"
    teacher = "base"
    advantage = { w_rl = 1.0, w_opd = 0.5 }
    loss = { eps_high = 0.28, ratio = { kind = "tis", cap = 2.0 }, kl = { beta = 0.0 } }

``dr_grpo`` is a further shorthand: ``grpo`` with ``advantage.normalize_std = false``
(``ppo``, harness mode's old name for it, too). ``grpo`` and ``prm_outcome`` train harness
rollouts only (``clawrl harness train``): outcome-only, or integrated PRM + outcome.
Importable without torch (the :mod:`clawrl.algorithms` configs are stdlib dataclasses).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from clawrl.algorithms.config import (
    BinaryRLAdvantage,
    CombinedAdvantage,
    GRPOAdvantage,
    OPDAdvantage,
    PPOClipLoss,
    PrecomputedAdvantage,
    PRMOutcomeAdvantage,
)

Teacher = Literal["policy", "base"]
"""The OPD teacher: the current policy, or the frozen base weights (LoRA disabled)."""

HintPlacement = Literal["user", "system"]
"""Where the OPD teacher's prompt carries the hint: appended to the last user (or tool)
message, or in the system message (:func:`clawrl.trainer.samples.hinted_messages`)."""

Evidence = Literal["reward", "hint"]
"""What a judged turn can offer a method: a judge score used as reward, or a hindsight hint."""


@dataclass(frozen=True)
class SampleNeeds:
    """What a judged turn must carry to become a training sample, and what the sample uses.

    Attributes:
        any_of: the turn is trained when it has at least one of these (empty: never trained).
        uses_reward: the judge's score goes into ``TrainSample.reward``.
        uses_hint: a hint is turned into teacher log-probs (OPD).
        zero_is_reward: a score of 0 counts as a reward (Binary RL's ``train_on_zero``).
        teacher: which weights score the hint-enhanced prompt (``None``: no teacher).
        hint_placement: where the teacher's prompt carries the hint.
        group: samples carry a group id and the episode they belong to (GRPO).
        step_scores: samples carry their step index within the episode and the judge's score
            of the step's next state (``None`` when the step has none); harness mode judges
            each trained turn for it (integrated PRM + outcome).
    """

    any_of: tuple[Evidence, ...]
    uses_reward: bool = False
    uses_hint: bool = False
    zero_is_reward: bool = False
    teacher: Teacher | None = None
    hint_placement: HintPlacement = "user"
    group: bool = False
    step_scores: bool = False


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=True)


class _Trained(_Section):
    """Fields of every method that trains."""

    loss: PPOClipLoss = Field(
        default_factory=PPOClipLoss,
        description="The policy loss: PPO clip (eps_low, eps_high, dual_clip), the importance "
        "ratio and mismatch correction (ratio.kind: sampling | old | tis | mis), the KL "
        "penalty (kl.beta, kl.estimator), the aggregation (token_mean | seq_mean_token_mean | "
        "seq_mean_token_sum_norm) and mask_truncated.",
    )

    trains: ClassVar[bool] = True

    @property
    def needs(self) -> SampleNeeds:  # pragma: no cover - every member overrides it
        raise NotImplementedError


class OffMethod(_Section):
    """Serve and record only; nothing is trained."""

    kind: Literal["off"] = "off"
    trains: ClassVar[bool] = False

    @property
    def needs(self) -> SampleNeeds:
        """Nothing is ever trained."""
        return SampleNeeds(any_of=())


class BinaryRLMethod(_Trained):
    """Binary RL (OpenClaw-RL): the judge's +1 / -1 is every sampled token's advantage."""

    kind: Literal["rl"] = "rl"
    advantage: BinaryRLAdvantage = Field(default_factory=BinaryRLAdvantage)
    train_on_zero: bool = Field(
        False, description="Keep score-0 turns as samples (A = 0: they only add KL and count)."
    )

    @property
    def needs(self) -> SampleNeeds:
        """A judge score (non-zero unless ``train_on_zero``), used as the reward."""
        return SampleNeeds(any_of=("reward",), uses_reward=True, zero_is_reward=self.train_on_zero)


class OPDMethod(_Trained):
    """Hindsight-guided OPD (OpenClaw-RL): the policy with the hint in its prompt is the teacher."""

    kind: Literal["opd"] = "opd"
    advantage: OPDAdvantage = Field(default_factory=OPDAdvantage)
    teacher: Teacher = Field(
        "policy", description="OPD teacher: the current policy or the frozen base weights."
    )
    hint_placement: HintPlacement = Field(
        "user",
        description="Where the teacher's prompt carries the hint: appended to the last user or "
        "tool message (user), or in the system message (system).",
    )

    @property
    def needs(self) -> SampleNeeds:
        """A hint, scored by the teacher."""
        return SampleNeeds(
            any_of=("hint",), uses_hint=True, teacher=self.teacher,
            hint_placement=self.hint_placement,
        )  # fmt: skip


class CombinedMethod(_Trained):
    """Binary RL + OPD (OpenClaw-RL "combined"): ``A_t = w_rl · r + w_opd · OPD_t``."""

    kind: Literal["combine"] = "combine"
    advantage: CombinedAdvantage = Field(default_factory=CombinedAdvantage)
    teacher: Teacher = Field(
        "policy", description="OPD teacher: the current policy or the frozen base weights."
    )
    hint_placement: HintPlacement = Field(
        "user",
        description="Where the teacher's prompt carries the hint: appended to the last user or "
        "tool message (user), or in the system message (system).",
    )
    train_on_zero: bool = Field(False, description="Keep score-0 turns without a hint as samples.")

    @property
    def needs(self) -> SampleNeeds:
        """A score or a hint; both are used when present."""
        return SampleNeeds(
            any_of=("reward", "hint"),
            uses_reward=True,
            uses_hint=True,
            zero_is_reward=self.train_on_zero,
            teacher=self.teacher,
            hint_placement=self.hint_placement,
        )


class GRPOMethod(_Trained):
    """GRPO over groups (harness mode): outcome rewards normalised within each group of episodes.

    A group is the rollouts of one task; an episode (a rollout) may contribute several samples
    (its trained turns), and counts once in its group's mean and std.
    """

    kind: Literal["grpo"] = "grpo"
    advantage: GRPOAdvantage = Field(default_factory=GRPOAdvantage)

    @property
    def needs(self) -> SampleNeeds:
        """An outcome reward, a group and an episode per sample."""
        return SampleNeeds(any_of=("reward",), uses_reward=True, zero_is_reward=True, group=True)


class PRMOutcomeMethod(_Trained):
    """Integrated PRM + outcome over groups (harness mode; OpenClaw-RL, general agents).

    Each trained turn is a step ``s`` of its rollout ``i``; the judge scores the step from its
    next state (the tool output or message that followed it), and
    ``R_{i,s} = PRM_{i,s} + outcome_i`` is normalised over the rollouts of the group that have
    a step ``s`` (:func:`clawrl.algorithms.prm_outcome_advantages`). A step without a score
    (the rollout's last turn has no next state; a judge failure) keeps ``R_{i,s} = outcome_i``.
    """

    kind: Literal["prm_outcome"] = "prm_outcome"
    advantage: PRMOutcomeAdvantage = Field(default_factory=PRMOutcomeAdvantage)

    @property
    def needs(self) -> SampleNeeds:
        """An outcome reward, a group, an episode and a step per sample; a step score when the
        judge gave one."""
        return SampleNeeds(
            any_of=("reward",), uses_reward=True, zero_is_reward=True, group=True,
            step_scores=True,
        )  # fmt: skip


class PrecomputedMethod(_Trained):
    """Each sample's ``reward`` is its advantage, computed elsewhere, broadcast to its tokens."""

    kind: Literal["precomputed"] = "precomputed"
    advantage: PrecomputedAdvantage = Field(default_factory=PrecomputedAdvantage)

    @property
    def needs(self) -> SampleNeeds:
        """An advantage in the ``reward`` field."""
        return SampleNeeds(any_of=("reward",), uses_reward=True, zero_is_reward=True)


TrainedMethod = (
    BinaryRLMethod | OPDMethod | CombinedMethod | GRPOMethod | PRMOutcomeMethod | PrecomputedMethod
)
"""The members that train (everything but ``off``)."""

MethodConfig = Annotated[OffMethod | TrainedMethod, Field(discriminator="kind")]
"""Discriminated union (by ``kind``) of the training methods."""

METHOD_KINDS = ("off", "rl", "opd", "combine", "grpo", "prm_outcome", "precomputed")
"""Every ``kind``, in the order ``--help`` lists them."""

SHORTHANDS: dict[str, dict[str, Any]] = {
    **{kind: {"kind": kind} for kind in METHOD_KINDS},
    "dr_grpo": {"kind": "grpo", "advantage": {"normalize_std": False}},
    "ppo": {"kind": "grpo", "advantage": {"normalize_std": False}},  # harness mode's old name
}
"""Strings accepted for ``trainer.method`` / ``--method`` and the table each stands for."""


def expand_method(value: Any) -> Any:
    """A shorthand string (``"combine"``) becomes its table; a table must name its ``kind``;
    anything else is returned as is (for pydantic to refuse).

    Raises:
        ValueError: an unknown shorthand, or a table without ``kind`` (the message lists the
            known ones).
    """
    if isinstance(value, str):
        try:
            return copy.deepcopy(SHORTHANDS[value])
        except KeyError:
            raise ValueError(
                f"unknown method {value!r}; choose from {', '.join(SHORTHANDS)}"
            ) from None
    if isinstance(value, dict) and "kind" not in value:
        raise ValueError(
            f"a method table needs a kind ({', '.join(METHOD_KINDS)}), e.g. "
            f'trainer.method = {{ kind = "rl", ... }} or --method rl'
        )
    return value


def merge_method(current: Any, shorthand: str) -> dict[str, Any]:
    """``--method SHORTHAND`` applied over the ``trainer.method`` of ``--config`` / ``--set``.

    The settings already given for the same kind are kept (the shorthand's own settings, such as
    ``dr_grpo``'s ``normalize_std = false``, win); a table without a kind takes the shorthand's.

    Raises:
        ValueError: the shorthand is unknown, or names another kind than the table does.
    """
    table = expand_method(shorthand)
    if current is None:
        return table
    if isinstance(current, str):
        current = expand_method(current)
    if not isinstance(current, dict):
        return table
    kind = current.get("kind")
    if kind is not None and kind != table["kind"]:
        raise ValueError(
            f"--method {shorthand} contradicts trainer.method kind {kind!r} given by --config "
            "or --set; give one of them"
        )
    return deep_merge(current, table)


def deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``base`` with ``top``'s keys, nested tables merged key by key."""
    out = copy.deepcopy(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out
