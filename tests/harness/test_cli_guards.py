"""`clawrl harness train|eval` refuse what would give a wrong result: a second run into one
output dir, full fine-tuning (nothing would be published), a run evaluated on another model, and
weights that do not load (the base model's numbers would be reported as the version's)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from clawrl.cli import main
from clawrl.errors import EngineError
from clawrl.harness.loop import wait_for_version


def test_train_refuses_an_out_dir_that_holds_versions(tmp_path, capsys):
    (tmp_path / "run" / "policies" / "v3").mkdir(parents=True)
    assert main(["harness", "train", "--model", "tiny", "--out", str(tmp_path / "run")]) != 0
    assert "already holds policy versions (v3" in capsys.readouterr().err


def test_train_refuses_full_finetuning(tmp_path, capsys):
    args = ["harness", "train", "--model", "tiny", "--full-finetune", "--out", str(tmp_path / "r")]
    assert main(args) != 0
    assert "--full-finetune (trainer.full_finetune) is not supported" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_eval_refuses_a_run_trained_on_another_model(tmp_path, capsys):
    (tmp_path / "policies" / "v1").mkdir(parents=True)
    (tmp_path / "run.json").write_text(json.dumps({"model": "smollm2-135m"}))
    args = ["harness", "eval", "--model", "tiny", "--run", str(tmp_path), "--version", "1"]
    assert main([*args, "--out", str(tmp_path / "e")]) != 0
    assert "trained on --model smollm2-135m, not tiny" in capsys.readouterr().err


@pytest.mark.timeout(120)
def test_eval_fails_when_the_version_does_not_load(tmp_path, capsys):
    (tmp_path / "policies" / "v1").mkdir(parents=True)  # no adapter in it
    args = ["harness", "eval", "--model", "tiny", "--limit", "1", "--k", "1", "--json",
            "--run", str(tmp_path), "--version", "1", "--out", str(tmp_path / "e")]  # fmt: skip
    assert main(args) != 0
    captured = capsys.readouterr()
    assert "cannot load policy version 1" in captured.err and captured.out == ""


def test_waiting_for_a_version_that_never_serves_is_an_error():
    engine = SimpleNamespace(policy_version=0)
    with pytest.raises(EngineError, match="did not serve policy version 2"):
        wait_for_version(engine, 2, timeout_s=0.1)  # type: ignore[arg-type]
    engine.policy_version = 2
    wait_for_version(engine, 2, timeout_s=0.1)


def test_a_resumed_run_keeps_its_task_stream_and_may_change_the_rest(tmp_path):
    """``harness train`` on an ``--out`` with checkpoints resumes: what decides the tasks of each
    step must be as before; more steps, trainer settings and warm-start flags may change."""
    import json

    from clawrl.cli.harness import _check_same_run
    from clawrl.errors import ConfigError

    run = {"model": "m", "harness": "reference", "tasks": "builtin", "split": "train",
           "match": None, "limit": None, "time_limit": None, "tasks_per_step": 4,
           "group_size": 4, "steps": 2, "trainer": {"lr": 1e-3}, "warm_start": "src"}  # fmt: skip
    (tmp_path / "run.json").write_text(json.dumps(run))
    _check_same_run(tmp_path, {**run, "steps": 20, "trainer": {"lr": 5e-4}, "warm_start": None})
    with pytest.raises(ConfigError, match="split: 'train' -> 'heldout'"):
        _check_same_run(tmp_path, {**run, "split": "heldout"})
    with pytest.raises(ConfigError, match="limit"):
        _check_same_run(tmp_path, {**run, "limit": 3})
    # the rollouts' sampling seed is kept too (another --seed would sample other rollouts)
    (tmp_path / "run.json").write_text(json.dumps({**run, "sampling_seed": 0}))
    _check_same_run(tmp_path, {**run, "sampling_seed": 0})
    with pytest.raises(ConfigError, match=r"sampling_seed \(--seed .*\): 0 -> 1"):
        _check_same_run(tmp_path, {**run, "sampling_seed": 1})


def test_a_run_recorded_before_the_harness_section_still_resumes(tmp_path):
    """Older ``run.json`` files hold ``--harness`` as typed and 0 or "" for an unset limit,
    time limit or match; they compare equal to the same run's settings now."""
    import json

    from clawrl.cli.harness import _check_same_run
    from clawrl.errors import ConfigError

    old = {"model": "m", "harness": "reference, mini-swe-agent", "tasks": "builtin",
           "split": "train", "match": "", "limit": 0, "time_limit": 0, "tasks_per_step": 4,
           "group_size": 4}  # fmt: skip
    (tmp_path / "run.json").write_text(json.dumps(old))
    now = {**old, "harness": "reference,mini-swe-agent", "match": None, "limit": None,
           "time_limit": None}  # fmt: skip
    _check_same_run(tmp_path, now)
    _check_same_run(tmp_path, {**now, "sampling_seed": 0})  # recorded before seeded sampling
    with pytest.raises(ConfigError, match="harness"):
        _check_same_run(tmp_path, {**now, "harness": "reference"})
