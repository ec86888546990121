"""Recorded harness traffic: capture the HTTP requests a real harness sends, and replay them.

A *recording* is what one harness run sent the gateway, in order, plus the scripted answers it
got, as one gzip-compressed JSON file (``*.json.gz``)::

    {"harness": "claude", "version": "2.1.332", "scenario": "subagents",
     "description": "...", "expect": {...},          # what the test asserts (free-form)
     "script": [RULE, ...],                          # how the scripted engine answered
     "exchanges": [{"t": 0.0, "method": "POST", "path": "/v1/messages", "query": "beta=true",
                    "headers": {...}, "body": {...} | "text" | null, "status": 200}, ...]}

Recording (:class:`TrafficRecorder`, an ASGI wrapper around the gateway app) keeps every HTTP
exchange: method, path, query string, request headers (``authorization``, ``x-api-key`` and
``cookie`` removed), the JSON body and the status. :func:`scrub` replaces the recording's own
directories and host name in every string, so a fixture names no machine or user.

The engine's answers are *rules* (:func:`rule_reply`), not a list in order: a harness makes side
calls and subagent calls concurrently, so the answer depends only on the prompt (and on how many
times a rule fired), and replaying the same requests in their recorded order gets the same
answers. :func:`replay` sends a recording's exchanges to an app one at a time, in the order they
started.

Rule (first match wins; every key of ``if`` must hold)::

    {"if": {"last_user_contains": "marker", "tools": true, "tool_result": false,
            "prompt_contains": "text", "prompt_lacks": "text"},
     "reply": "text" | {"calls": [[NAME, ARGS], ...], "content": "text"} | {"error": "engine"},
     "times": 1}          # optional: the rule applies to its first N matches only

``last_user_contains`` looks at the last user turn of the rendered prompt; ``tool_result`` is
whether that turn holds a tool result; ``tools`` whether the prompt offers tools. A reply
``{"error": "engine"}`` raises :class:`clawrl.errors.EngineError` (the gateway answers 500, as a
failed upstream would).
"""

from __future__ import annotations

import gzip
import json
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clawrl.engine import SamplingParams
from clawrl.errors import EngineError

DROPPED_HEADERS = frozenset({"authorization", "x-api-key", "cookie", "proxy-authorization"})
"""Request headers never written to a recording (credentials)."""


@dataclass
class Exchange:
    """One recorded HTTP exchange.

    Attributes:
        t: seconds from the recording's start to the request's start.
        method: HTTP method.
        path: URL path (no query string).
        query: the raw query string (``""`` when none).
        headers: request headers, lower-case names, credentials removed.
        body: the JSON body, or its text when it is not JSON, or ``None`` when empty.
        status: the HTTP status answered (0 when the app failed before answering).
    """

    t: float
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: Any
    status: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "t": round(self.t, 3),
            "method": self.method,
            "path": self.path,
            "query": self.query,
            "headers": self.headers,
            "body": self.body,
            "status": self.status,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Exchange:
        return cls(
            t=float(d["t"]),
            method=str(d["method"]),
            path=str(d["path"]),
            query=str(d.get("query") or ""),
            headers={str(k): str(v) for k, v in (d.get("headers") or {}).items()},
            body=d.get("body"),
            status=int(d.get("status") or 0),
        )


class TrafficRecorder:
    """ASGI wrapper that records every HTTP exchange with the wrapped app (thread-safe).

    Args:
        app: the ASGI app (the gateway).

    Attributes:
        exchanges: the exchanges so far, in the order their requests started.
    """

    def __init__(self, app: Any) -> None:
        self.app = app
        self.exchanges: list[Exchange] = []
        self._lock = threading.Lock()
        self._t0 = time.monotonic()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {
            k.decode("latin-1").lower(): v.decode("latin-1")
            for k, v in scope["headers"]
            if k.decode("latin-1").lower() not in DROPPED_HEADERS
        }
        ex = Exchange(
            t=time.monotonic() - self._t0,
            method=scope["method"],
            path=scope["path"],
            query=scope.get("query_string", b"").decode("latin-1"),
            headers=headers,
            body=None,
        )
        with self._lock:
            self.exchanges.append(ex)
        chunks: list[bytes] = []

        async def recv() -> Any:
            msg = await receive()
            if msg["type"] == "http.request":
                chunks.append(msg.get("body", b""))
            return msg

        async def snd(msg: Any) -> None:
            if msg["type"] == "http.response.start":
                ex.status = int(msg["status"])
            await send(msg)

        try:
            await self.app(scope, recv, snd)
        finally:
            ex.body = decode_body(b"".join(chunks))


def decode_body(raw: bytes) -> Any:
    """A request body as JSON, else as text, ``None`` when empty."""
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")


def scrub(value: Any, replacements: Mapping[str, str]) -> Any:
    """``value`` with every occurrence of each key of ``replacements`` replaced in every string
    (keys longest first, so a directory is replaced before its parent)."""
    order = sorted(replacements, key=len, reverse=True)

    def fix(s: str) -> str:
        for old in order:
            if old:
                s = s.replace(old, replacements[old])
        return s

    def walk(v: Any) -> Any:
        if isinstance(v, str):
            return fix(v)
        if isinstance(v, list):
            return [walk(x) for x in v]
        if isinstance(v, dict):
            return {fix(k): walk(x) for k, x in v.items()}
        return v

    return walk(value)


def default_scrubs(*dirs: Path | str) -> dict[str, str]:
    """Replacements for :func:`scrub`: each directory (as given and resolved) -> ``/rec/dN``
    (also in the ``-tmp-x-work`` form Claude Code names its project folders by), and this
    machine's host name -> ``host``."""
    out: dict[str, str] = {}
    for i, d in enumerate(dirs):
        for form in {str(d), str(Path(d).resolve())}:
            out[form] = f"/rec/d{i}"
            out[re.sub(r"[^A-Za-z0-9]", "-", form)] = f"-rec-d{i}"
    host = socket.gethostname()
    if host and len(host) >= 4:
        out[host] = "host"
    return out


