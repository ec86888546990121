"""The simulated users' replies: natural language, varied, deterministic, never check names."""

from __future__ import annotations

import asyncio
import re

import pytest

from clawrl.envs import RuleUser, generate_problems, load_scenario

PROBLEMS = generate_problems(60, seed=0)
STUDENT = load_scenario("student")
TEACHER = load_scenario("teacher")
CHECK_NAMES = [c.name for c in STUDENT.checks] + [c.name for c in TEACHER.checks]
PROTOCOL = re.compile(r"\b[a-z]+_[a-z_]+\b|[{}\[\]<>]")
"""Identifiers, unfilled slots, tags: none belongs in a user's message."""

# A response that fails exactly one student check each (and passes the others).
STUDENT_FAILING = {
    "within_word_limit": "32, " + "yeah " * 70,
    "few_sentences": "32. ok. sure. yes. right.",
    "answer_first": "she used sixteen of forty eight so thirty two left over for her, 32",
    "no_boilerplate": "32. i hope this helps",
    "casual_tone": "32, thus she has 32 left",
    "no_we": "32, let's see, she used 16",
    "no_headers": "32\n# eggs",
    "no_restating": "To find it: 32 left",
}


def _student_texts(check: str, seeds: range) -> set[str]:
    out = set()
    for seed in seeds:
        user = RuleUser(STUDENT, seed=seed)
        for p in PROBLEMS[:5]:
            task = user.start(p)
            result = user.evaluate(task, STUDENT_FAILING[check])
            assert result.failed == (check,), (check, result.failed)
            out.add(user.reply(result, task, turn=0))
    return out


def _assert_natural(text: str) -> None:
    assert text.strip() and text == text.strip()
    assert not any(name in text for name in CHECK_NAMES), text
    assert not PROTOCOL.search(text), text


@pytest.mark.parametrize("check", [c.name for c in STUDENT.checks])
def test_student_complaints_vary_and_read_as_language(check):
    texts = _student_texts(check, range(8))
    assert len(texts) >= 10, texts
    for t in texts:
        _assert_natural(t)
    assert len(set(STUDENT.check(check).complaints)) >= 10


def test_student_complaints_quote_evidence_and_thanks_vary():
    texts = _student_texts("no_boilerplate", range(8))
    assert any('"i hope this helps"' in t.lower() for t in texts)
    user = RuleUser(STUDENT)
    thanks = set()
    for i in range(60):
        task = user.start(PROBLEMS[i % 60])
        ok = user.evaluate(task, "it's 32, she used 16 of 48")
        assert ok.satisfied
        thanks.add(user.reply(ok, task, turn=i % 3))
    assert len(thanks) >= 10
    for t in thanks:
        _assert_natural(t)


def test_student_reply_is_deterministic_and_mentions_at_most_three_things():
    user = RuleUser(STUDENT)
    task = user.start(PROBLEMS[0])
    ai = "## Solution\nTo find it, we need 48-16. Therefore. " + "words " * 80
    result = user.evaluate(task, ai)
    assert len(result.failed) >= 5
    a = user.reply(result, task, turn=0)
    assert a == user.reply(result, task, turn=0)
    assert a != user.reply(result, task, turn=1)

    def said(phrase: str) -> bool:
        head = phrase.split("{")[0][:20].lower()
        return len(head) >= 8 and head in a.lower()

    hits = sum(any(said(p) for p in STUDENT.check(c).complaints) for c in result.failed)
    assert 1 <= hits <= 3


def test_still_and_sign_off_variants():
    user = RuleUser(STUDENT)
    stills, finals = set(), set()
    for p in PROBLEMS[:40]:
        task = user.start(p)
        bad = user.evaluate(task, STUDENT_FAILING["no_we"])
        stills.add(user.reply(bad, task, turn=1, previous_failed=("no_we",)))
        finals.add(user.reply(bad, task, turn=7, final=True))
    still = STUDENT.replies.still
    assert all(any(s in t.lower() for s in still) for t in stills)
    assert all(any(s.lower() in t.lower() for s in STUDENT.replies.sign_offs) for t in finals)
    assert len(finals) >= 10


