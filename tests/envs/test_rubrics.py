"""The check kinds on crafted responses, and the built-in scenarios' rubrics."""

from __future__ import annotations

import pytest
from pydantic import TypeAdapter

from clawrl.envs import Problem, RuleUser, generate_problem, load_scenario, make_worked_solution
from clawrl.envs.checks import CheckKind, build_check, sentence_count
from clawrl.envs.rubric import Check, Rubric

PROBLEM = generate_problem(0, 0)
KIND = TypeAdapter(CheckKind)
BOILERPLATE = load_scenario("student").check("no_boilerplate").rule.patterns
CASUAL = load_scenario("student").check("casual_tone").rule.patterns


def run(kind: dict, response: str, context=None):
    return build_check("c", "", KIND.validate_python(kind)).fn(response, context)


@pytest.mark.parametrize(
    ("kind", "response", "passed", "evidence"),
    [
        ({"kind": "no_bold"}, "it's **32** eggs", False, "32"),
        ({"kind": "no_bold"}, "it's __32__ eggs", False, "32"),
        ({"kind": "no_bold"}, "32 eggs **", False, "**"),
        ({"kind": "no_bold"}, "she has 32", True, None),
        ({"kind": "no_headers"}, "# Eggs\n32 left", False, "Eggs"),
        ({"kind": "no_headers"}, "Eggs left\n=====\n32", False, "Eggs left"),
        ({"kind": "no_headers"}, "#### 2", False, "2"),
        ({"kind": "no_headers"}, "she has 48 and uses 16 so 32 #nice", True, None),
        ({"kind": "no_numbered_list"}, "1. use 16\n2. 48-16 = 32", False, "1. use 16"),
        ({"kind": "no_numbered_list"}, "2) 16 used\n3) 32 left", False, "2) 16 used"),
        ({"kind": "no_numbered_list"}, "1. it's 32", False, "1. it's 32"),
        ({"kind": "no_numbered_list"}, "3.5 times, nah it's 32", True, None),
        ({"kind": "no_bullets"}, "- 16 used\n- 32 left", False, "- 16 used"),
        ({"kind": "no_markdown"}, "the answer is \\boxed{32}", False, "\\boxed"),
        ({"kind": "no_markdown"}, "```\n32\n```", False, "```"),
        ({"kind": "no_markdown"}, "plain 32", True, None),
        ({"kind": "pattern_absent", "patterns": BOILERPLATE}, "Final answer: 32", False,
         "Final answer"),
        ({"kind": "pattern_absent", "patterns": BOILERPLATE}, "Step 1 is 16", False, "Step 1"),
        ({"kind": "pattern_absent", "patterns": BOILERPLATE}, "32. I hope this helps!", False,
         "I hope this helps"),
        ({"kind": "pattern_absent", "patterns": BOILERPLATE}, "just a few steps, 32", True, None),
        ({"kind": "pattern_absent", "patterns": CASUAL}, "Therefore, 32 eggs.", False,
         "Therefore"),
        ({"kind": "pattern_absent", "patterns": CASUAL}, "We can calculate 48-16=32", False,
         "We can calculate"),
        ({"kind": "pattern_present", "patterns": ["eggs?"]}, "32 eggs", True, None),
        ({"kind": "max_words", "limit": 3}, "one two three four", False, "4"),
        ({"kind": "max_words", "limit": 3}, "one two three", True, "3"),
        ({"kind": "max_sentences", "limit": 2}, "It is 32. She had 48. So yes!", False, "3"),
        ({"kind": "number_first", "words": 4}, "It is 32 eggs.", True, None),
        # the quote stops at ``words`` words, so it never reaches the number it says is missing
        ({"kind": "number_first", "words": 4}, "To find the eggs we get 32", False,
         "To find the eggs"),
        ({"kind": "starts_with", "prefixes": ["it's"]}, "It's 32", True, None),
        ({"kind": "ends_with", "suffixes": ["eggs."]}, "32 eggs.", True, None),
        ({"kind": "states_number"}, "no idea sorry", False, None),
        ({"kind": "states_number"}, "", False, None),
    ],
)  # fmt: skip
def test_check_kinds(kind, response, passed, evidence):
    got_passed, got_evidence = run(kind, response)
    assert got_passed is passed
    if evidence is not None or not passed:
        assert got_evidence == evidence


