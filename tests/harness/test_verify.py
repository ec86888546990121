"""Verifier verdicts: a crash or bad output is a VerifierError, never a reward of 0."""

from __future__ import annotations

import os

import pytest

from clawrl.errors import VerifierError
from clawrl.harness.sandbox import Sandbox, choose_isolation
from clawrl.harness.tasks import load_task
from clawrl.harness.verify import parse_verdict, run_verifier


def test_parse_valid_verdicts():
    assert parse_verdict('noise\n{"reward": 0}\n').reward == 0.0
    v = parse_verdict('{"reward": 0.5, "exists": 1, "note": "x"}')
    assert v.reward == 0.5 and v.scores == {"exists": 1.0}


@pytest.mark.parametrize(
    "stdout",
    ["", "\n\n", "reward: 1", '{"reward": 1.5}', '{"reward": -0.1}', '{"reward": "1"}',
     '{"reward": true}', '[1]', '{"score": 1}', '{"reward": NaN}'],
)  # fmt: skip
def test_parse_invalid_verdicts_raise(stdout):
    with pytest.raises(VerifierError):
        parse_verdict(stdout)


def _task(tmp_path, script: str):
    folder = tmp_path / "t"
    (folder / "files").mkdir(parents=True)
    (folder / "task.toml").write_text('instruction = "do it"\n')
    verify = folder / "verify"
    verify.write_text("#!/bin/sh\n" + script)
    os.chmod(verify, 0o755)
    return load_task(folder)


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ("echo '{\"reward\": 0}'\n", 0.0),
        ("test -f done.txt && echo '{\"reward\": 1}' || echo '{\"reward\": 0}'\n", 0.0),
        ("exit 3\n", VerifierError),
        ("echo not json\n", VerifierError),
        ("echo '{\"reward\": 1}'; exit 1\n", VerifierError),
    ],
)
def test_run_verifier_error_versus_zero(tmp_path, script, expected):
    task = _task(tmp_path, script)
    with Sandbox.create(choose_isolation(), files=task.files) as box:
        if expected is VerifierError:
            with pytest.raises(VerifierError):
                run_verifier(task, box)
        else:
            assert run_verifier(task, box).reward == expected


def test_verifier_sees_the_finished_work_dir(tmp_path):
    task = _task(tmp_path, "test -f done.txt && echo '{\"reward\": 1}' || echo '{\"reward\": 0}'\n")
    with Sandbox.create(choose_isolation(), files=task.files) as box:
        (box.work / "done.txt").write_text("x")
        assert run_verifier(task, box).reward == 1.0
