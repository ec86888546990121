"""API-key check and key fingerprints.

With a key configured, every route but ``GET /healthz`` and ``/api/hello`` needs ``Authorization: Bearer KEY`` or
``x-api-key: KEY`` (the Anthropic SDK's header); otherwise it answers 401 in OpenAI's error
shape (Anthropic's under ``/v1/messages``). Keys are compared in constant time. A key is never
stored or logged: turns record only :func:`key_fingerprint` of whatever key the client
presented.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from clawrl.gateway.errors import AuthError, client_shaped, status_and_body


def presented_key(request: Request, *, basic: bool = False) -> str | None:
    """The API key the client sent (``Authorization: Bearer`` first, then ``x-api-key``).

    Args:
        basic: also take the password of ``Authorization: Basic`` (any user name): how a
            browser sends the key to the dashboard after its login prompt.
    """
    auth = request.headers.get("authorization")
    if auth:
        scheme, _, value = auth.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
        if basic and scheme.lower() == "basic" and value.strip():
            try:
                decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
            except (ValueError, UnicodeDecodeError):
                decoded = ""  # malformed: an x-api-key header may still carry the key
            password = decoded.partition(":")[2]
            if password:
                return password
    key = request.headers.get("x-api-key")
    return key.strip() if key and key.strip() else None


def key_fingerprint(key: str | None) -> str | None:
    """``sha256:<first 16 hex>`` of a key, or ``None``; identifies a client, reveals nothing."""
    if not key:
        return None
    return "sha256:" + hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]


def check_api_key(request: Request, expected: str | None, *, basic: bool = False) -> None:
    """Let the request through when no key is configured or it presents the right one.

    Args:
        basic: accept the key as a Basic-auth password too (the dashboard's pages).

    Raises:
        AuthError: (401) a key is configured and the request has none or a different one.
    """
    if expected is None:
        return
    got = presented_key(request, basic=basic)
    if got is None:
        raise AuthError("missing API key: send 'Authorization: Bearer KEY' (or 'x-api-key: KEY')")
    if not hmac.compare_digest(got.encode("utf-8"), expected.encode("utf-8")):
        raise AuthError("incorrect API key provided")


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` exposes the server only to this machine.

    ``localhost`` and loopback addresses (127.0.0.0/8, ::1) are; ``0.0.0.0``, ``::``, other
    addresses and other host names are not.
    """
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False


class ApiKeyMiddleware:
    """Pure ASGI middleware answering 401 (OpenAI shape) before any parsing when the key is
    missing or wrong. ``GET /healthz`` and ``/api/hello`` stay open for liveness probes. Under
    ``/dashboard`` the key may also come as a Basic-auth password, and a 401 asks for it with
    ``WWW-Authenticate: Basic`` so that a browser shows its login prompt.

    Args:
        app: the wrapped ASGI app.
        api_key: the required key; ``None`` lets everything through.
        on_reject: optional ``callable()`` per rejected request (metrics).
    """

    OPEN_PATHS = frozenset({"/healthz", "/api/hello"})

    def __init__(self, app: Any, api_key: str | None, on_reject: Any = None) -> None:
        self.app = app
        self.api_key = api_key
        self.on_reject = on_reject

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or self.api_key is None or scope["path"] in self.OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        dashboard = path == "/dashboard" or path.startswith("/dashboard/")
        try:
            check_api_key(Request(scope), self.api_key, basic=dashboard)
        except AuthError as e:
            if self.on_reject is not None:
                self.on_reject()
            status, body = status_and_body(e)
            body = client_shaped(path, status, body)
            challenge = 'Basic realm="clawrl dashboard"' if dashboard else "Bearer"
            response = JSONResponse(
                body, status_code=status, headers={"WWW-Authenticate": challenge}
            )
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)
