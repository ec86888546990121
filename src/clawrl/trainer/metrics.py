"""Per-step metrics: one JSON line per step, plus TensorBoard scalars when it is installed."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class MetricsWriter:
    """Appends ``{"step": n, "time": t, **metrics}`` to ``DIR/metrics.jsonl``.

    TensorBoard event files go to ``DIR/tensorboard`` when ``torch.utils.tensorboard`` (the
    ``tensorboard`` package) imports; otherwise only JSONL is written (said once in the log).
    """

    def __init__(self, directory: str | Path, *, tensorboard: bool = True) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / "metrics.jsonl"
        self._tb: Any = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(self.dir / "tensorboard"))
            except ImportError:
                log.info("tensorboard is not installed: metrics go to %s only", self.path)

    def write(self, step: int, metrics: dict[str, float]) -> None:
        """Record one step's metrics (floats; non-finite values are written as null)."""
        row: dict[str, Any] = {"step": step, "time": time.time()}
        for k, v in metrics.items():
            row[k] = float(v) if v == v and abs(v) != float("inf") else None
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if self._tb is not None:
            for k, v in metrics.items():
                self._tb.add_scalar(k, v, step)
            self._tb.flush()

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All rows of a ``metrics.jsonl`` file (a missing file gives ``[]``)."""
    p = Path(path)
    if not p.is_file():
        return []
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
