"""Step metrics go to the sinks ``[metrics]`` chooses: JSONL always, TensorBoard, and Weights &
Biases (run in its offline mode: the run is written under the output directory, with the whole
config as the run's config), in every mode, harness training included."""

from __future__ import annotations

import json
import sys
import time

import pytest

from clawrl.cli import main
from clawrl.config import load_config
from clawrl.errors import ConfigError
from clawrl.trainer.metrics import MetricsWriter, read_metrics


@pytest.fixture(autouse=True)
def _quiet_wandb(monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")


def _run_bytes(directory, *markers: bytes, timeout_s: float = 60.0) -> bytes:
    """The offline run's log once it holds every marker: wandb's service may still be writing
    it after ``finish()`` returned (seen on a first run in a fresh home directory)."""
    deadline = time.monotonic() + timeout_s
    while True:
        [run] = sorted((directory / "wandb").glob("offline-run-*/run-*.wandb"))[:1]
        data = run.read_bytes()
        if all(m in data for m in markers) or time.monotonic() > deadline:
            return data
        time.sleep(0.2)


def test_jsonl_tensorboard_and_an_offline_wandb_run(tmp_path):
    cfg = load_config(None, [
        "metrics.wandb=true", 'metrics.wandb_mode="offline"', 'metrics.wandb_project="p-clawrl"',
        'metrics.wandb_run_name="run-marker"', "trainer.lr=0.000123",
    ])  # fmt: skip
    writer = MetricsWriter.from_config(tmp_path, cfg)
    assert writer.wandb_run is not None
    writer.write(1, {"loss": 0.5, "reward/mean": -1.0, "grad/norm": float("nan")})
    writer.write(2, {"loss": 0.25, "reward/mean": 1.0, "grad/norm": 2.0})
    writer.close()
    writer.close()  # twice is harmless
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2] and rows[0]["grad/norm"] is None
    assert rows[1]["loss"] == 0.25
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    # the project, the run name, the config (trainer.lr) and every metric name are recorded
    markers = (b"p-clawrl", b"run-marker", b"0.000123", b"reward/mean", b"grad/norm")
    data = _run_bytes(tmp_path, *markers)
    for marker in markers:
        assert marker in data, marker
    # a resumed run (a new writer on the same directory) logs into the same W&B run
    first_id = (tmp_path / "wandb_run_id").read_text()
    again = MetricsWriter.from_config(tmp_path, cfg)
    assert again.wandb_run is not None and again.wandb_run.id == first_id
    again.write(3, {"loss": 0.125})
    again.close()


def test_sinks_off_write_jsonl_only(tmp_path):
    cfg = load_config(None, ["metrics.tensorboard=false"])
    writer = MetricsWriter.from_config(tmp_path, cfg)
    writer.write(1, {"loss": 1.0})
    writer.close()
    assert [r["loss"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1.0]
    assert not (tmp_path / "tensorboard").exists() and not (tmp_path / "wandb").exists()


def test_wandb_missing_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    cfg = load_config(None, ["metrics.wandb=true"])
    with pytest.raises(ConfigError, match=r"pip install 'clawrl\[wandb\]'"):
        MetricsWriter.from_config(tmp_path, cfg)
    with pytest.raises(ConfigError, match=r"metrics\.wandb_mode"):
        load_config(None, ['metrics.wandb_mode="sometimes"'])


@pytest.mark.timeout(300)
def test_harness_train_logs_each_step_once_to_every_sink(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["harness", "train", "--model", "tiny", "--limit", "1", "--group-size", "2",
            "--steps", "2", "--tasks-per-step", "1", "--isolation", "fallback",
            "--max-steps", "1", "--time-limit", "30", "--out", str(out),
            "--set", "metrics.wandb=true", "--set", 'metrics.wandb_mode="offline"']  # fmt: skip
    assert main(args) == 0
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]  # one row per harness step, trained or not
    assert all("rollout/reward_mean" in r and "policy/version" in r for r in rows)
    data = _run_bytes(out, b"rollout/reward_mean", b"group/skipped_zero_variance")
    assert b"rollout/reward_mean" in data and b"group/skipped_zero_variance" in data
    assert json.loads((out / "run.json").read_text())["harness_settings"]["group_size"] == 2
