"""Gateway fixtures: live servers on 127.0.0.1 with an ephemeral port, per test or per module.

* ``tiny_server`` (module scope): the real ``TransformersEngine`` on the tiny random model.
* ``scripted_server`` (factory): a ``ScriptedEngine`` with scripted replies, a fresh store.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest

from clawrl.engine.scripted import ScriptedEngine
from clawrl.gateway import create_app
from clawrl.gateway.server import LiveServer
from clawrl.store import Store

MODEL = "tiny"


@dataclass
class Served:
    """A running gateway and what the test needs to talk to it and inspect it."""

    server: LiveServer
    store: Store
    engine: Any
    app: Any

    @property
    def url(self) -> str:
        return self.server.url

    def client(self, api_key: str = "test-key", **kw: Any) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.server.base_url, api_key=api_key, max_retries=0, **kw)

    def turns(self) -> list:
        return [t for sid in self.store.session_ids() for t in self.store.session_turns(sid)]


@contextlib.contextmanager
def serve(engine: Any, tokenizer: Any, path: Path, **kw: Any) -> Iterator[Served]:
    store = Store(path)
    app = create_app(engine, tokenizer, store, model_name=MODEL, **kw)
    server = LiveServer(app).start()
    try:
        yield Served(server, store, engine, app)
    finally:
        server.stop()
        store.close()


@pytest.fixture(scope="module")
def tiny_server(tiny, tmp_path_factory) -> Iterator[Served]:
    """The gateway on the real engine with the tiny random model (one per test module)."""
    from clawrl.engine import TransformersEngine

    engine = TransformersEngine.from_policy(tiny, max_batch=8)
    try:
        with serve(engine, tiny.tokenizer, tmp_path_factory.mktemp("tiny") / "s.db") as s:
            yield s
    finally:
        engine.close()


@pytest.fixture
def scripted_server(tokenizer, tmp_path):
    """Factory: ``with scripted_server(replies, **engine_kw) as served: ...``."""
    stack = contextlib.ExitStack()

    def make(replies=(), *, api_key=None, user_from=None, **engine_kw) -> Served:
        engine = ScriptedEngine(tokenizer, replies, **engine_kw)
        path = tmp_path / f"s{len(stack._exit_callbacks)}.db"
        app_kw = {} if user_from is None else {"user_from": user_from}
        return stack.enter_context(serve(engine, tokenizer, path, api_key=api_key, **app_kw))

    with stack:
        yield make
