"""Harness evaluation statistics: families, per-task counts, intervals over tasks, paired gains."""

from __future__ import annotations

import math

import pytest

from clawrl.harness.stats import (
    TaskCount,
    family_pass_at_1,
    paired_gain,
    pass_at_1_ci,
    task_family,
)


def test_task_family_strips_the_variant_number():
    assert task_family("copy-file-3") == "copy-file"
    assert task_family("fix-bug-12") == "fix-bug"
    assert task_family("standalone") == "standalone"
    assert task_family("v2-task") == "v2-task"


def test_pass_at_1_is_the_mean_of_task_rates_and_the_interval_holds_it():
    counts = [TaskCount("a-0", 4, 4), TaskCount("a-1", 4, 0), TaskCount("b-0", 4, 2)]
    mean, low, high = pass_at_1_ci(counts)
    assert mean == pytest.approx(0.5)
    assert 0.0 <= low < mean < high <= 1.0
    # one task per value: resampling tasks can give anything from all-0 to all-1 means
    assert low <= 1 / 6 + 1e-9 and high >= 5 / 6 - 1e-9
    assert all(math.isnan(x) for x in pass_at_1_ci([]))


def test_identical_tasks_give_a_zero_width_interval():
    counts = [TaskCount(f"t-{i}", 4, 2) for i in range(10)]
    assert pass_at_1_ci(counts) == (0.5, 0.5, 0.5)


def test_family_rates_average_their_tasks():
    counts = [TaskCount("a-0", 4, 4), TaskCount("a-1", 4, 2), TaskCount("b-0", 2, 0)]
    assert family_pass_at_1(counts) == {"a": (0.75, 2), "b": (0.0, 1)}


def test_paired_gain_uses_only_shared_tasks_and_detects_a_uniform_gain():
    before = [TaskCount(f"t-{i}", 4, 1) for i in range(12)] + [TaskCount("only-before", 4, 0)]
    after = [TaskCount(f"t-{i}", 4, 3) for i in range(12)] + [TaskCount("only-after", 4, 4)]
    gain, low, high, n = paired_gain(before, after)
    assert n == 12 and gain == pytest.approx(0.5) and low == pytest.approx(0.5)
    assert high == pytest.approx(0.5)


def test_paired_gain_of_mixed_changes_straddles_zero():
    before = [TaskCount(f"t-{i}", 4, 2) for i in range(8)]
    after = [TaskCount(f"t-{i}", 4, 4 if i % 2 else 0) for i in range(8)]
    gain, low, high, n = paired_gain(before, after)
    assert n == 8 and gain == pytest.approx(0.0) and low < 0 < high
    assert math.isnan(paired_gain(before, [TaskCount("x-0", 1, 1)])[0])


def _row(counts):
    from clawrl.harness.loop import EvalRow

    mean, low, high = pass_at_1_ci(counts)
    return EvalRow(
        harness="reference", tasks=len(counts), rollouts=sum(c.n for c in counts),
        verifier_errors=0, harness_errors=0, pass_at_1=mean, pass_at_k=mean, k=1,
        reward_mean=mean, wall_s=1.0, pass_at_1_low=low, pass_at_1_high=high,
        families={f: p for f, (p, _) in family_pass_at_1(counts).items()}, counts=list(counts),
    )  # fmt: skip


def test_the_eval_table_gives_intervals_the_paired_gain_and_families():
    from clawrl.harness.loop import format_eval

    before = [TaskCount(f"{fam}-{i}", 4, 1) for fam in ("a", "b") for i in range(6)]
    after = [TaskCount(f"{fam}-{i}", 4, 3 if fam == "a" else 1) for fam in ("a", "b")
             for i in range(6)]  # fmt: skip
    text = format_eval([(0, [_row(before)]), (8, [_row(after)])])
    assert "0.250 [0.250, 0.250]" in text  # every task at 1 of 4: no spread
    (gain,) = [line for line in text.splitlines() if line.startswith("gain v8 - v0")]
    assert "paired over 12 tasks" in gain and "+0.250 [" in gain and "beyond noise" in gain
    fam_a = next(line for line in text.splitlines() if line.strip().startswith("a "))
    assert fam_a.split()[1:] == ["0.25", "0.75"]


@pytest.mark.parametrize(
    ("flag", "run", "message"),
    [("8,0", "r", "ascending"), ("x", "r", "integers"), ("3", None, "needs --run"),
     ("0,-1", "r", "ascending"), ("0,2", "r", "no policy version 2")],
)  # fmt: skip
def test_bad_version_lists_are_config_errors(tmp_path, flag, run, message):
    import argparse

    from clawrl.cli.harness import _versions
    from clawrl.errors import ConfigError

    (tmp_path / "policies" / "v1").mkdir(parents=True)
    args = argparse.Namespace(version=flag, run=str(tmp_path) if run else None)
    with pytest.raises(ConfigError, match=message):
        _versions(args)
    assert _versions(argparse.Namespace(version="0,1", run=str(tmp_path))) == [0, 1]
    assert _versions(argparse.Namespace(version=None, run=None)) == [0]


def _eval_json(path, version, passes):
    import json

    counts = {f"t-{i}": [4, c] for i, c in enumerate(passes)}
    path.write_text(json.dumps([{"harness": "reference", "version": version, "counts": counts}]))
    return str(path)


def test_compare_prints_each_side_and_the_paired_difference(tmp_path, capsys):
    from clawrl.cli import main

    a = _eval_json(tmp_path / "a.json", 5, [1] * 10)
    b = _eval_json(tmp_path / "b.json", 5, [3] * 10)
    assert main(["harness", "compare", a, b]) == 0
    out = capsys.readouterr().out
    assert "reference A (v5): pass@1 0.250 [0.250, 0.250] over 10 tasks" in out
    assert "reference B - A (paired over 10 tasks): +0.500 [+0.500, +0.500] (beyond noise)" in out


def test_compare_refuses_files_that_are_not_eval_output(tmp_path, capsys):
    from clawrl.cli import main

    a = _eval_json(tmp_path / "a.json", 5, [1, 2])
    (tmp_path / "bad.json").write_text('[{"harness": "reference", "pass_at_1": 0.5}]')
    assert main(["harness", "compare", a, str(tmp_path / "bad.json")]) != 0
    assert "no counts" in capsys.readouterr().err
    assert main(["harness", "compare", a, a, "--version-b", "3"]) != 0
    assert "no rows of version 3" in capsys.readouterr().err
