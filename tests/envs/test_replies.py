"""The simulated users' replies: natural language, varied, deterministic, never check names."""

from __future__ import annotations

import asyncio
import re

import pytest

from clawrl.envs import (
    RuleStudent,
    RuleTeacher,
    StudentCheck,
    TeacherCheck,
    generate_problems,
    student_rubric,
)
from clawrl.envs import student as student_mod
from clawrl.envs import teacher as teacher_mod
from clawrl.envs.student import student_reply
from clawrl.envs.teacher import teacher_reply

PROBLEMS = generate_problems(60, seed=0)
CHECK_NAMES = [c.value for c in StudentCheck] + [c.value for c in TeacherCheck]
PROTOCOL = re.compile(r"\b[a-z]+_[a-z_]+\b|[{}\[\]<>]")
"""Identifiers, unfilled slots, tags: none belongs in a user's message."""

# A response that fails exactly one student check each (and passes the others).
STUDENT_FAILING = {
    StudentCheck.NO_BOLD: "it's **32** lol",
    StudentCheck.NO_HEADERS: "# Answer\nit's 32",
    StudentCheck.NO_NUMBERED_STEPS: "1. 48-16\n2. so 32",
    StudentCheck.NO_BOILERPLATE: "Final answer: 32",
    StudentCheck.SHORT: "it's 32 " + "yeah " * 70,
    StudentCheck.CASUAL: "Thus it is 32.",
    StudentCheck.GIVES_ANSWER: "no clue",
}


def _student_texts(check: StudentCheck, seeds: range) -> set[str]:
    rubric = student_rubric()
    out = set()
    for seed in seeds:
        for p in PROBLEMS[:5]:
            result = rubric.evaluate(STUDENT_FAILING[check], p)
            assert result.failed == (check.value,)
            out.add(student_reply(result, key=f"student:{seed}:{p.id}", turn=0))
    return out


def _assert_natural(text: str) -> None:
    assert text.strip() and text == text.strip()
    assert not any(name in text for name in CHECK_NAMES), text
    assert not PROTOCOL.search(text), text


@pytest.mark.parametrize("check", list(StudentCheck))
def test_student_complaints_vary_and_read_as_language(check):
    texts = _student_texts(check, range(8))
    assert len(texts) >= 10, texts
    for t in texts:
        _assert_natural(t)
    bank = student_mod.COMPLAINTS[check]
    assert len(set(bank)) >= 10


def test_student_complaints_quote_evidence_and_thanks_vary():
    texts = _student_texts(StudentCheck.NO_BOILERPLATE, range(8))
    assert any('"Final answer"' in t for t in texts)
    rubric = student_rubric()
    ok = rubric.evaluate("it's 32, she used 16 of 48", PROBLEMS[0])
    thanks = {student_reply(ok, key=f"k{i}", turn=0) for i in range(60)}
    assert len(thanks) >= 10
    for t in thanks:
        _assert_natural(t)
    assert all(
        t.lower() not in {x.lower() for x in thanks}
        for t in _student_texts(StudentCheck.NO_BOLD, range(2))
    )


def test_student_reply_is_deterministic_and_mentions_at_most_three_things():
    rubric = student_rubric()
    ai = "## Solution\n1. **Step 1:** Therefore 48-16\n2. 32\n" + "words " * 80
    result = rubric.evaluate(ai, PROBLEMS[0])
    assert len(result.failed) == 6
    a = student_reply(result, key="k", turn=0)
    assert a == student_reply(result, key="k", turn=0)
    assert a != student_reply(result, key="k", turn=1)
    bank_hits = sum(
        any(p.split("{")[0][:20].lower() in a.lower() for p in student_mod.COMPLAINTS[c])
        for c in StudentCheck
    )
    assert 1 <= bank_hits <= 3


def test_still_and_sign_off_variants():
    rubric = student_rubric()
    bold = rubric.evaluate("it's **32**", PROBLEMS[0])
    stills = {
        student_reply(bold, key=f"k{i}", turn=1, previous_failed=("no_bold",)) for i in range(40)
    }
    assert sum(any(s in t.lower() for s in student_mod.STILL) for t in stills) == len(stills)
    finals = {student_reply(bold, key=f"k{i}", turn=7, final=True) for i in range(40)}
    assert all(any(s.lower() in t.lower() for s in student_mod.SIGN_OFFS) for t in finals)
    assert len(finals) >= 10


def test_student_session_logic():
    user = RuleStudent(seed=3)
    task = user.start(PROBLEMS[0])
    assert PROBLEMS[0].question in task.opening
    openings = {
        RuleStudent(seed=s).start(p).opening.replace(p.question, "Q")
        for s in range(4)
        for p in PROBLEMS[:10]
    }
    assert len(openings) >= 10
    msgs = [{"role": "user", "content": task.opening}]
    bad = asyncio.run(user.respond(task, msgs, "**32**", turn=0, final=False))
    assert not bad.done and bad.assessment.reward == -1 and bad.assessment.failed == ("no_bold",)
    good = asyncio.run(user.respond(task, msgs, "it's 32", turn=1, final=False))
    assert good.done and good.assessment.reward == 1 and good.assessment.score == 1.0
    last = asyncio.run(user.respond(task, msgs, "**32**", turn=7, final=True))
    assert last.done and last.assessment.reward == -1


# --- teacher ---------------------------------------------------------------------------------


def _flawed_works():
    user = RuleTeacher(seed=0, flaw_rate=1.0)
    return user, [user.start(p) for p in PROBLEMS[:12]]


TEACHER_FAILING = {
    TeacherCheck.PRAISE: "In step {step}, it should be {right}, not {wrong}.",
    TeacherCheck.NAMES_FIX: "Great work with {answer}!",
    TeacherCheck.FRIENDLY: "Good start, but careless: step {step} should be {right}.",
    TeacherCheck.SPECIFIC: "Good effort! Step {step} has a slip, check it.",
    TeacherCheck.CONCISE: "Good job, step {step} should be {right}. " + "Keep going. " * 60,
}


@pytest.mark.parametrize("check", list(TeacherCheck))
def test_teacher_complaints_vary_and_read_as_language(check):
    user, tasks = _flawed_works()
    texts = set()
    for task in tasks:
        f = task.context.flaw
        comment = TEACHER_FAILING[check].format(
            step=f.step, right=f.right_value, wrong=f.wrong_value, answer=task.context.answer
        )
        result = user.evaluate(task, comment)
        assert result.failed == (check.value,), (comment, result.failed)
        for turn in range(2):
            texts.add(teacher_reply(result, task.context, key=task.key, turn=turn))
    assert len(texts) >= 10
    for t in texts:
        _assert_natural(t)
    if check is TeacherCheck.NAMES_FIX:  # it tells the grader where the slip is
        assert any(f"step {task.context.flaw.step}" in t for t in texts for task in tasks)


def test_teacher_thanks_vary_and_end_the_session():
    user, tasks = _flawed_works()
    thanks = set()
    for task in tasks:
        f = task.context.flaw
        comment = f"Nice work! In step {f.step} it should be {f.right_value}, not {f.wrong_value}."
        reply = asyncio.run(user.respond(task, [], comment, turn=0, final=False))
        assert reply.done and reply.assessment.satisfied, (comment, reply.assessment.failed)
        thanks.add(reply.text)
        thanks |= {
            teacher_reply(user.evaluate(task, comment), task.context, key=f"{i}", turn=0)
            for i in range(5)
        }
    assert len(thanks) >= 10
    for t in thanks:
        _assert_natural(t)
    assert len(set(teacher_mod.THANKS)) >= 10
