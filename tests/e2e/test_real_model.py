"""One exchange per protocol with the real embedded model (SmolLM2-135M-Instruct, 8192 tokens).

The prompts fit its context: a question through the ``anthropic`` SDK (Messages) and the
``openai`` SDK (Responses), and mini-swe-agent's ~1k-token prompt through chat completions. A
135M model answers the question and does not follow mini's tool protocol, so the mini run
asserts a well-formed exchange, not a solved task: every call answered 200 and recorded
token-exactly (ids, aligned log-probs), one turn per model call mini counted. (mini drops an
answer cut off at ``max_tokens`` from its history and asks again, so such calls are branches,
not one chain: the store links by ids and does not pretend otherwise.)
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from clawrl.gateway import create_app
from clawrl.gateway.server import LiveServer
from clawrl.store import ApiProtocol, Store, TurnStatus

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def real(tmp_path_factory) -> Iterator[tuple[LiveServer, Store]]:
    """The gateway on the real model (loaded once for the module)."""
    from clawrl.engine import TransformersEngine
    from clawrl.models import load_policy

    policy = load_policy("smollm2-135m")
    engine = TransformersEngine.from_policy(policy, max_batch=2)
    store = Store(tmp_path_factory.mktemp("real") / "s.db")
    server = LiveServer(create_app(engine, policy.tokenizer, store, model_name="smollm2")).start()
    try:
        yield server, store
    finally:
        server.stop()
        store.close()
        engine.close()


def _turns(store: Store) -> list:
    turns = [t for sid in store.session_ids() for t in store.session_turns(sid)]
    return sorted(turns, key=lambda t: t.created_at)


def _well_formed(turn) -> None:
    assert turn.status == TurnStatus.OK and turn.trainable
    assert turn.completion_ids and len(turn.completion_ids) == len(turn.sampling_logprobs)
    assert all(lp <= 0 for lp in turn.sampling_logprobs)


def test_messages_with_the_real_model(real):
    import anthropic

    server, store = real
    client = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
    msg = client.messages.create(
        model="smollm2",
        max_tokens=24,
        messages=[{"role": "user", "content": QUESTION}],
        extra_body={"temperature": 0},
    )
    assert msg.content[0].type == "text" and "Paris" in msg.content[0].text
    turn = _turns(store)[-1]
    assert turn.protocol == ApiProtocol.ANTHROPIC_MESSAGES
    assert msg.usage.output_tokens == len(turn.completion_ids)
    _well_formed(turn)


def test_responses_with_the_real_model(real):
    import openai

    server, store = real
    client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    events = list(
        client.responses.create(
            model="smollm2", input=QUESTION, max_output_tokens=24, temperature=0, stream=True
        )
    )
    final = events[-1].response
    assert events[-1].type in ("response.completed", "response.incomplete")
    assert "Paris" in final.output_text
    turn = _turns(store)[-1]
    assert turn.protocol == ApiProtocol.OPENAI_RESPONSES
    assert final.usage.output_tokens == len(turn.completion_ids)
    _well_formed(turn)


def test_mini_swe_agent_with_the_real_model(real, e2e, tmp_path):
    server, store = real
    mini = e2e.program("mini")
    before = len(_turns(store))
    argv = [str(mini), "-m", "openai/smollm2", "-t", "List the files here.", "--yolo"]
    argv += ["--exit-immediately", "-c", "mini.yaml", "-c", "agent.step_limit=1"]
    argv += [
        "-c",
        f"model.model_kwargs.api_base={server.base_url}",
        "-c",
        "model.model_kwargs.api_key=x",
    ]
    argv += ["-c", "model.model_kwargs.max_tokens=16", "-c", "model.model_kwargs.temperature=0"]
    argv += ["-o", str(tmp_path / "traj.json")]
    env = {"MSWEA_CONFIGURED": "true", "MSWEA_COST_TRACKING": "ignore_errors"}
    out = e2e.run(argv, env, cwd=tmp_path, home=tmp_path / "home")
    turns = _turns(store)[before:]
    traj = json.loads((tmp_path / "traj.json").read_text())
    assert len(turns) == traj["info"]["model_stats"]["api_calls"] >= 1, out[-2000:]
    first = turns[0]
    for turn in turns:
        assert turn.protocol == ApiProtocol.OPENAI_CHAT
        assert len(turn.prompt_ids) < 8192
        assert turn.request_messages[:2] == first.request_messages[:2]  # system + task
        _well_formed(turn)
