"""Rule verdicts for a program's output: empty (0) and a non-zero exit status (-1)."""

from __future__ import annotations

import pytest

from clawrl.judge.rules import exit_status, program_rule
from clawrl.judge.types import NextState, NextStateRole, Score


@pytest.mark.parametrize(
    ("text", "status"),
    [
        ("Output:\nsed: can't read a.txt: No such file or directory\n\n(exit code 2)", 2),
        ("Output:\n(exit code 0)", 0),
        ("Segmentation fault (core dumped)\n[exit code 139]", 139),
        ("exit status: 1", 1),
        ("Command finished with exit code 0.", 0),
        ("[process exited with status 3]", 3),
        ("<returncode>1</returncode>\n<output>\nboom\n</output>", 1),
        ('{"exit_code": 4, "stdout": ""}', 4),
        ("Exit Code = -9", -9),
        # the last status reported is the command's (a log that quotes an earlier one)
        ("step 1 finished with exit code 0\nstep 2 ...\n(exit code 1)", 1),
        ("hello world", None),
        ("the exit of the code was fine", None),
        ("", None),
    ],
)
def test_exit_status_reads_the_last_reported_status(text, status):
    assert exit_status(text) == status


def _state(role: str, text: str) -> NextState:
    return NextState(role=NextStateRole(role), text=text)


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
