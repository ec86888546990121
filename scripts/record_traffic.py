#!/usr/bin/env python
"""Record real harness traffic into fixtures for the replay tests (tests/trajectory/test_traffic.py).

Each scenario runs one installed harness against a live gateway on a scripted engine that
answers by rules (clawrl.testing.traffic.rule_reply), records every HTTP exchange, scrubs the
run's directories and the host name, and writes ``tests/fixtures/traffic/HARNESS-SCENARIO.json.gz``.
The harnesses come from scripts/install_harnesses.sh; aider, which the e2e tests do not use,
from its own venv::

    python3 -m venv .harnesses/aider-venv
    .harnesses/aider-venv/bin/pip install aider-chat==0.86.2

    .venv/bin/python scripts/record_traffic.py --list
    .venv/bin/python scripts/record_traffic.py claude-subagents qwen-continue
    .venv/bin/python scripts/record_traffic.py all

Not part of the test suite: the harnesses' behaviour is what is being recorded, so a recording is
made deliberately (after a harness version bump) and committed; CI replays the committed files.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BIN = Path(os.environ.get("CLAWRL_HARNESS_BIN", REPO / ".harnesses" / "bin"))
AIDER = REPO / ".harnesses" / "aider-venv" / "bin" / "aider"
OUT = REPO / "tests" / "fixtures" / "traffic"
MARK = "clawrl-rec-task"
MARK2 = "clawrl-rec-second"
SUB = "clawrl-rec-subtask"


def call(name: str, args: dict[str, Any]) -> list[Any]:
    return [name, args]


def touch(work: Path, name: str) -> str:
    return f"echo rec > {work / name} && echo wrote-{name}"


@dataclass
class Ctx:
    work: Path
    home: Path
    url: str
    env: dict[str, str] = field(default_factory=dict)

    def run(
        self, argv: list[str], extra: dict[str, str] | None = None, timeout: float = 240
    ) -> str:
        env = {
            "PATH": f"{BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "HOME": str(self.home),
            "LANG": "C.UTF-8",
            "TERM": "dumb",
            "NO_COLOR": "1",
            **self.env,
            **(extra or {}),
        }
        started = time.monotonic()
        proc = subprocess.run(
            argv,
            cwd=self.work,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        out = proc.stdout + proc.stderr
        print(
            f"  {Path(argv[0]).name} {' '.join(argv[1:3])}: exit {proc.returncode}, "
            f"{time.monotonic() - started:.1f} s"
        )
        if proc.returncode != 0:
            print(out[-3000:])
        return out


@dataclass
class Scenario:
    harness: str
    name: str
    description: str
    script: Callable[[Ctx], list[dict[str, Any]]]
    drive: Callable[[Ctx], None]
    expect: dict[str, Any] = field(default_factory=dict)
    version_argv: list[str] = field(default_factory=list)


def claude_env(ctx: Ctx) -> dict[str, str]:
    return {
        "ANTHROPIC_BASE_URL": ctx.url,
        "ANTHROPIC_API_KEY": "x",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
    }


def bash(ctx: Ctx, name: str) -> list[Any]:
    return call("Bash", {"command": touch(ctx.work, name), "description": "Create the file"})


def simple_rules(first: list[list[Any]], final: str = "Done.") -> list[dict[str, Any]]:
    return [
        {"if": {"tools": False}, "reply": "OK."},
        {"if": {"tool_result": True}, "reply": final},
        {"if": {"last_user_contains": MARK}, "reply": {"calls": first}},
    ]


FAIL_FIRST = {
    "if": {"last_user_contains": MARK, "tool_result": False},
    "reply": {"error": "engine"},
    "times": 1,
}
"""The first call that holds the task answers 500 (the harness retries it)."""


def fail_first(rules: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [FAIL_FIRST, *rules]


def task(text: str = "Create the file with a shell command") -> str:
    return f"{text} ({MARK})."


# --- Claude Code ------------------------------------------------------------------------------


def claude_plain_continue(ctx: Ctx) -> None:
    ctx.run([str(BIN / "claude"), "-p", task(), "--allowedTools", "Bash"], claude_env(ctx))
    ctx.run(
        [str(BIN / "claude"), "-p", f"Thanks, now say hi ({MARK2}).", "--continue"], claude_env(ctx)
    )


def claude_retry(ctx: Ctx) -> None:
    ctx.run([str(BIN / "claude"), "-p", task(), "--allowedTools", "Bash"], claude_env(ctx))


def claude_compact(ctx: Ctx) -> None:
    ctx.run([str(BIN / "claude"), "-p", task(), "--allowedTools", "Bash"], claude_env(ctx))
    ctx.run([str(BIN / "claude"), "-p", "/compact", "--continue"], claude_env(ctx))
    ctx.run([str(BIN / "claude"), "-p", f"Now say hi ({MARK2}).", "--continue"], claude_env(ctx))


def claude_interactive(ctx: Ctx) -> None:
    """Claude Code's TUI in a pseudo-terminal (``script``): the interactive mode names sessions."""
    (ctx.home / ".claude.json").write_text(
        json.dumps(
            {
                "hasCompletedOnboarding": True,
                "lastOnboardingVersion": "2.1.332",
                "customApiKeyResponses": {"approved": ["x"], "rejected": []},
                "projects": {
                    str(ctx.work): {"hasTrustDialogAccepted": True, "allowedTools": ["Bash"]}
                },
            }
        )
    )
    keys = f"sleep 8; printf '%s\\r' '{task()}'; sleep 25; printf '/exit\\r'; sleep 3"
    claude = BIN / "claude"
    env = {**claude_env(ctx), "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": ""}
    ctx.run(
        ["bash", "-c", f'({keys}) | script -qfc "{claude} --allowedTools Bash" /dev/null'],
        env,
        timeout=90,
    )


