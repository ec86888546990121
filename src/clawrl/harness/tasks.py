"""The task format: one folder per task.

```
my-task/
  task.toml     id, instruction, time_limit_s, split, [harness] options
  files/        optional starting files, copied into every rollout's fresh work dir
  verify        executable; runs in the finished work dir, prints JSON {"reward": r, ...}
```

``task.toml``::

    id = "count-lines-03"             # defaults to the folder name
    instruction = "Write the number of lines of data.txt into count.txt."
    time_limit_s = 60                 # wall-clock limit of one rollout
    split = "train"                   # or "heldout"
    [harness]                         # options every adapter may read, e.g.
    max_steps = 4                     # the reference agent's step limit

The harness never sees ``task.toml`` or ``verify``: only ``files/`` is copied into the sandbox.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clawrl.errors import ConfigError

BUILTIN_TASKS = Path(__file__).with_name("tasks")
"""The built-in suite shipped with clawrl (``clawrl harness ... --tasks builtin``)."""


@dataclass(frozen=True)
class Task:
    """One task.

    Attributes:
        id: unique task id.
        instruction: what the harness is asked to do (its first user message).
        time_limit_s: wall-clock limit of one rollout (harness run), seconds.
        split: ``train`` or ``heldout``.
        path: the task folder.
        options: the ``[harness]`` table.
    """

    id: str
    instruction: str
    time_limit_s: float
    split: str
    path: Path
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def files(self) -> Path:
        """The starting files (may not exist)."""
        return self.path / "files"

    @property
    def verifier(self) -> Path:
        """The verifier executable."""
        return self.path / "verify"


def load_task(path: str | Path) -> Task:
    """Load one task folder.

    Raises:
        ConfigError: no or invalid ``task.toml``, no instruction, bad split, or no executable
            ``verify``.
    """
    path = Path(path)
    try:
        data = tomllib.loads((path / "task.toml").read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"task {path}: cannot read task.toml: {e}") from e
    instruction = str(data.get("instruction", "")).strip()
    if not instruction:
        raise ConfigError(f"task {path}: task.toml has no instruction")
    split = str(data.get("split", "train"))
    if split not in ("train", "heldout"):
        raise ConfigError(f"task {path}: split must be 'train' or 'heldout', got {split!r}")
    time_limit = float(data.get("time_limit_s", 60))
    if time_limit <= 0:
        raise ConfigError(f"task {path}: time_limit_s must be > 0")
    verifier = path / "verify"
    if not (verifier.is_file() and os.access(verifier, os.X_OK)):
        raise ConfigError(f"task {path}: no executable 'verify'")
    options = data.get("harness", {})
    if not isinstance(options, dict):
        raise ConfigError(f"task {path}: [harness] must be a table")
    return Task(str(data.get("id", path.name)), instruction, time_limit, split, path, options)


def resolve_tasks_dir(spec: str | Path) -> Path:
    """``builtin`` -> the shipped suite; anything else is a directory path."""
    return BUILTIN_TASKS if str(spec) == "builtin" else Path(spec)


def load_tasks(root: str | Path, *, split: str | None = None) -> list[Task]:
    """Every task folder (one holding ``task.toml``) under ``root``, sorted by id.

    Args:
        root: a suite directory, ``builtin``, or a single task folder.
        split: keep only ``train`` or ``heldout`` tasks; None keeps all.

    Raises:
        ConfigError: a task is invalid, two tasks share an id, or nothing was found.
    """
    root = resolve_tasks_dir(root)
    if not root.is_dir():
        raise ConfigError(
            f"--tasks {root}: no such directory (give a task suite directory, whose task folders "
            "hold task.toml and an executable verify, or 'builtin')"
        )
    folders = (
        [root]
        if (root / "task.toml").is_file()
        else sorted(p.parent for p in root.rglob("task.toml"))
    )
    tasks = [load_task(p) for p in folders]
    ids = [t.id for t in tasks]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise ConfigError(f"duplicate task ids under {root}: {dupes}")
    if split is not None:
        tasks = [t for t in tasks if t.split == split]
    if not tasks:
        raise ConfigError(f"no tasks under {root}" + (f" with split {split!r}" if split else ""))
    return sorted(tasks, key=lambda t: t.id)
