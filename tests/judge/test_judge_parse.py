"""Adversarial judge outputs, each with its right parse (clawrl.judge.parse)."""

from __future__ import annotations

import pytest

from clawrl.judge import AbstainReason, HintStatus, Score, parse_hint, parse_score


@pytest.mark.parametrize(
    ("text", "score", "reason"),
    [
        # prose with several scores before the designated final field: only the field counts
        (
            "First I thought +1 because the user said thanks. Score: +1 would fit.\n"
            "Score: +1\nBut then the user complained, so\nScore: -1",
            Score.BAD,
            None,
        ),
        # "final: -1" is prose, not the designated field -> abstention, never a -1
        ("first I thought +1 ... final: -1", None, AbstainReason.NO_SCORE_FIELD),
        # a Score: that does not start its line is prose
        ("I would say Score: +1 here.", None, AbstainReason.NO_SCORE_FIELD),
        ("Reason: the test passed.\nScore: +1", Score.GOOD, None),
        ("Reason: no evidence.\nScore: 0\n", Score.NEUTRAL, None),
        ("Score: 1", Score.GOOD, None),
        ("**Score:** -1", Score.BAD, None),
        ("score: −1.", Score.BAD, None),
        ("Score: -1\nI hope this helps!", Score.BAD, None),
        # the last Score: line is invalid: earlier valid ones are not consulted
        ("Score: +1\nScore: +1 or -1", None, AbstainReason.INVALID_SCORE),
        ("Score: 2", None, AbstainReason.INVALID_SCORE),
        ("Score: N/A", None, AbstainReason.INVALID_SCORE),
        ("Score:", None, AbstainReason.INVALID_SCORE),
        # refusals abstain (never a 0 or -1)
        ("I'm sorry, but I can't evaluate this conversation.", None, AbstainReason.REFUSAL),
        ("As an AI, I cannot judge.\nScore: unknown", None, AbstainReason.REFUSAL),
        ("I cannot evaluate this turn without more context.", None, AbstainReason.REFUSAL),
        # declining something else (a copied email) is not a refusal to judge
        ("Unfortunately I'm unable to attend on Thursday.", None, AbstainReason.NO_SCORE_FIELD),
        ("", None, AbstainReason.EMPTY),
        ("   \n ", None, AbstainReason.EMPTY),
        ("The assistant did well overall.", None, AbstainReason.NO_SCORE_FIELD),
    ],
)
def test_parse_score(text, score, reason):
    parsed = parse_score(text)
    assert parsed.score == score
    assert parsed.reason == reason
    assert (parsed.score is None) == (parsed.reason is not None)


def test_invalid_score_detail_names_the_value():
    assert "+1 or -1" in (parse_score("Score: +1 or -1").detail or "")


@pytest.mark.parametrize(
    ("text", "hint", "status"),
    [
        (
            "Reason: corrected.\n<hint>Read the file before editing it.</hint>\nScore: -1",
            "Read the file before editing it.",
            HintStatus.OK,
        ),
        # a valid score with an empty hint tag: the score counts, the hint does not exist
        ("Reason: fine.\n<hint></hint>\nScore: +1", None, HintStatus.NONE),
        ("<hint>  \n </hint>\nScore: +1", None, HintStatus.NONE),
        ("<hint>None.</hint>\nScore: +1", None, HintStatus.NONE),
        ("<hint>N/A</hint>\nScore: 0", None, HintStatus.NONE),
        # a hint tag that never closes
        (
            "Reason: x.\n<hint>Always check the file before you edit\nScore: -1",
            None,
            HintStatus.UNTERMINATED,
        ),
        ("<hint>Be nicer.</hint>", None, HintStatus.TOO_SHORT),
        ("<hint>" + "word " * 100 + "</hint>", None, HintStatus.TOO_LONG),
        ("Score: -1", None, HintStatus.ABSENT),
        # the last opener counts; whitespace is collapsed; case-insensitive tags
        (
            "<hint>old idea</hint> then <HINT>Use   metric\nunits for distances.</HINT>",
            "Use metric units for distances.",
            HintStatus.OK,
        ),
    ],
)
def test_parse_hint(text, hint, status):
    parsed = parse_hint(text)
    assert parsed.text == hint
    assert parsed.status == status


def test_valid_score_with_empty_hint_tag_is_a_vote_without_hint():
    from clawrl.judge.backends import vote_from_text

    v = vote_from_text(0, "Reason: user thanked.\n<hint></hint>\nScore: +1")
    assert v.score == Score.GOOD and v.hint is None and v.hint_status == HintStatus.NONE


def test_unterminated_hint_keeps_the_score():
    from clawrl.judge.backends import vote_from_text

    v = vote_from_text(0, "<hint>Check the file before editing it.\nScore: -1")
    assert v.score == Score.BAD and v.hint is None
    assert v.hint_status == HintStatus.UNTERMINATED


def test_truncated_output_says_so():
    from clawrl.judge.backends import vote_from_text

    v = vote_from_text(0, "Reason: the user", truncated=True)
    assert v.abstain_reason == AbstainReason.NO_SCORE_FIELD
    assert "max_tokens" in (v.detail or "")