@dataclass
class Recording:
    """A recorded harness run (module docstring).

    Attributes:
        harness: the harness program (``claude``, ``codex``, ...).
        version: its version string.
        scenario: what the run did (``plain``, ``subagents``, ...).
        description: one line for people.
        script: the scripted engine's rules (:func:`rule_reply`).
        exchanges: the HTTP exchanges in the order they started.
        expect: what a replay must produce (read by the tests).
    """

    harness: str
    version: str
    scenario: str
    description: str
    script: list[dict[str, Any]]
    exchanges: list[Exchange]
    expect: dict[str, Any] = field(default_factory=dict)

    def save(self, path: Path) -> None:
        """Write as gzip-compressed JSON (deterministic: no timestamp in the gzip header)."""
        data = {
            "harness": self.harness,
            "version": self.version,
            "scenario": self.scenario,
            "description": self.description,
            "expect": self.expect,
            "script": self.script,
            "exchanges": [e.to_json() for e in self.exchanges],
        }
        raw = json.dumps(data, ensure_ascii=False, indent=0, sort_keys=False).encode()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(gzip.compress(raw, mtime=0))

    @classmethod
    def load(cls, path: Path) -> Recording:
        """Read a recording written by :meth:`save`.

        Raises:
            ValueError: the file is not a recording (names the missing field).
        """
        data = json.loads(gzip.decompress(Path(path).read_bytes()))
        for key in ("harness", "scenario", "script", "exchanges"):
            if key not in data:
                raise ValueError(f"{path}: not a traffic recording (no {key!r})")
        return cls(
            harness=data["harness"],
            version=data.get("version", ""),
            scenario=data["scenario"],
            description=data.get("description", ""),
            script=list(data["script"]),
            exchanges=[Exchange.from_json(e) for e in data["exchanges"]],
            expect=dict(data.get("expect") or {}),
        )


def _last_user_turn(text: str) -> str:
    return text.rsplit("<|im_start|>user", 1)[-1]


def calls_text(calls: Sequence[Sequence[Any]], content: str | None = None) -> str:
    """The exact text the policy writes for one or more tool calls (``[[name, args], ...]``)."""
    from clawrl.chat import ChatMessage, ToolCall, assistant_message_text

    msg = ChatMessage(
        role="assistant",
        content=content,
        tool_calls=[ToolCall(name=str(name), arguments=dict(args)) for name, args in calls],
    )
    return assistant_message_text(msg)


def rule_reply(
    tokenizer: Any, rules: Iterable[Mapping[str, Any]], default: str = "OK."
) -> Callable[[list[int], SamplingParams], str]:
    """A :class:`clawrl.engine.scripted.ScriptedEngine` ``reply_fn`` from rules (module docstring).

    Raises (from the returned function):
        EngineError: a matched rule's reply is ``{"error": "engine"}``.
    """
    rules = [dict(r) for r in rules]
    fired = [0] * len(rules)
    lock = threading.Lock()

    def holds(cond: Mapping[str, Any], text: str, last_user: str) -> bool:
        for key, want in cond.items():
            if key == "last_user_contains" and str(want) not in last_user:
                return False
            if key == "prompt_contains" and str(want) not in text:
                return False
            if key == "prompt_lacks" and str(want) in text:
                return False
            if key == "tools" and bool(want) != ("<tools>" in text):
                return False
            if key == "tool_result" and bool(want) != ("<tool_response>" in last_user):
                return False
        return True

    def reply(prompt_ids: list[int], params: SamplingParams) -> str:
        text = tokenizer.decode(prompt_ids, skip_special_tokens=False)
        last_user = _last_user_turn(text)
        with lock:
            for i, rule in enumerate(rules):
                if rule.get("times") is not None and fired[i] >= int(rule["times"]):
                    continue
                if not holds(rule.get("if") or {}, text, last_user):
                    continue
                fired[i] += 1
                out = rule["reply"]
                break
            else:
                return default
        if isinstance(out, str):
            return out
        if isinstance(out, dict) and out.get("error"):
            raise EngineError(f"scripted failure ({out['error']})")
        return calls_text(out.get("calls") or [], out.get("content"))

    return reply


@dataclass
class ReplayResult:
    """What a replay got back.

    Attributes:
        statuses: the HTTP status of each replayed exchange, in order.
        recorded_statuses: the status each got when it was recorded.
    """

    statuses: list[int]
    recorded_statuses: list[int]


def replay(client: Any, recording: Recording) -> ReplayResult:
    """Send a recording's exchanges through ``client`` one at a time, in the order they started.

    Args:
        client: a :class:`starlette.testclient.TestClient` (or anything with its ``request``).
        recording: the recording.

    Returns:
        The statuses replayed and recorded, side by side.
    """
    statuses = []
    for ex in sorted(recording.exchanges, key=lambda e: e.t):
        url = ex.path + (f"?{ex.query}" if ex.query else "")
        headers = {k: v for k, v in ex.headers.items() if k not in ("content-length", "host")}
        if isinstance(ex.body, str):
            content: bytes | None = ex.body.encode()
        elif ex.body is None:
            content = None
        else:
            content = json.dumps(ex.body).encode()
        response = client.request(ex.method, url, headers=headers, content=content)
        statuses.append(response.status_code)
    return ReplayResult(
        statuses, [e.status for e in sorted(recording.exchanges, key=lambda e: e.t)]
    )
