"""Adapters for external harnesses, each configured through its own config files and environment.

Each one checks that its program is on ``PATH`` (``missing()`` names the install command when
not), writes its config into the sandbox's HOME, and points the harness at the per-rollout
gateway prefix ``/s/{rollout_id}`` so attribution is exact whatever the harness sends. Node
harnesses reserve large virtual memory, so they run without an address-space limit.

Only the ``/v1/chat/completions`` harnesses (mini-swe-agent, Qwen Code, OpenClaw, opencode) work
with the chat route alone; Claude Code needs the gateway's Anthropic route and Codex its
Responses route.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from clawrl.harness.adapters.base import (
    Launch,
    RolloutContext,
    install_root,
    session_base,
    write_text,
)
from clawrl.harness.sandbox import Limits, Sandbox

MINI_SWE_AGENT_ENV = "CLAWRL_MINI_SWE_AGENT"
"""Path of the ``mini`` executable (e.g. in its own venv) when it is not on ``PATH``."""


def _limits(ctx: RolloutContext) -> Limits:
    return Limits(
        time_s=ctx.time_limit_s, cpu_s=max(60, int(ctx.time_limit_s * 2)), memory_bytes=None
    )


@dataclass
class ExternalAdapter:
    """Shared part: the program name and how to install it."""

    name: str
    program: str
    install: str

    def executable(self) -> str | None:
        """The program's path, or None."""
        return shutil.which(self.program)

    def missing(self) -> str | None:
        if self.executable() is None:
            return f"{self.name}: '{self.program}' is not installed (install: {self.install})"
        return None

    def _launch(self, argv: list[str], env: dict[str, str], ctx: RolloutContext) -> Launch:
        return Launch(argv, env, _limits(ctx), install_root(self.program))


HARNESS_MAX_TOKENS = 1024
"""The completion budget clawrl configures a harness to ask for, where the harness has a setting:
prompt plus budget must fit the policy's context, or the gateway answers 400 like OpenAI and
Anthropic (``sampling.max_tokens_beyond_context = "clamp"`` generates what fits instead)."""


class ClaudeCodeAdapter(ExternalAdapter):
    """Claude Code: Anthropic Messages at ``ANTHROPIC_BASE_URL`` (the gateway's prefix)."""

    def __init__(self) -> None:
        super().__init__("claude-code", "claude", "npm i -g @anthropic-ai/claude-code")

    def prepare(self, sandbox: Sandbox, ctx: RolloutContext) -> Launch:
        write_text(sandbox.home / ".claude.json", json.dumps({"hasCompletedOnboarding": True}))
        env = {
            "ANTHROPIC_BASE_URL": session_base(sandbox, ctx),
            "ANTHROPIC_API_KEY": "x",
            "ANTHROPIC_MODEL": ctx.model,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_TELEMETRY": "1",
            # its default budget (32000) exceeds a small policy's context with any prompt: the
            # gateway refuses such calls like Anthropic does (sampling.max_tokens_beyond_context)
            "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(HARNESS_MAX_TOKENS),
        }
        argv = [self.program, "-p", ctx.instruction, "--allowedTools", "Bash"]
        return self._launch(argv, env, ctx)


class CodexAdapter(ExternalAdapter):
    """Codex CLI: OpenAI Responses via a ``local`` provider in ``$CODEX_HOME/config.toml``."""

    def __init__(self) -> None:
        super().__init__("codex", "codex", "npm i -g @openai/codex")

    def prepare(self, sandbox: Sandbox, ctx: RolloutContext) -> Launch:
        config = (
            f'model = "{ctx.model}"\nmodel_provider = "local"\n\n[model_providers.local]\n'
            f'name = "clawrl"\nbase_url = "{session_base(sandbox, ctx)}/v1"\n'
            'wire_api = "responses"\nenv_key = "LOCAL_API_KEY"\n'
        )
        write_text(sandbox.home / ".codex" / "config.toml", config)
        env = {"CODEX_HOME": f"{sandbox.inner_home}/.codex", "LOCAL_API_KEY": "x"}
        argv = [self.program, "exec", "--skip-git-repo-check", "-s", "workspace-write"]
        return self._launch([*argv, ctx.instruction], env, ctx)


class QwenCodeAdapter(ExternalAdapter):
    """Qwen Code: chat completions at ``OPENAI_BASE_URL``."""

    def __init__(self) -> None:
        super().__init__("qwen-code", "qwen", "npm i -g @qwen-code/qwen-code")

    def prepare(self, sandbox: Sandbox, ctx: RolloutContext) -> Launch:
        env = {
            "OPENAI_BASE_URL": f"{session_base(sandbox, ctx)}/v1",
            "OPENAI_API_KEY": "x",
            "OPENAI_MODEL": ctx.model,
            # else min(model limit, 32000) for a model it does not know (its applyOutputTokenLimit)
            "QWEN_CODE_MAX_OUTPUT_TOKENS": str(HARNESS_MAX_TOKENS),
        }
        argv = [self.program, "--auth-type", "openai", "--yolo", ctx.instruction]
        return self._launch(argv, env, ctx)


class OpenClawAdapter(ExternalAdapter):
    """OpenClaw: a JSON config with a ``local`` openai-completions provider."""

    def __init__(self) -> None:
        super().__init__("openclaw", "openclaw", "npm i -g openclaw (Node >= 24.16)")

    def prepare(self, sandbox: Sandbox, ctx: RolloutContext) -> Launch:
        provider = {
            "baseUrl": f"{session_base(sandbox, ctx)}/v1",
            "apiKey": "x",
            "api": "openai-completions",
            "models": [{"id": ctx.model, "maxTokens": HARNESS_MAX_TOKENS}],
        }
        config = {"models": {"providers": {"local": provider}}}
        write_text(sandbox.home / ".openclaw" / "openclaw.json", json.dumps(config, indent=2))
        path = f"{sandbox.inner_home}/.openclaw/openclaw.json"
        argv = [self.program, "agent", "exec", ctx.instruction, "--config", path]
        argv += ["--cwd", sandbox.inner_work, "--model", f"local/{ctx.model}", "--json"]
        return self._launch(argv, {"OPENCLAW_CONFIG_PATH": path}, ctx)


