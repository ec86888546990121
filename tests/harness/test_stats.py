"""Harness evaluation statistics: families, per-task counts, intervals over tasks, paired gains."""

from __future__ import annotations

import math

import pytest

from clawrl.harness.passk import (
    TaskCount,
    describe_gain,
    family_pass_at_1,
    paired_gain,
    pass_at_1_ci,
    task_family,
    verdict,
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
    assert all(math.isnan(x) for x in pass_at_1_ci([]))


def test_rollout_noise_widens_the_interval_of_identical_tasks():
    # every task passed 1 of 4: another 4 rollouts per task could pass more or fewer
    mean, low, high = pass_at_1_ci([TaskCount(f"t{i}-0", 4, 1) for i in range(10)])
    assert mean == 0.25 and low < 0.2 and high > 0.3
    # but a task that always (or never) passes gives the binomial stage nothing to redraw
    assert pass_at_1_ci([TaskCount(f"t{i}-0", 4, 4) for i in range(10)]) == (1.0, 1.0, 1.0)


def test_variants_of_one_family_are_not_independent_evidence():
    # 2 families x 10 variants: family a always passes, family b never does
    clustered = [TaskCount(f"{f}-{i}", 4, 4 if f == "a" else 0) for f in "ab" for i in range(10)]
    _, low, high = pass_at_1_ci(clustered)
    assert low <= 0.05 and high >= 0.95  # drawing 2 families: all a, all b, or one of each
    spread = [TaskCount(f"f{i}-0", 4, 4 if i % 2 else 0) for i in range(20)]
    _, low2, high2 = pass_at_1_ci(spread)  # 20 families: much more evidence
    assert high2 - low2 < (high - low) / 2


def test_the_tasks_scope_keeps_families_fixed_and_redraws_their_variants():
    # family a gains on every variant, family b on half of them (noisily): over families, a draw
    # of b twice can show little gain; over tasks within families, a is always in the draw
    before = [TaskCount(f"{f}-{i}", 4, 1) for f in "ab" for i in range(8)]
    after = [
        TaskCount(f"{f}-{i}", 4, 4 if f == "a" or i % 2 else 1) for f in "ab" for i in range(8)
    ]
    gain, low_f, high_f, n = paired_gain(before, after, over="families")
    gain_t, low_t, high_t, _ = paired_gain(before, after, over="tasks")
    assert gain == gain_t == pytest.approx(0.5625) and n == 16
    assert low_f < low_t < gain < high_t < high_f
    # one family: the two scopes draw the same way
    one = [TaskCount(f"a-{i}", 7, i % 8) for i in range(13)]
    assert pass_at_1_ci(one, over="tasks") == pass_at_1_ci(one, over="families")
    # a family of two tasks: no interval over tasks (redrawing 2 understates the spread)
    two = [*one, TaskCount("b-0", 4, 0), TaskCount("b-1", 4, 4)]
    assert all(math.isnan(x) for x in pass_at_1_ci(two, over="tasks")[1:])
    assert "n/a over tasks within families (a family has < 3 tasks)" in describe_gain(two, two)
    with pytest.raises(ValueError, match="over must be one of"):
        pass_at_1_ci(one, over="rollouts")


def test_task_counts_must_be_possible():
    with pytest.raises(ValueError, match="0 <= c <= n"):
        TaskCount("t-0", 4, 5)
    with pytest.raises(ValueError, match="n >= 1"):
        TaskCount("t-0", 0, 0)


def test_family_rates_average_their_tasks():
    counts = [TaskCount("a-0", 4, 4), TaskCount("a-1", 4, 2), TaskCount("b-0", 2, 0)]
    assert family_pass_at_1(counts) == {"a": (0.75, 2), "b": (0.0, 1)}


def test_paired_gain_uses_only_shared_tasks_and_detects_a_uniform_gain():
    before = [TaskCount(f"t{i}-0", 4, 0) for i in range(12)] + [TaskCount("only-before", 4, 0)]
    after = [TaskCount(f"t{i}-0", 4, 4) for i in range(12)] + [TaskCount("only-after", 4, 4)]
    gain, low, high, n = paired_gain(before, after)
    assert (gain, low, high, n) == (1.0, 1.0, 1.0, 12)
    before = [TaskCount(f"t{i}-0", 8, 2) for i in range(12)]
    after = [TaskCount(f"t{i}-0", 8, 6) for i in range(12)]
    gain, low, high, _ = paired_gain(before, after)
    assert gain == pytest.approx(0.5) and 0.3 < low < 0.5 < high < 0.7
    assert verdict(low, high, 12) == "beyond noise"


def test_verdicts_need_an_interval_and_enough_tasks():
    assert verdict(0.1, 0.3, 12) == "beyond noise" and verdict(-0.3, -0.1, 12) == "beyond noise"
    assert verdict(-0.1, 0.3, 12) == "within noise"
    assert verdict(0.1, 0.3, 1) == "n/a" and verdict(math.nan, math.nan, 0) == "n/a"


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

    before = [TaskCount(f"{fam}-{i}", 4, 0) for fam in ("a", "b") for i in range(6)]
    after = [TaskCount(f"{fam}-{i}", 4, 4 if fam == "a" else 0) for fam in ("a", "b")
             for i in range(6)]  # fmt: skip
    text = format_eval([(0, [_row(before)]), (8, [_row(after)])])
    assert "0.000 [0.000, 0.000]" in text and "0.500 [" in text
    (gain,) = [line for line in text.splitlines() if line.startswith("gain v8 - v0")]
    # 2 families, one gained everything, one nothing: beyond noise for other variants of these
    # two families (every variant of a gained, none of b), not for other families
    assert "+0.500 over 12 tasks" in gain
    assert "[+0.000, +1.000] over families (within noise)" in gain
    assert "[+0.500, +0.500] over tasks within families (beyond noise)" in gain
    fam_a = next(line for line in text.splitlines() if line.strip().startswith("a "))
    assert fam_a.split()[1:] == ["0.00", "1.00"]


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

    a = _eval_json(tmp_path / "a.json", 5, [0] * 10)
    b = _eval_json(tmp_path / "b.json", 5, [4] * 10)
    assert main(["harness", "compare", a, b]) == 0
    out = capsys.readouterr().out
    assert "reference A (v5): pass@1 0.000 [0.000, 0.000] over 10 tasks" in out
    # one family (t-0..t-9): no interval over families
    assert (
        "reference B - A (paired): +1.000 over 10 tasks: n/a over families (one family); "
        "[+1.000, +1.000] over tasks within families (beyond noise)" in out
    )
    assert f"A = {a}  B = {b}" in out


def test_compare_refuses_files_that_are_not_eval_output(tmp_path, capsys):
    from clawrl.cli import main

    a = _eval_json(tmp_path / "a.json", 5, [1, 2])
    (tmp_path / "bad.json").write_text('[{"harness": "reference", "pass_at_1": 0.5}]')
    assert main(["harness", "compare", a, str(tmp_path / "bad.json")]) != 0
    assert "without harness, version and counts" in capsys.readouterr().err
    assert main(["harness", "compare", a, a, "--version-b", "3"]) != 0
    assert "no rows of version 3" in capsys.readouterr().err
    for counts in ("[4, 9]", "[0, 0]", '"x"'):
        (tmp_path / "c.json").write_text(
            '[{"harness": "reference", "version": 1, "counts": {"t-0": ' + counts + "}}]"
        )
        assert main(["harness", "compare", a, str(tmp_path / "c.json")]) != 0
        assert "counts must be [n, c]" in capsys.readouterr().err, counts


def test_several_runs_get_a_mean_gain_with_an_interval_over_runs(tmp_path, capsys):
    from clawrl.cli import main

    a = _eval_json(tmp_path / "a.json", 0, [0] * 10)
    runs = [_eval_json(tmp_path / f"b{i}.json", 15, [c] * 10) for i, c in enumerate([2, 3, 4])]
    assert main(["harness", "compare", a, *runs]) == 0
    out = capsys.readouterr().out
    assert "reference B3 - A (paired): +1.000 over 10 tasks" in out
    # gains 0.5, 0.75, 1.0: sd 0.25, t(0.975, 2) = 4.303 -> half-width 0.621
    assert "mean B - A over 3 runs: +0.750, 95 % t-interval over runs [+0.129, +1.371]" in out
    assert "(runs: +0.500, +0.750, +1.000; tasks held fixed" in out and "B2 = " in out


def test_across_runs_needs_runs_and_gives_no_interval_for_one():
    from clawrl.harness.passk import across_runs

    mean, low, high = across_runs([0.25])
    assert mean == 0.25 and math.isnan(low) and math.isnan(high)
    with pytest.raises(ValueError, match="at least one"):
        across_runs([])


def test_compare_can_keep_only_matching_tasks(tmp_path, capsys):
    from clawrl.cli import main

    a = _eval_json(tmp_path / "a.json", 0, [0] * 12)
    b = _eval_json(tmp_path / "b.json", 1, [4] * 8 + [0] * 4)  # t-8..t-11 did not gain
    assert main(["harness", "compare", r"--match=-(8|9|1[01])$", a, b]) == 0
    out = capsys.readouterr().out
    assert "4 of them match" in out and "B - A (paired): +0.000 over 4 tasks" in out
    assert main(["harness", "compare", "--match", "(", a, b]) != 0
    assert "--match '(' is not a regex" in capsys.readouterr().err
    assert main(["harness", "compare", "--match", "nothing", a, b]) != 0
    assert "no task to compare" in capsys.readouterr().err
