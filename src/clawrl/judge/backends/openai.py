"""Judging through any OpenAI-compatible ``/chat/completions`` endpoint.

Each vote is one request (``n`` is not used: not every server supports it) with the generative
prompt (:data:`clawrl.judge.prompts.GENERATIVE_SYSTEM`), ``temperature``, ``top_p``, ``max_tokens``
and ``seed = base_seed + index``; votes run concurrently. The reply's ``choices[0].message.content``
is read by :mod:`clawrl.judge.parse`.

**Failures.** Every request has a timeout (``request_timeout_s``). Timeouts, connection errors
and HTTP 408/429/500/502/503/504 are retried at most ``max_retries`` times, waiting
``backoff_s * 2**attempt`` seconds (capped at :data:`MAX_BACKOFF_S`; a numeric ``Retry-After``
up to the cap is honoured). Any other HTTP error, a reply that is not the expected JSON, or the
last failed retry becomes an abstention (``backend_error``) with the cause in its detail; nothing
is raised. The judge's overall timeout cancels whatever is still running.

The API key is read from the environment variable named by ``api_key_env`` (never from a
config file or the command line) and sent as ``Authorization: Bearer``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Sequence
from typing import Any

import httpx

from clawrl.errors import JudgeError
from clawrl.judge.backends.base import failed_vote, vote_from_text
from clawrl.judge.prompts import GENERATIVE_SYSTEM, generative_user_prompt
from clawrl.judge.types import AbstainReason, BackendKind, JudgeInput, Vote

MAX_BACKOFF_S = 8.0
RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})


class OpenAIBackend:
    """Votes from an OpenAI-compatible endpoint.

    Args:
        url: the API base, e.g. ``http://127.0.0.1:8000/v1`` (``/chat/completions`` is appended).
        model: the ``model`` field of each request.
        api_key_env: name of the environment variable holding the key (``None``: no key).
        request_timeout_s: timeout of one HTTP request (seconds).
        max_retries: retries after the first attempt (0 = no retry).
        backoff_s: first retry delay (seconds), doubled each retry.
        max_tokens: ``max_tokens`` of each request.
        temperature: sampling temperature of each vote.
        top_p: nucleus mass.
        base_seed: vote ``i`` sends ``seed = base_seed + i``.
        transport: an ``httpx`` transport (tests use ``httpx.MockTransport``).

    Raises:
        JudgeError: ``api_key_env`` names a variable that is not set.
    """

    kind = BackendKind.OPENAI
    batched = False
    writes_hints = True

    def __init__(
        self,
        url: str,
        model: str,
        *,
        api_key_env: str | None = None,
        request_timeout_s: float = 30.0,
        max_retries: int = 2,
        backoff_s: float = 0.5,
        max_tokens: int = 256,
        temperature: float = 0.8,
        top_p: float = 0.95,
        base_seed: int = 0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.endpoint = url.rstrip("/") + "/chat/completions"
        self.model = model
        self.headers = {"Content-Type": "application/json"}
        if api_key_env:
            key = os.environ.get(api_key_env)
            if not key:
                raise JudgeError(f"environment variable {api_key_env} (judge API key) is not set")
            self.headers["Authorization"] = f"Bearer {key}"
        self.request_timeout_s = request_timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.top_p = top_p
        self.base_seed = base_seed
        self._transport = transport
        self._client: httpx.AsyncClient | None = None

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(
                timeout=self.request_timeout_s, headers=self.headers, transport=self._transport
            )
        return self._client

    def request_body(self, inp: JudgeInput, index: int) -> dict[str, Any]:
        """The JSON body of vote ``index``."""
        return {
            "model": self.model,
            "messages": [
                {"role": "system", "content": GENERATIVE_SYSTEM},
                {"role": "user", "content": generative_user_prompt(inp)},
            ],
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "seed": self.base_seed + index,
        }

    async def votes(self, inp: JudgeInput, indices: Sequence[int]) -> list[Vote]:
        """One request per vote, concurrently; see :class:`JudgeBackend`."""
        return list(await asyncio.gather(*(self._vote(inp, i) for i in indices)))

    async def _vote(self, inp: JudgeInput, index: int) -> Vote:
        seed = self.base_seed + index
        body = self.request_body(inp, index)
        start = time.perf_counter()
        error = "no attempt"
        retry_after: str | None = None
        for attempt in range(self.max_retries + 1):
            if attempt:
                await asyncio.sleep(self._delay(attempt, retry_after))
                retry_after = None
            try:
                resp = await self._http().post(self.endpoint, json=body)
            except httpx.TimeoutException:
                error = f"timeout after {self.request_timeout_s}s"
                continue
            except httpx.TransportError as e:
                error = f"transport error: {type(e).__name__}: {e}"
                continue
            if resp.status_code in RETRY_STATUS:
                error = f"HTTP {resp.status_code}: {resp.text[:200]}"
                retry_after = resp.headers.get("retry-after")
                continue
            if resp.status_code >= 400:
                detail = f"HTTP {resp.status_code}: {resp.text[:200]}"
                return failed_vote(index, AbstainReason.BACKEND_ERROR, detail, seed=seed)
            text, finish = _reply_text(resp)
            if text is None:
                return failed_vote(index, AbstainReason.BACKEND_ERROR, finish, seed=seed)
            return vote_from_text(
                index,
                text,
                seed=seed,
                latency_s=time.perf_counter() - start,
                truncated=finish == "length",
            )
        tries = self.max_retries + 1
        detail = f"{error} ({tries} attempt{'s' if tries > 1 else ''})"
        return failed_vote(index, AbstainReason.BACKEND_ERROR, detail, seed=seed)

    def _delay(self, attempt: int, retry_after: str | None) -> float:
        """Seconds before retry ``attempt`` (1-based): exponential, or a numeric Retry-After."""
        delay = min(self.backoff_s * 2 ** (attempt - 1), MAX_BACKOFF_S)
        if retry_after is not None:
            with contextlib.suppress(ValueError):  # an HTTP date: keep the exponential delay
                delay = min(max(float(retry_after), delay), MAX_BACKOFF_S)
        return delay

    async def aclose(self) -> None:
        """Close the HTTP client."""
        if self._client is not None:
            await self._client.aclose()
            self._client = None


def _reply_text(resp: httpx.Response) -> tuple[str | None, str]:
    """``(content, finish_reason)`` of a chat completion, or ``(None, why it is unusable)``."""
    try:
        data = resp.json()
        choice = data["choices"][0]
        content = choice["message"].get("content")
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as e:
        return None, f"unexpected reply ({type(e).__name__}): {resp.text[:200]}"
    if not isinstance(content, str):
        return "", str(choice.get("finish_reason"))
    return content, str(choice.get("finish_reason"))
