"""What the trainer consumes: one sample per judged turn."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TrainSample:
    """One turn to train on (OpenClaw-RL trains per turn: prompt -> sampled completion).

    Attributes:
        prompt_ids: ``[p]`` exactly the ids the engine received (context; never trained on).
        completion_ids: ``[c]`` the ids the engine sampled (the targets).
        sampling_logprobs: ``[c]`` engine log-probs at sampling time (after temperature).
        temperature: the temperature the completion was sampled at; the trainer applies the same
            temperature to its own logits so that on-policy ratios start at exactly 1.
        reward: judge score in {+1, -1, 0} (Binary RL), or None when only OPD applies.
        teacher_logprobs: ``[c]`` log π_teacher(a_t | s + hint) at the same temperature, or None
            when the turn has no hint.
        student_logprobs: ``[c]`` the OPD advantage's student term for a turn distilled out of
            its memory (context distillation: the policy's log-probs on ``prompt_ids``, the
            prompt without the memory block, at step start), or None: the advantage uses
            ``sampling_logprobs`` (the student as sampled, OpenClaw-RL's choice).
        policy_version: the version that sampled the completion (for staleness).
        truncated: the completion hit its length limit.
        turn_id: the store's turn id (for bookkeeping: a sample is trained once).
        group_id: rollout group (GRPO); 0 for the online loop.
        episode_id: the episode (rollout) the turn belongs to; GRPO counts each episode once in
            its group. ``""``: the turn is its own episode.
        step_index: the turn's step within its episode (harness mode: its rank among the
            rollout's trained turns by creation, 0 first); the PRM + outcome method normalises
            per (group, step).
        step_score: the judge's score of the step's next state in {+1, -1, 0} (PRM + outcome),
            or None when the step has none (no next state, a judge failure, or not judged).
        meta: free-form facts carried along (harness name, rollout id).
    """

    prompt_ids: list[int]
    completion_ids: list[int]
    sampling_logprobs: list[float]
    temperature: float = 1.0
    reward: float | None = None
    teacher_logprobs: list[float] | None = None
    student_logprobs: list[float] | None = None
    policy_version: int = 0
    truncated: bool = False
    turn_id: str = ""
    group_id: int = 0
    episode_id: str = ""
    step_index: int = 0
    step_score: float | None = None
    meta: dict[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.completion_ids:
            raise ValueError("a TrainSample needs at least one completion token")
        if len(self.sampling_logprobs) != len(self.completion_ids):
            raise ValueError(
                f"sampling_logprobs has {len(self.sampling_logprobs)} entries for "
                f"{len(self.completion_ids)} completion ids"
            )
        if self.teacher_logprobs is not None and len(self.teacher_logprobs) != len(
            self.completion_ids
        ):
            raise ValueError("teacher_logprobs must align with completion_ids")
        if self.student_logprobs is not None and len(self.student_logprobs) != len(
            self.completion_ids
        ):
            raise ValueError("student_logprobs must align with completion_ids")
        if self.step_index < 0:
            raise ValueError(f"step_index must be >= 0, got {self.step_index}")