def test_sentence_count():
    assert sentence_count("It is 32. She had 48! Right?") == 3
    assert sentence_count("1. a\n2. b\n3. c") == 3
    assert sentence_count("no punctuation at all") == 1
    assert sentence_count("3.5 eggs. ok") == 2


def test_student_rubric_on_the_typical_ai_answer():
    user = RuleUser(load_scenario("student"))
    ai = ("## Solution\n\nTo find the eggs left, we need to calculate 48 - 16.\n\n"
          "Therefore, the answer is 32.\n\n**Final Answer:** 32")  # fmt: skip
    r = user.rubric.evaluate(ai, PROBLEM)
    # "48" among its first words passes answer_first: a number up front, right or not
    assert set(r.failed) == {"few_sentences", "no_boilerplate", "casual_tone", "no_we",
                             "no_headers"}  # fmt: skip
    restating = user.rubric.evaluate("To find the eggs left, take 48 - 16 = 32.", PROBLEM)
    assert restating.failed == ("no_restating",)
    assert r.result("no_headers").evidence == "Solution"
    ok = user.rubric.evaluate("32, since she used 16 of her 48 eggs lol", PROBLEM)
    assert ok.satisfied and ok.score == 1.0


# --- grading kinds (the teacher) -------------------------------------------------------------


def _work(flawed: bool):
    p = generate_problem(0, 2)  # wages: 20 x 3 = 60, 60 x 6 = 360, 360-70 = 290
    w = make_worked_solution(p, seed=0, flaw_rate=1.0 if flawed else 0.0)
    assert (w.flaw is not None) is flawed
    return w


def test_flawed_work_fixture_is_what_the_comments_below_assume():
    w = _work(True)
    assert (w.flaw.step, w.flaw.right_value, w.flaw.wrong_value) == (1, "60", "58")
    assert w.answer == "278"


TEACHER = RuleUser(load_scenario("teacher"))


@pytest.mark.parametrize(
    ("comment", "failed"),
    [
        ("Great work multiplying by 6! You made one mistake: in step 1, 20 x 3 should be 60, "
         "not 58.", ()),
        ("Nice setup! Check your first step again: 20 x 3 is 60, so 58 is wrong.", ()),
        ("Good effort, but you should recheck: 58 should be 60, it's a slip.", ()),
        ("In step 1, you wrote 58 but 20 x 3 should be 60.", ("praises_work", "gives_verdict")),
        ("Well done using 6 days! Your answer is wrong.", ("names_fix",)),
        ("Step 1 is 58, nice, you are right.", ("names_fix",)),  # points at it, never says fix
        ("This is not good, you got step 1 wrong: it should be 60.", ("praises_work",)),
        ("Nice setup! There is a mistake in step 1: 20 x 3 should be 60.", ("talks_to_student",)),
        ("The answer is 290. Good job, you made a mistake in step 1; it should be 60.",
         ("no_bare_answer",)),
        ("The answer is 278.",
         ("praises_work", "names_fix", "talks_to_student", "gives_verdict", "no_bare_answer")),
    ],
)  # fmt: skip
def test_teacher_checks_on_flawed_work(comment, failed):
    r = TEACHER.rubric.evaluate(comment, _work(True))
    assert set(r.failed) == set(failed)
    assert r.score == pytest.approx(1 - len(failed) / 5)


def test_teacher_checks_on_correct_work():
    w = _work(False)
    r = TEACHER.rubric.evaluate("Great job, you got 360 - 70 = 290 exactly right!", w)
    assert r.satisfied and r.result("names_fix").passed is None
    assert "names_fix" not in r.passed and r.score == 1.0
    r = TEACHER.rubric.evaluate("Terrible. Wrong.", w)
    assert set(r.failed) == {"praises_work", "talks_to_student"}
    assert r.score == pytest.approx(2 / 4)  # a verdict, not a bare answer; names_fix n/a
    bare = TEACHER.rubric.evaluate("Answer: 290. You did great, it's correct.", w)
    assert bare.failed == ("no_bare_answer",) and bare.result("no_bare_answer").evidence


def test_grading_kinds_do_not_apply_without_work():
    for kind in ("praises_work", "names_fix", "cites_work"):
        assert run({"kind": kind}, "Great job!", PROBLEM) == (None, None)


def test_teacher_task_opening_shows_the_work():
    spec = load_scenario("teacher")
    user = RuleUser(
        spec.model_copy(update={"task": spec.task.model_copy(update={"flaw_rate": 1.0})})
    )
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
