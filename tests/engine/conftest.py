"""Fixtures of the engine tests: a TCP forwarder that a test can kill and revive, standing in
for a second replica of one real vLLM server (its death: every connection cut, the port
refusing, under the test's control)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Callable, Iterator

import pytest


class KillableProxy:
    """Forwards ``127.0.0.1:<port>`` to ``target_port`` until :meth:`kill`; :meth:`revive`
    listens on the same port again."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.revive()

    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        self._writers -= {writer, up_writer}

    def revive(self) -> None:
        async def start() -> None:
            self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port,
                                                      reuse_address=True)  # fmt: skip

        self._run(start())

    def kill(self) -> None:
        async def stop() -> None:
            if self._server is not None:
                self._server.close()
                self._server = None
            for w in list(self._writers):
                w.transport.abort()  # connections cut mid-response, as a dead host does
            self._writers.clear()

        self._run(stop())

    def close(self) -> None:
        self.kill()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


@pytest.fixture()
def killable_proxy() -> Iterator[Callable[[int], KillableProxy]]:
    """``make(target_port) -> KillableProxy``; every proxy made is closed after the test."""
    made: list[KillableProxy] = []

    def make(port: int) -> KillableProxy:
        made.append(KillableProxy(port))
        return made[-1]

    yield make
    for proxy in made:
        proxy.close()
