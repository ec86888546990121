"""Six real agent harnesses, unmodified, complete a scripted task through the gateway.

Each test points one harness (installed by ``scripts/install_harnesses.sh``) at a live gateway
on a scripted engine, asks it to create a file with a shell command, and checks the run
(``e2e.assert_run``, see conftest): the file exists, no 5xx, one trajectory whose tool call's
next state is the tool's output, retries are siblings, the session attributed as the harness
allows. The commands are the ones ``docs/harnesses.md`` documents.

========  ==========================  ======================  =============================
harness   protocol                    shell tool              session attribution
========  ==========================  ======================  =============================
claude    Anthropic Messages          ``Bash``                ``x-claude-code-session-id``
codex     OpenAI Responses            ``exec_command``        ``session-id`` header
opencode  chat completions            ``bash``                ``x-session-id``
qwen      chat completions            ``run_shell_command``   inferred (prefix)
openclaw  chat completions            ``exec``                ``Runtime: sessionId=`` line
mini      chat completions            ``bash``                inferred (prefix)
========  ==========================  ======================  =============================
"""

from __future__ import annotations

import json

import pytest

from clawrl.store import ApiProtocol, TurnKind

pytestmark = pytest.mark.e2e


def test_claude_code(harness_gateway, e2e):
    claude = e2e.program("claude")
    gw = harness_gateway("Bash", lambda cmd: {"command": cmd, "description": "Create the file"})
    gw.run(
        [str(claude), "-p", e2e.task, "--allowedTools", "Bash"],
        {
            "ANTHROPIC_BASE_URL": gw.url,
            "ANTHROPIC_API_KEY": "x",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_AUTOUPDATER": "1",
        },
    )
    call = e2e.assert_run(gw, "header:x-claude-code-session-id")
    assert call.protocol == ApiProtocol.ANTHROPIC_MESSAGES
    assert "dropped:billing_header" in call.sampling_params["notes"]
    assert all("beta=true" in e.path or e.path.endswith("/v1/messages") for e in gw.app.exchanges)


def test_codex(harness_gateway, e2e):
    codex = e2e.program("codex")
    gw = harness_gateway("exec_command", lambda cmd: {"cmd": cmd})
    codex_home = gw.home / ".codex"
    codex_home.mkdir()
    (codex_home / "config.toml").write_text(
        'model = "tiny"\n'
        'model_provider = "local"\n'
        "[model_providers.local]\n"
        'name = "local"\n'
        f'base_url = "{gw.url}/v1"\n'
        'wire_api = "responses"\n'
        'env_key = "LOCAL_API_KEY"\n'
    )
    # Codex's own sandbox (workspace-write) wraps commands in bubblewrap when /usr/bin/bwrap
    # exists, and then needs its codex-linux-sandbox helper, which the npm package does not put
    # on PATH here ("bwrap: execvp codex-linux-sandbox"): the test is about the gateway, so the
    # harness runs unsandboxed inside the test's temporary work dir.
    gw.run(
        [str(codex), "exec", "--skip-git-repo-check", "-s", "danger-full-access", e2e.task],
        {"CODEX_HOME": str(codex_home), "LOCAL_API_KEY": "x"},
    )
    call = e2e.assert_run(gw, "header:session-id")
    assert call.protocol == ApiProtocol.OPENAI_RESPONSES
    assert "ignored_tool:web_search" in call.sampling_params["notes"]
    assert call.sampling_params["codex_request_kind"] == "turn"


def test_opencode(harness_gateway, e2e):
    opencode = e2e.program("opencode")
    gw = harness_gateway("bash", lambda cmd: {"command": cmd, "description": "Create the file"})
    config = gw.home / ".config" / "opencode"
    config.mkdir(parents=True)
    provider = {
        "npm": "@ai-sdk/openai-compatible",
        "name": "clawrl",
        "options": {"baseURL": f"{gw.url}/v1", "apiKey": "x"},
        "models": {"tiny": {"name": "tiny"}},
    }
    (config / "opencode.json").write_text(json.dumps({"provider": {"clawrl": provider}}))
    gw.run(
        [str(opencode), "run", "-m", "clawrl/tiny", "--auto", e2e.task],
        {
            "XDG_CONFIG_HOME": str(gw.home / ".config"),
            "XDG_DATA_HOME": str(gw.home / ".local" / "share"),
            "XDG_CACHE_HOME": str(gw.home / ".cache"),
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
        },
    )
    call = e2e.assert_run(gw, "header:x-session-id")
    titles = [t for t in gw.turns() if t.side_kind == "title"]
    assert titles and all(t.kind == TurnKind.SIDE for t in titles)
    assert {t.session_id for t in titles} == {call.session_id}


def test_qwen_code(harness_gateway, e2e):
    qwen = e2e.program("qwen")
    gw = harness_gateway("run_shell_command")
    gw.run(
        [str(qwen), "--auth-type", "openai", "--yolo", e2e.task],
        {
            "OPENAI_BASE_URL": f"{gw.url}/v1",
            "OPENAI_API_KEY": "x",
            "OPENAI_MODEL": "tiny",
            "QWEN_CODE_SUPPRESS_YOLO_WARNING": "1",
        },
    )
    e2e.assert_run(gw, "inferred")


def test_openclaw(harness_gateway, e2e):
    openclaw = e2e.program("openclaw")
    gw = harness_gateway("exec")
    config = gw.home / "openclaw.json"
    provider = {
        "baseUrl": f"{gw.url}/v1",
        "apiKey": "x",
        "api": "openai-completions",
        "models": [{"id": "tiny", "name": "tiny", "maxTokens": 8192}],
    }
    config.write_text(json.dumps({"models": {"providers": {"clawrl": provider}}}))
    argv = [str(openclaw), "agent", "exec", e2e.task, "--config", str(config)]
    argv += ["--cwd", str(gw.work), "--model", "clawrl/tiny", "--json"]
    gw.run(argv, {"OPENCLAW_CONFIG_PATH": str(config)})
    call = e2e.assert_run(gw, "body:openclaw_runtime")
    later = [t for t in gw.turns() if t.created_at > call.created_at]
    assert any("dropped_messages" in t.sampling_params for t in later)


def test_mini_swe_agent(harness_gateway, e2e):
    mini = e2e.program("mini")
    submit = e2e.call_text("bash", {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"})
    gw = harness_gateway("bash", final=submit)
    argv = [str(mini), "-m", "openai/tiny", "-t", e2e.task, "--yolo", "--exit-immediately"]
    argv += ["-c", "mini.yaml", "-c", f"model.model_kwargs.api_base={gw.url}/v1"]
    argv += ["-c", "model.model_kwargs.api_key=x", "-o", str(gw.home / "trajectory.json")]
    gw.run(argv, {"MSWEA_CONFIGURED": "true", "MSWEA_COST_TRACKING": "ignore_errors"})
    e2e.assert_run(gw, "inferred")
