"""Harness adapters by name: ``reference`` plus the external harnesses clawrl drives."""

from __future__ import annotations

from clawrl.errors import HarnessError
from clawrl.harness.adapters.base import Adapter, Launch, RolloutContext
from clawrl.harness.adapters.external import (
    ClaudeCodeAdapter,
    CodexAdapter,
    MiniSweAgentAdapter,
    MiniSweAgentTextAdapter,
    OpenClawAdapter,
    OpencodeAdapter,
    QwenCodeAdapter,
)
from clawrl.harness.adapters.reference import ReferenceAdapter

ADAPTERS: dict[str, type[Adapter]] = {
    "reference": ReferenceAdapter,
    "mini-swe-agent": MiniSweAgentAdapter,
    "mini-swe-agent-text": MiniSweAgentTextAdapter,
    "claude-code": ClaudeCodeAdapter,
    "codex": CodexAdapter,
    "openclaw": OpenClawAdapter,
    "qwen-code": QwenCodeAdapter,
    "opencode": OpencodeAdapter,
}


def get_adapter(name: str, *, require_installed: bool = True) -> Adapter:
    """The adapter called ``name``.

    Raises:
        HarnessError: unknown name, or (``require_installed``) the program is not installed.
    """
    if name not in ADAPTERS:
        raise HarnessError(f"unknown harness {name!r}; known: {', '.join(ADAPTERS)}")
    adapter: Adapter = ADAPTERS[name]()
    if require_installed and (why := adapter.missing()) is not None:
        raise HarnessError(why)
    return adapter


__all__ = ["ADAPTERS", "Adapter", "Launch", "RolloutContext", "get_adapter"]
