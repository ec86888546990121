"""The LLM-backed user: persona prompts, the rating line, unparseable ratings counted."""

from __future__ import annotations

import asyncio

import pytest

from clawrl.envs import LLMUser, generate_problem, make_user
from clawrl.envs.llm_user import STUDENT_PERSONA, parse_rating, teacher_persona
from clawrl.envs.solutions import make_worked_solution
from clawrl.errors import ConfigError


@pytest.mark.parametrize(
    ("text", "message", "score"),
    [
        ("no bold pls\nRating: 3", "no bold pls", 0.3),
        ("thanks!!\n\nRating: 10/10", "thanks!!", 1.0),
        ("ok\n**Rating:** 7.5", "ok", 0.75),
        ('Student: "shorter please"\nrating = 2', "shorter please", 0.2),
        ("Rating: 9\nmeh\nRating: 4", "meh", 0.4),  # the last rating line counts
        ("sounds good, I'd say 8 out of 10", "sounds good, I'd say 8 out of 10", None),
        ("too long\nRating: 11", "too long", None),
        ("Rating: high", "Rating: high", None),
        ("", "", None),
    ],
)
def test_parse_rating(text, message, score):
    got_message, got_score = parse_rating(text)
    assert got_message == message
    assert got_score == (None if score is None else pytest.approx(score))


def test_teacher_persona_states_the_known_truth():
    p = generate_problem(0, 2)
    flawed = make_worked_solution(p, flaw_rate=1.0)
    text = teacher_persona(flawed)
    f = flawed.flaw
    assert f"step {f.step}" in text and f.wrong_value in text and f.right_value in text
    assert "it is correct" in teacher_persona(make_worked_solution(p, flaw_rate=0.0))
    assert STUDENT_PERSONA.rstrip().endswith("Rating: N")


def test_llm_user_against_an_openai_compatible_endpoint(fake_openai):
    ratings = iter(["lose the bold, it looks fake\nRating: 2", "perfect thx\nRating: 9", "hm"])
    server = fake_openai(lambda body: next(ratings))
    user = make_user("student", "llm", user_url=server.url + "/v1", user_model="judge-7b", seed=1)
    assert isinstance(user, LLMUser) and user.scenario == "student"
    task = user.start(generate_problem(0, 0))
    msgs = [{"role": "user", "content": task.opening}]

    bad = asyncio.run(user.respond(task, msgs, "**32**", turn=0, final=False))
    assert bad.text == "lose the bold, it looks fake" and not bad.done
    assert bad.assessment.reward == -1 and bad.assessment.score == pytest.approx(0.2)
    good = asyncio.run(user.respond(task, msgs, "it's 32", turn=1, final=False))
    assert good.done and good.assessment.satisfied and good.assessment.score == pytest.approx(0.9)
    unrated = asyncio.run(user.assess(task, "32"))
    assert unrated.reward is None and unrated.score is None and unrated.raw == "hm"
    assert (user.rated, user.unrated) == (2, 1)

    body = server.requests[0].body
    assert body["model"] == "judge-7b" and body["messages"][0]["content"] == STUDENT_PERSONA
    prompt = body["messages"][1]["content"]
    assert task.opening in prompt and "<<<\n**32**\n>>>" in prompt
    assert isinstance(body["seed"], int)
    assert server.requests[0].path == "/v1/chat/completions"  # no session for the user model


def test_make_user_validates_llm_settings():
    with pytest.raises(ConfigError, match="--user-url and --user-model"):
        make_user("teacher", "llm", user_model="m")
    with pytest.raises(ConfigError, match="--user-url"):
        make_user("teacher", "llm", user_url="localhost:8000", user_model="m")
    with pytest.raises(ConfigError):
        make_user("no-such-scenario")
