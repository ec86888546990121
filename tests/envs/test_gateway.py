"""The simulated users against the real gateway (``clawrl.gateway.create_app``).

Scripted engine: exact turns, next states and session ends in the store. Real engine on the
tiny random model (``clawrl.models.tiny_policy``): the evaluation plumbing end to end.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from clawrl.envs import evaluate_personalization, generate_problems, make_user, run_sessions

gateway = pytest.importorskip("clawrl.gateway")
from clawrl.engine.scripted import ScriptedEngine  # noqa: E402
from clawrl.gateway.server import LiveServer  # noqa: E402
from clawrl.store import SessionSource, Store  # noqa: E402
from clawrl.trajectory import load_tree, next_state  # noqa: E402

PROBLEMS = generate_problems(3, seed=0)


@contextlib.contextmanager
def serve(engine: Any, tokenizer: Any, path) -> Iterator[tuple[LiveServer, Store]]:
    store = Store(path)
    server = LiveServer(gateway.create_app(engine, tokenizer, store, model_name="tiny")).start()
    try:
        yield server, store
    finally:
        server.stop()
        store.close()


def test_student_session_through_the_real_gateway(tokenizer, tmp_path):
    engine = ScriptedEngine(tokenizer, ["**Final Answer:** 32", "it's 32 lol", "np!"])
    with serve(engine, tokenizer, tmp_path / "s.db") as (server, store):
        (log,) = run_sessions(server.url, make_user("student"), PROBLEMS[:1], max_tokens=64)
        assert log.error is None and log.ended and log.satisfied
        assert [t.response for t in log.turns] == ["**Final Answer:** 32", "it's 32 lol", "np!"]

        assert store.session_ids() == [log.session_id]
        assert store.get_session(log.session_id).ended_at is not None
        turns = store.session_turns(log.session_id)
        assert [t.id for t in turns] == [t.turn_id for t in log.turns]
        assert all(t.session_source == SessionSource.URL for t in turns)
        assert all(t.client["user_agent"].startswith("clawrl-envs/") for t in turns)

        # the student's natural-language reply is the next state of the answer it judges
        tree = load_tree(store, log.session_id)
        first = next_state(tree, log.turns[0].turn_id)
        assert first.role == "user"
        assert first.messages[-1]["content"] == log.turns[0].reply
        thanks = next_state(tree, log.turns[1].turn_id)
        assert thanks.messages[-1]["content"] == log.turns[1].reply
        assert next_state(tree, log.turns[2].turn_id) is None  # the closing call: no next state


def test_evaluation_on_the_tiny_policy(tiny, tmp_path):
    from clawrl.engine import TransformersEngine

    engine = TransformersEngine.from_policy(tiny, max_batch=4)
    try:
        with serve(engine, tiny.tokenizer, tmp_path / "e.db") as (server, store):
            result = evaluate_personalization(
                server.url, "student", PROBLEMS, max_tokens=8, concurrency=3
            )
            assert result.n_errors == 0 and len(result.scored) == 3
            assert 0.0 <= result.mean_score <= 1.0
            assert result.policy_versions == [0]
            ids = store.session_ids()
            assert sorted(ids) == sorted(item.session_id for item in result.items)
            for sid in ids:
                assert sid.startswith("eval-student-")
                assert store.get_session(sid).ended_at is not None
                (turn,) = store.session_turns(sid)
                assert 1 <= len(turn.completion_ids) <= 8
    finally:
        engine.close()