class OpencodeAdapter(ExternalAdapter):
    """opencode: an ``@ai-sdk/openai-compatible`` provider in ``$XDG_CONFIG_HOME``."""

    def __init__(self) -> None:
        super().__init__("opencode", "opencode", "npm i -g opencode-ai")

    def prepare(self, sandbox: Sandbox, ctx: RolloutContext) -> Launch:
        config = {
            "$schema": "https://opencode.ai/config.json",
            "provider": {
                "local": {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": "clawrl",
                    "options": {"baseURL": f"{session_base(sandbox, ctx)}/v1", "apiKey": "x"},
                    "models": {ctx.model: {"name": ctx.model}},
                }
            },
        }
        write_text(sandbox.home / ".config" / "opencode" / "opencode.json", json.dumps(config))
        env = {
            "XDG_CONFIG_HOME": f"{sandbox.inner_home}/.config",
            # else 32000 for a model without a configured limit
            "OPENCODE_EXPERIMENTAL_OUTPUT_TOKEN_MAX": str(HARNESS_MAX_TOKENS),
        }
        argv = [self.program, "run", "-m", f"local/{ctx.model}", "--auto", ctx.instruction]
        return self._launch(argv, env, ctx)


class MiniSweAgentAdapter(ExternalAdapter):
    """mini-swe-agent: chat completions via litellm (``-c model.model_kwargs.api_base=...``).

    Looks for ``mini`` at ``$CLAWRL_MINI_SWE_AGENT`` first, then on ``PATH``; install it in its
    own venv (``python -m venv V && V/bin/pip install mini-swe-agent``). Option ``step_limit``
    (default 4) caps its model calls.
    """

    def __init__(self) -> None:
        super().__init__("mini-swe-agent", "mini", "pip install mini-swe-agent (own venv)")

    def executable(self) -> str | None:
        env = os.environ.get(MINI_SWE_AGENT_ENV)
        if env:
            return env if os.access(env, os.X_OK) else None
        return shutil.which(self.program)

    def prepare(self, sandbox: Sandbox, ctx: RolloutContext) -> Launch:
        exe = self.executable() or self.program
        venv = str(Path(exe).absolute().parent.parent)
        base = f"{session_base(sandbox, ctx)}/v1"
        argv = [exe, "-m", f"openai/{ctx.model}", "-t", ctx.instruction, "--yolo"]
        argv += [
            "--exit-immediately",
            "-c",
            "mini.yaml",
            "-c",
            f"model.model_kwargs.api_base={base}",
        ]
        argv += ["-c", "model.model_kwargs.api_key=x"]
        argv += ["-c", f"agent.step_limit={int(ctx.options.get('step_limit', 4))}"]
        argv += ["-c", "model.model_kwargs.max_tokens=192"]
        env = {
            "MSWEA_CONFIGURED": "true",
            "MSWEA_COST_TRACKING": "ignore_errors",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        }
        launch = self._launch(argv, env, ctx)
        launch.read_only = sorted({*launch.read_only, venv, *install_root("python3")})
        return launch


MINI_TEXT_CONFIG = r"""# clawrl's templates for mini-swe-agent's text-based mode (mini_textbased.yaml), written for
# small models: one short instruction, one worked example, the task. The action is the first
# ```bash block; the example shows the submit command that ends the run.
agent:
  system_template: |
    You are a shell agent in a Linux directory. Reply with one shell command in a ```bash block.
    When the task is done, reply with echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT in a ```bash block.
  instance_template: |
    Example task: Create a file named x.txt containing the word cat.
    Example reply:
    ```bash
    echo cat > x.txt
    ```
    Example output:
    (exit code 0)
    Example reply:
    ```bash
    echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT
    ```

    Task: {{task}}
model:
  model_class: litellm_textbased
  action_regex: '```(?:bash|sh|shell|console)?[ \t]*\n(?!```)(.+?)\n?```'
  observation_template: |
    Output:
    {% if output.exception_info %}{{ output.exception_info }}
    {% endif %}{{ output.output[-1500:] | trim }}
    (exit code {{ output.returncode }})
  format_error_template: |
    Reply with one shell command in a ```bash block.
"""
"""The config :class:`MiniSweAgentTextAdapter` merges over ``mini_textbased.yaml``."""


class MiniSweAgentTextAdapter(MiniSweAgentAdapter):
    """mini-swe-agent, unmodified, in its text-based mode (``mini_textbased.yaml``: the action
    is parsed from a code block instead of a tool call) with :data:`MINI_TEXT_CONFIG`'s short
    templates: the format the embedded model can produce (its default tool-call format the
    135M model never produces). Option ``step_limit`` (default 4) caps its model calls.
    """

    def __init__(self) -> None:
        super().__init__()
        self.name = "mini-swe-agent-text"

    def prepare(self, sandbox: Sandbox, ctx: RolloutContext) -> Launch:
        launch = super().prepare(sandbox, ctx)
        write_text(sandbox.home / "clawrl-mini-text.yaml", MINI_TEXT_CONFIG)
        config = f"{sandbox.inner_home}/clawrl-mini-text.yaml"
        at = launch.argv.index("mini.yaml")
        launch.argv[at : at + 1] = ["mini_textbased.yaml", "-c", config]
        return launch
