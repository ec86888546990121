"""Majority and tie rules (clawrl.judge.votes)."""

from __future__ import annotations

import pytest

from clawrl.judge import AbstainReason, NoJudgmentReason, Score, Vote, majority


@pytest.mark.parametrize(
    ("scores", "expected", "tie"),
    [
        ([1, -1, 0], Score.NEUTRAL, True),  # three different votes: tie -> 0
        ([1, -1], Score.NEUTRAL, True),
        ([-1, -1, 1], Score.BAD, False),
        ([1, 1, 0, -1, None], Score.GOOD, False),
        ([1, None, None], Score.GOOD, False),  # abstentions are set aside, not counted as 0
        ([1, 0, None], Score.NEUTRAL, True),
        ([1, 1, -1, -1, 0], Score.NEUTRAL, True),
        ([0, 0, 1], Score.NEUTRAL, False),
        ([-1], Score.BAD, False),
    ],
)
def test_majority(mk_vote, scores, expected, tie):
    t = majority([mk_vote(i, s) for i, s in enumerate(scores)])
    assert t.score == expected
    assert t.tie is tie
    assert t.reason is None
    assert sum(t.counts.values()) == sum(s is not None for s in scores)


def test_all_abstentions_give_no_judgment_with_reason(mk_vote):
    votes = [
        mk_vote(0, None),
        Vote(index=1, score=None, abstain_reason=AbstainReason.REFUSAL),
        mk_vote(2, None),
    ]
    t = majority(votes)
    assert t.score is None
    assert t.reason == NoJudgmentReason.ALL_ABSTAINED
    assert t.detail == "3 votes abstained: 2 no_score_field, 1 refusal"


def test_all_timeouts_give_timeout_reason():
    votes = [Vote(index=i, score=None, abstain_reason=AbstainReason.TIMEOUT) for i in range(2)]
    assert majority(votes).reason == NoJudgmentReason.TIMEOUT
