"""Personalization evaluation and ``clawrl eval personalization`` against a fake gateway."""

from __future__ import annotations

import json

import pytest

from clawrl.cli import main
from clawrl.envs import (
    evaluate_personalization,
    generate_problems,
    make_user,
    problem_split,
)
from clawrl.envs.client import EVAL_HEADER

PROBLEMS = generate_problems(10, seed=0)
AI = "## Answer\n**Final Answer:** 32"  # fails headers and boilerplate: 6/8
CASUAL = "it's 32"  # passes everything: 8/8


def _teacher(flaw_rate: float):
    from clawrl.envs import RuleUser, load_scenario

    spec = load_scenario("teacher")
    return RuleUser(
        spec.model_copy(update={"task": spec.task.model_copy(update={"flaw_rate": flaw_rate})})
    )


def by_question(body):
    """AI-styled for problems whose question has an even length, else casual."""
    return AI if len(body["messages"][-1]["content"]) % 2 == 0 else CASUAL


def test_scores_first_answers_with_the_rubric_and_marks_eval_traffic(fake_openai):
    server = fake_openai(by_question)
    result = evaluate_personalization(server.url, "student", PROBLEMS, concurrency=3)
    user = make_user("student")
    expected = {}
    for p in PROBLEMS:
        answer = by_question({"messages": [{"content": user.start(p).opening}]})
        expected[p.id] = 6 / 8 if answer == AI else 1.0
    assert result.scores == pytest.approx(expected)
    assert result.mean_score == pytest.approx(sum(expected.values()) / len(PROBLEMS))
    n_ai = sum(1 for v in expected.values() if v < 1)
    assert 0 < n_ai < len(PROBLEMS)
    rates = result.check_pass_rates
    assert rates["no_boilerplate"] == rates["no_headers"] == pytest.approx(1 - n_ai / len(PROBLEMS))
    assert rates["within_word_limit"] == rates["answer_first"] == 1.0
    assert result.satisfied_rate == pytest.approx(1 - n_ai / len(PROBLEMS))
    assert result.policy_versions == [3] and result.n_errors == result.n_unrated == 0
    # guard metrics: no loops; the answer 32 is right only where the problem's answer is 32
    assert result.repetition_rate == 0.0
    right = sum(1 for p in PROBLEMS if p.answer == "32") / len(PROBLEMS)
    assert result.answer_accuracy == pytest.approx(right)

    # one call per problem, marked as evaluation, under an eval- session that is then ended
    assert len(server.chats()) == len(PROBLEMS)
    for req in server.requests:
        sid = req.path.split("/")[2]
        assert sid.startswith("eval-student-") and req.headers["x-session-id"] == sid
        assert req.headers[EVAL_HEADER.lower()] == "1"
        assert len(req.body["messages"]) == 1
        assert req.body["temperature"] == 0.0 and "seed" not in req.body
    assert len(server.ended) == len(PROBLEMS)
    assert all(e.headers[EVAL_HEADER.lower()] == "1" for e in server.ended)
    assert all(item.ended for item in result.items)
    assert json.loads(json.dumps(result.to_dict()))["problems"] == len(PROBLEMS)


def test_teacher_eval_sampling_seed_and_failures(fake_openai):
    def reply(body):
        if "Problem: " + PROBLEMS[0].question in body["messages"][-1]["content"]:
            return 503, "policy is reloading"
        return "Great job! Everything checks out."

    server = fake_openai(reply)
    result = evaluate_personalization(
        server.url, "teacher", PROBLEMS, temperature=0.7, user=_teacher(flaw_rate=0.0)
    )
    assert result.n_errors == 1 and "HTTP 503: policy is reloading" in result.items[0].error
    assert result.items[0].score is None and len(result.scored) == len(PROBLEMS) - 1
    # correct work: praise passes and it is a comment, but it neither talks to the student nor
    # says "correct"; names_fix does not apply
    assert result.mean_score == pytest.approx(2 / 4)
    assert "names_fix" not in result.check_pass_rates
    assert result.check_pass_rates["talks_to_student"] == 0.0
    assert result.check_pass_rates["gives_verdict"] == 0.0
    assert result.check_pass_rates["no_bare_answer"] == 1.0
    assert result.answer_accuracy is None  # the teacher's answers are comments, not numbers
    seeds = [r.body["seed"] for r in server.requests]
    assert len(set(seeds)) == len(PROBLEMS)
    with pytest.raises(ValueError, match="student user cannot evaluate"):
        evaluate_personalization(server.url, "teacher", PROBLEMS, user=make_user("student"))


def test_llm_user_ratings_and_unparseable_ones(fake_openai):
    def reply(body):
        system = body["messages"][0]
        if system["role"] == "system" and "role-playing" in system["content"]:
            return "nice and short\nRating: 8"
        return "it's 32"

    server = fake_openai(reply)
    user = make_user("student", "llm", user_url=server.url, user_model="u")
    result = evaluate_personalization(server.url, "student", PROBLEMS[:4], user=user)
    assert result.mean_score == pytest.approx(0.8) and result.user_kind == "llm"
    assert result.check_pass_rates == {} and result.satisfied_rate == 1.0

    server2 = fake_openai(lambda body: "I'd give it an 8" if "role-playing" in str(body) else "32")
    user2 = make_user("student", "llm", user_url=server2.url, user_model="u")
    result2 = evaluate_personalization(server2.url, "student", PROBLEMS[:3], user=user2)
    assert result2.mean_score is None and result2.n_unrated == 3 and user2.unrated == 3


def test_cli_json_and_table(fake_openai, capsys):
    server = fake_openai(lambda body: "it's 32")
    args = ["eval", "personalization", "--base-url", server.url, "--problems", "5"]
    assert main([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["mean_score"] == 1.0 and out["problems"] == 5
    held = {p.id for p in problem_split(held_out=5).held_out}
    assert set(out["scores"]) == held  # the same held-out split the demo trains around

    assert main([*args, "--scenario", "teacher"]) == 0
    text = capsys.readouterr().out
    assert "mean score" in text and "talks_to_student" in text and "teacher" in text


def test_cli_reports_a_dead_gateway_and_bad_settings(capsys):
    args = ["eval", "personalization", "--base-url", "http://127.0.0.1:9", "--problems", "2"]
    assert main([*args, "--timeout", "5"]) == 1
    assert "every call failed" in capsys.readouterr().err
    assert main([*args, "--user", "llm"]) == 1
    assert "--user-url and --user-model" in capsys.readouterr().err


def test_guard_metrics_count_loops_and_right_answers(fake_openai):
    def reply(body):
        text = body["messages"][-1]["content"]
        i = next(i for i, p in enumerate(PROBLEMS) if p.question in text)
        if i < 3:  # a decoding loop that ends on the right number
            return f"It has {PROBLEMS[i].answer} things. " * 3
        return f"it's {PROBLEMS[i].answer}" if i % 2 else "it's 1000001"

    result = evaluate_personalization(fake_openai(reply).url, "student", PROBLEMS)
    assert result.repetition_rate == pytest.approx(3 / 10)
    right = [i for i in range(10) if i < 3 or i % 2]  # 0, 1, 2, 3, 5, 7, 9
    assert result.answer_accuracy == pytest.approx(len(right) / 10)
    assert [it.correct for it in result.items] == [i in right for i in range(10)]
