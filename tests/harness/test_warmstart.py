"""The warm start: passed rollouts of training tasks, replayed through a harness in its own format
and verified again, trained with the supervised gradient; held-out and failed rollouts unused.

The source rollouts come from a scripted engine through the reference agent (their answers
decide which pass); the warm start trains the tiny random model on the replays' token ids.
"""

from __future__ import annotations

import json

import pytest
import torch

from clawrl.algorithms import LossInputs, compute_loss, count_normalizers
from clawrl.cli import main
from clawrl.config import TrainerConfig
from clawrl.engine.scripted import ScriptedEngine
from clawrl.errors import ConfigError
from clawrl.gateway import create_app
from clawrl.harness.adapters.external import MiniSweAgentAdapter
from clawrl.harness.loop import HarnessRunner, HarnessSettings
from clawrl.harness.tasks import BUILTIN_TASKS, load_task
from clawrl.harness.warmstart import (
    MINI_SUBMIT,
    SFT_METHOD,
    collect_demonstrations,
    demo_replies,
    rollout_commands,
    run_warm_start,
)
from clawrl.store import RolloutPurpose, Store
from clawrl.trainer.learner import Learner
from clawrl.trainer.trainer import Trainer

SOLVE = "I will do it.\n```bash\necho blue > a.txt\n```"  # solves create-file-2
FAIL = "```bash\nls\n```"


def _source(tmp_path, tokenizer, replies_per_rollout):
    """A store with one reference rollout of create-file-2 (a training task) per reply list,
    one of delete-file-2 (not a task of these runs) and a passed one of create-file-0 (held
    out)."""
    store = Store(tmp_path / "source.db")
    engine = ScriptedEngine(tokenizer, default_reply="DONE")
    runner = HarnessRunner(
        create_app(engine, tokenizer, store, model_name="policy"), store,
        HarnessSettings(harnesses=["reference"], parallel=1),
    )  # fmt: skip
    create = load_task(BUILTIN_TASKS / "create-file-2")
    try:
        for replies in replies_per_rollout:
            engine.replies = list(replies)
            runner.run([(create, runner.adapters[0], "src")])
        engine.replies = [SOLVE, "DONE"]
        runner.run([(load_task(BUILTIN_TASKS / "delete-file-2"), runner.adapters[0], "other")])
        engine.replies = ["```bash\necho hello > hello.txt\n```", "DONE"]
        runner.run([(load_task(BUILTIN_TASKS / "create-file-0"), runner.adapters[0], "held")])
    finally:
        runner.close()
    return store, create


def test_demonstrations_are_passed_distinct_training_rollouts(tmp_path, tokenizer):
    sources = [[SOLVE, "DONE"], [FAIL, "DONE"], [SOLVE, "DONE"]]
    store, create = _source(tmp_path, tokenizer, sources)
    with store:
        heldout = load_task(BUILTIN_TASKS / "create-file-0")
        assert heldout.split == "heldout"
        demos, skipped = collect_demonstrations(store, {create.id: create, heldout.id: heldout})
        assert [d.commands for d in demos] == [("echo blue > a.txt",)]
        assert demos[0].task_id == create.id and demos[0].harness == "reference"
        assert skipped == {"not_passed": 1, "duplicate": 1, "not_in_this_run": 1,
                           "heldout_task": 1}  # fmt: skip
        first = store.rollout_results()[0].rollout.id
        assert rollout_commands(store, first) == ("echo blue > a.txt",)


def test_a_mini_swe_agent_submit_is_no_command(tmp_path, tokenizer):
    """mini-swe-agent's submit command ends its run; it is not part of the demonstration."""
    submit = f"```bash\n{MINI_SUBMIT}\n```"
    store, create = _source(tmp_path, tokenizer, [[SOLVE, submit, "DONE"]])
    with store:
        demos, _ = collect_demonstrations(store, {create.id: create})
        assert [d.commands for d in demos] == [("echo blue > a.txt",)]


