"""The policy engine on one or more vLLM servers: token ids over HTTP, live policy versions.

:class:`VLLMEngine` is an :class:`clawrl.engine.Engine` whose forward passes run in vLLM
servers (``clawrl serve --engine vllm``). The gateway still renders every prompt itself and
sends token ids; the engine stores the ids vLLM sampled and their processed log-probs
(:mod:`clawrl.engine.vllm.protocol`). It owns one thread with its own event loop and HTTP
client, so any thread or event loop may call it, like the in-process engine.

**Policy versions.** A LoRA version is loaded into every healthy replica under a versioned
name (``POST /v1/load_lora_adapter``, ``clawrl-<run>-v<N>``) before any request is sent to it;
a request keeps the adapter name it started with, so requests in flight finish on their
version while new ones use the new one; an older adapter is unloaded once no request uses it.
Full weights (a state dict, or a model directory) are published by ``reload_weights`` from
disk (``POST /collective_rpc``, dev mode): new requests wait while the requests in flight
finish, every replica reloads, then the waiting requests go on the new version; nothing is
aborted. Every completion records the version that produced it.

**Replicas.** Requests go to the healthy replica with the fewest requests in flight. A replica
that refuses a connection or answers 5xx is taken out: its requests end with
:class:`EngineUnavailableError` (the gateway's 503, an error event in a stream; the turn is
recorded incomplete), and a health loop (``GET /health``) takes it back once it answers and has
been given the current version.

**Scoring.** ``score`` at temperature 1 reads ``prompt_logprobs`` (one request); at another
temperature vLLM's prompt log-probs do not apply (they skip the sampling processors), so each
target position is one request that returns the processed log-prob of the target id at the
next position (``logprob_token_ids``), all sent at once; vLLM's prefix cache serves their shared
prefix. ``base=True`` scores with the base model's served name.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx

from clawrl.engine import inputs
from clawrl.engine.sampling import GREEDY_BELOW
from clawrl.engine.types import Completion, EngineStats, SamplingParams, TokenEvent
from clawrl.engine.vllm import protocol
from clawrl.engine.vllm.checks import ServerInfo, check_server
from clawrl.errors import (
    EngineClosedError,
    EngineError,
    EngineUnavailableError,
)

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class Replica:
    """One vLLM server.

    Attributes:
        url: its base URL (``http://host:port``).
        healthy: whether requests may go to it.
        inflight: requests it is serving now.
        synced_version: the newest policy version it can serve (its adapter is loaded).
    """

    url: str
    healthy: bool = True
    inflight: int = 0
    synced_version: int = 0
    failures: int = 0


@dataclass
class _Version:
    """A published policy version: the served name requests use, and how many use it."""

    name: str
    adapter: Path | None = None  # LoRA adapter directory; None: the base name (full weights)
    inflight: int = 0


class VLLMEngine:
    """An :class:`clawrl.engine.Engine` over vLLM servers (see the module docstring).

    Args:
        urls: the replicas' base URLs (``http://127.0.0.1:8000``; a trailing ``/v1`` is
            dropped).
        tokenizer: the policy's tokenizer: its ids are what the servers must read and write
            (checked at start, :mod:`clawrl.engine.vllm.checks`).
        max_context: the context window in tokens; default and upper bound: the servers'
            smallest ``max_model_len``.
        publish_dir: where full weights given as a state dict are written for
            ``reload_weights`` (must be readable by the servers); default a temporary folder.
        request_timeout_s: seconds one request may take.
        health_interval_s: seconds between health checks of the replicas.
        api_key: a bearer key the servers require (``--api-key`` of vLLM), if any.
        on_close: called once by :meth:`close` (e.g. stopping a server clawrl launched).

    Raises:
        EngineError: a replica is unreachable or fails a check (raw log-probs, another
            tokenizer); the servers disagree on the base model.
    """

    scores_at_temperature = True
    """``score`` honours any temperature (see the module docstring)."""

    def __init__(
        self,
        urls: Sequence[str],
        tokenizer: Any,
        *,
        max_context: int | None = None,
        publish_dir: str | Path | None = None,
        request_timeout_s: float = 600.0,
        health_interval_s: float = 2.0,
        api_key: str | None = None,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        if not urls:
            raise EngineError("the vLLM engine needs at least one server URL (--vllm-url)")
        from clawrl.models import tokenizer_fingerprint

        self.tokenizer = tokenizer
        self.tokenizer_id = tokenizer_fingerprint(tokenizer)
        self.eos_token_ids = frozenset(int(i) for i in {tokenizer.eos_token_id} if i is not None)
        self.stats = EngineStats()
        self.policy_version = 0
        self.replicas = [Replica(_base_url(u)) for u in urls]
        self._timeout = float(request_timeout_s)
        self._health_interval = float(health_interval_s)
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._on_close = on_close
        self._publish_dir = Path(publish_dir) if publish_dir else None
        self._run = uuid.uuid4().hex[:8]
        self._closed = False
        self._versions: dict[int, _Version] = {}
        self._gate: asyncio.Event | None = None  # cleared while full weights reload
        self._tasks: set[asyncio.Task[Any]] = set()
        self._pending: set[concurrent.futures.Future[Any]] = set()  # callers waiting on the loop
        self._emitters: set[Callable[[TokenEvent | BaseException | None], None]] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="clawrl-vllm",
                                        daemon=True)  # fmt: skip
        self._thread.start()
        try:
            self.servers: list[ServerInfo] = self._call(self._start(max_context))
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ thread plumbing

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the engine loop and wait for it from a plain thread."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    async def _on_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the engine loop and await it from any other loop (a close while it
        runs raises :class:`EngineClosedError` in the caller)."""
        if self._closed:
            coro.close()
            raise EngineClosedError("engine is closed")
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        self._pending.add(fut)
        fut.add_done_callback(self._pending.discard)
        try:
            return await asyncio.wrap_future(fut)
        except asyncio.CancelledError:
            if self._closed and fut.cancelled():
                raise EngineClosedError("engine closed while the request ran") from None
            raise

    async def _start(self, max_context: int | None) -> list[ServerInfo]:
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(self._timeout, connect=10.0), headers=self._headers,
            limits=httpx.Limits(max_connections=1024, max_keepalive_connections=256),
        )  # fmt: skip
        self._gate = asyncio.Event()
        self._gate.set()
        infos = list(await asyncio.gather(*(check_server(self._client, r.url, self.tokenizer)
                                             for r in self.replicas)))  # fmt: skip
        roots = {i.root for i in infos}
        names = {i.model for i in infos}
        if len(names) > 1:
            raise EngineError(f"the vLLM replicas serve different base models: {sorted(roots)}")
        self.base_name = infos[0].model
        window = min(i.max_model_len for i in infos if i.max_model_len) if infos else 0
        if max_context is not None and window and max_context > window:
            raise EngineError(f"max_context {max_context} is larger than vLLM's {window}")
        self.max_context = int(max_context or window)
        self._versions[0] = _Version(self.base_name)
        self._spawn(self._health_loop())
        for info in infos:
            log.info("vLLM replica %s: model %s, context %d, tokenizer checked by %s",
                     info.url, info.model, info.max_model_len, info.tokenizer_check)  # fmt: skip
        return infos

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ------------------------------------------------------------------ replicas

    def _pick(self) -> Replica:
        healthy = [
            r for r in self.replicas if r.healthy and r.synced_version >= self.policy_version
        ]
        if not healthy:
            raise EngineUnavailableError("no vLLM replica is available")
        return min(healthy, key=lambda r: r.inflight)

    def _mark_down(self, replica: Replica, why: str) -> None:
        if replica.healthy:
            log.warning("vLLM replica %s taken out: %s", replica.url, why)
        replica.healthy = False

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self._health_interval)
            for replica in self.replicas:
                try:
                    r = await self._client.get(f"{replica.url}/health", timeout=5.0)
                    ok = r.status_code == 200
                except httpx.HTTPError:
                    ok = False
                if not ok:
                    self._mark_down(replica, "health check failed")
                    continue
                if not replica.healthy or replica.synced_version < self.policy_version:
                    try:
                        await self._sync(replica)
                    except (EngineError, httpx.HTTPError) as e:
                        log.warning("vLLM replica %s not taken back: %s", replica.url, e)
                        continue
                    if not replica.healthy:
                        log.warning("vLLM replica %s taken back (policy v%d)", replica.url,
                                    replica.synced_version)  # fmt: skip
                    replica.healthy = True

    async def _sync(self, replica: Replica) -> None:
        """Give ``replica`` the current version (a restarted server has lost its adapters)."""
        current = self._versions[self.policy_version]
        if current.adapter is not None:
            await self._load_adapter(replica, current.name, current.adapter, replace=True)
        replica.synced_version = self.policy_version

    async def _rpc(self, replica: Replica, path: str, body: dict[str, Any]) -> None:
        try:
            r = await self._client.post(f"{replica.url}{path}", json=body)
        except httpx.HTTPError as e:
            self._mark_down(replica, str(e))
            raise EngineUnavailableError(f"vLLM replica {replica.url} is unreachable: {e}") from e
        if r.status_code != 200:
            raise EngineError(f"vLLM {replica.url}{path} answered HTTP {r.status_code}: "
                              f"{r.text[:300]}")  # fmt: skip

    async def _load_adapter(
        self, replica: Replica, name: str, path: Path, *, replace: bool = False
    ) -> None:
        body: dict[str, Any] = {"lora_name": name, "lora_path": str(path)}
        if replace:
            body["load_inplace"] = True
        await self._rpc(replica, "/v1/load_lora_adapter", body)

    # ------------------------------------------------------------------ versions

    def load_policy(self, version: int, weights: Any) -> concurrent.futures.Future[int]:
        """Publish ``weights`` as ``version`` on every healthy replica; see the module
        docstring. ``weights``: a PEFT LoRA adapter directory, a model directory (full
        weights), or a state dict (written under ``publish_dir`` first).

        Raises:
            ValueError: ``version`` does not increase.
            EngineClosedError: the engine was closed.
        """
        if version <= self.policy_version:
            raise ValueError(f"policy versions only increase: {version} <= {self.policy_version}")
        if self._closed:
            raise EngineClosedError("engine is closed")
        return asyncio.run_coroutine_threadsafe(self._publish(int(version), weights), self._loop)

    async def _publish(self, version: int, weights: Any) -> int:
        if isinstance(weights, dict):
            weights = await asyncio.to_thread(self._write_state_dict, version, weights)
        path = Path(weights).resolve()
        live = [r for r in self.replicas if r.healthy]
        if not live:
            raise EngineUnavailableError("no vLLM replica is available to publish to")
        if (path / "adapter_config.json").is_file():
            name = f"clawrl-{self._run}-v{version}"
            await asyncio.gather(*(self._load_adapter(r, name, path) for r in live))
            self._versions[version] = _Version(name, adapter=path)
        elif any(path.glob("*.safetensors")):
            await self._reload_full(live, path)
            self._versions[version] = _Version(self.base_name)
        else:
            raise EngineError(f"{path} is neither a PEFT adapter nor a safetensors model dir")
        for r in live:
            r.synced_version = version
        self.policy_version = version
        await self._unload_idle()
        return version

    def _write_state_dict(self, version: int, state: dict[str, Any]) -> Path:
        from safetensors.torch import save_file

        root = self._publish_dir or Path(_temp_dir())
        target = root / f"v{version}"
        target.mkdir(parents=True, exist_ok=True)
        save_file({k: v.detach().contiguous().clone() for k, v in state.items()},
                  str(target / "model.safetensors"))  # fmt: skip
        return target

    async def _reload_full(self, live: list[Replica], path: Path) -> None:
        """Reload full weights without aborting anything: hold new requests, let the ones in
        flight finish, reload every replica, let the held requests go."""
        assert self._gate is not None
        self._gate.clear()
        try:
            while any(v.inflight for v in self._versions.values()):
                await asyncio.sleep(0.01)
            body = {"method": "reload_weights", "kwargs": {"weights_path": str(path)}}
            await asyncio.gather(*(self._rpc(r, "/collective_rpc", body) for r in live))
        finally:
            self._gate.set()

    async def _unload_idle(self) -> None:
        for version in sorted(self._versions):
            info = self._versions[version]
            if version >= self.policy_version or info.inflight or info.adapter is None:
                continue
            del self._versions[version]
            for r in self.replicas:
                if r.healthy:
                    with contextlib.suppress(EngineError):
                        await self._rpc(r, "/v1/unload_lora_adapter", {"lora_name": info.name})

    # ------------------------------------------------------------------ generation

    def _check_prompt(self, prompt_ids: Sequence[int]) -> list[int]:
        prompt = inputs.prompt_ids(prompt_ids, self.max_context)
        if self._closed:
            raise EngineClosedError("engine is closed")
        return prompt

    async def _acquire(self) -> tuple[int, _Version, Replica]:
        assert self._gate is not None
        await self._gate.wait()
        version = self.policy_version
        info = self._versions[version]
        replica = self._pick()
        info.inflight += 1
        replica.inflight += 1
        self.stats.batch_size += 1
        return version, info, replica

    def _release(self, info: _Version, replica: Replica) -> None:
        info.inflight -= 1
        replica.inflight -= 1
        self.stats.batch_size -= 1
        if info.inflight == 0:
            self._spawn(self._unload_idle())

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Completion:
        """Sample one completion (non-streamed request); see :meth:`clawrl.engine.Engine.generate`.

        Raises:
            ContextLengthError: the prompt leaves no room for a completion.
            EngineUnavailableError: no replica could serve it, or its replica died.
            EngineError: vLLM failed or answered without ids / log-probs.
        """
        prompt = self._check_prompt(prompt_ids)
        return await self._on_loop(self._generate(prompt, params))

    async def _generate(self, prompt: list[int], params: SamplingParams) -> Completion:
        start = time.perf_counter()
        version, info, replica = await self._acquire()
        try:
            body = protocol.completion_body(info.name, prompt, params, self._max_new(prompt, params),
                                            stream=False)  # fmt: skip
            payload = await self._post_json(replica, "/v1/completions", body, len(prompt))
        finally:
            self._release(info, replica)
        choice = protocol.parse_choice(payload, want_top=params.logprobs_top_k)
        self._check_echo(choice, prompt)
        if choice.finish_reason is None:
            raise EngineError("vLLM returned a choice without a finish reason")
        self.stats.requests += 1
        self.stats.prompt_tokens += len(prompt)
        self.stats.generated_tokens += len(choice.token_ids)
        latency = time.perf_counter() - start
        return Completion(
            token_ids=choice.token_ids, logprobs=choice.logprobs,
            finish_reason=choice.finish_reason, policy_version=version,
            prompt_tokens=len(prompt), top_logprobs=choice.top_logprobs,
            stop_string=choice.stop_string, time_to_first_token=latency, latency=latency,
        )  # fmt: skip

    async def generate_stream(
        self, prompt_ids: Sequence[int], params: SamplingParams
    ) -> AsyncIterator[TokenEvent]:
        """Yield each sampled token as its chunk arrives; the last event has a finish reason.

        Closing the iterator early aborts the request on the server (the HTTP stream closes).

        Raises:
            as :meth:`generate`; a chunk without token ids raises :class:`EngineError` (the
            turn is untrainable, never stored shorter than what was sampled).
        """
        prompt = self._check_prompt(prompt_ids)
        loop = asyncio.get_running_loop()
        q: asyncio.Queue[TokenEvent | BaseException | None] = asyncio.Queue()

        def emit(item: TokenEvent | BaseException | None) -> None:
            if not loop.is_closed():
                loop.call_soon_threadsafe(q.put_nowait, item)

        if self._closed:
            raise EngineClosedError("engine is closed")
        self._emitters.add(emit)
        future = asyncio.run_coroutine_threadsafe(self._stream(prompt, params, emit), self._loop)
        try:
            while True:
                item = await q.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self._emitters.discard(emit)
            future.cancel()

    async def _stream(
        self, prompt: list[int], params: SamplingParams,
        emit: Callable[[TokenEvent | BaseException | None], None],
    ) -> None:  # fmt: skip
        try:
            version, info, replica = await self._acquire()
        except BaseException as e:
            emit(e)
            return
        sent = 0
        try:
            body = protocol.completion_body(info.name, prompt, params, self._max_new(prompt, params),
                                            stream=True)  # fmt: skip
            async with self._client.stream("POST", f"{replica.url}/v1/completions", json=body) as r:
                if r.status_code != 200:
                    text = (await r.aread()).decode(errors="replace")
                    self._on_status(replica, r.status_code)
                    protocol.raise_for_error(r.status_code, text, len(prompt), self.max_context)
                finished = False
                async for line in r.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    chunk = json.loads(data)
                    if "error" in chunk:
                        raise EngineError(f"vLLM stream error: {str(chunk['error'])[:300]}")
                    if not chunk.get("choices"):
                        continue
                    delta = protocol.parse_choice(chunk, want_top=params.logprobs_top_k)
                    self._check_echo(delta, prompt)
                    if delta.finish_reason is not None and not delta.token_ids and sent:
                        raise EngineError("vLLM ended the stream with a chunk holding no token")
                    for i, tok in enumerate(delta.token_ids):
                        last = i == len(delta.token_ids) - 1
                        emit(TokenEvent(
                            tok, delta.logprobs[i],
                            delta.top_logprobs[i] if i < len(delta.top_logprobs) else [],
                            delta.finish_reason if last else None, version,
                        ))  # fmt: skip
                        sent += 1
                        self.stats.generated_tokens += 1
                    if delta.finish_reason is not None:
                        finished = True
                if not finished:
                    raise EngineUnavailableError(f"vLLM replica {replica.url} ended the stream "
                                                 "before the completion finished")  # fmt: skip
            self.stats.requests += 1
            self.stats.prompt_tokens += len(prompt)
            emit(None)
        except httpx.HTTPError as e:
            self._mark_down(replica, str(e))
            emit(EngineUnavailableError(f"vLLM replica {replica.url} failed: {e}"))
        except (EngineError, ValueError) as e:
            emit(e if isinstance(e, EngineError) else EngineError(f"vLLM stream: {e}"))
        except asyncio.CancelledError:
            raise
        finally:
            self._release(info, replica)

    def _max_new(self, prompt: list[int], params: SamplingParams) -> int:
        return max(1, min(int(params.max_tokens), self.max_context - len(prompt)))

    def _check_echo(self, choice: protocol.ChoiceDelta, prompt: list[int]) -> None:
        if choice.prompt_token_ids is not None and choice.prompt_token_ids != prompt:
            raise EngineError("vLLM read other prompt ids than clawrl sent")

    def _on_status(self, replica: Replica, status: int) -> None:
        if status >= 500:
            self._mark_down(replica, f"HTTP {status}")

    async def _post_json(
        self, replica: Replica, path: str, body: dict[str, Any], prompt_tokens: int
    ) -> dict[str, Any]:
        try:
            r = await self._client.post(f"{replica.url}{path}", json=body)
        except httpx.HTTPError as e:
            self._mark_down(replica, str(e))
            raise EngineUnavailableError(f"vLLM replica {replica.url} failed: {e}") from e
        if r.status_code != 200:
            self._on_status(replica, r.status_code)
            if r.status_code >= 500:
                raise EngineUnavailableError(f"vLLM replica {replica.url} answered HTTP "
                                             f"{r.status_code}")  # fmt: skip
            protocol.raise_for_error(r.status_code, r.text, prompt_tokens, self.max_context)
        out: dict[str, Any] = r.json()
        return out

    # ------------------------------------------------------------------ scoring

    async def score(
        self,
        prompt_ids: Sequence[int],
        target_ids: Sequence[int],
        *,
        temperature: float = 1.0,
        base: bool = False,
    ) -> list[float]:
        """Teacher-forced log-probs of ``target_ids`` (``[t]``) after ``prompt_ids``, at
        ``temperature`` (greedy: 1); ``base=True`` scores with the base weights.

        Raises:
            ContextLengthError: prompt + target do not fit.
            EngineError: vLLM failed.
        """
        out = await self.score_batch([(prompt_ids, target_ids)], temperature=temperature, base=base)
        return out[0]

    async def score_batch(
        self,
        items: Sequence[tuple[Sequence[int], Sequence[int]]],
        *,
        temperature: float = 1.0,
        base: bool = False,
    ) -> list[list[float]]:
        """:meth:`score` for several pairs, sent concurrently; one ``[t_i]`` list per pair."""
        norm = inputs.score_items(items, self.max_context)
        temp = 1.0 if temperature < GREEDY_BELOW else float(temperature)
        return await self._on_loop(self._score_all(norm, temp, base))

    async def _score_all(
        self, items: list[tuple[list[int], list[int]]], temperature: float, base: bool
    ) -> list[list[float]]:
        return list(await asyncio.gather(*(self._score_one(p, t, temperature, base)
                                           for p, t in items)))  # fmt: skip

    async def _score_one(
        self, prompt: list[int], target: list[int], temperature: float, base: bool
    ) -> list[float]:
        if not target:
            return []
        _version, info, replica = await self._acquire()
        name = self.base_name if base else info.name
        try:
            if abs(temperature - 1.0) < 1e-9:
                body = protocol.prompt_logprobs_body(name, prompt, target)
                payload = await self._post_json(replica, "/v1/completions", body, len(prompt))
                return protocol.parse_prompt_logprobs(payload, len(prompt), target)
            bodies = [
                protocol.next_token_body(name, prompt + target[:i], [target[i]], temperature)
                for i in range(len(target))
            ]
            payloads = await asyncio.gather(
                *(self._post_json(replica, "/v1/completions", b, len(prompt)) for b in bodies)
            )
            return [protocol.parse_next_token(p, [target[i]])[0] for i, p in enumerate(payloads)]
        finally:
            self._release(info, replica)

    async def score_next_batch(
        self,
        prompts: Sequence[Sequence[int]],
        candidates: Sequence[int],
        *,
        temperature: float = 1.0,
    ) -> list[list[float]]:
        """``[len(prompts)][len(candidates)]`` next-token log-probs at ``temperature``.

        Raises:
            ContextLengthError: a prompt does not fit.
            EngineError: vLLM failed.
        """
        norm = inputs.next_token_prompts(prompts, self.max_context)
        temp = 1.0 if temperature < GREEDY_BELOW else float(temperature)
        cands = [int(c) for c in candidates]
        return await self._on_loop(self._next_all(norm, cands, temp))

    async def _next_all(
        self, prompts: list[list[int]], candidates: list[int], temperature: float
    ) -> list[list[float]]:
        async def one(prompt: list[int]) -> list[float]:
            _version, info, replica = await self._acquire()
            try:
                body = protocol.next_token_body(info.name, prompt, candidates, temperature)
                payload = await self._post_json(replica, "/v1/completions", body, len(prompt))
            finally:
                self._release(info, replica)
            return protocol.parse_next_token(payload, candidates)

        return list(await asyncio.gather(*(one(p) for p in prompts)))

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Stop: requests in flight end with :class:`EngineClosedError`; later calls raise it;
        then ``on_close`` (e.g. the launched server stops). Idempotent."""
        if self._closed:
            return
        self._closed = True

        closed = EngineClosedError("engine closed")
        for emit in list(self._emitters):  # streams in flight end with the error
            emit(closed)
        for fut in list(self._pending):
            fut.cancel()

        async def shutdown() -> None:
            for task in list(self._tasks):
                task.cancel()
            for info in self._versions.values():  # a shared server keeps no adapter of ours
                if info.adapter is None:
                    continue
                for r in self.replicas:
                    if r.healthy:
                        with contextlib.suppress(EngineError):
                            await self._rpc(r, "/v1/unload_lora_adapter", {"lora_name": info.name})
            client = getattr(self, "_client", None)
            if client is not None:
                await client.aclose()

        with contextlib.suppress(Exception):
            self._call(shutdown(), timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        if self._on_close is not None:
            self._on_close()


def _base_url(url: str) -> str:
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def _temp_dir() -> str:
    import tempfile

    return tempfile.mkdtemp(prefix="clawrl-vllm-weights-")
