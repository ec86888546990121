"""Adapters: the reference agent's command parsing, install checks, configs, per-rollout URLs."""

from __future__ import annotations

import json
import tomllib

import pytest

from clawrl.errors import HarnessError
from clawrl.harness.adapters import ADAPTERS, RolloutContext, get_adapter
from clawrl.harness.adapters.external import ExternalAdapter
from clawrl.harness.adapters.reference_agent import extract_command
from clawrl.harness.sandbox import Isolation, Sandbox


def _call(args: str, name: str = "shell") -> dict:
    return {"id": "c1", "function": {"name": name, "arguments": args}}


@pytest.mark.parametrize(
    ("message", "command"),
    [
        ({"content": "", "tool_calls": [_call('{"command": "ls -l"}')]}, "ls -l"),
        ({"content": "", "tool_calls": [_call('{"command": "ls"}', "other")]}, None),
        ({"content": "", "tool_calls": [_call("not json")]}, None),
        ({"content": "Sure:\n```bash\necho hi > a.txt\n```\nDone"}, "echo hi > a.txt"),
        ({"content": "```\nwc -l < d.txt > c.txt\n```"}, "wc -l < d.txt > c.txt"),
        ({"content": "```sh\nrm x\n"}, "rm x"),  # unterminated fence
        ({"content": "mkdir build"}, "mkdir build"),
        ({"content": "DONE"}, None),
        ({"content": "I cannot do that.\nSorry"}, None),
    ],
)
def test_reference_agent_extracts_commands(message, command):
    assert extract_command(message)[0] == command


def test_missing_programs_are_reported_clearly(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("CLAWRL_MINI_SWE_AGENT", raising=False)
    for name in ADAPTERS:
        if name == "reference":
            assert get_adapter(name).missing() is None
            continue
        with pytest.raises(HarnessError, match="not installed"):
            get_adapter(name)
    with pytest.raises(HarnessError, match="unknown harness"):
        get_adapter("nope")


CTX = RolloutContext("r123", "smollm2", "Create a.txt", 60.0)


@pytest.mark.parametrize("isolation", [Isolation.FALLBACK, Isolation.BWRAP])
def test_configs_point_at_the_per_rollout_prefix(isolation):
    with Sandbox.create(isolation, gateway=("127.0.0.1", 9)) as box:
        base = f"{box.gateway_base()}/s/r123"
        adapters = {n: get_adapter(n, require_installed=False) for n in ADAPTERS}
        launches = {n: a.prepare(box, CTX) for n, a in adapters.items()}
        assert launches["reference"].env["CLAWRL_BASE_URL"] == f"{base}/v1"
        assert launches["claude-code"].env["ANTHROPIC_BASE_URL"] == base
        assert launches["qwen-code"].env["OPENAI_BASE_URL"] == f"{base}/v1"
        codex = tomllib.loads((box.home / ".codex" / "config.toml").read_text())
        assert codex["model_providers"]["local"]["base_url"] == f"{base}/v1"
        assert codex["model_providers"]["local"]["wire_api"] == "responses"
        claw = json.loads((box.home / ".openclaw" / "openclaw.json").read_text())
        assert claw["models"]["providers"]["local"]["baseUrl"] == f"{base}/v1"
        oc = json.loads((box.home / ".config" / "opencode" / "opencode.json").read_text())
        assert oc["provider"]["local"]["options"]["baseURL"] == f"{base}/v1"
        assert f"model.model_kwargs.api_base={base}/v1" in launches["mini-swe-agent"].argv
        for name, launch in launches.items():
            if isinstance(adapters[name], ExternalAdapter):
                assert launch.limits.memory_bytes is None  # Node reserves large address space
