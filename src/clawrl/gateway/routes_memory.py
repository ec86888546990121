"""The preference memory over HTTP (:mod:`clawrl.memory`): what the gateway adds to main calls
with ``clawrl serve --memory``, to read and change while it serves.

* ``GET /v1/memory`` — ``{"object": "list", "enabled", "data": [entry, ...]}``: the active
  entries (``?all=true``: every entry, ended ones too).
* ``GET /v1/memory/{id}`` — one entry with its history; 404 when there is none.
* ``POST /v1/memory`` — ``{"text"}``: remember a directive by hand (the same rules as hints:
  merged into a near-duplicate, or replacing an entry it contradicts); 201 with the entry.
* ``PATCH /v1/memory/{id}`` — ``{"text"?, "active"?}``: edit the text, turn it off or back on.
* ``DELETE /v1/memory/{id}`` — forget it: its text and history are removed for good.

An entry is ``{"id", "object": "memory.entry", "text", "status", "source", "source_turn_id",
"source_session_id", "support", "created_at", "updated_at", "ended_at", "end_reason"}`` (and
``"history"`` from ``GET /v1/memory/{id}``; ``"note"`` from ``POST`` and ``PATCH`` when the
server runs without ``--memory``: the entry is kept, not used). Errors are OpenAI-shaped (400,
404).
"""

from __future__ import annotations

from typing import Any

import anyio.to_thread
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from clawrl.access import require_admin
from clawrl.errors import ClientInputError
from clawrl.gateway.state import GatewayState
from clawrl.memory import MemoryKeeper, entry_json
from clawrl.store import MemoryEntryRecord, MemoryStatus
from clawrl.store.memory import MAX_TEXT_CHARS

router = APIRouter()


OFF_NOTE = ("memory is off on this server: the entry is kept but not added to prompts "
            "(clawrl serve --memory adds them)")  # fmt: skip
"""The ``note`` of an entry added or changed while memory is off."""


def _gw(request: Request) -> GatewayState:
    gw: GatewayState = request.app.state.gateway
    return gw


def _keeper(request: Request) -> MemoryKeeper:
    require_admin(request, "the memory of the served policy")
    gw: GatewayState = request.app.state.gateway
    if gw.memory is not None:
        return gw.memory
    if gw.memory_admin is None:  # memory off: the entries can still be read and changed
        gw.memory_admin = MemoryKeeper(gw.store)
    return gw.memory_admin


def _not_found(entry_id: str, keeper: MemoryKeeper | None = None) -> ClientInputError:
    """404 for ``entry_id``; when it is the start of one entry's id (``clawrl memory list``
    shows 12 characters), the message names the full id: the API takes full ids only."""
    more = ""
    if keeper is not None and entry_id:
        ids = [e.id for e in keeper.store.memory_entries(keeper.user_id, active_only=False)
               if e.id.startswith(entry_id) and e.id != entry_id
               and e.status != MemoryStatus.FORGOTTEN]  # fmt: skip
        if len(ids) == 1:
            more = f"; the API takes the full id: did you mean {ids[0]!r}?"
    return ClientInputError(f"no memory entry {entry_id!r} (GET /v1/memory lists them){more}",
                            status=404, param="id", code="memory_entry_not_found")  # fmt: skip


class MemoryAdd(BaseModel):
    """``POST /v1/memory``."""

    model_config = ConfigDict(extra="forbid")
    text: str = Field(..., min_length=1, max_length=MAX_TEXT_CHARS)


class MemoryEdit(BaseModel):
    """``PATCH /v1/memory/{id}``."""

    model_config = ConfigDict(extra="forbid")
    text: str | None = Field(None, min_length=1, max_length=MAX_TEXT_CHARS)
    active: bool | None = None


@router.get("/v1/memory")
async def list_memory(request: Request, all: bool = False) -> dict[str, Any]:
    """The memory's entries (active ones; ``?all=true``: every one)."""
    keeper = _keeper(request)
    gw: GatewayState = request.app.state.gateway

    def read() -> list[MemoryEntryRecord]:
        if gw.memory is not None:  # serving with memory: what the next call would get
            keeper.sync()
        return keeper.store.memory_entries(keeper.user_id, active_only=not all)

    entries = await anyio.to_thread.run_sync(read)
    return {"object": "list", "enabled": gw.memory is not None,
            "data": [entry_json(e) for e in entries]}  # fmt: skip


@router.get("/v1/memory/{entry_id}")
async def get_memory(entry_id: str, request: Request) -> dict[str, Any]:
    keeper = _keeper(request)

    def read() -> MemoryEntryRecord:
        e = keeper.store.get_memory_entry(entry_id)
        if e is None or e.user_id != keeper.user_id:
            raise _not_found(entry_id, keeper)
        return e

    return entry_json(await anyio.to_thread.run_sync(read), history=True)


@router.post("/v1/memory", status_code=201)
async def add_memory(body: MemoryAdd, request: Request) -> JSONResponse:
    keeper = _keeper(request)
    if not body.text.strip():
        raise ClientInputError("a memory entry needs a text", param="text")
    e = await anyio.to_thread.run_sync(keeper.remember, body.text)
    assert e is not None  # a non-empty text always lands
    out = entry_json(e)
    if _gw(request).memory is None:
        out["note"] = OFF_NOTE
    return JSONResponse(out, status_code=201)


@router.patch("/v1/memory/{entry_id}")
async def edit_memory(entry_id: str, body: MemoryEdit, request: Request) -> dict[str, Any]:
    keeper = _keeper(request)
    if body.text is None and body.active is None:
        raise ClientInputError("nothing to change: send 'text' and/or 'active'", param="text")

    def edit() -> MemoryEntryRecord:
        try:
            return keeper.edit(entry_id, text=body.text, active=body.active)
        except KeyError:
            raise _not_found(entry_id, keeper) from None
        except ValueError as e:
            raise ClientInputError(str(e), param="active" if body.active else "text") from e

    out = entry_json(await anyio.to_thread.run_sync(edit))
    if _gw(request).memory is None:
        out["note"] = OFF_NOTE
    return out


@router.delete("/v1/memory/{entry_id}")
async def forget_memory(entry_id: str, request: Request) -> dict[str, Any]:
    keeper = _keeper(request)

    def forget() -> None:
        if not keeper.forget(entry_id):
            raise _not_found(entry_id, keeper)

    await anyio.to_thread.run_sync(forget)
    return {"id": entry_id, "object": "memory.entry", "deleted": True,
            "status": str(MemoryStatus.FORGOTTEN)}  # fmt: skip
