"""Step scores for integrated PRM + outcome: the judge's verdict on each turn's next state.

With a method whose samples carry step scores (:class:`clawrl.config.PRMOutcomeMethod`), each
training step of harness mode judges the turns of its rollouts before building samples, the way
the online loop does: the same :class:`~clawrl.judge.worker.JudgeWorker` builds each
turn's judge input from its next state (:func:`clawrl.trajectory.next_state`: the tool output or
message that followed the turn in the rollout's prefix tree; no person takes part in a rollout,
so a harness's observation sent as a user message, e.g. ``Output: ... (exit code 0)``, is judged
as a program's output: role ``environment``), asks the configured judge (m votes,
majority +1 / -1 / 0) and stores the judgment in the store's ``judgments`` table, so it shows in
``clawrl sessions``, the dashboard and ``clawrl export``. A turn without a next state (the
rollout's last turn: the harness exited after it) is stored with reason ``no_next_state``; a judge
that times out or fails is stored without a score and counted, never raised.

A trained turn's step score is then the stored score, or ``None`` (:func:`step_judgment`); the
trainer gives a step without a score the outcome alone (:func:`clawrl.trainer.batch.
step_reward_inputs`).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterable, Sequence
from enum import StrEnum

from clawrl.judge.worker import JudgeFn, JudgeWorker
from clawrl.store import DropReason, JudgmentRecord, Store
from clawrl.trainer.types import TrainSample


class StepJudgment(StrEnum):
    """What the store says about a trained turn's step score."""

    SCORED = "scored"  # the judge gave +1, -1 or 0
    NO_NEXT_STATE = "no_next_state"  # nothing followed the turn (the rollout's last turn)
    FAILED = "failed"  # the judge timed out, raised, every vote abstained, or it was not judged


def step_judgment(record: JudgmentRecord | None) -> tuple[float | None, StepJudgment]:
    """The step score of a turn from its stored judgment (``None``: not judged) and its kind."""
    if record is not None and record.score is not None:
        return float(record.score), StepJudgment.SCORED
    if record is not None and record.reason == DropReason.NO_NEXT_STATE:
        return None, StepJudgment.NO_NEXT_STATE
    return None, StepJudgment.FAILED


class StepJudge:
    """Judges the turns of each step's rollouts, on one event loop held for the whole run (a
    judge backend's HTTP client stays bound to the loop it was first used on).

    Args:
        store: the run's store (turns are read from it, judgments written to it).
        judge: ``async (JudgeInput) -> Judgment`` (``Runtime.judge.judge``).
        timeout_s: the most seconds one judgment may take (then stored as ``timeout``).
        concurrency: judgments in flight at once.
    """

    def __init__(
        self, store: Store, judge: JudgeFn, *, timeout_s: float = 150.0, concurrency: int = 4
    ) -> None:
        self.worker = JudgeWorker(
            store, judge, timeout_s=timeout_s, concurrency=concurrency, observations=True
        )
        self._loop = asyncio.new_event_loop()

    def judge_rollouts(self, rollout_ids: Iterable[str]) -> int:
        """Judge every unjudged trainable turn of the (ended) rollouts ``rollout_ids`` and store
        the judgments (:meth:`JudgeWorker.judge_sessions`); returns how many turns went to the
        judge.

        Raises:
            StoreError: the store failed. Judge time-outs and ``JudgeError`` are stored, not
                raised.
        """
        return self._loop.run_until_complete(self.worker.judge_sessions(list(rollout_ids)))

    def close(self) -> None:
        """Close the event loop (the judge itself is the caller's)."""
        self._loop.close()


def prm_metrics(store: Store, samples: Sequence[TrainSample]) -> dict[str, float]:
    """``prm/*`` metrics over the trained turns ``samples`` of a step.

    ``prm/judged_turns`` (a score), ``prm/no_next_state`` (masked: the outcome alone),
    ``prm/judge_failures`` (time-out, error, all votes abstained), ``prm/step_score_mean`` (mean
    score of the judged turns; 0 when none) and ``prm/score/{+1,0,-1}`` counts.
    """
    kinds: Counter[StepJudgment] = Counter()
    scores: list[float] = []
    for s in samples:
        score, kind = step_judgment(store.get_judgment(s.turn_id))
        kinds[kind] += 1
        if score is not None:
            scores.append(score)
    out = {
        "prm/judged_turns": float(kinds[StepJudgment.SCORED]),
        "prm/no_next_state": float(kinds[StepJudgment.NO_NEXT_STATE]),
        "prm/judge_failures": float(kinds[StepJudgment.FAILED]),
        "prm/step_score_mean": sum(scores) / len(scores) if scores else 0.0,
    }
    for value, key in ((1.0, "+1"), (0.0, "0"), (-1.0, "-1")):
        out[f"prm/score/{key}"] = float(sum(x == value for x in scores))
    return out
