"""Serving an ASGI app with uvicorn on a socket clawrl binds itself.

:func:`bind_socket` binds ``host:port`` (port 0: a free one) with ``TCP_NODELAY``;
:class:`LiveServer` runs an app on such a socket in a background thread and stops it by flag,
with no process to kill. ``clawrl demo`` and harness mode serve their gateway with it (and tests
use it); ``clawrl serve`` runs uvicorn in the foreground with signal handling
(:mod:`clawrl.cli.serve`).
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any, Literal

from clawrl.errors import ConfigError


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket bound to ``host:port`` (port 0: a free one); connections made
    before the server accepts wait in its backlog.

    Raises:
        ConfigError: the address cannot be bound (in use, not local).
    """
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # Accepted connections inherit TCP_NODELAY; without it a keep-alive response written
        # as headers + body waits ~40 ms for the client's delayed ACK (Nagle).
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind(addr)
        # listen now, not when uvicorn starts: a client that connects as soon as the URL is
        # printed waits in the backlog instead of being refused (uvicorn listens again, harmless)
        sock.listen(2048)
    except OSError as e:
        raise ConfigError(f"cannot bind {host}:{port}: {e}") from e
    return sock


class LiveServer:
    """An ASGI app served by uvicorn on ``host`` (loopback) and an ephemeral port, in a thread.

    Use as a context manager::

        with LiveServer(app) as server:
            client = openai.OpenAI(base_url=server.base_url, api_key="x")

    Args:
        app: the ASGI app.
        host: the loopback address to bind.
        lifespan: ``"on"`` runs the app's lifespan (e.g. the online loop a
            :class:`clawrl.runtime.Runtime` gives its app); ``"off"`` by default.
        port: the port (0: a free one).
    """

    def __init__(
        self,
        app: Any,
        host: str = "127.0.0.1",
        lifespan: Literal["auto", "on", "off"] = "off",
        port: int = 0,
    ) -> None:
        import uvicorn

        self.app = app
        self.host = host
        self._sock = bind_socket(host, port)
        self.port: int = self._sock.getsockname()[1]
        config = uvicorn.Config(
            app, log_level="warning", lifespan=lifespan, timeout_graceful_shutdown=5
        )
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI base URL, ``http://127.0.0.1:PORT/v1``."""
        return f"{self.url}/v1"

    def start(self, timeout_s: float = 20.0) -> LiveServer:
        """Start serving and wait until the server accepts connections.

        Raises:
            RuntimeError: it did not start within ``timeout_s`` (or its lifespan failed).
        """
        if self._thread.is_alive():  # already started (``with runtime.serve() as s``)
            return self
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"uvicorn did not start on {self.url}")
            time.sleep(0.01)
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Ask uvicorn to exit (requests in flight finish) and wait for the thread."""
        self.server.should_exit = True
        self._thread.join(timeout_s)
        self._sock.close()

    def __enter__(self) -> LiveServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
