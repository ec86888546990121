"""clawrl.chat stays below the engine in the dependency order (DESIGN.md)."""

from __future__ import annotations

import subprocess
import sys


def test_chat_does_not_import_engine_or_torch():
    code = (
        "import sys, clawrl.chat\n"
        "bad = [m for m in sys.modules if m.startswith(('clawrl.engine', 'torch', 'transformers'))]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
