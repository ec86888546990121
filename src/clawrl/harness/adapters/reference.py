"""The ``reference`` adapter: clawrl's own terminal agent (:mod:`.reference_agent`)."""

from __future__ import annotations

import sys
from pathlib import Path

from clawrl.harness.adapters.base import Launch, RolloutContext, session_base
from clawrl.harness.sandbox import Limits, Sandbox

AGENT_SCRIPT = Path(__file__).with_name("reference_agent.py")


class ReferenceAdapter:
    """Runs ``reference_agent.py`` with the venv's Python; always installed.

    Options (task ``[harness]`` table or run options): ``max_steps`` (2), ``temperature`` (0.7),
    ``max_tokens`` (64), ``tools`` (false; true declares the ``shell`` tool), ``few_shot`` (true).
    """

    name = "reference"

    def missing(self) -> str | None:
        return None

    def prepare(self, sandbox: Sandbox, ctx: RolloutContext) -> Launch:
        o = ctx.options
        env = {
            "CLAWRL_BASE_URL": f"{session_base(sandbox, ctx)}/v1",
            "CLAWRL_MODEL": ctx.model,
            "CLAWRL_INSTRUCTION": ctx.instruction,
            "CLAWRL_MAX_STEPS": str(int(o.get("max_steps", 2))),
            "CLAWRL_TEMPERATURE": str(float(o.get("temperature", 0.7))),
            "CLAWRL_MAX_TOKENS": str(int(o.get("max_tokens", 64))),
            "CLAWRL_TOOLS": "1" if o.get("tools", False) else "0",
            "CLAWRL_FEW_SHOT": "1" if o.get("few_shot", True) else "0",
        }
        argv = [sys.executable, "-I", sandbox.script_path(AGENT_SCRIPT)]
        return Launch(argv, env, Limits(time_s=ctx.time_limit_s, memory_bytes=2 << 30))
