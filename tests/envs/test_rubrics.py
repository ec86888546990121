"""The student's and the teacher's rubric checks on crafted responses."""

from __future__ import annotations

import pytest

from clawrl.envs import (
    Problem,
    RuleTeacher,
    StudentCheck,
    TeacherCheck,
    generate_problem,
    make_worked_solution,
    student_rubric,
    teacher_rubric,
)
from clawrl.envs.rubric import Check, Rubric

PROBLEM = generate_problem(0, 0)
S = StudentCheck
AI_STYLE = """## Solution

To solve this problem, let's break it down step by step.

1. **Eggs used:** 4 x 4 = 16
2. **Eggs bought:** 4 x 12 = 48

Therefore, 48 - 16 = 32.

**Final Answer:** 32"""


def _student(response: str, max_words: int = 60):
    return student_rubric(max_words).evaluate(response, PROBLEM)


@pytest.mark.parametrize(
    ("response", "failed", "evidence"),
    [
        ("she uses 16 eggs and had 48, so there's 32 left", (), {}),
        ("it's **32** eggs", (S.NO_BOLD,), {S.NO_BOLD: "32"}),
        ("it's __32__ eggs", (S.NO_BOLD,), {S.NO_BOLD: "32"}),
        ("32 eggs **", (S.NO_BOLD,), {S.NO_BOLD: "**"}),
        ("# Eggs\n32 left", (S.NO_HEADERS,), {S.NO_HEADERS: "Eggs"}),
        ("Eggs left\n=====\n32", (S.NO_HEADERS,), {S.NO_HEADERS: "Eggs left"}),
        ("1. use 16\n2. 48-16 = 32", (S.NO_NUMBERED_STEPS,), {S.NO_NUMBERED_STEPS: "1. use 16"}),
        ("(1) use 16, 32 left", (S.NO_NUMBERED_STEPS,), {}),
        ("Final answer: 32", (S.NO_BOILERPLATE,), {S.NO_BOILERPLATE: "Final answer"}),
        ("To solve this problem, take 48-16=32", (S.NO_BOILERPLATE,), {}),
        ("Step 1 is 16, then 32", (S.NO_BOILERPLATE,), {S.NO_BOILERPLATE: "Step 1"}),
        ("32. I hope this helps!", (S.NO_BOILERPLATE,), {S.NO_BOILERPLATE: "I hope this helps"}),
        ("2) 16 used\n3) 32 left", (S.NO_NUMBERED_STEPS,), {S.NO_NUMBERED_STEPS: "2) 16 used"}),
        ("the answer is \\boxed{32}", (S.NO_BOILERPLATE,), {S.NO_BOILERPLATE: "\\boxed"}),
        ("1. it's 32", (S.NO_NUMBERED_STEPS,), {}),
        ("Therefore, 32 eggs remain.", (S.CASUAL,), {S.CASUAL: "Therefore"}),
        ("We can calculate 48-16=32", (S.CASUAL,), {S.CASUAL: "We can calculate"}),
        ("it is \\(48-16=32\\)", (S.CASUAL,), {}),
        ("no idea sorry", (S.GIVES_ANSWER,), {}),
        ("", (S.GIVES_ANSWER,), {}),
        # lookalikes that are fine: a decimal is not a list, "steps" in prose is not "Step 1"
        ("3.5 times, nah it's 32, just a few steps", (), {}),
        ("she has 48 and uses 16 so 32 #nice", (), {}),
    ],
)
def test_student_checks(response, failed, evidence):
    r = _student(response)
    assert set(r.failed) == {f.value for f in failed}
    for name, found in evidence.items():
        assert r.result(name.value).evidence == found
    assert r.score == pytest.approx(1 - len(failed) / 7)
    assert r.satisfied is (not failed)


def test_student_length_and_the_typical_ai_answer():
    long = " ".join(["word"] * 60) + " 32"
    assert _student(long).failed == ("within_word_limit",)
    assert _student(long).result("within_word_limit").evidence == "61"
    assert _student(long, max_words=100).satisfied
    r = _student(AI_STYLE)
    assert set(r.failed) == {
        "no_bold",
        "no_headers",
        "no_numbered_steps",
        "no_boilerplate",
        "casual_tone",
    }
    assert r.score == pytest.approx(2 / 7)
    assert r.result("no_headers").evidence == "Solution"
    assert r.result("no_boilerplate").evidence == "To solve this problem"