def test_student_session_logic():
    user = RuleUser(STUDENT, seed=3)
    task = user.start(PROBLEMS[0])
    assert PROBLEMS[0].question in task.opening
    openings = {
        RuleUser(STUDENT, seed=s).start(p).opening.replace(p.question, "Q")
        for s in range(4)
        for p in PROBLEMS[:10]
    }
    assert len(openings) >= 10
    msgs = [{"role": "user", "content": task.opening}]
    bad = asyncio.run(user.respond(task, msgs, "# 32", turn=0, final=False))
    assert not bad.done and bad.assessment.reward == -1
    assert bad.assessment.failed == ("no_headers",)
    good = asyncio.run(user.respond(task, msgs, "it's 32", turn=1, final=False))
    assert good.done and good.assessment.reward == 1 and good.assessment.score == 1.0
    last = asyncio.run(user.respond(task, msgs, "# 32", turn=7, final=True))
    assert last.done and last.assessment.reward == -1


# --- teacher ---------------------------------------------------------------------------------


def _flawed_works():
    spec = TEACHER.model_copy(update={"task": TEACHER.task.model_copy(update={"flaw_rate": 1.0})})
    user = RuleUser(spec, seed=0)
    return user, [user.start(p) for p in PROBLEMS[:12]]


TEACHER_FAILING = {
    "praises_work": "In step {step}, you wrote {wrong}; it should be {right}, a small mistake.",
    "names_fix": "Great work with {answer}, you got it right!",
    "talks_to_student": "Good start, but step {step} should be {right}, not {wrong}; a slip.",
    "gives_verdict": "Good effort! In step {step} you should use {right}, not {wrong}.",
    "no_bare_answer": "The answer is {answer}. Good job, you made a mistake in step {step}; "
    "it should be {right}.",
}


@pytest.mark.parametrize("check", list(TEACHER_FAILING))
def test_teacher_complaints_vary_and_read_as_language(check):
    user, tasks = _flawed_works()
    texts = set()
    for task in tasks:
        f = task.context.flaw
        comment = TEACHER_FAILING[check].format(
            step=f.step, right=f.right_value, wrong=f.wrong_value, answer=task.context.answer
        )
        result = user.evaluate(task, comment)
        assert result.failed == (check,), (comment, result.failed)
        for turn in range(2):
            texts.add(user.reply(result, task, turn=turn))
    assert len(texts) >= 10
    for t in texts:
        _assert_natural(t)
    if check == "names_fix":  # it tells the grader where the slip is
        assert any(f"step {task.context.flaw.step}" in t for t in texts for task in tasks)


def test_teacher_thanks_vary_and_end_the_session():
    user, tasks = _flawed_works()
    thanks = set()
    for task in tasks:
        f = task.context.flaw
        comment = (
            f"Nice work! You made one slip: in step {f.step} it should be {f.right_value}, "
            f"not {f.wrong_value}."
        )
        reply = asyncio.run(user.respond(task, [], comment, turn=0, final=False))
        assert reply.done and reply.assessment.satisfied, (comment, reply.assessment.failed)
        thanks.add(reply.text)
        for i in range(5):
            thanks.add(user.reply(user.evaluate(task, comment), task, turn=i))
    assert len(thanks) >= 10
    for t in thanks:
        _assert_natural(t)
    assert len(set(TEACHER.replies.thanks)) >= 10


def test_polite_complaints_written_without_punctuation_read_as_sentences():
    """A polite scenario whose complaints have no final punctuation (the built-in
    parent scenario) still gives one sentence per complaint: each ends with a full stop before the
    next part and the sign-off, and one that starts the reply or follows a bare space starts
    with a capital; complaints that end in punctuation are left as written (teacher)."""
    spec = load_scenario("parent")
    assert any(c[-1].isalnum() for check in spec.checks for c in check.complaints)
    answer = "Great! We can do it.\n# Working\nFirst add, then multiply, and you get 5."
    seen = 0
    for seed in range(3):
        user = RuleUser(spec, seed=seed)
        for p in PROBLEMS[:8]:
            task = user.start(p)
            result = user.evaluate(task, answer)
            assert len(result.failed) >= 2
            reply = user.reply(result, task, turn=1, final=True)
            assert reply[0].isupper(), reply
            # no run-on join: a lower-case word never runs into a connective or the sign-off
            joins = [c.strip() for c in spec.replies.connectives if c.strip()]
            joins += [s.split()[0] for s in spec.replies.sign_offs]
            for word in joins:
                assert not re.search(rf"[a-z0-9] {re.escape(word)}", reply), (word, reply)
            assert not re.search(r"[a-z][.?!] [a-z]", reply), reply
            seen += 1
    assert seen == 24
