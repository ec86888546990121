"""mini-swe-agent (a real external harness) produces a rewarded rollout through the sandbox.

Needs ``mini`` on PATH or at ``$CLAWRL_MINI_SWE_AGENT`` (e.g. its own venv); skipped otherwise.
The engine is scripted: mini-swe-agent's bash tool call, then its submit command.
"""

from __future__ import annotations

import pytest

from clawrl.engine.scripted import ScriptedEngine
from clawrl.gateway import create_app
from clawrl.harness.adapters.external import MiniSweAgentAdapter
from clawrl.harness.loop import HarnessRunner, HarnessSettings
from clawrl.harness.samples import rollout_samples
from clawrl.harness.tasks import BUILTIN_TASKS, load_task
from clawrl.store import Store

# `make test` installs mini-swe-agent into .harnesses/ (tests/harness/conftest.py finds it)
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        MiniSweAgentAdapter().missing() is not None, reason="mini-swe-agent is not installed"
    ),
]
CALL = '<tool_call>{{"name": "bash", "arguments": {{"command": "{}"}}}}</tool_call>'


def _one_rollout(store, tokenizer, harness, replies, default_reply):
    """One create-file-0 rollout through ``harness`` against a scripted engine."""
    engine = ScriptedEngine(tokenizer, replies, default_reply=default_reply)
    settings = HarnessSettings(harnesses=[harness], parallel=1)
    app = create_app(engine, tokenizer, store, model_name=settings.model_name)
    runner = HarnessRunner(app, store, settings)
    try:
        (rollout,) = runner.run(
            [(load_task(BUILTIN_TASKS / "create-file-0"), runner.adapters[0], "g")]
        )
    finally:
        runner.close()
    return rollout


@pytest.mark.timeout(300)
def test_mini_swe_agent_rollout_gets_reward_and_training_rows(tmp_path, tokenizer):
    replies = [
        CALL.format("echo hello > hello.txt"),
        CALL.format("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"),
    ]
    with Store(tmp_path / "s.db") as store:
        rollout = _one_rollout(store, tokenizer, "mini-swe-agent", replies, replies[-1])
        assert rollout.reward == 1.0, rollout.harness_tail
        turns = store.session_turns(rollout.id)
        assert len(turns) == 2  # every call attributed to the rollout by its URL prefix
        samples, _ = rollout_samples(store, rollout.id, 0.5, 0, {})
        assert {s.turn_id for s in samples} == {t.id for t in turns}


@pytest.mark.timeout(300)
def test_mini_swe_agent_text_mode_parses_a_bash_block_and_submits(tmp_path, tokenizer):
    replies = [
        "I will write the file.\n```bash\necho hello > hello.txt\n```",
        "```bash\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```",
    ]
    with Store(tmp_path / "s.db") as store:
        rollout = _one_rollout(store, tokenizer, "mini-swe-agent-text", replies, "no command here")
        assert rollout.reward == 1.0, rollout.harness_tail
        turns = store.session_turns(rollout.id)
        assert len(turns) == 2  # the submit command ended the run: no third call
        first = tokenizer.decode(turns[0].prompt_ids)
        assert "Example task:" in first and "Create a file named hello.txt" in first
        second = tokenizer.decode(turns[1].prompt_ids)
        assert "(exit code 0)" in second  # clawrl's observation template, not the default's
