"""An async client for OpenAI-compatible chat completions, over httpx (no SDK needed).

It speaks the plain wire format: ``POST {root}/v1/chat/completions`` with a JSON body, answer
``choices[0].message.content``. Against the clawrl gateway it adds session attribution and the
evaluation marker:

* a session's calls go to ``{root}/s/{session_id}/v1/chat/completions`` (the gateway's exact,
  first-priority attribution) and also carry ``X-Session-Id``;
* ``POST {root}/v1/sessions/{session_id}/end`` ends a session;
* ``eval_mode=True`` adds the header ``X-Clawrl-Eval: 1`` to every request — the online loop must
  not train on such calls (evaluation session ids also start with ``eval-``).

``root`` is the base URL without a trailing ``/v1``: ``http://127.0.0.1:8000`` and
``http://127.0.0.1:8000/v1`` both work.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx

from clawrl import __version__
from clawrl.envs.errors import ChatEndpointError
from clawrl.policy_version import parse_fingerprint

EVAL_HEADER = "X-Clawrl-Eval"
"""Header marking evaluation requests (value ``1``): the gateway records them, the learner
skips them."""
SESSION_HEADER = "X-Session-Id"
USER_AGENT = f"clawrl-envs/{__version__}"
"""Recorded by the gateway with each turn: these calls came from a simulated user."""
DEFAULT_TIMEOUT_S = 300.0
"""Per-request timeout (seconds): a CPU policy answering 256 tokens under load is slow."""


def api_root(base_url: str) -> str:
    """The server root of an OpenAI base URL: trailing ``/`` and ``/v1`` removed.

    Raises:
        ValueError: not an ``http://`` or ``https://`` URL.
    """
    url = base_url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"base URL must start with http:// or https://, got {base_url!r}")
    return url[: -len("/v1")] if url.endswith("/v1") else url


@dataclass(frozen=True)
class ChatResult:
    """One chat completion.

    Attributes:
        content: the assistant's text (``""`` when the model produced none).
        finish_reason: ``stop``, ``length``, ... as sent.
        model: the model name echoed by the server.
        policy_version: parsed from the gateway's ``system_fingerprint``
            (``clawrl-policy-vN``), else ``None``.
        session_id: the gateway's ``x-clawrl-session-id`` header, else ``None``.
        turn_ids: the gateway's ``x-clawrl-turn-ids`` header, split (empty elsewhere).
        usage: the ``usage`` object (``prompt_tokens``, ``completion_tokens``), possibly empty.
        latency_s: wall time of the request, seconds.
    """

    content: str
    finish_reason: str | None
    model: str | None = None
    policy_version: int | None = None
    session_id: str | None = None
    turn_ids: tuple[str, ...] = ()
    usage: dict[str, Any] = field(default_factory=dict)
    latency_s: float = 0.0


def _error_message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:300] or response.reason_phrase
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if body.get("detail"):
            return str(body["detail"])
    return str(body)[:300]


class ChatClient:
    """Chat completions against one OpenAI-compatible server.

    Use as an async context manager (or call :meth:`aclose`)::

        async with ChatClient("http://127.0.0.1:8000") as client:
            result = await client.complete(messages, model="policy", session_id="s-1")

    Args:
        base_url: the server's base URL (with or without ``/v1``).
        api_key: sent as ``Authorization: Bearer ...`` when set.
        timeout_s: per-request timeout, seconds.
        eval_mode: mark every request with ``X-Clawrl-Eval: 1``.
        headers: extra headers on every request.
        transport: an httpx transport (tests).

    Raises:
        ValueError: a malformed base URL.
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        eval_mode: bool = False,
        headers: Mapping[str, str] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.root = api_root(base_url)
        self.eval_mode = eval_mode
        hdrs = {
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
            **(headers or {}),
        }
        if api_key:
            hdrs["Authorization"] = f"Bearer {api_key}"
        if eval_mode:
            hdrs[EVAL_HEADER] = "1"
        self.timeout_s = timeout_s
        self._http = httpx.AsyncClient(
            headers=hdrs, timeout=httpx.Timeout(timeout_s, connect=10.0), transport=transport
        )

    async def __aenter__(self) -> ChatClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    def chat_url(self, session_id: str | None = None) -> str:
        """The chat-completions URL, under ``/s/{session_id}`` when a session is given."""
        if session_id is None:
            return f"{self.root}/v1/chat/completions"
        return f"{self.root}/s/{quote(session_id, safe='')}/v1/chat/completions"

    async def _post(
        self, url: str, body: dict[str, Any], headers: dict[str, str]
    ) -> tuple[httpx.Response, Any]:
        try:
            response = await self._http.post(url, json=body, headers=headers)
        except httpx.TimeoutException as e:
            raise ChatEndpointError(f"{url}: no answer within {self.timeout_s:g} s", url=url) from e
        except httpx.TransportError as e:
            raise ChatEndpointError(
                f"{url}: cannot connect ({e.__class__.__name__}: {e}); is the server running?",
                url=url,
            ) from e
        if response.status_code >= 400:
            raise ChatEndpointError(
                f"{url}: HTTP {response.status_code}: {_error_message(response)}",
                url=url,
                status=response.status_code,
            )
        try:
            return response, response.json()
        except ValueError as e:
            raise ChatEndpointError(f"{url}: the answer is not JSON", url=url) from e

    async def complete(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        model: str,
        temperature: float | None = None,
        max_tokens: int | None = None,
        seed: int | None = None,
        session_id: str | None = None,
    ) -> ChatResult:
        """One non-streaming chat completion.

        Args:
            messages: OpenAI chat messages.
            model: the model name (the gateway serves its policy under any name).
            temperature: sampling temperature (``None``: the server's default; 0 = greedy).
            max_tokens: new tokens at most (``None``: the server's default).
            seed: sampling seed, where the server supports it.
            session_id: attribute the call to this session (URL prefix and header).

        Raises:
            ChatEndpointError: connection error, timeout, HTTP status >= 400, or an answer
                without ``choices[0].message``.
        """
        body: dict[str, Any] = {"model": model, "messages": [dict(m) for m in messages]}
        if temperature is not None:
            body["temperature"] = temperature
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        if seed is not None:
            body["seed"] = seed
        headers = {SESSION_HEADER: session_id} if session_id is not None else {}
        url = self.chat_url(session_id)
        start = time.perf_counter()
        response, data = await self._post(url, body, headers)
        latency = time.perf_counter() - start
        try:
            choice = data["choices"][0]
            message = choice["message"]
        except (KeyError, IndexError, TypeError) as e:
            raise ChatEndpointError(f"{url}: answer has no choices[0].message", url=url) from e
        turn_ids = response.headers.get("x-clawrl-turn-ids", "")
        return ChatResult(
            content=str(message.get("content") or ""),
            finish_reason=choice.get("finish_reason"),
            model=data.get("model"),
            policy_version=parse_fingerprint(data.get("system_fingerprint")),
            session_id=response.headers.get("x-clawrl-session-id"),
            turn_ids=tuple(t for t in turn_ids.split(",") if t),
            usage=dict(data.get("usage") or {}),
            latency_s=latency,
        )

    async def end_session(self, session_id: str) -> None:
        """``POST /v1/sessions/{session_id}/end`` (the gateway's; idempotent).

        Raises:
            ChatEndpointError: the call failed (404 for a session the gateway never saw).
        """
        url = f"{self.root}/v1/sessions/{quote(session_id, safe='')}/end"
        await self._post(url, {}, {})
