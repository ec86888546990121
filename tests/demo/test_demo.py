"""The main job end to end on the tiny model with a scripted judge, and its report.

``run_demo`` builds the real gateway, online loop and trainer (the composition root), the
simulated student talks to the tiny random policy, the scripted judge turns the student's replies
into rewards and hints, the trainer steps, and the report is written: this checks the files, the
tables, the statistics and that ``config.toml`` is what ran.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from clawrl.config import load_config
from clawrl.demo import DemoSettings, run_demo, score_table, write_report
from clawrl.demo.report import DROP_REASONS
from clawrl.judge.types import BackendKind, Hint, HintSelection, Judgment, Score
from clawrl.models import tiny_policy
from clawrl.runtime import JudgeBundle
from clawrl.stats import bootstrap_ci, paired_diff_ci, seed_ci, sessions_to_converge


async def scripted_judge(inp):
    """+1 for thanks, else -1 with a hint (the judge is not under test here)."""
    if "thank" in inp.next_state.text.lower() or "ty" in inp.next_state.text.lower().split():
        return Judgment(score=Score.GOOD, backend=BackendKind.GENERATIVE, model="scripted")
    return Judgment(
        score=Score.BAD, backend=BackendKind.GENERATIVE, model="scripted",
        hint=Hint(text="Answer with the number first.", selection=HintSelection.SINGLE),
    )  # fmt: skip


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    settings = DemoSettings(
        scenario="student", methods=("rl", "combine"), seeds=(0,), steps=2, eval_steps=(0, 1, 2),
        batch_size=2, eval_problems=6, max_tokens=6, concurrency=2, max_turns=2,
        out_dir=str(out / "report"), examples=2, jobs=2,  # both runs at once, in (seed, method) order
    )  # fmt: skip
    cfg = load_config(None, ["trainer.lr=1e-3", "trainer.poll_interval_s=0.1"])
    events: list[tuple[str, dict]] = []
    results = run_demo(
        settings, cfg, judge=JudgeBundle(scripted_judge, description="scripted x1"),
        policy_factory=lambda: tiny_policy(seed=0, max_context=1024),
        progress=lambda event, info: events.append((event, info)),
    )  # fmt: skip
    report = write_report(results, settings, cfg, wall_s=12.0)
    _demo_events.extend(events)
    return settings, cfg, results, report


_demo_events: list[tuple[str, dict]] = []


@pytest.mark.timeout(600)
def test_the_demo_trains_evaluates_and_reports(demo):
    _settings, _cfg, results, report = demo
    assert [r.method for r in results] == ["rl", "combine"]
    for r in results:
        assert r.steps_done == 2 and r.samples_trained == 4
        assert sorted(r.evaluations) == [0, 1, 2]
        assert [r.evaluations[s].version for s in (0, 1, 2)] == [0, 1, 2]
        for e in r.evaluations.values():
            assert len(e.scores) == 6 and e.ci[0] <= e.score <= e.ci[1]
            assert set(e.check_rates) == {c for c in e.checks[0]}
        assert r.first_answers and set(r.converge) >= {"overall", "answer_first"}
        assert r.agreement["compared"] > 0 and "sign_error_rate" in r.agreement
        # only the last checkpoint and policy version are kept
        ckpts = sorted((report.parent / "runs" / f"{r.method}-seed0" / "trainer" /
                        "checkpoints").glob("step-*"))  # fmt: skip
        assert [c.name for c in ckpts] == ["step-000002"]
        assert r.adapter is not None and r.adapter.endswith("v2")
    text = report.read_text()
    for section in ("## Each check", "## Guards", "## Sessions to converge",
                    "## Training and the judge", "## Before and after", "## The trained policy",
                    "clawrl export-model"):  # fmt: skip
        assert section in text, section
    assert "| Binary RL | 1 |" in text and "| Combined | 1 |" in text
    assert any(f"{reason}:" in text for reason in DROP_REASONS) or "were not:" in text
    out = report.parent
    for name in ("scores.png", "training.png"):
        png = (out / name).read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    data = json.loads((out / "results.json").read_text())
    assert data[0]["evaluations"]["2"]["version"] == 2


def test_config_toml_records_what_ran(demo, tmp_path):
    settings, cfg, _results, report = demo
    text = (report.parent / "config.toml").read_text()
    demo_part = text.split("[demo]")[1]
    assert "steps = 2" in demo_part and "batch_size = 2" in demo_part
    assert 'methods = ["rl", "combine"]' in demo_part and "max_tokens = 6" in demo_part
    assert "eval_temperature = 0.0" in demo_part and "max_turns = " in demo_part
    # the [trainer] table is the first run's as trained (not the base config's method "off")
    (tmp_path / "c.toml").write_text(text.split("\n[demo]")[0])
    ran = load_config(tmp_path / "c.toml")
    assert ran.trainer.method.kind == "rl" and ran.trainer.batch_size == settings.batch_size
    assert ran.trainer.micro_batch_size == settings.batch_size
    assert ran.trainer.keep_checkpoints == 1
    assert ran.model == cfg.model and ran.judge == cfg.judge and ran.engine == cfg.engine
    assert "#   combine seed 0: method = " in text and '"kind": "combine"' in text


def test_score_table_shape(demo):
    _, _, results, _ = demo
    lines = score_table(results).splitlines()
    assert lines[0] == "| method | seeds | base (v0) | 1 steps | 2 steps | gain at 2 |"
    assert lines[2].startswith("| Binary RL | 1 | ")  # a zero-width interval prints no brackets


def test_statistics_hand_computed():
    low, high = bootstrap_ci([1.0] * 10)
    assert low == high == 1.0
    low, high = bootstrap_ci([0.0, 1.0] * 25, seed=1)
    assert 0.3 < low < 0.5 < high < 0.7
    assert math.isnan(bootstrap_ci([])[0])
    diff, low, high = paired_diff_ci([0.0] * 20, [1.0] * 20)
    assert (diff, low, high) == (1.0, 1.0, 1.0)
    mean, low, high = seed_ci([0.5, 0.7, 0.6])
    assert mean == pytest.approx(0.6)
    assert (high - mean) == pytest.approx(4.303 * 0.1 / 3**0.5)
    assert sessions_to_converge([True, False, True, True, True, False]) == 5
    assert sessions_to_converge([True, True]) is None
    assert sessions_to_converge([True, True, True]) == 3


def test_each_run_prints_its_dashboard_and_a_finished_run_opens_in_it(demo):
    """The demo announces each run's live dashboard; ``clawrl dashboard --demo DIR`` reads the
    finished report back: its store, its trainer's curves and its evaluations."""
    import argparse

    from clawrl.cli.dashboard import _paths
    from clawrl.dashboard import DashboardSource, demo_view, load_demo_result
    from clawrl.store import Store

    _settings, _cfg, _results, report = demo
    servers = [info for event, info in _demo_events if event == "server"]
    assert [(s["method"], s["seed"]) for s in servers] == [("rl", 0), ("combine", 0)]
    assert all(s["url"].startswith("http://127.0.0.1:") and s["url"].endswith("/dashboard")
               for s in servers)  # fmt: skip
    args = argparse.Namespace(demo=str(report.parent), run="combine-seed0", store=None,
                              output_dir=None)  # fmt: skip
    store_path, out_dir, results_json, title = _paths(args)
    assert Path(store_path).name == "store.db" and out_dir is not None and results_json is not None
    assert "combine-seed0" in title
    result = load_demo_result(results_json, "combine-seed0")
    view = demo_view(result)
    assert view["method"] == "combine" and [e["step"] for e in view["evaluations"]] == [0, 1, 2]
    for e in view["evaluations"]:
        assert len(e["ci"]) == 2 and e["checks"]
        for c in e["checks"].values():
            low, high = c["ci"]
            assert low <= c["rate"] <= high
    assert len(view["examples"]) == 2 and {"before", "after"} <= set(view["examples"][0])
    assert result["agreement"]["compared"] > 0
    with Store(store_path) as store:
        source = DashboardSource(store, output_dir=out_dir, read_only=True,
                                 demo=lambda: view)  # fmt: skip
        assert source.training()["steps"] == 2 and source.overview()["trained"] == 4
        assert source.overview()["policy_version"] == 2
    args.run = "opd-seed7"
    with pytest.raises(Exception, match="has no run 'opd-seed7'"):
        _paths(args)


