"""End-to-end fixtures: real agent harnesses against a live gateway on a scripted engine.

The harnesses are installed by ``scripts/install_harnesses.sh`` into ``.harnesses/bin`` (or the
directory in ``$CLAWRL_HARNESS_BIN``); a test whose program is missing is skipped and says so.

Each test gets a :class:`HarnessGateway`: the real gateway app (every protocol route, the real
chat layer and store) on a :class:`~clawrl.engine.scripted.ScriptedEngine` whose completions
depend on the prompt (:func:`harness_reply`), so the order of side calls does not matter:

* the prompt offers no tools (a title request) or its last user turn is neither the task nor
  a tool result (memory extraction and other side calls): ``OK.``;
* the last user turn holds a tool result: ``final`` (a closing text, or mini-swe-agent's
  submit command);
* the last user turn is the task: ``call`` (the harness's own shell tool, creating a file).

Harness prompts are tens of thousands of tokens: the engine's context window is set far beyond
them (:data:`SCRIPTED_CONTEXT`). Every HTTP exchange is recorded
(:class:`clawrl.testing.traffic.TrafficRecorder`; written to ``requests-N.json.gz`` under the
test's temp dir) so a test can assert "no 5xx" and a failure can be read.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from clawrl.engine.scripted import ScriptedEngine
from clawrl.gateway import create_app
from clawrl.gateway.server import LiveServer
from clawrl.store import Store, TurnKind, TurnRecord, TurnStatus
from clawrl.testing.replies import harness_reply as scripted_harness_reply
from clawrl.testing.replies import tool_call_text
from clawrl.testing.traffic import Recording, TrafficRecorder
from clawrl.trajectory import load_tree
from clawrl.trajectory.next_state import NextStateRole, next_state

REPO = Path(__file__).resolve().parents[2]
HARNESS_BIN = Path(os.environ.get("CLAWRL_HARNESS_BIN", REPO / ".harnesses" / "bin"))
SCRIPTED_CONTEXT = 1_000_000
"""Context window of the scripted engine (tokens): no harness prompt comes near it."""
TASK_MARKER = "clawrl-e2e-task"
"""A word in every task prompt: the scripted engine answers the tool call to the turn that
holds it."""
RUN_TIMEOUT_S = 150


def harness_program(name: str) -> Path:
    """The installed harness program ``name``; skips the test when it is not installed."""
    path = HARNESS_BIN / name
    if not os.access(path, os.X_OK):
        pytest.skip(
            f"{name} is not installed in {HARNESS_BIN}: run scripts/install_harnesses.sh "
            "(or set CLAWRL_HARNESS_BIN)"
        )
    return path


def call_text(name: str, arguments: dict[str, Any], content: str | None = None) -> str:
    """The exact text the policy would write for a tool call (what history renders back)."""
    return tool_call_text(name, arguments, content)


def harness_reply(tokenizer: Any, call: str, final: str):
    """The scripted engine's ``reply_fn`` (module docstring)."""
    return scripted_harness_reply(tokenizer, call, final, TASK_MARKER)


@dataclass
class HarnessGateway:
    """A live gateway for one harness run, and what the test inspects afterwards."""

    server: LiveServer
    store: Store
    engine: ScriptedEngine
    app: TrafficRecorder
    work: Path
    home: Path
    command: str
    target: Path
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.server.url

    def turns(self) -> list[TurnRecord]:
        return [t for sid in self.store.session_ids() for t in self.store.session_turns(sid)]

    def run(self, argv: list[str], env: dict[str, str], timeout_s: float = RUN_TIMEOUT_S) -> str:
        """Run the harness in the work dir with its own HOME (:func:`run_harness`)."""
        started = time.monotonic()
        out = run_harness(argv, env, cwd=self.work, home=self.home, timeout_s=timeout_s)
        self.seconds["run"] = time.monotonic() - started
        return out


