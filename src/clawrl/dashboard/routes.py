"""The dashboard's routes: five pages and the JSON they poll.

==========================================  ===================================================
route                                       serves
==========================================  ===================================================
``GET /dashboard``                          overview: policy version, traffic, backlog, drops
``GET /dashboard/sessions``                 searchable session list
``GET /dashboard/session?id=ID``            one session's prefix tree, judgments, training
``GET /dashboard/training``                 live curves (and the demo's evaluations)
``GET /dashboard/judge``                    score distribution, abstentions, agreement
``GET /dashboard/memory``                   the preference memory: active and ended entries
``GET /dashboard/api/{overview,sessions,``  the JSON each page polls every
``training,judge,memory}``,                 :data:`POLL_MS` milliseconds
``/api/session?id=ID``
``GET /dashboard/static/{file}``            ``app.js``, ``style.css`` (shipped in the package)
==========================================  ===================================================

Pages are a static HTML shell filled by ``app.js`` (no build step, no CDN: it works offline).
Every text from the store reaches the page through ``textContent``, never as HTML. Store reads
run in a worker thread. Auth is the gateway's (:class:`clawrl.gateway.auth.ApiKeyMiddleware`):
with an API key set a browser gets a Basic-auth prompt (any user name, the key as password).
"""

from __future__ import annotations

import html
from importlib import resources
from typing import Any

import anyio
import anyio.to_thread
from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from clawrl.access import key_user, own_session, require_admin
from clawrl.dashboard.data import PAGE_SIZE_MAX, DashboardSource
from clawrl.errors import ClientInputError, StoreError
from clawrl.store.users import MAX_USER_ID_CHARS, user_id_problem

PREFIX = "/dashboard"
POLL_MS = 2000
"""How often a page refreshes its data (milliseconds)."""

PAGES = {
    "overview": ("", "Overview"),
    "sessions": ("/sessions", "Sessions"),
    "training": ("/training", "Training"),
    "judge": ("/judge", "Judge"),
    "memory": ("/memory", "Memory"),
}
STATIC = {"app.js": "text/javascript; charset=utf-8", "style.css": "text/css; charset=utf-8"}


def _source(request: Request) -> DashboardSource:
    source: DashboardSource = request.app.state.dashboard
    return source


def _shell(page: str, source: DashboardSource, extra: dict[str, str] | None = None) -> str:
    nav = "".join(
        f'<a href="{PREFIX}{path}" class="{"on" if key == page else ""}">{title}</a>'
        for key, (path, title) in PAGES.items()
    )
    data = {"page": page, "prefix": PREFIX, "poll": str(POLL_MS), **(extra or {})}
    if source.read_only:
        data["readonly"] = "1"
    attrs = " ".join(f'data-{k}="{html.escape(v, quote=True)}"' for k, v in data.items())
    title = html.escape(source.title)
    badge = ' <span class="badge">read-only</span>' if source.read_only else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title} · {PAGES.get(page, ("", "Session"))[1]}</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="{PREFIX}/static/style.css"></head>
<body {attrs}>
<header><span class="brand">clawrl</span> <span class="title">{title}</span>{badge}
<nav>{nav}</nav><span id="live" class="live">connecting…</span></header>
<main id="main"><p class="muted">loading…</p></main>
<script src="{PREFIX}/static/app.js"></script>
</body></html>"""


router = APIRouter(prefix=PREFIX)


def _page(page: str) -> Any:
    async def serve(request: Request) -> HTMLResponse:
        return HTMLResponse(_shell(page, _source(request)))

    serve.__doc__ = f"The {PAGES[page][1].lower()} page."
    return serve


for _key, (_path, _title) in PAGES.items():
    router.add_api_route(_path, _page(_key), methods=["GET"], response_class=HTMLResponse)


SESSION_ID = Query(..., alias="id", min_length=1, max_length=4096)
"""A session id as a query parameter: ids may hold ``/``, or be ``.`` / ``..``, which a path
segment cannot carry through a browser."""


@router.get("/session", response_class=HTMLResponse)
async def session_page(request: Request, session_id: str = SESSION_ID) -> HTMLResponse:
    """One session's page (``?id=SESSION_ID``)."""
    return HTMLResponse(_shell("session", _source(request), {"session": session_id}))