def test_validation_split_never_touches_the_held_out_problems():
    from clawrl.demo.runner import run_split
    from clawrl.envs import load_scenario

    spec = load_scenario("student")
    plain = run_split(DemoSettings(eval_problems=8), spec, seed=3)
    val = run_split(DemoSettings(eval_problems=8, validation=True), spec, seed=3)
    held = {p.question for p in plain.held_out}
    assert len(val.held_out) == 8 and len(held) == 8
    # validation problems come from the training split, and training keeps off them
    assert not held & {p.question for p in val.held_out}
    assert not held & {p.question for p in val.train}
    assert not {p.question for p in val.held_out} & {p.question for p in val.train}
    assert {p.question for p in val.held_out} <= {p.question for p in plain.train}


def test_the_demo_trains_combined_with_its_tuned_weights_unless_configured(tmp_path):
    from clawrl.demo.runner import method_config

    ran = method_config(load_config(None), "combine", DemoSettings(), tmp_path, 0)
    assert ran.trainer.method.kind == "combine"
    assert (ran.trainer.method.advantage.w_rl, ran.trainer.method.advantage.w_opd) == (0.25, 1.0)
    (tmp_path / "c.toml").write_text(
        '[trainer.method]\nkind = "combine"\nadvantage = { w_rl = 1.0, w_opd = 0.5 }\n'
    )
    mine = method_config(load_config(tmp_path / "c.toml"), "combine", DemoSettings(), tmp_path, 0)
    assert (mine.trainer.method.advantage.w_rl, mine.trainer.method.advantage.w_opd) == (1.0, 0.5)
    rl = method_config(load_config(None), "rl", DemoSettings(), tmp_path, 0)
    assert rl.trainer.method.kind == "rl"


