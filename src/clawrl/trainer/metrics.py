"""Per-step metrics: one JSON line per step, and the sinks the ``[metrics]`` settings choose
(TensorBoard, Weights & Biases). :class:`clawrl.trainer.learner.Learner` writes each step's row
once, in every mode."""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from clawrl.config import Config, MetricsConfig
from clawrl.errors import ConfigError

log = logging.getLogger(__name__)


class MetricsWriter:
    """Appends ``{"step": n, "time": t, **metrics}`` to ``DIR/metrics.jsonl``, and logs the same
    numbers to TensorBoard (``DIR/tensorboard``) and W&B when asked.

    Args:
        directory: the run's output directory.
        tensorboard: also write TensorBoard event files (skipped, said once in the log, when
            ``torch.utils.tensorboard`` does not import).
        wandb: the W&B settings (``None``: no W&B run); the run's config is ``run_config``.
        run_config: what W&B records as the run's config (the whole :class:`Config`).

    Raises:
        ConfigError: W&B is asked for but ``wandb`` is not installed, or its run does not start
            (not logged in, no network); the message says how to fix it.
    """

    def __init__(
        self,
        directory: str | Path,
        *,
        tensorboard: bool = True,
        wandb: MetricsConfig | None = None,
        run_config: Mapping[str, Any] | None = None,
    ) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / "metrics.jsonl"
        self._tb: Any = None
        self._wandb: Any = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(self.dir / "tensorboard"))
            except ImportError:
                log.info("tensorboard is not installed: metrics go to %s only", self.path)
        if wandb is not None and wandb.wandb:
            self._wandb = _start_wandb(self.dir, wandb, dict(run_config or {}))

    @classmethod
    def from_config(cls, directory: str | Path, config: Config) -> MetricsWriter:
        """The sinks ``config.metrics`` chooses, for a run writing into ``directory``; W&B
        records ``config`` as the run's config.

        Raises:
            ConfigError: as the constructor.
        """
        mc = config.metrics
        return cls(
            directory,
            tensorboard=mc.tensorboard,
            wandb=mc if mc.wandb else None,
            run_config=config.model_dump(mode="json"),
        )

    @property
    def wandb_run(self) -> Any:
        """The W&B run (``None`` without one)."""
        return self._wandb

    def write(self, step: int, metrics: Mapping[str, float]) -> None:
        """Record one step's metrics (floats; non-finite values are written as null in JSONL
        and left out of TensorBoard and W&B)."""
        row: dict[str, Any] = {"step": step, "time": time.time()}
        finite = {k: float(v) for k, v in metrics.items() if math.isfinite(float(v))}
        for k in metrics:
            row[k] = finite.get(k)
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if self._tb is not None:
            for k, v in finite.items():
                self._tb.add_scalar(k, v, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(finite, step=step)

    def close(self) -> None:
        """Close the sinks (the W&B run is finished); closing twice is harmless."""
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            run, self._wandb = self._wandb, None
            run.finish()


WANDB_ID_FILE = "wandb_run_id"
"""In a training run's directory: its W&B run id, so that a resumed run logs into that run."""


def _start_wandb(directory: Path, mc: MetricsConfig, run_config: dict[str, Any]) -> Any:
    """A W&B run for the training run writing into ``directory``.

    Raises:
        ConfigError: ``wandb`` is missing, or the run did not start.
    """
    try:
        import wandb
    except ImportError as e:
        raise ConfigError(
            "metrics.wandb needs the wandb package: pip install 'clawrl[wandb]' (or wandb), "
            "or set metrics.wandb = false"
        ) from e
    # a training run resumed into the same directory goes on in the same W&B run
    id_file = directory / WANDB_ID_FILE
    run_id = (id_file.read_text().strip() or None) if id_file.is_file() else None
    try:
        run = wandb.init(
            project=mc.wandb_project,
            entity=mc.wandb_entity,
            name=mc.wandb_run_name or directory.resolve().name,
            config=run_config,
            dir=str(directory),
            mode=mc.wandb_mode,
            id=run_id,
            resume="allow" if run_id else None,
            reinit="create_new",  # the demo's parallel runs each log a run of their own
        )
    except Exception as e:  # wandb raises its own errors (not logged in, no network, ...)
        raise ConfigError(
            f"W&B could not start a run ({type(e).__name__}: {e}); log in with `wandb login`, "
            'or set metrics.wandb_mode = "offline" (upload later with `wandb sync`)'
        ) from e
    if run_id is None:
        id_file.write_text(run.id)
    return run


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All rows of a ``metrics.jsonl`` file (a missing file gives ``[]``)."""
    p = Path(path)
    if not p.is_file():
        return []
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
