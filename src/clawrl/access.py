"""Whose data a request may see: the user of a user's API key (``clawrl serve --user-keys``).

:class:`clawrl.gateway.auth.ApiKeyMiddleware` leaves the user of a user's key in the request's
``state`` (:data:`KEY_USER`); the gateway's and the dashboard's routes read it here
(:func:`key_user`), refuse what spans every user (:func:`require_admin`) and keep each user's
sessions in a namespace of their own (:func:`session_prefix`, :func:`own_session`). A request
with the admin key, or to a server without keys, carries no user: it sees everything.
"""

from __future__ import annotations

from starlette.requests import Request

from clawrl.errors import ClientInputError

KEY_USER = "clawrl_key_user"
"""Where :class:`clawrl.gateway.auth.ApiKeyMiddleware` leaves the user of a user's key (the request's ``state``)."""


def key_user(request: Request) -> str | None:
    """Whose user key the request presented (``None``: the admin key, or no keys configured:
    everything is visible)."""
    value = request.scope.get("state", {}).get(KEY_USER)
    return value if isinstance(value, str) else None


def session_prefix(request: Request) -> str:
    """The namespace of the sessions of a request made with a user's key (``"USER:"``; ``""``
    otherwise): every session such a request names or opens is stored under it
    (:func:`clawrl.gateway.prepare.prepare_messages`), so one user naming a session never
    reaches another's, nor learns whether it exists."""
    user = key_user(request)
    return "" if user is None else f"{user}:"


def own_session(request: Request, session_id: str) -> str:
    """The stored id of a session a client names: under :func:`session_prefix` (an id already
    in it, as ``x-clawrl-session-id`` answered it, is kept)."""
    prefix = session_prefix(request)
    return session_id if session_id.startswith(prefix) else prefix + session_id


def require_admin(request: Request, what: str) -> None:
    """Refuse a request made with a user's key to ``what`` (data of every user).

    Raises:
        ClientInputError: (403, ``admin_only``) a user's key.
    """
    user = key_user(request)
    if user is not None:
        raise ClientInputError(f"{what} covers every user and this key is one user's ({user!r}): "
                               "use the admin key (--api-key)", status=403, code="admin_only")  # fmt: skip
