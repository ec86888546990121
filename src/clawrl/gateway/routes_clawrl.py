"""clawrl's own routes: health, metrics, ending sessions and explicit feedback.

* ``GET /healthz`` — ``{"status": "ok", "model", "policy_version"}`` (no auth); 503 with
  ``"status": "unavailable"`` while the engine can serve nothing.
* ``GET`` / ``HEAD /api/hello`` — ``{"status": "ok"}``: Claude Code's connectivity preflight
  (2.1.x sends ``HEAD /api/hello`` to its base URL before the first call); no auth, like
  ``/healthz``.
* ``GET /metrics`` — Prometheus text (:mod:`clawrl.gateway.metrics`).
* ``POST /v1/sessions/{id}/end`` — close a session: later calls are no longer linked to it by
  prefix inference. 404 for an unknown session (and, with a user's key, for a session without
  a turn of that user: :mod:`clawrl.gateway.auth`).
* ``POST /v1/feedback`` — ``{"turn_id" | "session_id", "reward": -1..1, "comment"?}``: a
  next-state signal for the judge and the trainer. 400 for a reward out of range or no id,
  404 for an unknown turn or session (a user's key: another user's too). With ``clawrl serve --memory`` the comment's directive
  goes into the memory before the answer (``"memory_changed"``: entries added or changed).
"""

from __future__ import annotations

from typing import Any

import anyio.to_thread
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel, ConfigDict, Field

from clawrl.access import key_user, own_session, require_admin
from clawrl.errors import ClientInputError
from clawrl.gateway.state import GatewayState
from clawrl.policy_version import version_fields
from clawrl.store import FeedbackRecord, Store

router = APIRouter()


def _gw(request: Request) -> GatewayState:
    return request.app.state.gateway


@router.get("/healthz", response_model=None)
async def healthz(request: Request) -> dict[str, Any] | JSONResponse:
    """Health: the served model and the policy version; HTTP 503 with ``"status":
    "unavailable"`` while the engine can serve nothing (every vLLM replica down), so a load
    balancer sends requests to another replica."""
    gw = _gw(request)
    body = {
        "status": "ok",
        "model": gw.model_name,
        **version_fields(gw.engine.policy_version),
    }
    if not gw.engine.available:
        return JSONResponse({**body, "status": "unavailable"}, status_code=503)
    return body


@router.api_route("/api/hello", methods=["GET", "HEAD"])
async def hello() -> dict[str, str]:
    """Connectivity preflight (Claude Code's ``HEAD /api/hello``): always ``{"status": "ok"}``."""
    return {"status": "ok"}


@router.get("/metrics")
async def metrics(request: Request) -> PlainTextResponse:
    """Prometheus text exposition (format 0.0.4); the admin key's only."""
    require_admin(request, "/metrics")
    gw = _gw(request)
    gw.metrics.read_engine(gw.engine)
    return PlainTextResponse(gw.metrics.render(), media_type="text/plain; version=0.0.4")


def _theirs(store: Store, session_id: str, user: str | None) -> bool:
    """Whether ``user``'s key may act on the session (``None``: the admin, or no keys)."""
    return user is None or user in store.session_user_ids(session_id)


def _end_session(store: Store, session_id: str, user: str | None = None) -> float | None:
    if store.get_session(session_id) is None or not _theirs(store, session_id, user):
        raise ClientInputError(
            f"session {session_id!r} does not exist",
            status=404,
            param="session_id",
            code="session_not_found",
        )
    store.end_session(session_id)
    session = store.get_session(session_id)
    return None if session is None else session.ended_at


@router.post("/v1/sessions/{session_id}/end")
async def end_session(session_id: str, request: Request) -> dict[str, Any]:
    """End a session (idempotent).

    Raises:
        ClientInputError: 404 for an unknown session.
    """
    gw = _gw(request)
    session_id = own_session(request, session_id)
    ended_at = await anyio.to_thread.run_sync(_end_session, gw.store, session_id, key_user(request))
    return {"id": session_id, "object": "session", "ended": True, "ended_at": ended_at}


class FeedbackRequest(BaseModel):
    """``POST /v1/feedback`` body."""

    model_config = ConfigDict(extra="forbid")

    turn_id: str | None = None
    session_id: str | None = None
    reward: float = Field(..., ge=-1.0, le=1.0, allow_inf_nan=False)
    comment: str | None = Field(None, max_length=20_000)


def _add_feedback(store: Store, body: FeedbackRequest, user: str | None = None) -> FeedbackRecord:
    if body.turn_id is None and body.session_id is None:
        raise ClientInputError("feedback needs a 'turn_id' or a 'session_id'", param="turn_id")
    if body.turn_id is not None:
        turn = store.get_turn(body.turn_id)
        if turn is None or (user is not None and turn.user_id != user):
            raise ClientInputError(
                f"turn {body.turn_id!r} does not exist",
                status=404,
                param="turn_id",
                code="turn_not_found",
            )
        if body.session_id is not None and body.session_id != turn.session_id:
            raise ClientInputError(
                f"turn {body.turn_id!r} is not in session {body.session_id!r}",
                param="session_id",
            )
    elif store.get_session(body.session_id or "") is None or not _theirs(
        store, body.session_id or "", user
    ):
        raise ClientInputError(
            f"session {body.session_id!r} does not exist",
            status=404,
            param="session_id",
            code="session_not_found",
        )
    return store.add_feedback(
        body.reward, turn_id=body.turn_id, session_id=body.session_id, comment=body.comment
    )


@router.post("/v1/feedback")
async def feedback(body: FeedbackRequest, request: Request) -> dict[str, Any]:
    """Record explicit feedback on a turn or a session.

    Raises:
        ClientInputError: 400 (no id, reward out of [-1, 1]), 404 (unknown turn or session).
    """
    gw = _gw(request)
    if body.session_id is not None:
        body = body.model_copy(update={"session_id": own_session(request, body.session_id)})
    fb = await anyio.to_thread.run_sync(_add_feedback, gw.store, body, key_user(request))
    extra: dict[str, Any] = {}
    memory = gw.memory
    if memory is not None:  # the comment's directive reaches the next session at once
        changed = await anyio.to_thread.run_sync(lambda: memory.sync(force=True))
        extra["memory_changed"] = changed
    return {
        "id": fb.id,
        "object": "feedback",
        "turn_id": fb.turn_id,
        "session_id": fb.session_id,
        "reward": fb.reward,
        "comment": fb.comment,
        "created_at": fb.created_at,
        **extra,
    }