def test_replies_follow_each_harness_format():
    assert demo_replies("reference", ["ls", "pwd"]) == ["```bash\nls\n```", "```bash\npwd\n```",
                                                        "DONE"]  # fmt: skip
    assert demo_replies("mini-swe-agent-text", ["ls"])[-1] == f"```bash\n{MINI_SUBMIT}\n```"
    with pytest.raises(ConfigError, match="no warm-start reply format"):
        demo_replies("claude-code", ["ls"])


def test_sft_method_is_the_supervised_gradient():
    """ratio vs the policy before the step (1 at the step), advantage 1, no KL: the loss's
    gradient is that of the token-mean negative log-likelihood (float64, masked, ragged)."""
    assert SFT_METHOD.kind == "precomputed" and SFT_METHOD.loss.kl.beta == 0.0
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 7, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 7, (3, 5))
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 1, 1, 0, 0]], dtype=torch.bool)

    def policy_lp():
        return logits.log_softmax(-1).gather(-1, targets[..., None])[..., 0]

    lp = policy_lp()
    inputs = LossInputs(
        policy_logprobs=lp, sampling_logprobs=lp.detach() - 0.3, advantages=torch.ones_like(lp),
        loss_mask=mask, old_logprobs=lp.detach(),
        normalizers=count_normalizers(mask, None, mask_truncated=False),
    )  # fmt: skip
    (got,) = torch.autograd.grad(compute_loss(SFT_METHOD.loss, inputs).loss, logits)
    nll = -(policy_lp() * mask).sum() / mask.sum()
    (want,) = torch.autograd.grad(nll, logits)
    torch.testing.assert_close(got, want)
    assert got.abs().sum() > 0


def _warm_start(tmp_path, tiny, source, tasks, harness, epochs=3):
    store = Store(tmp_path / "run.db")
    scripted = ScriptedEngine(tiny.tokenizer)
    runner = HarnessRunner(
        create_app(scripted, tiny.tokenizer, store, model_name="policy"), store,
        HarnessSettings(harnesses=[harness], parallel=1),
    )  # fmt: skip
    config = TrainerConfig(method="grpo", micro_batch_size=2, lr=1e-3)
    trainer = Trainer(tiny.model, config, tmp_path / "out")
    policy_engine = ScriptedEngine(tiny.tokenizer)  # stands in for the engine being trained
    try:
        learner = Learner(trainer, store, engines=[policy_engine])
        report = run_warm_start(source, runner, scripted, learner, policy_engine, tasks,
                                epochs=epochs, batch_size=2)  # fmt: skip
    finally:
        runner.close()
    return report, store, trainer, policy_engine


def test_warm_start_replays_verifies_trains_and_publishes(tmp_path, tiny):
    source, create = _source(tmp_path, tiny.tokenizer, [[SOLVE, "DONE"], [FAIL, "DONE"]])
    with source:
        report, store, trainer, engine = _warm_start(tmp_path, tiny, source, [create],
                                                     "reference")  # fmt: skip
    with store:
        assert report.demonstrations == 1 and report.replays_passed["reference"] == 1
        assert report.samples == 2  # the command turn and the DONE turn
        assert report.steps == 3 and report.version == 1 and engine.policy_version == 1
        assert (tmp_path / "out" / "policies" / "v1").is_dir()
        assert trainer.method.kind == "grpo"  # the run's own method again
        # the supervised loss falls over the epochs (the same 2 samples each step)
        assert report.losses[-1] < report.losses[0]
        (replay,) = store.rollout_results()
        assert replay.group.purpose == RolloutPurpose.WARM_START and replay.reward == 1.0
        assert "warm start" in report.line()


def test_no_demonstration_is_a_clear_error(tmp_path, tiny):
    source, create = _source(tmp_path, tiny.tokenizer, [[FAIL, "DONE"]])
    with source, pytest.raises(ConfigError, match="no demonstration in"):
        _warm_start(tmp_path, tiny, source, [create], "reference")


