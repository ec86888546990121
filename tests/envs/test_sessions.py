"""Training conversations against a fake OpenAI-compatible gateway."""

from __future__ import annotations

import socket

import pytest

from clawrl.envs import generate_problems, make_user, run_sessions
from clawrl.envs.client import EVAL_HEADER

PROBLEMS = generate_problems(6, seed=0)


def _turn(body) -> int:
    """How many answers the policy gave before this request."""
    return sum(1 for m in body["messages"] if m["role"] == "assistant")


def improving(body):
    """Boilerplate and "we" first, then a heading, then a casual answer."""
    answers = ["32, we got the final answer", "## Eggs\nit's 32", "it's 32, easy"]
    return answers[min(_turn(body), 2)]


def test_multi_turn_session_until_the_student_is_satisfied(fake_openai):
    server = fake_openai(improving)
    (log,) = run_sessions(server.url, make_user("student", seed=0), PROBLEMS[:1], temperature=0.5)
    sid = log.session_id
    assert sid.startswith("sim-student-") and sid.endswith(PROBLEMS[0].id)
    assert log.error is None and log.ended and log.satisfied

    # three judged answers, then the closing call that carries the thanks
    assert [t.assessment.reward for t in log.judged_turns] == [-1, -1, 1]
    assert log.judged_turns[0].assessment.failed == ("no_boilerplate", "no_we")
    assert log.judged_turns[1].assessment.failed == ("no_headers",)
    assert len(log.turns) == 4 and log.turns[-1].closing
    assert log.turns[-1].user_message == log.turns[2].reply

    # every call went to /s/{sid}/v1 with the session header, and grew by one exchange
    chats = server.chats()
    assert len(chats) == 4 and chats == server.chats(sid)
    for k, req in enumerate(chats):
        assert req.path == f"/s/{sid}/v1/chat/completions"
        assert req.headers["x-session-id"] == sid
        assert EVAL_HEADER.lower() not in req.headers
        assert len(req.body["messages"]) == 2 * k + 1
        assert req.body["temperature"] == 0.5
    assert [r.body["max_tokens"] for r in chats] == [256, 256, 256, 16]
    last = chats[-1].body["messages"]
    assert (
        last[0]["content"] == log.turns[0].user_message
        and PROBLEMS[0].question in last[0]["content"]
    )
    assert [m["content"] for m in last[1::2]] == [t.response for t in log.turns[:3]]
    assert [m["content"] for m in last[2::2]] == [t.reply for t in log.turns[:3]]

    # then the session was ended, once
    assert [e.path for e in server.ended] == [f"/v1/sessions/{sid}/end"]

    # the gateway's turn ids map to the simulator's ground truth
    truth = log.ground_truth()
    assert list(truth) == [t.turn_id for t in log.judged_turns]
    assert [a.reward for a in truth.values()] == [-1, -1, 1]
    assert all(t.policy_version == 3 for t in log.turns)
    assert log.to_dict()["turns"][0]["assessment"]["failed"] == ["no_boilerplate", "no_we"]


def test_max_turns_caps_an_unsatisfied_session_and_it_signs_off(fake_openai):
    server = fake_openai(lambda body: "# 32")
    (log,) = run_sessions(server.url + "/v1", make_user("student"), PROBLEMS[:1], max_turns=3)
    assert len(log.judged_turns) == 3 and not log.satisfied and log.ended
    assert all(t.assessment.reward == -1 for t in log.judged_turns)
    replies = [t.reply for t in log.judged_turns]
    assert len(set(replies)) == 3  # the same complaint, phrased differently each turn
    assert len(server.chats()) == 4


def test_without_closing_call(fake_openai):
    server = fake_openai(lambda body: "it's 32")
    (log,) = run_sessions(server.url, make_user("student"), PROBLEMS[:1], closing_call=False)
    assert len(log.turns) == 1 and log.satisfied and log.ended and not log.turns[0].closing
    assert len(server.chats()) == 1 and len(server.ended) == 1


def test_concurrent_sessions_progress_and_stop(fake_openai):
    server = fake_openai(improving)
    seen = []
    logs = run_sessions(
        server.url, make_user("teacher", seed=1), PROBLEMS, concurrency=3, progress=seen.append
    )
    assert len(logs) == 6 and sorted(seen, key=id) == sorted(logs, key=id)
    assert [log.problem_id for log in logs] == [p.id for p in PROBLEMS]
    assert len({log.session_id for log in logs}) == 6
    assert all(log.session_id.startswith("sim-teacher-") for log in logs)
    assert {e.path for e in server.ended} == {f"/v1/sessions/{log.session_id}/end" for log in logs}
    for log in logs:  # each session's calls carry its own id only
        assert len(server.chats(log.session_id)) == len(log.turns)
        assert "Student's work:" in log.turns[0].user_message

    server.requests.clear()
    started = []
    logs = run_sessions(
        server.url,
        make_user("student"),
        PROBLEMS,
        concurrency=1,
        progress=started.append,
        should_stop=lambda: len(started) >= 2,
    )
    assert len(logs) == 2


def test_failed_calls_are_recorded_per_session(fake_openai):
    def flaky(body):
        if "Final" in str(body["messages"]):  # second call of the session
            return 500, "engine exploded"
        return "**Final Answer:** 32"

    server = fake_openai(flaky)
    logs = run_sessions(server.url, make_user("student"), PROBLEMS[:2], concurrency=2)
    for log in logs:
        assert len(log.turns) == 1 and log.ended
        assert "HTTP 500: engine exploded" in log.error and log.session_id in log.error


def test_unreachable_gateway_and_bad_arguments():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (log,) = run_sessions(
        f"http://127.0.0.1:{port}", make_user("student"), PROBLEMS[:1], timeout_s=5
    )
    assert "cannot connect" in log.error and not log.turns and not log.ended
    with pytest.raises(ValueError, match="reserved"):
        run_sessions("http://x", make_user("student"), [], session_prefix="eval-x")
    with pytest.raises(ValueError, match="concurrency"):
        run_sessions("http://x", make_user("student"), [], concurrency=0)
    with pytest.raises(ValueError, match="http"):
        run_sessions("localhost:1", make_user("student"), [])
