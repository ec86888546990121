"""Harness tests find the mini-swe-agent that ``make test`` installs into ``.harnesses/``
(``scripts/install_harnesses.sh``) before any module asks whether it is installed."""

from __future__ import annotations

import os
from pathlib import Path

_LOCAL_MINI = Path(__file__).resolve().parents[2] / ".harnesses" / "bin" / "mini"
if _LOCAL_MINI.exists():
    os.environ.setdefault("CLAWRL_MINI_SWE_AGENT", str(_LOCAL_MINI))
