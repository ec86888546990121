"""The separate-process commands' parsing and lines: ``clawrl train``, ``clawrl judge worker``,
``clawrl serve --external-trainer`` (the processes themselves: tests/trainer/test_processes.py).
"""

from __future__ import annotations

import sys

import pytest

from clawrl.cli import build_parser, main
from clawrl.cli.judge_worker import judgment_line
from clawrl.cli.options import config_with_flags
from clawrl.cli.train import torchrun_command
from clawrl.config import Config
from clawrl.errors import ConfigError, StoreError
from clawrl.runtime import build_runtime
from clawrl.store import JudgmentRecord


def test_train_and_judge_worker_are_commands(capsys):
    for argv in (["train", "--help"], ["judge", "worker", "--help"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 0
    out = capsys.readouterr().out
    assert "torchrun --nproc-per-node" in out and "--nproc N" in out
    assert "clawrl judge worker --store" in out


def test_nproc_becomes_torchrun_over_the_same_arguments():
    cmd = torchrun_command(["--store", "s.db", "--nproc", "2", "--method", "rl", "--nproc=3"], 2)
    assert cmd[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert cmd[cmd.index("--nproc-per-node") + 1] == "2"
    assert cmd[cmd.index("-m", 3) + 1 : cmd.index("-m", 3) + 3] == ["clawrl", "train"]
    assert cmd[-4:] == ["--store", "s.db", "--method", "rl"]  # --nproc is torchrun's now


def test_external_trainer_is_a_setting_and_needs_version_polling(tiny):
    args = build_parser().parse_args(["serve", "--method", "combine", "--external-trainer"])
    cfg = config_with_flags(args)
    assert cfg.server.external_trainer and cfg.trainer.method.kind == "combine"
    polling_off = cfg.model_copy(
        update={"server": cfg.server.model_copy(update={"version_poll_s": 0.0})}
    )
    with pytest.raises(ConfigError, match="version_poll_s"):
        build_runtime(polling_off, policy=tiny, store=":memory:")


def test_an_external_trainer_gateway_trains_nothing_and_follows_versions(tiny, tmp_path):
    cfg = Config.model_validate(
        {"trainer": {"method": "combine"}, "server": {"external_trainer": True}}
    )
    runtime = build_runtime(cfg, policy=tiny, store=str(tmp_path / "s.db"))
    try:
        assert runtime.service is None and runtime.trainer is None and runtime.judge is None
        assert runtime.follower is not None and runtime.follows_versions
    finally:
        runtime.close()


def test_one_line_per_judgment():
    rec = JudgmentRecord("9e8d7c6b5a", "3f2a1b2c00", 1, "choice", votes=[{}, {}, {}], hint="x",
                         latency_s=0.41, created_at=0.0)  # fmt: skip
    line = judgment_line(rec)
    assert "judged turn 9e8d7c6b session 3f2a1b2c: +1, 3 votes, hint, 0.41 s" in line
    none = JudgmentRecord("9e8d7c6b5a", "3f2a1b2c00", None, "worker", reason="timeout")
    assert "no judgment (timeout)" in judgment_line(none)


def test_a_bad_store_fails_before_the_model_loads(monkeypatch):
    """The store is opened first: a typo in --store is reported at once, not after the model
    (17-32 s on a CPU) has loaded."""
    import clawrl.models

    def no_load(*a, **k):
        raise AssertionError("the policy was loaded before the store was opened")

    monkeypatch.setattr(clawrl.models, "load_policy", no_load)
    with pytest.raises(StoreError, match="PostgreSQL URL without"):
        build_runtime(Config(), store="postgresql:/db")


def test_python_m_clawrl_and_the_older_python_m_clawrl_trainer_run_clawrl_train():
    """``python -m clawrl train`` is what torchrun starts; ``python -m clawrl.trainer`` (the older
    spelling, in users' launch scripts) re-executes it, so both print the train command's help."""
    import subprocess

    for module in (["clawrl", "train"], ["clawrl.trainer"]):
        out = subprocess.run(
            [sys.executable, "-m", *module, "--help"], capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 0, out.stderr
        assert "usage: clawrl train" in out.stdout, out.stdout[:300]
