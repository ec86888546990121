"""What an adapter is: how one agent harness is installed, configured and launched."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from clawrl.harness.sandbox import Limits, Sandbox


@dataclass(frozen=True)
class RolloutContext:
    """What an adapter needs to launch one rollout.

    Attributes:
        rollout_id: the rollout's id; also its gateway session (``/s/{rollout_id}/...``).
        model: the model name the harness should send.
        instruction: the task instruction.
        time_limit_s: the task's wall-clock limit.
        options: the task's ``[harness]`` table merged with the run's options.
    """

    rollout_id: str
    model: str
    instruction: str
    time_limit_s: float
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class Launch:
    """A prepared harness command: argv, extra environment, limits, read-only paths."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    limits: Limits = field(default_factory=Limits)
    read_only: list[str] = field(default_factory=list)


class Adapter(Protocol):
    """One harness. ``missing()`` says why it cannot run here (None: installed)."""

    name: str

    def missing(self) -> str | None: ...

    def prepare(self, sandbox: Sandbox, ctx: RolloutContext) -> Launch: ...


def session_base(sandbox: Sandbox, ctx: RolloutContext) -> str:
    """``http://HOST:PORT/s/{rollout_id}``: the per-rollout gateway prefix seen inside."""
    return f"{sandbox.gateway_base()}/s/{ctx.rollout_id}"


def install_root(program: str) -> list[str]:
    """Host dirs a program needs read-only: its resolved install tree (and node's, if any)."""
    roots: list[str] = []
    for name in (program, "node"):
        exe = shutil.which(name)
        if exe is None:
            continue
        for path in (Path(exe), Path(exe).resolve()):
            roots.append(str(path.parent.parent))
    return sorted(set(roots))


def write_text(path: Path, text: str) -> None:
    """Write a config file, creating its parents (inside the sandbox HOME)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.chmod(path, 0o600)
