"""Hint selection among votes and the heuristic directive extractor (clawrl.judge.hints)."""

from __future__ import annotations

import pytest

from clawrl.judge import HintSelection, NextStateRole, extract_directive, overlap_f1, select_hint
from clawrl.judge.hints import content_tokens


def test_overlap_f1_hand_computed():
    a = content_tokens("Read the file before editing it")  # read file before editing
    b = content_tokens("Always read the config file first")  # always read config file first
    # overlap {read, file} = 2; p = 2/4, r = 2/5 -> F1 = 2*0.5*0.4/0.9
    assert overlap_f1(a, b) == pytest.approx(2 * 0.5 * 0.4 / 0.9)
    assert overlap_f1(a, a) == 1.0
    assert overlap_f1(a, []) == 0.0
    assert overlap_f1(["x"], ["y"]) == 0.0


def test_consensus_beats_longest(mk_vote):
    votes = [
        mk_vote(0, -1, "Read the file before editing it."),
        # the longest hint, unsupported by the others (OpenClaw-RL would pick it)
        mk_vote(
            1,
            -1,
            "Consider being more careful with all operations, and think about what "
            "the user might want in general before acting on anything at all.",
        ),
        mk_vote(2, -1, "Always read the file first before editing it."),
    ]
    h = select_hint(votes)
    assert h is not None
    assert h.selection == HintSelection.CONSENSUS
    # content tokens: v0 = 4 (read file before editing), v2 = 6, v1 = 14 sharing only "before".
    # F1(v0, v2) = 2*1*(4/6)/(1+4/6) = 0.8; F1(v0, v1) = 2/18; F1(v2, v1) = 0.1.
    # support: v0 = (0.8 + 2/18)/2 = 0.4556 > v2 = (0.8 + 0.1)/2 = 0.45 > v1
    assert h.text == "Read the file before editing it."
    assert h.supporting_votes == [0, 2]  # v1's F1 with v0 (0.11) is below 0.3
    assert h.support == pytest.approx((0.8 + 2 / 18) / 2, abs=1e-6)


def test_tie_breaks_by_length_then_index(mk_vote):
    same = "Use metric units for every distance."
    h = select_hint([mk_vote(0, -1, same), mk_vote(1, -1, same)])
    assert h is not None and h.supporting_votes == [0, 1]
    h2 = select_hint(
        [mk_vote(0, -1, "Use metric units for every distance please."), mk_vote(1, -1, same)]
    )
    assert h2 is not None and h2.text == same  # fewer content tokens wins the tie


def test_quorum_half_of_valid_votes(mk_vote):
    one_of_three = [
        mk_vote(0, -1, "Read the file before editing it."),
        mk_vote(1, -1),
        mk_vote(2, -1),
    ]
    assert select_hint(one_of_three) is None
    assert select_hint(one_of_three, quorum=0.0) is not None
    two_of_three = [*one_of_three[:2], mk_vote(2, -1, "Check the file before you edit it.")]
    assert select_hint(two_of_three) is not None
    # abstentions do not count toward the valid votes, and their hints are ignored
    with_abstain = [
        mk_vote(0, -1, "Read the file before editing it."),
        mk_vote(1, None),
        mk_vote(2, None, "Some abstaining vote's hint text."),
    ]
    h = select_hint(with_abstain)
    assert h is not None and h.selection == HintSelection.SINGLE and h.supporting_votes == [0]


def test_no_candidates(mk_vote):
    assert select_hint([mk_vote(0, 1), mk_vote(1, 1)]) is None
    assert select_hint([]) is None


@pytest.mark.parametrize(
    ("text", "role", "expected"),
    [
        (
            "No, use an f-string instead of % formatting.",
            "user",
            "Use an f-string instead of % formatting.",
        ),
        (
            "Thanks! Next time please also show the conversion factor.",
            "user",
            "Next time please also show the conversion factor.",
        ),
        ("Wrong. Keep it under 100 words.", "user", "Keep it under 100 words."),
        ("Too long. Keep it short.", "user", "Too long. Keep it short."),
        ("Try again.", "user", None),  # bare redo: no directive
        ("nope, give me another one", "user", None),
        ("Thanks, that's right!", "user", None),
        ("Now write a poem about cats.", "user", None),  # a new request is not a correction
        ("hint: don't push before pulling", "tool", None),  # tool output: never a directive
        ("You should read the file first.", "feedback", "You should read the file first."),
    ],
)
def test_extract_directive(text, role, expected):
    h = extract_directive(text, NextStateRole(role))
    assert (h.text if h else None) == expected
    if h:
        assert h.selection == HintSelection.HEURISTIC


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # request forms count only in a correction (negative=True)
        ("lose the bold formatting", "Lose the bold formatting"),
        ("hmm can you not put stuff in bold? it looks weird", "Can you not put stuff in bold?"),
        ("no bold please, I have to hand this in", "No bold please, I have to hand this in."),
        (
            "ok but way too long, I just need a couple sentences",
            "Way too long, I just need a couple sentences",
        ),
        ("you didn't say the number", "You didn't say the number"),
        ("nope, give me another one", None),  # a redo stays a redo
        ("That didn't do it. Please take another shot at it.", None),
        ("This is useless.", None),  # a complaint that names no change
    ],
)
def test_extract_directive_in_a_correction(text, expected):
    h = extract_directive(text, NextStateRole.USER, negative=True)
    got = h.text if h else None
    if expected is None:
        assert got is None
    else:
        assert got is not None and got.rstrip(".") == expected.rstrip(".")


