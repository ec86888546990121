"""API-key check and key fingerprints.

With a key configured, every route but ``GET /healthz`` and ``/api/hello`` needs ``Authorization: Bearer KEY`` or
``x-api-key: KEY`` (the Anthropic SDK's header); otherwise it answers 401 in OpenAI's error
shape (Anthropic's under ``/v1/messages``). Keys are compared in constant time. A key is never
stored or logged: turns record only :func:`key_fingerprint` of whatever key the client
presented.

Users' keys (``clawrl serve --user-keys FILE``, :func:`load_user_keys`): each key belongs to one
user. A request with it is that user's (:func:`clawrl.gateway.users.resolve_user`; naming
another user is a 403) and sees only that user's data: their sessions on the dashboard, feedback
and session ends on their own turns only (another user's session answers 404, as an unknown
one); what spans every user (the overview, training and judge pages, ``/metrics``, the shared
memory) answers 403. The admin key (``--api-key``) sees everything. :func:`clawrl.access.key_user` says whose
key a request presented.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from clawrl.access import KEY_USER
from clawrl.errors import ConfigError
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


def load_user_keys(path: str | Path, *, admin_key: str | None = None) -> dict[str, str]:
    """Users' API keys from a file: one ``USER KEY`` per line (separated by white space; blank
    lines and lines starting with ``#`` are skipped).

    Returns:
        key -> user id.

    Raises:
        ConfigError: the file cannot be read, a line is not ``USER KEY``, a user id a turn
            could not record, a key given twice, or the admin key among them.
    """
    from clawrl.store.users import user_id_problem

    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read the users' keys file {path}: {e}") from e
    keys: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        parts = line.split()
        where = f"{path}, line {number}"
        if len(parts) != 2:
            raise ConfigError(f"{where}: expected 'USER KEY' (two fields), got {len(parts)}")
        user, key = parts
        if (problem := user_id_problem(user)) is not None:
            raise ConfigError(f"{where}: the user id {problem}")
        if ":" in user:  # a user's sessions are stored as USER:NAME
            raise ConfigError(f"{where}: a user id with a key must not contain ':'")
        if key in keys:
            raise ConfigError(
                f"{where}: this key is given to user {keys[key]!r} already (one user per key)"
            )
        if admin_key is not None and hmac.compare_digest(key.encode(), admin_key.encode()):
            raise ConfigError(f"{where}: the key of user {user!r} is the admin key (--api-key)")
        keys[key] = user
    if not keys:
        raise ConfigError(f"{path} holds no 'USER KEY' line")
    return keys


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
        api_key: the admin key; ``None`` (and no ``user_keys``) lets everything through.
        on_reject: optional ``callable()`` per rejected request (metrics).
        user_keys: users' keys, key -> user id (:func:`load_user_keys`); a request with one
            carries its user (:func:`clawrl.access.key_user`).
    """

    OPEN_PATHS = frozenset({"/healthz", "/api/hello"})

    def __init__(
        self,
        app: Any,
        api_key: str | None,
        on_reject: Any = None,
        user_keys: Mapping[str, str] | None = None,
    ) -> None:
        self.app = app
        self.api_key = api_key
        self.on_reject = on_reject
        self.user_keys = dict(user_keys or {})

    def _user_of(self, request: Request, basic: bool) -> str | None:
        """The user of the presented key (``None``: the admin key).

        Raises:
            AuthError: no key, or one that is neither the admin's nor a user's.
        """
        got = presented_key(request, basic=basic)
        if got is not None:
            found = None
            for key, user in self.user_keys.items():  # every one compared: no early exit
                if hmac.compare_digest(got.encode("utf-8"), key.encode("utf-8")):
                    found = user
            if found is not None:
                return found
        if self.api_key is None:
            raise AuthError("missing API key: send 'Authorization: Bearer KEY' (or 'x-api-key: "
                            "KEY')" if got is None else "incorrect API key provided")  # fmt: skip
        check_api_key(request, self.api_key, basic=basic)
        return None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        keyed = self.api_key is not None or bool(self.user_keys)
        if scope["type"] != "http" or not keyed or scope["path"] in self.OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        dashboard = path == "/dashboard" or path.startswith("/dashboard/")
        try:
            user = self._user_of(Request(scope), dashboard)
            if user is not None:
                scope.setdefault("state", {})[KEY_USER] = user
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