@pytest.mark.e2e
@pytest.mark.timeout(300)
@pytest.mark.skipif(MiniSweAgentAdapter().missing() is not None, reason="mini not installed")
def test_reference_success_replayed_through_mini_swe_agent_text(tmp_path, tiny):
    """A reference-agent success becomes mini-swe-agent-text turns: mini's own prompt, the
    command in its code block, then its submit command; the verifier passes the replay."""
    source, create = _source(tmp_path, tiny.tokenizer, [[SOLVE, "DONE"]])
    with source:
        report, store, _, _ = _warm_start(tmp_path, tiny, source, [create],
                                          "mini-swe-agent-text", epochs=1)  # fmt: skip
    with store:
        assert report.replays_passed["mini-swe-agent-text"] == 1, report.line()
        (replay,) = store.rollout_results()
        turns = store.session_turns(replay.rollout.id)
        assert len(turns) == 2  # the command, then the submit command ended the run
        first = tiny.tokenizer.decode(turns[0].prompt_ids)
        assert "Example task:" in first and "Create a file named a.txt" in first
        assert MINI_SUBMIT in tiny.tokenizer.decode(turns[1].completion_ids)
        assert report.samples == 2 and report.version == 1


@pytest.mark.timeout(300)
def test_cli_warm_start_only(tmp_path, tokenizer, capsys):
    """`harness train --warm-start SRC --steps 0`: the warm start alone, published as v1."""
    (tmp_path / "src").mkdir()
    source, _ = _source(tmp_path / "src", tokenizer, [[SOLVE, "DONE"]])
    source.close()
    (tmp_path / "src" / "source.db").rename(tmp_path / "src" / "store.db")
    out = tmp_path / "run"
    args = ["harness", "train", "--model", "tiny", "--match", "^create-file-2$",
            "--warm-start", str(tmp_path / "src"), "--steps", "0", "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "warm start: 1 demonstrations" in printed and "reference 1/1 passed" in printed
    assert "published: v1..v1" in printed and (out / "policies" / "v1").is_dir()
    assert json.loads((out / "run.json").read_text())["warm_start"] == str(tmp_path / "src")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ([], "no store at"),
        (["--harness", "claude-code"], "no warm-start reply format"),
        (["--warm-start-epochs", "0"], "harness.warm_start_epochs: Input should be greater"),
        (["--split", "heldout"], "not with --split heldout"),
    ],
)
def test_cli_warm_start_refuses_before_loading_the_model(tmp_path, capsys, extra, message):
    args = ["harness", "train", "--model", "tiny", "--warm-start", str(tmp_path / "nowhere"),
            "--steps", "0", "--out", str(tmp_path / "run"), *extra]  # fmt: skip
    assert main(args) != 0
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_cli_warm_start_with_rl_steps_needs_no_kl_to_the_base(tmp_path, tokenizer, capsys):
    (tmp_path / "src").mkdir()
    _source(tmp_path / "src", tokenizer, [[SOLVE, "DONE"]])[0].close()
    (tmp_path / "src" / "source.db").rename(tmp_path / "src" / "store.db")
    args = ["harness", "train", "--model", "tiny", "--warm-start", str(tmp_path / "src"),
            "--steps", "1", "--out", str(tmp_path / "run")]  # fmt: skip
    assert main(args) != 0
    assert "--kl-beta 0" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--steps", "0"], "nothing to train"),
        (["--steps", "-1"], "nothing to train"),
        (["--warm-start-epochs", "3"], "need --warm-start SRC"),
    ],
)
def test_cli_train_refuses_what_trains_nothing(tmp_path, capsys, args, message):
    assert main(["harness", "train", "--model", "tiny", "--out", str(tmp_path / "r"), *args]) != 0
    assert message in capsys.readouterr().err
