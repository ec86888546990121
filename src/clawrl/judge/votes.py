"""Majority of votes.

**Rule.** Abstentions are set aside (they are never a -1 or a 0). Among the valid votes, the
score with strictly more votes than each other score wins (a plurality: [+1, +1, -1] → +1,
[+1, 0, abstain] → tie). When two or more scores share the top count — [+1, -1, 0],
[+1, -1], [+1, +1, -1, -1, 0] — the judgment is **0**: the votes disagree, so the next state
carries no reliable evidence either way, and 0 is the score that teaches nothing in Binary RL.
When every vote abstains there is no judgment; its reason is ``timeout`` if every abstention was
a timeout, else ``all_abstained``, and its detail counts the abstentions by reason.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from clawrl.judge.types import AbstainReason, NoJudgmentReason, Score, Vote


@dataclass(frozen=True)
class Tally:
    """The outcome of counting votes.

    Attributes:
        score: the majority score, or ``None`` when every vote abstained.
        reason: why there is no score (set exactly when ``score is None``).
        detail: abstention counts, e.g. ``"3 votes abstained: 2 no_score_field, 1 refusal"``.
        counts: valid votes per score.
        tie: the top count was shared, so ``score`` is 0 by the tie rule.
    """

    score: Score | None
    reason: NoJudgmentReason | None = None
    detail: str | None = None
    counts: dict[Score, int] = field(default_factory=dict)
    tie: bool = False


def majority(votes: Sequence[Vote]) -> Tally:
    """Count ``votes`` by the rule of the module doc.

    Args:
        votes: every vote of one judgment, abstentions included.

    Returns:
        The :class:`Tally`.
    """
    counts = Counter(v.score for v in votes if v.score is not None)
    if not counts:
        reasons = Counter(v.abstain_reason for v in votes if v.abstain_reason is not None)
        parts = ", ".join(f"{n} {r.value}" for r, n in sorted(reasons.items(), key=lambda x: x[0]))
        detail = f"{len(votes)} votes abstained" + (f": {parts}" if parts else "")
        only_timeouts = bool(votes) and set(reasons) == {AbstainReason.TIMEOUT}
        reason = NoJudgmentReason.TIMEOUT if only_timeouts else NoJudgmentReason.ALL_ABSTAINED
        return Tally(None, reason, detail)
    ranked = counts.most_common()
    top = ranked[0][1]
    leaders = [s for s, n in ranked if n == top]
    valid_counts: dict[Score, int] = {s: n for s, n in counts.items() if s is not None}
    if len(leaders) > 1:
        return Tally(Score.NEUTRAL, counts=valid_counts, tie=True)
    winner = leaders[0]
    assert winner is not None
    return Tally(winner, counts=valid_counts)