def test_request_forms_need_a_correction():
    """A new task reads like a request; without a -1 or a correction cue it is no hint."""
    for text in ("can you explain how vaccines work?", "Please summarize this in a paragraph."):
        assert extract_directive(text, NextStateRole.USER) is None
        assert extract_directive(text, NextStateRole.USER, negative=True) is not None


def test_directive_set_precision_and_recall_with_oracle_mood():
    """160 replies labeled by a writer who had not seen the code (see the module doc). The
    writer's mood stands in for the judge's score, so this is an upper bound on what the judge
    gets (the judge may score a new request -1)."""
    import json
    from pathlib import Path

    rows = [
        json.loads(line)
        for line in (Path(__file__).parent / "directive_cases.jsonl").read_text().splitlines()
    ]
    unhappy = {"directive", "vague_complaint", "redo"}
    tp = fp = fn = 0
    for r in rows:
        hinted = extract_directive(r["text"], NextStateRole.USER, negative=r["kind"] in unhappy)
        tp += bool(hinted) and r["directive"]
        fp += bool(hinted) and not r["directive"]
        fn += (not hinted) and r["directive"]
    assert len(rows) == 160
    assert tp / (tp + fp) >= 0.95
    assert tp / (tp + fn) >= 0.85


@pytest.mark.parametrize(
    ("text", "negative", "expected"),
    [
        # lead-in words that can start an instruction stay (the hint keeps its meaning)
        ("Close the file before returning, don't leak it.", False, "Close the file"),
        ("Wait for the build to finish, don't guess.", False, "Wait for the build"),
        ("no-one writes like that, drop the bold", True, "No-one writes like that"),
        # "no" as a courtesy, and questions the writer asks for themselves: no correction
        ("No problem. Can you explain how vaccines work?", False, None),
        ("No rush, whenever you get a chance", False, None),
        ("What should I cook tonight?", False, None),
        ("I can't live without coffee lol.", False, None),
        ("Never  mind, what's the weather?", False, None),
        # a redo that names something more is a directive; a bare one is not
        ("Redo it in metric units.", True, "Redo it in metric units"),
        ("Please take another shot at it.", True, None),
    ],
)
def test_extract_directive_review_cases(text, negative, expected):
    h = extract_directive(text, NextStateRole.USER, negative=negative)
    if expected is None:
        assert h is None
    else:
        assert h is not None and h.text.startswith(expected)


@pytest.mark.parametrize(
    ("text", "negative", "expected"),
    [
        # "never" as a narration, not an instruction
        ("oh wow, super helpful, never would've thought of that", True, None),
        ("My professor spent two lectures and never got it across.", True, None),
        ("Never use semicolons in these.", False, "Never use semicolons"),
        # a courtesy clause names nothing; any other attempt is a redo
        ("Let's try that one again, please.", True, None),
        ("another joke pls", True, None),
        ("can u give me a different option", True, None),
        # a contrast "X, not Y" and a redo that names more, in a correction
        ("those times are Pacific, not Eastern. redo it in PT", True, "Those times are Pacific"),
        ("Not helpful. And not accurate.", True, None),
        ("we can't add pandas here, do it with the csv module", True, "We can't add pandas"),
        ("wrong base, retarget it to release/2.4", True, "Base, retarget it"),  # lead-in dropped
        # praise turning to a request is read as one, a new topic is not
        ("good answer, but give distances in km pls", False, "Good answer, but give"),
        ("Excellent. For the next problems, please show each step.", False, "For the next"),
        ("totally unrelated but can u recommend a sci-fi movie", False, None),
        # an addition and a statement about the writer name no change
        ("perfect, can you also add a couple of unit tests?", True, None),
        ("Honestly disappointing. I could have written that without a database.", True, None),
        ("Actually I'd like more detail on step 3.", True, "I'd like more detail"),
        # found by a review: a named alternative is no redo, a lead-in keeps its contrast
        ("no, use a different font", True, "Use a different font"),
        ("wrong, use another library", True, "Use another library"),
        ("thanks, but give distances in km", False, "Give distances in km"),
        ("Thanks. Also, can you write a poem about cats, but keep it short?", False, None),
        ("I really need to leave soon, bye", False, None),
        ("We need to buy milk today.", False, None),
        ("The answer needs to come first.", False, "The answer needs to come first"),
    ],
)
def test_extract_directive_training_set_misses(text, negative, expected):
    """The misses and false hints of the shipped and first blind sets (and the directive set)
    that made the rules of 2026-12-07 (README, "The judge")."""
    test_extract_directive_review_cases(text, negative, expected)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("text", ["Looks good but not x" + "." * 100_000 + "?", "not " * 50_000])
def test_extract_directive_is_linear_on_long_punctuation(text):
    # the contrast clause "not Y" backtracked over runs of dots: 100k took about 30 s
    import time

    t0 = time.perf_counter()
    extract_directive(text, NextStateRole.USER, negative=True)
    assert time.perf_counter() - t0 < 5


@pytest.mark.timeout(60)
def test_extract_directive_is_linear_on_long_whitespace():
    # was quadratic: 40k spaces took 53 s; 200k would take ~20 min, linear takes well under 1 s
    extract_directive("a" + " " * 200_000 + "b and c", NextStateRole.USER, negative=True)