# --- teacher ---------------------------------------------------------------------------------

T = TeacherCheck


def _work(flawed: bool):
    p = generate_problem(0, 2)  # wages: 20 x 3 = 60, 60 x 6 = 360, 360-70 = 290
    w = make_worked_solution(p, seed=0, flaw_rate=1.0 if flawed else 0.0)
    assert (w.flaw is not None) is flawed
    return w


def test_flawed_work_fixture_is_what_the_comments_below_assume():
    w = _work(True)
    assert (w.flaw.step, w.flaw.right_value, w.flaw.wrong_value) == (1, "60", "58")
    assert w.answer == "278"


@pytest.mark.parametrize(
    ("comment", "failed"),
    [
        (
            "Nice setup! In step 1, 20 x 3 should be 60, not 58, so the rest is off by a bit.",
            (),
        ),
        ("Great work multiplying by 6! Check the first step again: 20 x 3 is 60.", ()),
        ("Good effort, but recheck: 58 should be 60.", ()),
        ("In step 1, 20 x 3 should be 60, not 58.", (T.PRAISE,)),
        ("Well done using 6 days!", (T.NAMES_FIX,)),
        ("Step 1 is 58, nice.", (T.NAMES_FIX,)),  # points at it but never says to fix it
        ("This is not good. Step 1 should be 60.", (T.PRAISE,)),  # "not good" is no praise
        ("Not very careful: step 1 should be 60.", (T.PRAISE,)),
        ("No rush, great setup! Step 1 should be 60.", ()),
        ("Nice try, but this is careless: step 1 should be 60.", (T.FRIENDLY,)),
        (
            "Good job! One step has a small mistake, check your multiplication.",
            (T.SPECIFIC, T.NAMES_FIX),
        ),
        ("Good job! Step 1 has a small mistake; check it.", (T.SPECIFIC,)),  # "1" is a step ref
    ],
)
def test_teacher_checks_on_flawed_work(comment, failed):
    r = teacher_rubric().evaluate(comment, _work(True))
    assert set(r.failed) == {f.value for f in failed}
    assert r.score == pytest.approx(1 - len(failed) / 5)


def test_teacher_checks_on_correct_work_and_length():
    w = _work(False)
    r = teacher_rubric().evaluate("Great job, 360 - 70 = 290 is exactly right!", w)
    assert r.satisfied and r.result("names_fix").passed is None
    assert "names_fix" not in r.passed and r.score == 1.0
    r = teacher_rubric().evaluate("Terrible. Wrong.", w)
    assert set(r.failed) == {"praises_work", "friendly_tone", "cites_numbers"}
    assert r.result("friendly_tone").evidence == "Terrible"
    assert r.score == pytest.approx(1 / 4)  # concise passes; names_fix does not apply
    long = "Great job with 290! " + "You did it. " * 50
    assert teacher_rubric().evaluate(long, w).failed == ("within_word_limit",)
    assert teacher_rubric(max_words=200).evaluate(long, w).satisfied


def test_teacher_task_opening_shows_the_work():
    user = RuleTeacher(seed=0, flaw_rate=1.0)
    task = user.start(generate_problem(0, 2))
    assert "Step 1: Each day: 20 x 3 = 58 dollars." in task.opening
    assert task.opening.rstrip().endswith("Answer: 278")
    assert task.context.flaw.step == 1


def test_rubric_scores_only_applicable_checks_and_rejects_duplicates():
    def na(response: str, _: Problem):
        return None, None

    def has_x(response: str, _: Problem):
        return "x" in response, "no x"

    rubric = Rubric("t", [Check("na", "never applies", na), Check("x", "has an x", has_x)])
    assert rubric.evaluate("x", PROBLEM).score == 1.0
    r = rubric.evaluate("y", PROBLEM)
    assert r.score == 0.0 and r.failed == ("x",) and r.result("x").evidence == "no x"
    assert Rubric("empty", []).evaluate("", PROBLEM).score == 1.0
    with pytest.raises(ValueError, match="duplicate"):
        Rubric("d", [Check("a", "", na), Check("a", "", na)])
