"""Protocol fixtures: live gateways for the ``anthropic`` and ``openai`` SDKs.

* ``scripted`` (factory): the gateway on a :class:`ScriptedEngine` (fixed completions as real
  token ids), a fresh store per call; where the SDK is what is under test.
* ``tiny_gateway`` (module scope): the real ``TransformersEngine`` on the tiny random model.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import anthropic
import openai
import pytest

from clawrl.engine.scripted import ScriptedEngine
from clawrl.gateway import create_app
from clawrl.gateway.server import LiveServer
from clawrl.store import Store, TurnRecord


@dataclass
class Gateway:
    """A running gateway, its store and engine, and SDK clients for it."""

    server: LiveServer
    store: Store
    engine: Any

    def anthropic(self, **kw: Any) -> anthropic.Anthropic:
        kw.setdefault("max_retries", 0)
        return anthropic.Anthropic(base_url=self.server.url, api_key="test-key", **kw)

    def openai(self, **kw: Any) -> openai.OpenAI:
        kw.setdefault("max_retries", 0)
        return openai.OpenAI(base_url=self.server.base_url, api_key="test-key", **kw)

    def turns(self) -> list[TurnRecord]:
        """Every recorded turn, oldest first."""
        turns = [t for sid in self.store.session_ids() for t in self.store.session_turns(sid)]
        return sorted(turns, key=lambda t: t.created_at)


@contextlib.contextmanager
def serve(engine: Any, tokenizer: Any, path: Any, **kw: Any) -> Iterator[Gateway]:
    store = Store(path)
    server = LiveServer(create_app(engine, tokenizer, store, model_name="tiny", **kw)).start()
    try:
        yield Gateway(server, store, engine)
    finally:
        server.stop()
        store.close()


@pytest.fixture
def scripted(tokenizer, tmp_path):
    """Factory: ``scripted(replies, **engine_kw)`` -> a :class:`Gateway` on a scripted engine."""
    stack = contextlib.ExitStack()

    def make(replies: Any = (), *, api_key: str | None = None, **engine_kw: Any) -> Gateway:
        engine = ScriptedEngine(tokenizer, replies, **engine_kw)
        path = tmp_path / f"s{len(stack._exit_callbacks)}.db"
        return stack.enter_context(serve(engine, tokenizer, path, api_key=api_key))

    with stack:
        yield make


@pytest.fixture(scope="module")
def tiny_gateway(tiny, tmp_path_factory) -> Iterator[Gateway]:
    """The gateway on the real engine with the tiny random model (one per test module)."""
    from clawrl.engine import TransformersEngine

    engine = TransformersEngine.from_policy(tiny, max_batch=4)
    try:
        with serve(engine, tiny.tokenizer, tmp_path_factory.mktemp("tiny") / "s.db") as gw:
            yield gw
    finally:
        engine.close()
