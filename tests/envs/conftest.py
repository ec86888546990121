"""A fake OpenAI-compatible server (FastAPI + uvicorn on 127.0.0.1, ephemeral port, in a thread).

It fakes the world's edge (the gateway) for the simulated users: scripted completions, every
request recorded (path, headers, body), ``/v1/sessions/{id}/end``, and the clawrl response
headers and ``system_fingerprint``. Stopped by flag, no process to kill.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

Reply = str | tuple[int, str]
"""A scripted completion text, or ``(status, message)`` for an error answer."""


@dataclass
class Recorded:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass
class FakeOpenAI:
    """Scripted OpenAI-compatible server state."""

    reply: Callable[[dict[str, Any]], Reply]
    policy_version: int = 3
    requests: list[Recorded] = field(default_factory=list)
    ended: list[Recorded] = field(default_factory=list)
    sessions: set[str] = field(default_factory=set)
    server: Any = None
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def chats(self, session_id: str | None = None) -> list[Recorded]:
        return [
            r for r in self.requests if session_id is None or r.path.startswith(f"/s/{session_id}/")
        ]


def _app(state: FakeOpenAI) -> FastAPI:
    app = FastAPI()
    counter = iter(range(10**9))

    async def chat(request: Request, session_id: str | None = None) -> JSONResponse:
        body = await request.json()
        state.requests.append(Recorded(request.url.path, dict(request.headers), body))
        reply = state.reply(body)
        if isinstance(reply, tuple):
            status, message = reply
            return JSONResponse({"error": {"message": message}}, status_code=status)
        sid = session_id or request.headers.get("x-session-id") or "inferred"
        state.sessions.add(sid)
        turn = f"turn-{next(counter)}"
        data = {
            "id": f"chatcmpl-{turn}",
            "object": "chat.completion",
            "model": body.get("model"),
            "system_fingerprint": f"clawrl-policy-v{state.policy_version}",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": reply},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        }
        headers = {"x-clawrl-session-id": sid, "x-clawrl-turn-ids": turn}
        return JSONResponse(data, headers=headers)

    @app.post("/v1/chat/completions")
    async def plain(request: Request) -> JSONResponse:
        return await chat(request)

    @app.post("/s/{session_id}/v1/chat/completions")
    async def scoped(session_id: str, request: Request) -> JSONResponse:
        return await chat(request, session_id)

    @app.post("/v1/sessions/{session_id}/end")
    async def end(session_id: str, request: Request) -> JSONResponse:
        state.ended.append(Recorded(request.url.path, dict(request.headers), {}))
        if session_id not in state.sessions:
            return JSONResponse({"error": {"message": "no such session"}}, status_code=404)
        return JSONResponse({"id": session_id, "object": "session", "ended": True})

    return app


@pytest.fixture
def fake_openai() -> Iterator[Callable[..., FakeOpenAI]]:
    """Factory: ``fake_openai(reply_fn) -> FakeOpenAI`` serving on 127.0.0.1 until the test ends."""
    started: list[tuple[uvicorn.Server, threading.Thread, socket.socket]] = []

    def make(reply: Callable[[dict[str, Any]], Reply], **kw: Any) -> FakeOpenAI:
        state = FakeOpenAI(reply, **kw)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        state.port = sock.getsockname()[1]
        server = uvicorn.Server(uvicorn.Config(_app(state), log_level="warning", lifespan="off"))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        deadline = time.monotonic() + 10
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "fake server did not start"
            time.sleep(0.01)
        started.append((server, thread, sock))
        state.server = server
        return state

    yield make
    for server, thread, sock in started:
        server.should_exit = True
        thread.join(10)
        sock.close()
        assert not thread.is_alive(), "fake server did not stop"