@router.get("/static/{name}")
async def static(name: str) -> Response:
    """``app.js`` and ``style.css`` from the package (404 for anything else)."""
    if name not in STATIC:
        raise ClientInputError(f"no dashboard asset {name!r}", status=404, code="not_found")
    body = resources.files("clawrl.dashboard").joinpath("static", name).read_bytes()
    return Response(body, media_type=STATIC[name], headers={"Cache-Control": "no-cache"})


READERS = 2
"""Dashboard reads in flight at once (their own worker threads: a page open in many tabs never
takes the gateway's threads for recording turns)."""


async def _json(request: Request, fn: Any, *args: Any) -> JSONResponse:
    """``fn(*args)`` in a worker thread under the app's own :data:`READERS` limiter (made on
    first use, inside the app's event loop), as JSON that is never cached."""
    limiter = getattr(request.app.state, "dashboard_limiter", None)
    if limiter is None:
        limiter = request.app.state.dashboard_limiter = anyio.CapacityLimiter(READERS)
    data = await anyio.to_thread.run_sync(fn, *args, limiter=limiter)
    return JSONResponse(data, headers={"Cache-Control": "no-store"})


@router.get("/api/overview")
async def api_overview(request: Request) -> JSONResponse:
    """:meth:`DashboardSource.overview` (the admin key's only: it spans every user)."""
    require_admin(request, "the overview")
    return await _json(request, _source(request).overview)


@router.get("/api/sessions")
async def api_sessions(
    request: Request,
    q: str = Query("", max_length=500),
    limit: int = Query(100, ge=1, le=PAGE_SIZE_MAX),
    offset: int = Query(0, ge=0, le=2**62),
    user: str | None = Query(None, max_length=MAX_USER_ID_CHARS),
) -> JSONResponse:
    """:meth:`DashboardSource.sessions` (``q``: search text; ``user``: only sessions with this
    user's turns, ``""`` for turns without a user; a bad value is a 400 naming it)."""
    if "\x00" in q:
        raise ClientInputError("the search text 'q' must not contain NUL characters", param="q")
    if user is not None and (problem := user_id_problem(user)) is not None:
        raise ClientInputError(f"the user filter {problem}", param="user")
    keyed = key_user(request)
    if keyed is not None:  # a user's key: their sessions only
        if user is not None and user != keyed:
            raise ClientInputError(f"this key is user {keyed!r}'s: it lists their sessions only",
                                   status=403, param="user", code="user_mismatch")  # fmt: skip
        user = keyed
    return await _json(request, _source(request).sessions, q, limit, offset, user)


@router.get("/api/session")
async def api_session(request: Request, asked: str = SESSION_ID) -> JSONResponse:
    """:meth:`DashboardSource.session`.

    Raises:
        ClientInputError: 404 for an unknown session.
    """
    source = _source(request)
    keyed = key_user(request)

    def read() -> dict[str, Any]:
        session_id = own_session(request, asked)
        theirs = keyed is None or keyed in source.store.session_user_ids(session_id)
        if source.store.get_session(session_id) is None or not theirs:
            raise ClientInputError(
                f"session {session_id!r} does not exist",
                status=404,
                param="id",
                code="session_not_found",
            )
        try:
            return source.session(session_id)
        except StoreError as exc:
            raise ClientInputError(str(exc), status=404, code="session_not_found") from exc

    return await _json(request, read)


@router.get("/api/training")
async def api_training(request: Request) -> JSONResponse:
    """:meth:`DashboardSource.training` (the admin key's only)."""
    require_admin(request, "the training page")
    return await _json(request, _source(request).training)


@router.get("/api/judge")
async def api_judge(request: Request) -> JSONResponse:
    """:meth:`DashboardSource.judge` (the admin key's only)."""
    require_admin(request, "the judge page")
    return await _json(request, _source(request).judge)


@router.get("/api/memory")
async def api_memory(request: Request) -> JSONResponse:
    """:meth:`DashboardSource.memory` (the admin key's only)."""
    require_admin(request, "the memory page")
    return await _json(request, _source(request).memory)


async def _root() -> RedirectResponse:
    """``GET /``: a browser pointed at the server's root lands on the dashboard."""
    return RedirectResponse(PREFIX, status_code=307)


def mount_dashboard(app: FastAPI, source: DashboardSource) -> DashboardSource:
    """Serve the dashboard on ``app`` under ``/dashboard`` (and redirect ``GET /`` to it);
    returns ``source`` (the caller may set its ``demo`` view later)."""
    app.state.dashboard = source
    app.include_router(router)
    app.add_api_route("/", _root, methods=["GET"], include_in_schema=False)
    return source
