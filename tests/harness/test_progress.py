"""Progress lines on long batches of rollouts."""

from __future__ import annotations

import io
from types import SimpleNamespace

from clawrl.cli.harness import RolloutProgress


def test_a_line_per_interval_with_passes_and_time_left_and_none_at_the_end():
    out = io.StringIO()
    progress = RolloutProgress(out, every_s=0.0)
    progress(None, 0, 4)
    for done, reward in enumerate([1.0, None, 0.5, 1.0], start=1):
        progress(SimpleNamespace(reward=reward), done, 4)  # type: ignore[arg-type]
    lines = out.getvalue().splitlines()
    assert [line.split(":")[0].strip() for line in lines] == [
        "rollouts 1/4", "rollouts 2/4", "rollouts 3/4"
    ]  # fmt: skip
    assert "1 passed" in lines[0] and "1 passed" in lines[2] and "min left" in lines[2]
    quiet = io.StringIO()
    slow = RolloutProgress(quiet, every_s=3600.0)
    slow(None, 0, 2)
    slow(SimpleNamespace(reward=1.0), 1, 2)  # type: ignore[arg-type]
    assert quiet.getvalue() == ""
    # a new batch counts its passes afresh
    progress(None, 0, 2)
    progress(SimpleNamespace(reward=0.0), 1, 2)  # type: ignore[arg-type]
    assert "rollouts 1/2: 0 passed" in out.getvalue().splitlines()[-1]
