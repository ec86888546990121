"""Every error the gateway answers, in OpenAI's error shape, mapped once per boundary.

Shape (what the ``openai`` SDK parses into ``APIStatusError``)::

    {"error": {"message": "...", "type": "invalid_request_error", "param": "messages[2]",
               "code": "invalid_value"}}

Mapping (one status per error class, decided here only):

================================  ======  =========================  ==========================
raised                            status  ``type``                   ``kind`` (metrics, turns)
================================  ======  =========================  ==========================
``AuthError``                     401     ``authentication_error``   ``auth``
``ClientInputError``              its own ``invalid_request_error``  ``client_input`` / its code
request validation (pydantic)     400     ``invalid_request_error``  ``validation``
malformed JSON body               400     ``invalid_request_error``  ``invalid_json``
unknown route / method            404/405 ``invalid_request_error``  ``not_found`` / ...
``EngineClosedError``             503     ``server_error``           ``engine_closed``
``EngineUnavailableError``        503     ``server_error``           ``engine_unavailable``
``EngineError``                   500     ``server_error``           ``engine``
``StoreError``                    500     ``server_error``           ``store``
anything else                     500     ``server_error``           ``internal``
================================  ======  =========================  ==========================
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from clawrl.errors import (
    ClientInputError,
    ContextLengthError,
    EngineClosedError,
    EngineError,
    EngineUnavailableError,
    StoreError,
)

log = logging.getLogger(__name__)


class AuthError(ClientInputError):
    """The request lacks the gateway's API key or carries a wrong one (HTTP 401)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, status=401, code="invalid_api_key")


def error_body(
    message: str, type_: str, *, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """The OpenAI error object ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_kind(exc: BaseException) -> str:
    """A short, stable name for an error, used as a metrics label and as a turn's error kind."""
    if isinstance(exc, AuthError):
        return "auth"
    if isinstance(exc, ContextLengthError):
        return "context_length_exceeded"
    if isinstance(exc, ClientInputError):
        return exc.code or "client_input"
    if isinstance(exc, EngineClosedError):
        return "engine_closed"
    if isinstance(exc, EngineUnavailableError):
        return "engine_unavailable"
    if isinstance(exc, EngineError):
        return "engine"
    if isinstance(exc, StoreError):
        return "store"
    return "internal"


def status_and_body(exc: BaseException) -> tuple[int, dict[str, Any]]:
    """HTTP status and OpenAI error body for a clawrl error (or any other exception: 500)."""
    if isinstance(exc, AuthError):
        return 401, error_body(exc.message, "authentication_error", code=exc.code)
    if isinstance(exc, ClientInputError):
        return exc.status, error_body(
            exc.message, "invalid_request_error", param=exc.param, code=exc.code
        )
    if isinstance(exc, EngineClosedError):
        return 503, error_body(
            f"the engine is shut down: {exc}", "server_error", code="unavailable"
        )
    if isinstance(exc, EngineUnavailableError):
        return 503, error_body(
            f"the engine is unavailable, retry: {exc}", "server_error", code="unavailable"
        )
    if isinstance(exc, EngineError):
        return 500, error_body(f"generation failed: {exc}", "server_error", code="engine_error")
    if isinstance(exc, StoreError):
        return 500, error_body(
            f"the call could not be recorded: {exc}", "server_error", code="store_error"
        )
    return 500, error_body(f"internal error: {type(exc).__name__}", "server_error")


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None, str]:
    """(message, param, kind) for the first pydantic error of a request."""
    errors = exc.errors()
    if not errors:
        return "invalid request", None, "validation"
    first = errors[0]
    loc = [str(x) for x in first.get("loc", ()) if x != "body"]
    if first.get("type") == "json_invalid":
        ctx = first.get("ctx") or {}
        detail = ctx.get("error", first.get("msg", "invalid JSON"))
        return f"the request body is not valid JSON: {detail}", None, "invalid_json"
    param = _format_loc(loc) if loc else None
    if first.get("type") == "missing" and not loc:
        return "the request body is missing (a JSON object is required)", None, "validation"
    msg = first.get("msg", "invalid value")
    more = f" (and {len(errors) - 1} more errors)" if len(errors) > 1 else ""
    where = f"'{param}': " if param else ""
    return f"{where}{msg}{more}", param, "validation"