def claude_one(ctx: Ctx) -> None:
    ctx.run(
        [str(BIN / "claude"), "-p", task(), "--allowedTools", "Bash,Task,Agent"], claude_env(ctx)
    )


def claude_subagent_rules(ctx: Ctx) -> list[dict[str, Any]]:
    spawn = {
        "description": "Make a file",
        "prompt": f"Create a file ({SUB}).",
        "subagent_type": "general-purpose",
    }
    return [
        {"if": {"tools": False}, "reply": "OK."},
        {
            "if": {"tool_result": True, "prompt_contains": SUB, "prompt_lacks": MARK},
            "reply": "Subtask done.",
        },
        {
            "if": {"last_user_contains": SUB, "tool_result": False},
            "reply": {"calls": [bash(ctx, "sub.txt")]},
        },
        {"if": {"tool_result": True}, "reply": "Both subagents finished."},
        {
            "if": {"last_user_contains": MARK},
            "reply": {"calls": [call("Agent", spawn), call("Agent", spawn)]},
        },
    ]


# --- Codex ------------------------------------------------------------------------------------


def codex_setup(ctx: Ctx) -> None:
    home = ctx.home / ".codex"
    home.mkdir(exist_ok=True)
    (home / "config.toml").write_text(
        'model = "tiny"\nmodel_provider = "local"\n[model_providers.local]\nname = "local"\n'
        f'base_url = "{ctx.url}/v1"\nwire_api = "responses"\nenv_key = "LOCAL_API_KEY"\n'
    )
    ctx.env.update({"CODEX_HOME": str(home), "LOCAL_API_KEY": "x"})


def codex_resume(ctx: Ctx) -> None:
    if "CODEX_HOME" not in ctx.env:
        codex_setup(ctx)
    base = [str(BIN / "codex"), "exec", "--skip-git-repo-check", "-s", "danger-full-access"]
    ctx.run([*base, task()])
    ctx.run(
        [
            str(BIN / "codex"),
            "exec",
            "--skip-git-repo-check",
            "-s",
            "danger-full-access",
            "resume",
            "--last",
            f"Now say hi ({MARK2}).",
        ]
    )


def codex_compact(ctx: Ctx) -> None:
    """A low auto-compaction limit: the resumed turn compacts the history first."""
    codex_setup(ctx)
    config = Path(ctx.env["CODEX_HOME"]) / "config.toml"
    config.write_text("model_auto_compact_token_limit = 2000\n" + config.read_text())
    codex_resume(ctx)


def codex_retry(ctx: Ctx) -> None:
    codex_setup(ctx)
    ctx.run(
        [str(BIN / "codex"), "exec", "--skip-git-repo-check", "-s", "danger-full-access", task()]
    )


