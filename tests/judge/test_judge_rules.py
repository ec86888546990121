"""Rule verdicts for a program's output: empty (0) and a non-zero exit status (-1)."""

from __future__ import annotations

import pytest

from clawrl.judge.rules import ExitReport, exit_status, program_rule, read_exit_status
from clawrl.judge.types import NextStateRole, NextStateText, Score


@pytest.mark.parametrize(
    ("text", "status"),
    [
        # trailers (the last non-empty line)
        ("Output:\nsed: can't read a.txt: No such file or directory\n\n(exit code 2)", 2),
        ("Output:\n(exit code 0)", 0),
        ("Segmentation fault (core dumped)\n[exit code 139]", 139),
        ("[exit code 0, no output]", 0),
        ("exit status: 1", 1),
        ("Exit Code = -9", -9),
        ("Command finished with exit code 0.", 0),
        ("[process exited with status 3]", 3),
        ("Process exited with code 0", 0),
        ("step 1 finished with exit code 0\nstep 2 ...\n(exit code 1)", 1),
        # headers (the first line), whatever the body mentions
        ("Exit code: 0\nWall time: 0.1 seconds\nOutput:\nprint('exit code 1')", 0),
        ("Exit code 1\nsrc/a.py: no match", 1),
        # mini-swe-agent's own tag wins over what its output mentions
        ("<returncode>0</returncode>\n<output>\nexit status 2\n</output>", 0),
        ("<returncode>1</returncode>\n<output>\nbuild: exit code 0\n</output>", 1),
        # one-line JSON results
        ('{"exit_code": 4, "stdout": ""}', 4),
        ('{"exitCode": 1}', 1),
        # a mention is not a report
        ("The script returns exit status 1 when no files are found.", None),
        ("FAILED tests/test_x.py::test_a - AssertionError: exit code 2 != 0\n1 failed", None),
        ("Usage: tool [opts]\n  --strict   exit code 2 on warnings\ndone", None),
        ("make: *** [Makefile:3: all] Error 2", None),
        ("hello world", None),
        ("the exit of the code was fine", None),
        ("", None),
        ("  \n ", None),
        ("exit code \u0661", None),  # an Arabic-Indic digit is no status
    ],
)
def test_exit_status_reads_a_report_not_a_mention(text, status):
    assert exit_status(text) == status


@pytest.mark.timeout(60)
def test_exit_status_does_not_backtrack_on_long_outputs():
    """No catastrophic backtracking (a quadratic pattern takes minutes on these)."""
    texts = [
        "exit code" + " " * 200_000 + "x",
        "exit " * 100_000 + "\n(exit code 1)",
        "{" + '"exit_code": ' * 50_000 + "}",
        "(" + "a" * 200_000,
    ]
    assert [exit_status(t) for t in texts] == [None, 1, None, None]


def _state(role: str, text: str) -> NextStateText:
    return NextStateText(role=NextStateRole(role), text=text)


def test_program_rule_verdicts():
    bad = program_rule(_state("environment", "Output:\nsh: 1: nano: not found\n(exit code 127)"))
    assert bad is not None and bad.score == Score.BAD and bad.rule == "exit_status"
    assert "127" in bad.detail
    empty = program_rule(_state("tool", " \n"))
    assert empty is not None and empty.score == Score.NEUTRAL and empty.rule == "empty_output"
    # exit status 0 proves nothing about the task: the model reads it
    assert program_rule(_state("tool", "Output:\n(exit code 0)")) is None
    assert program_rule(_state("tool", "3 data.txt")) is None
    # a person quoting a status is not a program's output
    assert program_rule(_state("user", "it said exit code 1, please fix")) is None
    assert program_rule(_state("feedback", "exit code 1")) is None


@pytest.mark.parametrize(
    ("text", "report"),
    [
        ("Output:\n(exit code 1)", ExitReport(1, printed=False)),
        ("Output:\nfoo\n(exit code 1)", ExitReport(1, printed=True)),
        ("<returncode>1</returncode>\n<output>\n</output>", ExitReport(1, printed=False)),
        ("<returncode>2</returncode>\n<output>\nboom\n</output>", ExitReport(2, printed=True)),
        ("Exit code: 1", ExitReport(1, printed=False)),
        ('{"exit_code": 1}', ExitReport(1, printed=True)),
    ],
)
def test_read_exit_status_says_whether_anything_else_was_printed(text, report):
    assert read_exit_status(text) == report


def test_status_1_with_nothing_printed_is_left_to_the_model():
    """grep that matched nothing, a false ``test``: an answer as often as a failure."""
    assert program_rule(_state("environment", "Output:\n(exit code 1)")) is None
    assert program_rule(_state("tool", "<returncode>1</returncode><output></output>")) is None
    silent_2 = program_rule(_state("environment", "Output:\n(exit code 2)"))
    assert silent_2 is not None and silent_2.score == Score.BAD
    printed_1 = program_rule(
        _state("tool", "grep: x.txt: No such file or directory\n[exit code 1]")
    )
    assert printed_1 is not None and printed_1.score == Score.BAD