def _format_loc(loc: list[str]) -> str:
    out = ""
    for part in loc:
        if part.isdigit():
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out


def client_shaped(
    path: str, status: int, body: dict[str, Any], exc: BaseException | None = None
) -> dict[str, Any]:
    """``body`` in the error shape of the route's own protocol: Anthropic's
    (:func:`clawrl.gateway.anthropic_format.error_json`) under ``/v1/messages``, else OpenAI's;
    under ``/v1/responses`` a ``param`` of ``messages`` (a prompt too long, a template that
    rejects the conversation) names the Responses field, ``input``."""
    from clawrl.gateway.anthropic_format import error_json, is_anthropic_path

    if is_anthropic_path(path):
        return error_json(status, body, exc)
    err = body.get("error")
    responses = path.rstrip("/").endswith("/v1/responses")
    if responses and isinstance(err, dict) and err.get("param") == "messages":
        return {**body, "error": {**err, "param": "input"}}
    return body


def install_error_handlers(app: FastAPI, on_error: Any = None, on_answer: Any = None) -> None:
    """Register handlers that answer every error in OpenAI's shape (Anthropic's under the
    Anthropic routes, :func:`client_shaped`).

    Args:
        app: the FastAPI app.
        on_error: optional ``callable(kind: str)`` called once per error answered (metrics).
        on_answer: optional ``callable(method, path, status, message)`` called once per error
            answered that recorded no turn (``clawrl serve``'s console line for a refused
            request; a prompt too long is recorded as an error turn, whose line says so).
    """

    def note(kind: str) -> None:
        if on_error is not None:
            on_error(kind)

    def answered(request: Request, status: int, body: dict[str, Any]) -> None:
        if on_answer is None:
            return
        err = body.get("error")
        message = err.get("message", "") if isinstance(err, dict) else str(err)
        try:
            on_answer(request.method, request.url.path, status, str(message))
        except Exception:  # a console line must never change the answer
            log.exception("an error listener failed")

    async def clawrl_error(request: Request, exc: Exception) -> JSONResponse:
        status, body = status_and_body(exc)
        note(error_kind(exc))
        if status >= 500:
            log.error("%s %s failed: %s", request.method, request.url.path, exc)
        headers = {"WWW-Authenticate": "Bearer"} if isinstance(exc, AuthError) else None
        if not isinstance(exc, ContextLengthError | EngineError):  # those record a turn
            answered(request, status, body)
        body = client_shaped(request.url.path, status, body, exc)
        return JSONResponse(body, status_code=status, headers=headers)

    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param, kind = _validation_message(exc)
        note(kind)
        code = "invalid_json" if kind == "invalid_json" else "invalid_value"
        body = error_body(message, "invalid_request_error", param=param, code=code)
        answered(request, 400, body)
        return JSONResponse(client_shaped(request.url.path, 400, body), status_code=400)

    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        note(code or f"http_{exc.status_code}")
        type_ = "invalid_request_error" if exc.status_code < 500 else "server_error"
        message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 404:
            message = f"no route {request.method} {request.url.path} ({message})"
        body = error_body(message, type_, code=code)
        answered(request, exc.status_code, body)
        return JSONResponse(
            client_shaped(request.url.path, exc.status_code, body),
            status_code=exc.status_code,
            headers=getattr(exc, "headers", None),
        )

    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error in %s %s", request.method, request.url.path)
        note("internal")
        body = error_body(f"internal error: {type(exc).__name__}: {exc}", "server_error")
        answered(request, 500, body)
        return JSONResponse(client_shaped(request.url.path, 500, body, exc), status_code=500)

    for cls in (ClientInputError, EngineError, StoreError):
        app.add_exception_handler(cls, clawrl_error)
    app.add_exception_handler(RequestValidationError, validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, http_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, unexpected)
