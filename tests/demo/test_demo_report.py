"""The demo's report: table shape, plots, config round trip."""

from __future__ import annotations

import json

from clawrl.config import load_config
from clawrl.demo import DemoSettings, MethodResult, score_table, write_report
from clawrl.demo.report import guard_table


def _results():
    a = MethodResult("rl", scores={0: 0.5, 8: 0.6, 16: 0.7}, steps_done=16, sessions=30,
                     samples_trained=64, drops={"drop/no_next_state": 5},
                     agreement={"rate": 0.9, "compared": 40},
                     metrics=[{"step": 1, "reward/mean": 0.5, "hint/rate": 0.25},
                              {"step": 2, "reward/mean": 0.0, "hint/rate": 0.5}],
                     guards={0: {"repetition_rate": 0.0, "answer_accuracy": 0.1},
                             16: {"repetition_rate": 0.16, "answer_accuracy": 0.04}})  # fmt: skip
    b = MethodResult("combine", scores={0: 0.5, 8: 0.65}, note="stopped at step 9")
    return [a, b]


def test_score_table_has_one_row_per_method_and_a_column_per_step():
    table = score_table(_results(), [0, 8, 16])
    lines = table.splitlines()
    assert lines[0] == "| method | base (v0) | 8 steps | 16 steps |"
    assert lines[2] == "| Binary RL | 0.500 | 0.600 | 0.700 |"
    assert lines[3] == "| Combined | 0.500 | 0.650 | — |"


def test_write_report(tmp_path):
    settings = DemoSettings(out_dir=str(tmp_path / "r"), methods=("rl", "combine"))
    cfg = load_config()
    path = write_report(_results(), settings, cfg, wall_s=600)
    text = path.read_text()
    assert "| Binary RL | 16 | 30 | 64 | no_next_state: 5 | 0.90 (40 turns) |" in text
    assert "stopped at step 9" in text
    for name in ("scores.png", "training.png"):
        png = (tmp_path / "r" / name).read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    data = json.loads((tmp_path / "r" / "results.json").read_text())
    assert data[0]["scores"]["16"] == 0.7
    # the config written with the report loads back (without its [demo] section)
    conf = (tmp_path / "r" / "config.toml").read_text().split("[demo]")[0]
    (tmp_path / "c.toml").write_text(conf)
    assert load_config(tmp_path / "c.toml") == cfg


def test_guard_table_reports_loops_and_right_answers():
    lines = guard_table(_results(), [0, 8, 16]).splitlines()
    assert lines[2] == "| Binary RL | 0% loop, 10% right | — | 16% loop, 4% right |"
    assert lines[3] == "| Combined | — | — | — |"
