"""A byte relay between TCP and a unix socket (stdlib only: it also runs inside the sandbox).

Why: under bubblewrap the harness runs with ``--unshare-net``, in a network namespace of its
own that has only a loopback device, so no address outside the sandbox is reachable. The
gateway is handed in as one unix socket bind-mounted into the sandbox; inside, this script
listens on ``127.0.0.1:PORT`` of the private loopback and relays each connection to that socket
(``python relay.py tcp-to-unix PORT SOCKET``). Outside, :class:`UnixToTcpRelay` accepts on the
socket and connects to the gateway's TCP port. The harness therefore reaches exactly one
address: the gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
from collections.abc import Awaitable, Callable

Connector = Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            writer.close()


def _handler(connect: Connector) -> Callable[..., Awaitable[None]]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await connect()
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    return handle


async def serve_tcp_to_unix(port: int, socket_path: str) -> None:
    """Listen on ``127.0.0.1:port`` and relay every connection to ``socket_path``."""
    server = await asyncio.start_server(
        _handler(lambda: asyncio.open_unix_connection(socket_path)), "127.0.0.1", port
    )
    async with server:
        await server.serve_forever()


class UnixToTcpRelay:
    """Host side: accept on a unix socket, relay to ``host:port`` (the gateway); a thread.

    Args:
        socket_path: the unix socket to create (its directory is bind-mounted into the sandbox).
        host / port: the gateway's TCP address.
    """

    def __init__(self, socket_path: str, host: str, port: int) -> None:
        self.socket_path = socket_path
        self.host, self.port = host, port
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._server: asyncio.AbstractServer | None = None
        self._thread = threading.Thread(target=self._run, name="clawrl-relay", daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        connect = _handler(lambda: asyncio.open_connection(self.host, self.port))
        self._server = self._loop.run_until_complete(
            asyncio.start_unix_server(connect, self.socket_path)
        )
        os.chmod(self.socket_path, 0o666)
        self._ready.set()
        self._loop.run_forever()

    def start(self) -> UnixToTcpRelay:
        """Start the thread; returns once the socket accepts connections."""
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError(f"relay on {self.socket_path} did not start")
        return self

    def stop(self) -> None:
        """Close the socket and stop the thread."""
        if self._server is not None:
            self._loop.call_soon_threadsafe(self._server.close)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)


def launch(port: int, socket_path: str, argv: list[str]) -> int:
    """Serve the relay in a thread, run ``argv`` once it listens, return its exit status."""
    import socket
    import subprocess

    loop = asyncio.new_event_loop()
    thread = threading.Thread(
        target=loop.run_until_complete, args=(serve_tcp_to_unix(port, socket_path),), daemon=True
    )
    thread.start()
    for _ in range(200):
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.1):
            break
        threading.Event().wait(0.02)
    return subprocess.call(argv)


USAGE = "usage: relay.py tcp-to-unix PORT SOCKET | relay.py launch PORT SOCKET -- ARGV..."


def main(argv: list[str]) -> int:
    """The in-sandbox side: ``tcp-to-unix PORT SOCKET`` or ``launch PORT SOCKET -- ARGV...``."""
    if len(argv) == 3 and argv[0] == "tcp-to-unix":
        asyncio.run(serve_tcp_to_unix(int(argv[1]), argv[2]))
        return 0
    if len(argv) > 4 and argv[0] == "launch" and argv[3] == "--":
        return launch(int(argv[1]), argv[2], argv[4:])
    print(USAGE, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
