"""Harness-mode settings (``[harness]``): which tasks, which harnesses, how many rollouts, how
they are isolated and timed. Importable without torch.

``clawrl harness train`` and ``clawrl harness eval`` read this section; their flags
(``--tasks``, ``--harness``, ``--group-size``, ...) are shorthands for its fields, applied over
``--config`` / ``--set harness.KEY=VALUE``.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class HarnessConfig(BaseModel):
    """Harness mode: tasks with verifiers run through unmodified agent harnesses in a sandbox
    (``clawrl harness train`` / ``eval``)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    tasks: str = Field(
        "builtin",
        min_length=1,
        description="Task suite directory, or 'builtin' (the embedded one).",
    )
    split: Literal["train", "heldout", "all"] | None = Field(
        None,
        description="Which tasks: train, heldout or all; None: train for 'harness train', "
        "heldout for 'harness eval'.",
    )
    match: str | None = Field(
        None,
        min_length=1,
        description="Use only the tasks whose id this regular expression is found in (re.search).",
    )
    limit: int | None = Field(
        None, ge=1, description="Use only the first N tasks (by id, after match); None: all."
    )
    harnesses: list[str] = Field(
        default_factory=lambda: ["reference"],
        min_length=1,
        description="Harness adapters (clawrl harness list); several make a mixed-harness run.",
    )
    group_size: int = Field(
        4, ge=1, le=1024, description="G: rollouts per task and harness in a training group."
    )
    tasks_per_step: int = Field(4, ge=1, le=4096, description="Tasks per training step.")
    steps: int = Field(
        5, ge=0, description="Training steps (0: a warm start alone, with warm_start set)."
    )
    k: int = Field(4, ge=1, le=1024, description="Rollouts per task in an evaluation (Pass@k).")
    parallel: int = Field(4, ge=1, le=256, description="Rollouts in flight at once.")
    isolation: Literal["auto", "bwrap", "fallback"] = Field(
        "auto",
        description="Sandbox: bwrap (bubblewrap namespaces), fallback (a temporary directory, "
        "no isolation), auto (bwrap where it works).",
    )
    max_steps: int | None = Field(
        None, ge=1, description="The reference agent's step limit; None: each task's own."
    )
    time_limit_s: float | None = Field(
        None, gt=0, description="Seconds every rollout may take; None: each task's own limit."
    )
    seeded: bool = Field(
        True,
        description="Seed every rollout's sampling: a rollout's calls use seeds fixed by the "
        "run's seed, the step, the group and the member, so a run with the same seed samples "
        "the same answers whatever else is in flight (calls sending their own seed keep it); "
        "false: unseeded.",
    )
    seed: int | None = Field(
        None,
        ge=0,
        description="The rollouts' sampling seed; None: the trainer's seed (trainer.seed, the "
        "--seed flag), so one seed decides the LoRA init, the warm start's shuffle and the "
        "sampling.",
    )
    warm_start: str | None = Field(
        None,
        min_length=1,
        description="Before the RL steps, supervised steps on the passed rollouts in this run "
        "directory's (or store's) store, replayed through each harness; None: no warm start.",
    )
    warm_start_epochs: int = Field(2, ge=1, description="Passes over the replayed turns.")
    warm_start_per_task: int = Field(
        2, ge=1, description="Distinct command lists replayed per task at most."
    )

    def sampling_seed(self, trainer_seed: int) -> int | None:
        """The run's rollout sampling seed (``None``: unseeded): ``seed``, else
        ``trainer_seed``."""
        if not self.seeded:
            return None
        return self.seed if self.seed is not None else trainer_seed

    @field_validator("match")
    @classmethod
    def _regex(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as e:
                raise ValueError(f"{value!r} is not a regular expression: {e}") from e
        return value

    @field_validator("harnesses", mode="before")
    @classmethod
    def _names(cls, value: object) -> object:
        if isinstance(value, str):  # "reference,mini-swe-agent" (the --harness flag's form)
            value = [h.strip() for h in value.split(",") if h.strip()]
        return value

    def split_for(self, command: Literal["train", "eval"]) -> Literal["train", "heldout", "all"]:
        """The split a command uses: :attr:`split`, else train for training, heldout for eval."""
        if self.split is not None:
            return self.split
        return "train" if command == "train" else "heldout"