def run_harness(
    argv: list[str], env: dict[str, str], *, cwd: Path, home: Path, timeout_s: float = RUN_TIMEOUT_S
) -> str:
    """Run a harness program with ``HOME=home`` in ``cwd`` and return its output (stdout +
    stderr); fail the test with that output when it exits non-zero or times out. Prints the
    wall time (seconds)."""
    home.mkdir(parents=True, exist_ok=True)
    full_env = {
        "PATH": f"{HARNESS_BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "NO_COLOR": "1",
        **env,
    }
    started = time.monotonic()
    try:
        proc = subprocess.run(
            argv,
            cwd=cwd,
            env=full_env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        pytest.fail(f"{argv[0]} timed out after {timeout_s} s:\n{out[-4000:]}")
    seconds = time.monotonic() - started
    out = proc.stdout + proc.stderr
    print(f"\n{Path(argv[0]).name}: {seconds:.1f} s, exit {proc.returncode}")
    if proc.returncode != 0:
        pytest.fail(f"{argv[0]} exited {proc.returncode}:\n{out[-4000:]}")
    return out


@pytest.fixture
def harness_gateway(tokenizer, tmp_path) -> Iterator[Any]:
    """Factory: ``harness_gateway(tool, args, final=...)`` starts a gateway for one harness
    whose scripted tool call is ``tool(args(command))``, ``command`` creating
    ``work/created_by_TOOL.txt`` (:func:`shell_command`)."""
    started: list[tuple[LiveServer, Store]] = []

    def make(
        tool: str,
        args: Callable[[str], dict[str, Any]] = lambda command: {"command": command},
        final: str = "The file is created.",
    ) -> HarnessGateway:
        work, home = tmp_path / "work", tmp_path / "home"
        work.mkdir()
        home.mkdir()
        command, target = shell_command(work, f"created_by_{tool}.txt")
        engine = ScriptedEngine(
            tokenizer,
            reply_fn=harness_reply(tokenizer, call_text(tool, args(command)), final),
            max_context=SCRIPTED_CONTEXT,
        )
        store = Store(tmp_path / "store.db")
        app = create_app(engine, tokenizer, store, model_name="tiny")
        recording = TrafficRecorder(app)
        server = LiveServer(recording).start()
        started.append((server, store, recording))
        return HarnessGateway(server, store, engine, recording, work, home, command, target)

    yield make
    for i, (server, store, recording) in enumerate(started):
        server.stop()
        store.close()
        dump = Recording("e2e", "", "e2e", "what the harness sent", [], recording.exchanges)
        dump.save(tmp_path / f"requests-{i}.json.gz")  # for reading a failure


def shell_command(work: Path, name: str) -> tuple[str, Path]:
    """A shell command that creates ``work/NAME`` and prints a line naming it; and the file."""
    target = work / name
    return f"echo clawrl-e2e > {target} && echo wrote-{name}", target


def assert_run(gw: HarnessGateway, attribution: str) -> TurnRecord:
    """The checks every harness run must pass (issue 8, part 5).

    1. the harness executed the command: the file exists;
    2. the gateway answered no 5xx;
    3. the store holds the run as one trajectory: the main turn that made the tool call and the
       turn after it are in one session, linked by ids, and the call's next state is the tool's
       output (role ``tool``, holding the command's output line);
    4. retries are siblings: main turns with identical prompts have the same parent;
    5. the session was attributed as expected (``attribution`` is a prefix of the turn's
       ``client.attribution``, e.g. ``header:x-claude-code-session-id`` or ``inferred``).

    Returns:
        The tool-call turn.
    """
    target, command = gw.target, gw.command
    assert target.exists(), f"{target} was not created"
    assert target.read_text().strip() == "clawrl-e2e", f"{target} was not created"
    server_errors = [(e.method, e.path, e.status) for e in gw.app.exchanges if e.status >= 500]
    assert not server_errors, server_errors
    turns = gw.turns()
    calls = [
        t
        for t in turns
        if t.kind == TurnKind.MAIN
        and t.status == TurnStatus.OK
        and any(
            c["arguments"] and command in json.dumps(c["arguments"]) for c in t.output["tool_calls"]
        )
    ]
    assert calls, "no recorded turn made the tool call"
    call = calls[0]
    tree = load_tree(gw.store, call.session_id)
    state = next_state(tree, call.id)
    assert state is not None, "the tool-call turn has no next state"
    assert state.role == NextStateRole.TOOL, state
    tool_msgs = [m for m in state.messages if m["role"] == "tool"]
    assert tool_msgs and any(target.name in (m["content"] or "") for m in tool_msgs), state.messages
    assert state.ids, "no environment ids after the tool call"
    child = tree.node(state.child_turn_id)
    assert child.turn.kind == TurnKind.MAIN and child.parent_id == call.id
    main = [n for n in tree.nodes.values() if n.turn.kind == TurnKind.MAIN]
    by_prompt: dict[tuple[int, ...], set[str | None]] = {}
    for n in main:
        by_prompt.setdefault(tuple(n.turn.prompt_ids), set()).add(n.parent_id)
    assert all(len(parents) == 1 for parents in by_prompt.values()), "a retry is not a sibling"
    assert call.client["attribution"].startswith(attribution), call.client["attribution"]
    print(
        f"session {call.session_id} ({call.session_source}, {call.client['attribution']}): "
        f"{len(tree.nodes)} turns, roots {len(tree.roots)}, "
        f"kinds {sorted((n.turn.kind.value, n.turn.side_kind or '') for n in tree.nodes.values())}"
    )
    return call


@pytest.fixture
def e2e() -> Any:
    """The helpers above, for test modules (``--import-mode=importlib`` cannot import a
    conftest): ``e2e.program``, ``e2e.call_text``, ``e2e.assert_run``, ``e2e.run``,
    ``e2e.task``."""
    return SimpleNamespace(
        program=harness_program,
        call_text=call_text,
        assert_run=assert_run,
        run=run_harness,
        task=f"Create the file with a shell command ({TASK_MARKER}).",
    )