# --- Qwen Code --------------------------------------------------------------------------------


def qwen_env(ctx: Ctx) -> dict[str, str]:
    return {
        "OPENAI_BASE_URL": f"{ctx.url}/v1",
        "OPENAI_API_KEY": "x",
        "OPENAI_MODEL": "tiny",
        "QWEN_CODE_SUPPRESS_YOLO_WARNING": "1",
    }


def qwen_continue(ctx: Ctx) -> None:
    (ctx.work / "notes.md").write_text("first\n")
    q = [str(BIN / "qwen"), "--auth-type", "openai", "--yolo"]
    ctx.run([*q, task()], qwen_env(ctx))
    (ctx.work / "more.md").write_text("the directory listing changes\n")
    ctx.run([*q, "--continue", f"Now say hi ({MARK2})."], qwen_env(ctx))


# --- mini-swe-agent ---------------------------------------------------------------------------


def mini_rules(ctx: Ctx) -> list[dict[str, Any]]:
    submit = call("bash", {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"})
    return [
        {"if": {"tools": False}, "reply": "OK."},
        {"if": {"tool_result": True}, "reply": {"calls": [submit]}},
        # the first answer has no tool call: mini sends a format error and drops the answer
        {"if": {"last_user_contains": MARK}, "reply": "I will think about it first.", "times": 1},
        {"reply": {"calls": [call("bash", {"command": touch(ctx.work, "mini.txt")})]}},
    ]


def mini_format_error(ctx: Ctx) -> None:
    argv = [str(BIN / "mini"), "-m", "openai/tiny", "-t", task(), "--yolo", "--exit-immediately"]
    argv += ["-c", "mini.yaml", "-c", f"model.model_kwargs.api_base={ctx.url}/v1"]
    argv += ["-c", "model.model_kwargs.api_key=x", "-o", str(ctx.home / "trajectory.json")]
    ctx.run(argv, {"MSWEA_CONFIGURED": "true", "MSWEA_COST_TRACKING": "ignore_errors"})


# --- OpenClaw ---------------------------------------------------------------------------------


def openclaw_config(ctx: Ctx) -> Path:
    config = ctx.home / "openclaw.json"
    provider = {
        "baseUrl": f"{ctx.url}/v1",
        "apiKey": "x",
        "api": "openai-completions",
        "models": [{"id": "tiny", "name": "tiny", "maxTokens": 8192}],
    }
    config.write_text(json.dumps({"models": {"providers": {"clawrl": provider}}}))
    ctx.env["OPENCLAW_CONFIG_PATH"] = str(config)
    return config


def openclaw_retry(ctx: Ctx) -> None:
    config = openclaw_config(ctx)
    argv = [str(BIN / "openclaw"), "agent", "exec", task(), "--config", str(config)]
    argv += ["--cwd", str(ctx.work), "--model", "clawrl/tiny", "--json"]
    ctx.run(argv)


def openclaw_session(ctx: Ctx) -> None:
    openclaw_config(ctx)
    base = [str(BIN / "openclaw"), "agent", "--local", "--session-id", "rec-oc-1"]
    ctx.run([*base, "-m", task(), "--model", "clawrl/tiny"])
    ctx.run([*base, "-m", f"Now say hi ({MARK2}).", "--model", "clawrl/tiny"])


# --- opencode ---------------------------------------------------------------------------------


def opencode_plain(ctx: Ctx) -> None:
    config = ctx.home / ".config" / "opencode"
    config.mkdir(parents=True)
    provider = {
        "npm": "@ai-sdk/openai-compatible",
        "name": "clawrl",
        "options": {"baseURL": f"{ctx.url}/v1", "apiKey": "x"},
        "models": {"tiny": {"name": "tiny"}},
    }
    (config / "opencode.json").write_text(json.dumps({"provider": {"clawrl": provider}}))
    ctx.run(
        [str(BIN / "opencode"), "run", "-m", "clawrl/tiny", "--auto", task()],
        {
            "XDG_CONFIG_HOME": str(ctx.home / ".config"),
            "XDG_DATA_HOME": str(ctx.home / ".local" / "share"),
            "XDG_CACHE_HOME": str(ctx.home / ".cache"),
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
        },
    )


# --- aider ------------------------------------------------------------------------------------


def aider_rules(ctx: Ctx) -> list[dict[str, Any]]:
    edit = "hello.py\n```python\n<<<<<<< SEARCH\nprint('hi')\n=======\nprint('hello')\n>>>>>>> REPLACE\n```\n"
    return [
        {"if": {"prompt_contains": "one-line Git commit messages"}, "reply": "feat: say hello"},
        {"if": {"last_user_contains": MARK}, "reply": edit},
        {"reply": "Fixed."},
    ]


def aider_commit(ctx: Ctx) -> None:
    (ctx.work / "hello.py").write_text("print('hi')\n")
    for argv in (
        ["git", "init", "-q"],
        ["git", "add", "."],
        ["git", "-c", "user.name=r", "-c", "user.email=r@x", "commit", "-qm", "init"],
    ):
        subprocess.run(argv, cwd=ctx.work, check=True, env={**os.environ, "HOME": str(ctx.home)})
    ctx.run(
        [
            str(AIDER),
            "--model",
            "openai/tiny",
            "--openai-api-base",
            f"{ctx.url}/v1",
            "--openai-api-key",
            "x",
            "--message",
            f"Say hello in hello.py ({MARK})",
            "--yes-always",
            "--no-check-update",
            "--analytics-disable",
            "--no-show-model-warnings",
            "--no-gitignore",
            "--no-pretty",
            "--no-stream",
            "hello.py",
        ],
        {
            "GIT_AUTHOR_NAME": "r",
            "GIT_AUTHOR_EMAIL": "r@x",
            "GIT_COMMITTER_NAME": "r",
            "GIT_COMMITTER_EMAIL": "r@x",
        },
    )


def scenarios() -> dict[str, Scenario]:
    out = [
        Scenario(
            "claude",
            "continue",
            "claude -p with a Bash tool call, then --continue",
            lambda c: simple_rules([bash(c, "a.txt")]),
            claude_plain_continue,
            {"sessions": 1, "segments": 1},
        ),
        Scenario(
            "claude",
            "retry",
            "the first call answers 500 (Claude Code retries it)",
            lambda c: fail_first(
                simple_rules([bash(c, "a.txt")]),
            ),
            claude_retry,
            {"sessions": 1},
        ),
        Scenario(
            "claude",
            "parallel",
            "two Bash calls in one answer",
            lambda c: simple_rules([bash(c, "a.txt"), bash(c, "b.txt")]),
            claude_one,
            {"sessions": 1},
        ),
        Scenario(
            "claude",
            "subagents",
            "two Agent calls with identical prompts, each agent runs Bash",
            claude_subagent_rules,
            claude_one,
            {"sessions": 1, "subagents": 2},
        ),
        Scenario(
            "claude",
            "title",
            "the interactive TUI: one task, its session-title call, /exit",
            lambda c: [
                {
                    "if": {"prompt_contains": "You are naming a coding session"},
                    "reply": '{"title": "File creation"}',
                },
                *simple_rules([bash(c, "a.txt")]),
            ],
            claude_interactive,
            {"sessions": 1},
        ),
        Scenario(
            "claude",
            "compact",
            "a run, /compact, then one more turn",
            lambda c: simple_rules([bash(c, "a.txt")]),
            claude_compact,
            {"sessions": 1},
        ),
        Scenario(
            "codex",
            "resume",
            "codex exec with a tool call, then exec resume --last",
            lambda c: simple_rules([call("exec_command", {"cmd": touch(c.work, "a.txt")})]),
            codex_resume,
            {"sessions": 1},
        ),
        Scenario(
            "codex",
            "compact",
            "exec, then resume with auto-compaction at 2000 tokens",
            lambda c: simple_rules([call("exec_command", {"cmd": touch(c.work, "a.txt")})]),
            codex_compact,
            {"sessions": 1},
        ),
        Scenario(
            "codex",
            "retry",
            "the first call answers 500",
            lambda c: fail_first(
                simple_rules([call("exec_command", {"cmd": touch(c.work, "a.txt")})]),
            ),
            codex_retry,
            {"sessions": 1},
        ),
        Scenario(
            "qwen",
            "continue",
            "a tool call, then --continue after the directory changed",
            lambda c: simple_rules(
                [call("run_shell_command", {"command": touch(c.work, "a.txt")})]
            ),
            qwen_continue,
            {"sessions": 1},
        ),
        Scenario(
            "mini",
            "format-error",
            "the first answer has no tool call (format error)",
            mini_rules,
            mini_format_error,
            {"sessions": 1},
        ),
        Scenario(
            "openclaw",
            "retry",
            "the first call answers 500 (OpenClaw retries, rewriting it)",
            lambda c: fail_first(
                simple_rules([call("exec", {"command": touch(c.work, "a.txt")})]),
            ),
            openclaw_retry,
            {"sessions": 1},
        ),
        Scenario(
            "openclaw",
            "session",
            "two messages in one --session-id",
            lambda c: simple_rules([call("exec", {"command": touch(c.work, "a.txt")})]),
            openclaw_session,
            {"sessions": 1},
        ),
        Scenario(
            "opencode",
            "plain",
            "opencode run with a bash call (and its title call)",
            lambda c: simple_rules(
                [call("bash", {"command": touch(c.work, "a.txt"), "description": "Create"})]
            ),
            opencode_plain,
            {"sessions": 1},
        ),
        Scenario(
            "aider",
            "commit",
            "aider edits hello.py and writes a commit message",
            aider_rules,
            aider_commit,
            {"sessions": 1},
        ),
    ]
    return {f"{s.harness}-{s.name}": s for s in out}


def harness_version(harness: str) -> str:
    prog = AIDER if harness == "aider" else BIN / harness
    try:
        out = subprocess.run(
            [str(prog), "--version"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"},
        )
        return (out.stdout or out.stderr).strip().splitlines()[0][:80]
    except (OSError, IndexError, subprocess.TimeoutExpired):
        return "unknown"


def record(key: str, scenario: Scenario) -> Path:
    from clawrl.engine.scripted import ScriptedEngine
    from clawrl.gateway import create_app
    from clawrl.gateway.server import LiveServer
    from clawrl.models import tiny_policy
    from clawrl.store import Store
    from clawrl.testing.traffic import (
        Exchange,
        Recording,
        TrafficRecorder,
        default_scrubs,
        rule_reply,
        scrub,
    )

    tok = tiny_policy(seed=0).tokenizer
    root = Path(tempfile.mkdtemp(prefix="rec-"))
    try:
        work, home = root / "work", root / "home"
        work.mkdir()
        home.mkdir()
        ctx = Ctx(work, home, "")
        store = Store(root / "store.db")
        rules = scenario.script(ctx)
        engine = ScriptedEngine(tok, reply_fn=rule_reply(tok, rules), max_context=1_000_000)
        recorder = TrafficRecorder(create_app(engine, tok, store, model_name="tiny"))
        server = LiveServer(recorder).start()
        ctx.url = server.url
        print(f"{key}: {scenario.description}")
        try:
            scenario.drive(ctx)
        finally:
            server.stop()
            store.close()
        port = ctx.url.rsplit(":", 1)[-1]
        subs = {
            **default_scrubs(work, home, root),
            f"127.0.0.1:{port}": "127.0.0.1:8000",
            str(REPO): "/repo",
        }
        exchanges = [Exchange.from_json(scrub(e.to_json(), subs)) for e in recorder.exchanges]
        rules = scrub(rules, subs)
        rec = Recording(
            scenario.harness,
            harness_version(scenario.harness),
            scenario.name,
            scenario.description,
            rules,
            exchanges,
            scenario.expect,
        )
        path = OUT / f"{key}.json.gz"
        rec.save(path)
        print(
            f"  {len(exchanges)} exchanges -> {path.relative_to(REPO)} "
            f"({path.stat().st_size // 1024} KiB); statuses "
            f"{sorted({e.status for e in exchanges})}"
        )
        return path
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="scenario keys, or 'all'")
    parser.add_argument("--list", action="store_true", help="list the scenarios")
    args = parser.parse_args()
    table = scenarios()
    if args.list or not args.names:
        for key, s in table.items():
            print(f"{key:22s} {s.description}")
        return 0
    keys = list(table) if args.names == ["all"] else args.names
    for key in keys:
        if key not in table:
            print(f"unknown scenario {key!r}; --list shows them", file=sys.stderr)
            return 2
        record(key, table[key])
    return 0


if __name__ == "__main__":
    sys.exit(main())
