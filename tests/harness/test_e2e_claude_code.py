"""Claude Code (the real, unmodified harness) produces rewarded rollouts in harness mode.

Needs ``claude`` (``scripts/install_harnesses.sh`` puts it in ``.harnesses/bin``); skipped
otherwise. Claude Code runs inside the rollout sandbox and talks Anthropic Messages to the
per-rollout gateway prefix ``/s/{rollout_id}``. The engine is scripted on the prompt: the task
turn gets a ``Bash`` tool call that creates the file, a turn holding the tool result gets a
closing text, and any side call (a title, a topic check) gets ``OK.``, so the order in which
Claude Code makes its calls does not matter.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from clawrl.engine.scripted import ScriptedEngine
from clawrl.gateway import create_app
from clawrl.harness.adapters.external import ClaudeCodeAdapter
from clawrl.harness.loop import HarnessRunner, HarnessSettings
from clawrl.harness.rollout import RolloutStatus
from clawrl.harness.samples import rollout_samples
from clawrl.harness.tasks import BUILTIN_TASKS, load_task
from clawrl.store import ApiProtocol, Store
from clawrl.testing.replies import harness_reply, tool_call_text

_BIN = Path(os.environ.get("CLAWRL_HARNESS_BIN", Path(__file__).parents[2] / ".harnesses/bin"))
pytestmark = pytest.mark.e2e


@pytest.mark.timeout(600)
def test_claude_code_rollouts_get_rewards_and_training_rows(tmp_path, tokenizer, monkeypatch):
    if not os.access(_BIN / "claude", os.X_OK):
        pytest.skip(f"claude is not installed in {_BIN}: run scripts/install_harnesses.sh")
    monkeypatch.setenv("PATH", f"{_BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    adapter = ClaudeCodeAdapter()
    assert adapter.missing() is None
    engine = ScriptedEngine(
        tokenizer,
        [],
        reply_fn=harness_reply(
            tokenizer,
            tool_call_text("Bash", {"command": "echo hello > hello.txt", "description": "x"}),
            "I created hello.txt.",
            task_marker="Create a file named hello.txt",
        ),
        max_context=1_000_000,
    )
    task = load_task(BUILTIN_TASKS / "create-file-0")
    settings = HarnessSettings(harnesses=["claude-code"], parallel=2)
    with Store(tmp_path / "s.db") as store:
        app = create_app(engine, tokenizer, store, model_name=settings.model_name)
        runner = HarnessRunner(app, store, settings)
        try:
            rollouts = runner.run(
                [(task, runner.adapters[0], "g"), (task, runner.adapters[0], "g")]
            )
        finally:
            runner.close()
        assert len(rollouts) == 2
        for rollout in rollouts:
            assert rollout.status == RolloutStatus.OK, (rollout.error, rollout.harness_tail)
            assert rollout.reward == 1.0, rollout.harness_tail
            turns = store.session_turns(rollout.id)
            assert turns, "no call was attributed to the rollout"
            assert {t.protocol for t in turns} == {ApiProtocol.ANTHROPIC_MESSAGES}
            samples, _ = rollout_samples(store, rollout.id, 1.0, 0, {})
            # the call that wrote the tool call is trained, with the rollout's advantage
            assert samples and all(s.reward == 1.0 for s in samples)
            tool_turns = [t for t in turns if (t.output or {}).get("tool_calls")]
            assert tool_turns and tool_turns[0].id in {s.turn_id for s in samples}
