"""The shipped head judge on the real embedded model: it loads, and it is accurate.

The accuracy floors are regression guards a little under the measured numbers (README "How good
the judge is"): a retrained head that judges worse fails here. The blind sets are measured, never
trained or tuned on.
"""

from __future__ import annotations

import asyncio

import pytest

from clawrl.config import load_config
from clawrl.judge.cases import blind_b_cases_path, blind_cases_path, load_cases
from clawrl.judge.evaluate import evaluate
from clawrl.runtime import build_judge

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def head_judge():
    bundle = build_judge(load_config(None, ["judge.votes=5"]))
    yield bundle
    bundle.close()


@pytest.mark.parametrize(
    ("cases", "floor", "max_sign_errors"),
    [(None, 0.90, 0.05), (blind_cases_path(), 0.80, 0.10), (blind_b_cases_path(), 0.83, 0.07)],
    ids=["shipped", "blind", "blind-b"],
)
def test_shipped_head_judges_the_labeled_sets(head_judge, cases, floor, max_sign_errors):
    assert head_judge.prm is not None and head_judge.description == "head x5"
    report = asyncio.run(evaluate(head_judge.prm, load_cases(cases), concurrency=4))
    assert report.accuracy is not None and report.accuracy >= floor, report.metrics()
    assert report.coverage is not None and report.coverage >= 0.9
    assert report.sign_error_rate is not None and report.sign_error_rate <= max_sign_errors