def test_memory_arms_run_from_the_same_start_and_are_scored_with_and_without_memory(tmp_path):
    """``clawrl demo --memory``'s arms on the tiny model: the scripted judge's hint becomes a
    memory entry that main calls get; memory alone never changes the weights (its answers
    without the memory are the same at every step); memory + Combined trains turns without
    their block (distill/* metrics) and the report shows both scorings and the memory."""
    from clawrl.demo.runner import method_config

    alone = method_config(load_config(None), "memory", DemoSettings(), tmp_path, 0)
    assert alone.trainer.lr == 0.0 and alone.memory.enabled and not alone.memory.distill
    both = method_config(load_config(None), "memory+combine", DemoSettings(), tmp_path, 0)
    assert both.trainer.method.kind == "combine" and both.memory.distill and both.trainer.lr > 0
    settings = DemoSettings(
        scenario="student", methods=("memory", "memory+combine"), seeds=(0,), steps=3,
        eval_steps=(0, 3), batch_size=2, eval_problems=4, max_tokens=6, concurrency=2,
        max_turns=2, out_dir=str(tmp_path / "report"), examples=1,
    )  # fmt: skip
    cfg = load_config(None, ["trainer.lr=1e-3", "trainer.poll_interval_s=0.1"])
    results = run_demo(
        settings, cfg, judge=JudgeBundle(scripted_judge, description="scripted x1"),
        policy_factory=lambda: tiny_policy(seed=0, max_context=1024),
    )  # fmt: skip
    mem, dist = results
    assert (mem.method, dist.method) == ("memory", "memory+combine")
    for r in results:
        assert sorted(r.evaluations) == sorted(r.weights_only) == [0, 3]
        assert any("number first" in e["text"] for e in r.memory)
    assert mem.weights_only[0].answers == mem.weights_only[3].answers  # lr 0
    assert mem.weights_only[0].answers == dist.weights_only[0].answers  # the same start
    assert mem.steps_done == dist.steps_done == 3
    # the first wave had no memory yet (its hints made the entry); the third step's turns did
    assert any(m.get("distill/samples", 0) > 0 for m in dist.metrics)
    assert not any("distill/samples" in m for m in mem.metrics)
    import sqlite3

    db = sqlite3.connect(tmp_path / "report" / "runs" / "memory-seed0" / "store.db")
    evals = db.execute("SELECT memory IS NOT NULL, COUNT(*) FROM turns "
                       "WHERE untrainable_reason = 'eval' GROUP BY 1").fetchall()  # fmt: skip
    db.close()
    # steps 0 and 3, twice each, 4 problems: only step 3's scoring with memory had a block
    assert dict(evals) == {0: 12, 1: 4}
    report = write_report(results, settings, cfg, wall_s=1.0).read_text()
    assert "Memory + Combined (distilled) · weights alone" in report
    assert "## The memory" in report and "number first" in report


def test_runs_at_once_split_the_cores(monkeypatch):
    """--jobs N: torch's threads are the cores split between the runs at once (1 at least);
    one run, or OMP_NUM_THREADS set by the user, leaves them alone."""
    import os

    from clawrl.demo.runner import torch_threads_per_run

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    assert torch_threads_per_run(1) is None
    assert [torch_threads_per_run(n) for n in (2, 3, 8, 16)] == [4, 2, 1, 1]
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert torch_threads_per_run(2) is None


def test_the_memory_combine_arm_keeps_its_bounds_over_a_configured_table(tmp_path):
    """The memory + Combined arm's OPD clip and tis ratio win over a configured Combined table
    (a config.toml the demo wrote holds the memory-alone arm's), whose other settings stay;
    Combined itself keeps the configured table as it is."""
    from clawrl.demo.runner import method_config

    cfg = load_config(None, ['trainer.method={kind="combine", advantage={w_rl=0.5}}'])
    arm = method_config(cfg, "memory+combine", DemoSettings(), tmp_path, 0).trainer.method
    assert (arm.advantage.w_rl, arm.advantage.opd_clip) == (0.5, 2.0)
    assert (arm.loss.ratio.kind, arm.loss.ratio.cap) == ("tis", 2.0)
    plain = method_config(cfg, "combine", DemoSettings(), tmp_path, 0).trainer.method
    assert (plain.advantage.w_rl, plain.advantage.opd_clip, plain.loss.ratio.kind) == (
        0.5, None, "sampling")  # fmt: skip
    demo = method_config(load_config(), "memory+combine", DemoSettings(), tmp_path, 0)
    assert demo.trainer.method.advantage.w_rl == 0.25  # the demo's own table, bounded
    assert demo.trainer.method.advantage.opd_clip == 2.0 and demo.memory.distill
