"""How often the PRM judge agrees with the simulated user's own ground truth.

During training every judged policy answer has two labels: the simulator's reward (+1 the
answer satisfied the user, -1 it did not; :meth:`SessionLog.ground_truth`) and the judge's
score read from the user's next message (+1 / -1 / 0, or a vote mean in [-1, 1]). Agreement is
measured on turns where both are decisive; a judge 0 (no evidence) is counted apart.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from clawrl.envs.sessions import SessionLog


@dataclass(frozen=True)
class Agreement:
    """Judge versus simulator over judged turns.

    Attributes:
        compared: turns where the simulator's reward is +-1 and the judge's score is non-zero.
        agreed: of those, turns where the signs match.
        judge_neutral: turns the judge scored 0.
        missing: turns with ground truth that the judge has not scored (yet).
        confusion: counts keyed ``"truth=+1,judge=-1"`` etc. (``judge=0`` included).
    """

    compared: int
    agreed: int
    judge_neutral: int
    missing: int
    confusion: dict[str, int] = field(default_factory=dict)

    @property
    def rate(self) -> float | None:
        """``agreed / compared``, or ``None`` when nothing could be compared."""
        return self.agreed / self.compared if self.compared else None

    @property
    def sign_errors(self) -> int:
        """Turns the judge scored with the opposite sign of the simulator's truth."""
        return self.compared - self.agreed

    @property
    def sign_error_rate(self) -> float | None:
        """Sign errors over every turn the judge scored (0 included), or ``None``."""
        judged = self.compared + self.judge_neutral
        return self.sign_errors / judged if judged else None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (with ``rate``)."""
        return {
            "compared": self.compared,
            "agreed": self.agreed,
            "rate": self.rate,
            "sign_errors": self.sign_errors,
            "sign_error_rate": self.sign_error_rate,
            "judge_neutral": self.judge_neutral,
            "missing": self.missing,
            "confusion": dict(self.confusion),
        }


def _sign(x: float) -> int:
    return (x > 0) - (x < 0)


def judge_agreement(
    logs: Iterable[SessionLog], judge_scores: Mapping[str, float | None]
) -> Agreement:
    """Compare the judge's scores with the simulator's ground truth, turn by turn.

    Args:
        logs: training sessions (:func:`clawrl.envs.run_sessions`).
        judge_scores: gateway turn id -> the judge's score (+1 / -1 / 0, a vote mean, or
            ``None`` for not judged).

    Returns:
        The counts; turns whose ground truth is unknown (an unrated LLM answer) are skipped.
    """
    compared = agreed = neutral = missing = 0
    confusion: dict[str, int] = {}
    for log in logs:
        for turn_id, truth in log.ground_truth().items():
            if truth.reward is None:
                continue
            score = judge_scores.get(turn_id)
            if score is None:
                missing += 1
                continue
            judged = _sign(float(score))
            shown = f"{judged:+d}" if judged else "0"
            key = f"truth={truth.reward:+d},judge={shown}"
            confusion[key] = confusion.get(key, 0) + 1
            if judged == 0:
                neutral += 1
                continue
            compared += 1
            agreed += judged == truth.reward
    return Agreement(compared, agreed, neutral, missing, confusion)
