"""The load script at CI size: 16 concurrent streaming clients for 1 minute on the tiny model,
zero errors, every acknowledged call recorded (the full size, 64 clients for 5 minutes on the
embedded model, is ``benchmarks/load_gateway.py``'s default)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "load_gateway.py"


def test_sixteen_streaming_clients_for_a_minute_lose_nothing(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("load_gateway", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    out = tmp_path / "load.json"
    rc = module.main(["--clients", "16", "--duration", "60", "--baseline-s", "5",
                      "--model", "tiny", "--max-tokens", "16", "--json", str(out)])  # fmt: skip
    printed = capsys.readouterr().out
    assert rc == 0, printed
    numbers = json.loads(out.read_text())
    assert numbers["errors"] == 0 and numbers["missing"] == 0, printed
    assert numbers["calls"] >= 16 and numbers["acknowledged"] >= numbers["calls"], printed
    assert "recorded:" in printed and "100.0 %" in printed
