"""Whose request is this: the user id a turn records (``turns.user_id``).

``server.user_from`` lists where the gateway looks, first match wins:

- ``header``: the ``x-clawrl-user`` header (any client can send it: ``openai`` SDK
  ``default_headers``, Claude Code ``ANTHROPIC_CUSTOM_HEADERS``);
- ``body``: the end-user field of the client's own protocol: OpenAI's ``user`` (chat
  completions and Responses) or ``safety_identifier``, Anthropic's ``metadata.user_id`` when it
  is a plain id (Claude Code's, a JSON-object string or ``user_<hash>_account_..._session_<uuid>``
  before, names a session, not a user, and is skipped);
- ``key``: the fingerprint of the API key the request presented (``sha256:`` and 16 hex
  digits, :func:`clawrl.gateway.auth.key_fingerprint`), so that each key is one user.

Nothing found: ``""``, no user. White space around an id is not part of it; a value that cannot
be an id (not a string, control characters, more than 256 characters) is refused with a 400
``invalid_user`` naming the field, in the client's protocol; it is never cut or cleaned into
another user's id.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from starlette.requests import Request

from clawrl.access import key_user
from clawrl.config import UserSourceName
from clawrl.gateway.auth import key_fingerprint, presented_key
from clawrl.gateway.errors import ClientInputError
from clawrl.store.users import user_id_problem

UserSource = UserSourceName
USER_HEADER = "x-clawrl-user"
DEFAULT_USER_FROM: tuple[UserSource, ...] = ("header", "body")


def body_user(
    user: Any = None,
    metadata: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> tuple[str, Any] | None:
    """The end-user field a request body carries, as ``(field, value)``, or ``None``.

    Args:
        user: OpenAI's ``user``.
        metadata: the body's ``metadata`` (Anthropic's ``metadata.user_id``).
        extra: the body's other fields (OpenAI's ``safety_identifier``).
    """
    if user is not None:
        return "user", user
    if extra is not None and extra.get("safety_identifier") is not None:
        return "safety_identifier", extra["safety_identifier"]
    if isinstance(metadata, Mapping) and metadata.get("user_id") is not None:
        value = metadata["user_id"]
        if isinstance(value, str) and (_is_json_object(value) or _OLD_CLAUDE_CODE.search(value)):
            return None  # Claude Code: it names the session (and device), not a user
        return "metadata.user_id", value
    return None


_OLD_CLAUDE_CODE = re.compile(r"_session_[0-9a-fA-F-]{36}$")
"""Claude Code before its JSON ``metadata.user_id``: ``user_<hash>_account_<id>_session_<uuid>``
(a new "user" per session if taken as one)."""


def _is_json_object(text: str) -> bool:
    if not text.lstrip().startswith("{"):
        return False
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def resolve_user(
    request: Request, from_body: tuple[str, Any] | None, user_from: Sequence[UserSource]
) -> str:
    """The request's user id (``""``: none), from the first of ``user_from`` that gives one.

    Args:
        request: the HTTP request (headers, the presented API key).
        from_body: :func:`body_user` of the request body.
        user_from: where to look, in order (``server.user_from``).

    A request made with a user's key (:func:`clawrl.gateway.auth.key_user`) is that user's,
    whatever ``user_from`` says.

    Raises:
        ClientInputError: (400, ``invalid_user``) the first source that gives a value gives
            one that cannot be a user id; (403, ``user_mismatch``) a user's key with a header or
            body naming another user.
    """
    keyed = key_user(request)
    if keyed is not None:
        for where, value in ((USER_HEADER, request.headers.get(USER_HEADER)),
                             from_body or (None, None)):  # fmt: skip
            if isinstance(value, str) and value.strip() and value.strip() != keyed:
                raise ClientInputError(
                    f"{where} names user {value.strip()!r} but this API key belongs to user "
                    f"{keyed!r} (a user's key acts for that user only)",
                    status=403, param=where, code="user_mismatch",
                )  # fmt: skip
        return keyed
    for source in user_from:
        if source == "header":
            found: tuple[str, Any] | None = None
            if (value := request.headers.get(USER_HEADER)) is not None:
                found = (USER_HEADER, value)
        elif source == "body":
            found = from_body
        else:
            fingerprint = key_fingerprint(presented_key(request))
            found = None if fingerprint is None else ("api key", fingerprint)
        if found is None:
            continue
        where, value = found
        if isinstance(value, str):
            value = value.strip()
            if not value:
                continue
        problem = user_id_problem(value)
        if problem is not None:
            raise ClientInputError(
                f"{where} names the user of this request and {problem} (a user id is a string "
                "of at most 256 characters without control characters)",
                param=where,
                code="invalid_user",
            )
        return str(value)
    return ""
