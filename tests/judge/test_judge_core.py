"""The Judge: votes under one deadline, majority, hints, explicit feedback, failures."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import ValidationError

from clawrl.errors import JudgeError
from clawrl.judge import (
    AbstainReason,
    BackendKind,
    HintSelection,
    Judge,
    NextStateText,
    NoJudgmentReason,
    Score,
)

GOOD = "Reason: the user thanked.\nScore: +1"
BAD = "Reason: corrected.\n<hint>Read the file before editing it.</hint>\nScore: -1"
NEUTRAL = "Reason: nothing.\nScore: 0"


def run(coro):
    return asyncio.run(coro)


def test_three_different_votes_tie_to_zero(scripted, inp):
    j = run(Judge(scripted([GOOD, BAD, NEUTRAL]), votes=3).judge(inp))
    assert j.score == Score.NEUTRAL
    assert [v.score for v in j.votes] == [Score.GOOD, Score.BAD, Score.NEUTRAL]
    assert j.detail == "tie (-1: 1, 0: 1, +1: 1) gives 0"
    assert j.raw_outputs == [GOOD, BAD, NEUTRAL]
    assert j.hint is None  # 1 hint of 3 valid votes is below the quorum of 2
    assert j.backend == BackendKind.GENERATIVE and j.model == "scripted"


def test_majority_and_hint(scripted, inp):
    j = run(Judge(scripted([BAD, BAD, GOOD]), votes=3).judge(inp))
    assert j.score == Score.BAD
    assert j.hint is not None and j.hint.text == "Read the file before editing it."
    assert j.hint.supporting_votes == [0, 1]
    assert [v.seed for v in j.votes] == [0, 1, 2]
    m = j.metrics()
    assert m["judge/votes_valid"] == 3 and m["judge/has_hint"] == 1


def test_all_abstentions_give_no_judgment(scripted, inp):
    outs = ["I'm sorry, I can't judge this.", "the answer was fine, final: +1", "<hint>x"]
    j = run(Judge(scripted(outs), votes=3).judge(inp))
    assert j.score is None
    assert j.no_judgment_reason == NoJudgmentReason.ALL_ABSTAINED
    assert j.detail == "3 votes abstained: 2 no_score_field, 1 refusal"
    assert len(j.abstentions) == 3 and j.hint is None
    assert j.metrics()["judge/abstain/no_score_field"] == 2


def test_abstention_is_not_counted_as_a_vote(scripted, inp):
    j = run(Judge(scripted([GOOD, "no idea", "Score: maybe"]), votes=3).judge(inp))
    assert j.score == Score.GOOD
    assert [v.abstain_reason for v in j.abstentions] == [
        AbstainReason.NO_SCORE_FIELD,
        AbstainReason.INVALID_SCORE,
    ]


def test_votes_run_concurrently(scripted, inp):
    backend = scripted([GOOD], delays={0: 0.05, 1: 0.05, 2: 0.05})
    j = run(Judge(backend, votes=3).judge(inp))
    assert backend.max_in_flight == 3  # sequential votes would never overlap
    assert j.score == Score.GOOD
    assert sorted(map(tuple, backend.calls)) == [(0,), (1,), (2,)]


def test_slow_votes_time_out_and_the_call_returns_in_time(scripted, inp):
    # votes that would take an hour: only the judge's timeout lets the test finish (a broken
    # timeout hangs it until the suite's per-test timeout fails it)
    backend = scripted([GOOD], delays={1: 3600, 2: 3600})

    async def go():
        j = await Judge(backend, votes=3, timeout_s=0.3).judge(inp)
        await asyncio.sleep(0.05)  # let the cancellations land
        return j

    j = run(go())
    assert j.score == Score.GOOD  # the vote that finished decides
    assert [v.abstain_reason for v in j.votes] == [
        None,
        AbstainReason.TIMEOUT,
        AbstainReason.TIMEOUT,
    ]
    assert sorted(backend.cancelled) == [1, 2]  # the slow votes were cancelled, not leaked


def test_judge_that_times_out_entirely_gives_no_judgment(scripted, inp):
    backend = scripted([GOOD], delays={0: 3600}, batched=True)  # only the timeout ends it
    j = run(Judge(backend, votes=3, timeout_s=0.2).judge(inp))
    assert j.score is None and j.no_judgment_reason == NoJudgmentReason.TIMEOUT
    assert j.detail == "3 votes abstained: 3 timeout"
    assert backend.calls == [[0, 1, 2]]  # batched: one call for all votes


def test_backend_error_is_an_abstention_but_a_bug_is_raised(scripted, inp):
    j = run(Judge(scripted([GOOD, JudgeError("endpoint down"), GOOD]), votes=3).judge(inp))
    assert j.score == Score.GOOD
    assert j.votes[1].abstain_reason == AbstainReason.BACKEND_ERROR
    assert j.votes[1].detail == "endpoint down"
    with pytest.raises(TypeError):
        run(Judge(scripted([TypeError("bug")]), votes=1).judge(inp))


def test_explicit_feedback_is_used_as_given(scripted, mk_input):
    backend = scripted([BAD])
    judge = Judge(backend, votes=3)
    fb = mk_input("You should read the file before editing it.", "feedback", reward=-0.5)
    j = run(judge.judge(fb))
    assert backend.calls == []  # no votes
    assert j.score == Score.BAD and j.reward == -0.5 and j.votes == []
    assert j.backend == BackendKind.FEEDBACK
    assert j.hint is not None and j.hint.selection == HintSelection.FEEDBACK
    assert j.hint.text == "You should read the file before editing it."
    assert run(judge.judge(mk_input("great", "feedback", reward=1.0))).score == Score.GOOD
    zero = run(judge.judge(mk_input("", "feedback", reward=0.0)))
    assert zero.score == Score.NEUTRAL and zero.hint is None
    # feedback without a reward is judged like any other next state
    j2 = run(judge.judge(mk_input("that was wrong", "feedback")))
    assert j2.score == Score.BAD and len(j2.votes) == 3


def test_reward_only_on_feedback():
    with pytest.raises(ValidationError):
        NextStateText(role="user", text="hi", reward=1.0)
    with pytest.raises(ValidationError):
        NextStateText(role="feedback", text="hi", reward=2.0)


def test_backend_without_hints_uses_the_directive_heuristic(scripted, mk_input):
    backend = scripted([BAD])
    backend.writes_hints = False
    j = run(Judge(backend, votes=1).judge(mk_input("No, use tabs instead of spaces.")))
    assert j.hint is not None and j.hint.selection == HintSelection.HEURISTIC
    assert j.hint.text == "Use tabs instead of spaces."


def test_judge_many_keeps_order(scripted, mk_input):
    backend = scripted([GOOD])
    inputs = [mk_input(f"message {i}") for i in range(5)]
    js = run(Judge(backend, votes=1).judge_many(inputs, concurrency=2))
    assert len(js) == 5 and all(j.score == Score.GOOD for j in js)


def test_bad_arguments(scripted):
    with pytest.raises(ValueError):
        Judge(scripted([GOOD]), votes=0)
    with pytest.raises(ValueError):
        Judge(scripted([GOOD]), timeout_s=0)


def test_first_votes_re_aggregates_a_recorded_eval(scripted, mk_input):
    from clawrl.judge import CaseCategory, JudgeCase
    from clawrl.judge.evaluate import evaluate

    cases = [
        JudgeCase(
            id="complaint-01",
            category=CaseCategory.COMPLAINT,
            input=mk_input("this is useless"),
            expected_score=Score.BAD,
            has_hint=False,
        )
    ]
    backend = scripted([GOOD, BAD, BAD])  # vote 0 says +1, votes 1-2 say -1 (with hints)
    report = run(evaluate(Judge(backend, votes=3), cases))
    assert report.accuracy == 1.0 and report.hint_precision == 0.0  # 2 of 3 votes: hint
    one = report.first_votes(1)
    assert one.votes == 1 and one.accuracy == 0.0 and one.hint_precision is None
    assert one.results[0].judgment.score == Score.GOOD
    assert report.first_votes(2).results[0].judgment.score == Score.NEUTRAL  # tie
    assert report.metrics()["eval/accuracy/complaint"] == 1.0
    with pytest.raises(ValueError):
        report.first_votes(4)
