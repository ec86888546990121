"""The crash campaign at CI size: `clawrl serve --method combine` killed with SIGKILL 5 times at
random points and restarted; every acknowledged turn intact, no sample trained twice or lost,
versions monotonic, the run continues (benchmarks/crash_campaign.py; the full size is 20)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "crash_campaign.py"


def test_five_kills_lose_nothing(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("crash_campaign", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    rc = module.main(["--kills", "5", "--max-s", "8", "--final-s", "10", "--dir", str(tmp_path)])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    result = json.loads((tmp_path / "campaign.json").read_text())
    assert result["kills"] == 5 and result["failures"] == []
    assert result["acknowledged"] > 0 and result["steps"] > 0, printed
