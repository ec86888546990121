"""The policy engine on one or more vLLM servers: token ids over HTTP, live policy versions.

:class:`VLLMEngine` is an :class:`clawrl.engine.Engine` whose forward passes run in vLLM
servers (``clawrl serve --engine vllm``). The gateway still renders every prompt itself and
sends token ids; the engine stores the ids vLLM sampled and their processed log-probs
(:mod:`clawrl.engine.vllm.protocol`). It owns one thread with its own event loop and HTTP
client, so any thread or event loop may call it, like the in-process engine.

**Policy versions.** Publishing is serialised: one version at a time, in increasing order. A
LoRA version is loaded into every healthy replica under a versioned name
(``POST /v1/load_lora_adapter``, ``clawrl-<run>-v<N>``) before any request is sent to it; a
request keeps the adapter name it started with, so requests in flight finish on their version
while new ones use the new one; an older adapter is unloaded once no request uses it. Full
weights (a state dict, or a model directory) are published by ``reload_weights`` from disk
(``POST /collective_rpc``, dev mode): new requests wait while the requests in flight finish,
every replica reloads, then the waiting requests go on the new version; nothing is aborted. A
replica that fails to take a version is taken out until it has it. Every completion records the
version that produced it.

**Per-user adapters.** :meth:`VLLMEngine.load_adapter` loads a user's adapter version into
every healthy replica under a name of its own (``clawrl-<run>-u<digest>-v<N>``); a request
naming the user (``SamplingParams.adapter``) is sent to that adapter, keeps the version it
started with, and an older version is unloaded once no request uses it; a replica taken back
gets each user's newest version again. vLLM holds at most ``--max-loras`` adapters in a batch
and ``--max-cpu-loras`` in memory, reading the least recently used back from disk
(:class:`clawrl.engine.vllm.VLLMServer` sets both). A request names one adapter, so a user's
adapter is served on the base (or full fine-tuned) weights: while the policy is itself a LoRA
version, requests naming a user's adapter are refused (``EngineError``) and so is a new user
version (``ValueError``).

**Replicas.** Requests go to the healthy replica, synced to the current version, with the
fewest requests in flight. A replica that refuses connections, fails its health check, or fails
three requests in a row (5xx, timeouts) is taken out: its requests end with
:class:`EngineUnavailableError` (the gateway's 503, an error event in a stream; the choice is
recorded with its error, never trained), and a health loop (``GET /health``) takes it back once
it answers and has been given the current version again (its adapter, or its full weights).

**Scoring.** ``score`` reads ``prompt_logprobs``: one request per sample, at temperature 1 on
any server, at another temperature on a server running clawrl's plugin
(:mod:`clawrl.engine.vllm.server_plugin`; every server clawrl launches does; probed at start and
whenever a replica is taken back). Without the plugin vLLM's prompt log-probs skip the sampling
processors, so at T != 1 each target position is one request that returns the processed log-prob of the target id at the
next position (``logprob_token_ids``), at most :data:`SCORE_CONCURRENCY` at once; vLLM's prefix
cache serves their shared prefix (measured: 89 % of the prompt tokens of 48 such requests over an
824-token prompt were cache hits, sent all at once). ``base=True`` scores with the base weights.

**The base model behind a zero adapter.** vLLM's CPU LoRA kernels (``vllm/lora/ops/torch_ops``,
vLLM 0.32) index the stacked adapter weights with each token's slot, and a token without an
adapter has slot ``-1``: in a batch of more than one request it reads the *last* slot, which
keeps the weights of whichever adapter was last activated there (unloading does not zero it).
Measured on the embedded model: a base request that shared batches with adapter requests after
adapters had been loaded and unloaded got log-probs off by up to 0.45 nats (0 before any
unload). So once LoRA versions exist, everything this engine sends for the base weights (version
0 and ``base=True``) names a *zero adapter* (``clawrl-<run>-base``: the first published adapter
with every ``lora_B`` zeroed, whose output is exactly the base model's), and
:meth:`VLLMEngine.use_base_adapter` loads one before the first request when the caller has an
adapter already (``clawrl serve`` gives the trainer's initial one).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import hashlib
import json
import logging
import shutil
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx

from clawrl.engine import inputs
from clawrl.engine.sampling import GREEDY_BELOW
from clawrl.engine.types import Completion, EngineStats, SamplingParams, TokenEvent
from clawrl.engine.vllm import protocol
from clawrl.engine.vllm.checks import (
    ServerInfo,
    check_prompt_temperature,
    check_server,
    temperature_probe_ids,
)
from clawrl.engine.vllm.yielding import ServingFirst
from clawrl.errors import EngineClosedError, EngineError, EngineUnavailableError

log = logging.getLogger(__name__)
T = TypeVar("T")

SCORE_CONCURRENCY = 64
"""Scoring sub-requests (one per target token at T != 1) in flight at once, per engine."""
SCORING_DEFER_S = 10.0
"""Default seconds a scoring request may give way to generation on its replica."""
SCORING_SLOTS = 2
"""Default scoring requests (one per scored sample) in flight per replica."""
FAILURES_TO_TAKE_OUT = 3
"""Consecutive failed requests (5xx, timeouts) after which a replica is taken out."""
ADAPTER_PREFIX = "clawrl-"
"""Served names of the adapters this engine loads start with it."""

Emit = Callable[[TokenEvent | BaseException | None], None]


@dataclass
class Replica:
    """One vLLM server.

    Attributes:
        url: its base URL (``http://host:port``).
        healthy: whether requests may go to it.
        inflight: requests it is serving now.
        synced_version: the newest policy version it can serve (-1: none until resynced).
        failures: failed requests in a row.
        prompt_temperature: it runs clawrl's plugin (one request per scored sample at any
            temperature; :func:`clawrl.engine.vllm.checks.check_prompt_temperature`).
        scoring: its scoring requests yield to its generation requests
            (:mod:`clawrl.engine.vllm.yielding`); set when the engine starts.
    """

    url: str
    healthy: bool = True
    inflight: int = 0
    synced_version: int = 0
    failures: int = 0
    prompt_temperature: bool = False
    scoring: ServingFirst | None = None


@dataclass
class _Version:
    """A published policy version: the served name requests use, where its weights are, and how
    many requests use it now."""

    name: str
    adapter: Path | None = None  # LoRA adapter directory
    weights: Path | None = None  # full weights directory (served under the base name)
    written: bool = False  # ``weights`` was written by this engine (deleted when superseded)
    inflight: int = 0
    user_version: int | None = None  # a user's adapter: its version (``None``: a policy version)


def _lora_policy(version: int) -> str:
    return (
        f"policy v{version} is a LoRA adapter on vLLM and a request names one adapter: a user's "
        "adapter is served on the base (or full fine-tuned) weights only (the in-process engine "
        "stacks both)"
    )


class VLLMEngine:
    """An :class:`clawrl.engine.Engine` over vLLM servers (see the module docstring).

    Args:
        urls: the replicas' base URLs (``http://127.0.0.1:8000``; a trailing ``/v1`` is
            dropped).
        tokenizer: the policy's tokenizer: its ids are what the servers must read and write
            (checked at start, :mod:`clawrl.engine.vllm.checks`).
        eos_token_ids: ids that end a completion (default: the tokenizer's EOS;
            :func:`clawrl.engine.inputs.policy_eos_ids` gives a policy's, as vLLM stops on).
        max_context: the context window in tokens; default and upper bound: the servers'
            smallest ``max_model_len``.
        publish_dir: where full weights given as a state dict are written for
            ``reload_weights`` (must be readable by the servers); default a temporary folder.
        request_timeout_s: seconds one request may take.
        health_interval_s: seconds between health checks of the replicas.
        api_key: a bearer key the servers require (``--api-key`` of vLLM), if any.
        on_close: called once by :meth:`close` (e.g. stopping a server clawrl launched).
        scoring_defer_s: seconds a scoring request may be held back for generation on its
            replica (:mod:`clawrl.engine.vllm.yielding`; 0: scoring never yields).
        scoring_slots: scoring requests (one per scored sample) in flight per replica.
        transport: the HTTP transport (tests put a fake server here); default: the network.

    Raises:
        EngineError: a replica is unreachable or fails a check (raw log-probs, another
            tokenizer); the servers serve different models.
    """

    def __init__(
        self,
        urls: Sequence[str],
        tokenizer: Any,
        *,
        eos_token_ids: Iterable[int] | None = None,
        max_context: int | None = None,
        publish_dir: str | Path | None = None,
        request_timeout_s: float = 600.0,
        health_interval_s: float = 2.0,
        api_key: str | None = None,
        on_close: Callable[[], None] | None = None,
        scoring_defer_s: float = SCORING_DEFER_S,
        scoring_slots: int = SCORING_SLOTS,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if not urls:
            raise EngineError("the vLLM engine needs at least one server URL (--vllm-url)")
        from clawrl.models import tokenizer_fingerprint

        self.tokenizer = tokenizer
        self.tokenizer_id = tokenizer_fingerprint(tokenizer)
        eos = eos_token_ids if eos_token_ids is not None else [tokenizer.eos_token_id]
        self.eos_token_ids = frozenset(int(i) for i in eos if i is not None)
        self.stats = EngineStats()
        self.policy_version = 0
        self.replicas = [Replica(_base_url(u)) for u in urls]
        self._timeout = float(request_timeout_s)
        self._health_interval = float(health_interval_s)
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._on_close = on_close
        self._transport = transport
        self._scoring = (float(scoring_defer_s), int(scoring_slots))
        self._publish_dir = Path(publish_dir) if publish_dir else None
        self._run = uuid.uuid4().hex[:8]
        self._closed = False
        self._lock = threading.Lock()  # guards the sets below and _queued against close()
        self._queued = 0  # the newest version load_policy accepted
        self._versions: dict[int, _Version] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._pending: set[concurrent.futures.Future[Any]] = set()  # callers waiting on the loop
        self._publishes: set[concurrent.futures.Future[int]] = set()
        self._emitters: set[Emit] = set()
        self._base_adapter: Path | None = None  # the zero adapter serving the base weights
        self._users: dict[str, dict[int, _Version]] = {}  # user adapter -> version -> info
        self._user_latest: dict[str, int] = {}  # what new requests naming the user get
        self._user_max: dict[str, int] = {}  # each name's versions only increase
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

    def _register(self, fut: concurrent.futures.Future[Any]) -> None:
        with self._lock:
            closed = self._closed
            if not closed:
                self._pending.add(fut)
        if closed:  # close() ran between the caller's check and here: it would never see it
            fut.cancel()
        fut.add_done_callback(self._pending.discard)

    async def _on_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the engine loop and await it from any other loop (a close while it
        runs raises :class:`EngineClosedError` in the caller)."""
        if self._closed:
            coro.close()
            raise EngineClosedError("engine is closed")
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        self._register(fut)
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
            transport=self._transport,
        )  # fmt: skip
        self._gate = asyncio.Event()  # cleared while full weights reload
        self._gate.set()
        self._publish_lock = asyncio.Lock()
        self._score_slots = asyncio.Semaphore(SCORE_CONCURRENCY)
        for r in self.replicas:
            r.scoring = ServingFirst(*self._scoring)
        infos = list(await asyncio.gather(*(check_server(self._client, r.url, self.tokenizer)
                                             for r in self.replicas)))  # fmt: skip
        served = {(i.model, i.root) for i in infos}
        if len(served) > 1:
            raise EngineError(f"the vLLM replicas serve different models: {sorted(served)}")
        self.base_name = infos[0].model
        window = min(i.max_model_len for i in infos if i.max_model_len) if infos else 0
        if max_context is not None and window and max_context > window:
            raise EngineError(f"max_context {max_context} is larger than vLLM's {window}")
        self.max_context = int(max_context or window)
        self._versions[0] = _Version(self.base_name)
        self._base_served = self.base_name  # what base requests name (the zero adapter, later)
        self._spawn(self._health_loop())
        for replica, info in zip(self.replicas, infos, strict=True):
            replica.prompt_temperature = info.prompt_temperature
            log.info("vLLM replica %s: model %s, context %d, tokenizer checked by %s",
                     info.url, info.model, info.max_model_len, info.tokenizer_check)  # fmt: skip
            self._say_scoring(replica)
        return infos

    def _say_scoring(self, replica: Replica) -> None:
        if replica.prompt_temperature:
            log.info("vLLM replica %s runs clawrl's plugin: a sample is scored at any "
                     "temperature in one request", replica.url)  # fmt: skip
        else:
            log.warning(
                "vLLM replica %s lacks clawrl's plugin (or it gave other values than vLLM's "
                "sampler): teacher scoring at a temperature other than 1 takes one request per "
                "target token there (exact, slower), and on vLLM's CPU build a request with a "
                "seed whose prompt is prefilled over several engine steps kills its engine core "
                "('CPU Generator does not use offset'). To add it: python -m "
                "clawrl.engine.vllm.server_plugin DIR, then start the server with PYTHONPATH=DIR",
                replica.url,
            )

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ------------------------------------------------------------------ replicas

    needs_base_adapter = True
    """vLLM serves version 0 through a zero adapter (:meth:`use_base_adapter`)."""

    @property
    def available(self) -> bool:
        """Whether a replica can take a request now (healthy and on the current version);
        the gateway's ``/healthz`` answers 503 while not."""
        return not self._closed and any(
            r.healthy and r.synced_version >= self.policy_version for r in self.replicas
        )

    def _pick(self) -> Replica:
        ready = [r for r in self.replicas if r.healthy and r.synced_version >= self.policy_version]
        if not ready:
            raise EngineUnavailableError("no vLLM replica is available")
        return min(ready, key=lambda r: r.inflight)

    def _take_out(self, replica: Replica, why: str, *, unsynced: bool = False) -> None:
        if replica.healthy:
            log.warning("vLLM replica %s taken out: %s", replica.url, why)
        replica.healthy = False
        if unsynced:
            replica.synced_version = -1

    def _failed(self, replica: Replica, why: str, *, connection: bool = False) -> None:
        """A request to ``replica`` failed: out at once when it refused the connection, after
        :data:`FAILURES_TO_TAKE_OUT` failures in a row otherwise."""
        replica.failures += 1
        if connection or replica.failures >= FAILURES_TO_TAKE_OUT:
            self._take_out(replica, why)

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self._health_interval)
            try:
                await asyncio.gather(*(self._check(r) for r in self.replicas))
            except Exception:  # keep checking whatever one pass hit
                log.exception("vLLM health check failed")

    async def _check(self, replica: Replica) -> None:
        try:
            r = await self._client.get(f"{replica.url}/health", timeout=10.0)
            ok = r.status_code == 200
        except httpx.HTTPError:
            ok = False
        if not ok:
            self._take_out(replica, "health check failed")
            return
        if replica.healthy and replica.synced_version >= self.policy_version:
            return
        try:
            await self._sync(replica)
        except (EngineError, httpx.HTTPError) as e:
            log.warning("vLLM replica %s not taken back: %s", replica.url, e)
            return
        if not replica.healthy:
            log.warning("vLLM replica %s taken back (policy v%d)", replica.url,
                        replica.synced_version)  # fmt: skip
        replica.failures = 0
        replica.healthy = True

    async def _sync(self, replica: Replica) -> None:
        """Give ``replica`` the current version (a restarted server has lost its adapters and
        serves its start-up weights); serialised with publishing."""
        async with self._publish_lock:
            target = self.policy_version
            current = self._versions[target]
            if self._base_adapter is not None:
                await self._load_adapter(replica, self._base_served, self._base_adapter,
                                         replace=True)  # fmt: skip
            for user, latest in list(self._user_latest.items()):  # users' adapters too
                info = self._users.get(user, {}).get(latest)
                if info is None or info.adapter is None:
                    continue  # unloaded meanwhile
                try:
                    await self._load_adapter(replica, info.name, info.adapter, replace=True)
                except EngineError as e:  # one user's adapter keeps no replica out
                    log.error("vLLM replica %s did not take user %r's adapter v%d back: %s",
                              replica.url, user, latest, e)  # fmt: skip
            if current.adapter is not None:
                await self._load_adapter(replica, current.name, current.adapter, replace=True)
            elif current.weights is not None:
                body = {
                    "method": "reload_weights",
                    "kwargs": {"weights_path": str(current.weights)},
                }
                await self._rpc(replica, "/collective_rpc", body, timeout=600.0)
            # a restarted server may have lost (or gained) clawrl's plugin: probed before it
            # counts as synced (a synced replica may be picked)
            had = replica.prompt_temperature
            replica.prompt_temperature = await check_prompt_temperature(
                self._client, replica.url, self.base_name, temperature_probe_ids(self.tokenizer)
            )
            if had != replica.prompt_temperature:
                self._say_scoring(replica)
            replica.synced_version = target

    async def _rpc(
        self, replica: Replica, path: str, body: dict[str, Any], *, timeout: float = 120.0
    ) -> None:
        try:
            r = await self._client.post(f"{replica.url}{path}", json=body, timeout=timeout)
        except httpx.HTTPError as e:
            raise EngineUnavailableError(f"vLLM replica {replica.url}{path} failed: {e}") from e
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

    def use_base_adapter(self, adapter_dir: str | Path) -> None:
        """Serve the base weights (version 0, ``base=True`` scoring) through a zero copy of the
        LoRA adapter at ``adapter_dir`` (any adapter of the policy; its ``lora_B`` weights are
        zeroed, so the output is exactly the base model's), loaded on every healthy replica
        now; see the module docstring for the vLLM behaviour this avoids. Without this call it
        happens at the first published adapter. Idempotent.

        Raises:
            EngineError: ``adapter_dir`` is not a PEFT adapter, or no replica loaded it.
            EngineClosedError: the engine was closed.
        """
        if self._closed:
            raise EngineClosedError("engine is closed")
        self._call(self._base_adapter_locked(Path(adapter_dir).resolve()))

    async def _base_adapter_locked(self, adapter: Path) -> None:
        async with self._publish_lock:
            await self._ensure_base_adapter(adapter)

    async def _ensure_base_adapter(self, adapter: Path) -> None:
        """Load the zero base adapter made from ``adapter`` (publish lock held)."""
        if self._base_adapter is not None:
            return
        zero = await asyncio.to_thread(_write_zero_adapter, adapter, self._scratch() / "base")
        name = f"{ADAPTER_PREFIX}{self._run}-base"
        live = [r for r in self.replicas if r.healthy]
        if not live:
            raise EngineUnavailableError("no vLLM replica is available")
        await self._on_replicas(live, lambda r: self._load_adapter(r, name, zero),
                                "load the zero base adapter")  # fmt: skip
        self._base_adapter, self._base_served = zero, name
        base = self._versions.get(0)
        if base is not None and base.adapter is None and base.weights is None:
            base.name = name  # new version-0 requests too (those in flight keep theirs)

    def _scratch(self) -> Path:
        """This engine's folder for files it writes (under ``publish_dir`` when given)."""
        if self._publish_dir is not None:
            return self._publish_dir / f"engine-{self._run}"
        import tempfile

        return Path(tempfile.gettempdir()) / f"clawrl-vllm-{self._run}"

    def load_adapter(
        self, name: str, version: int, adapter_dir: str | Path
    ) -> concurrent.futures.Future[int]:
        """Serve requests naming ``name`` with the PEFT LoRA adapter at ``adapter_dir`` as its
        ``version`` (module docstring, per-user adapters; :meth:`clawrl.engine.Engine.
        load_adapter`). The future resolves with ``version`` once every healthy replica has it,
        or fails: ``ValueError`` for a version that does not increase, a directory that is not
        a LoRA adapter vLLM takes (e.g. a rank above ``--max-lora-rank``), or a policy that is
        a LoRA version; :class:`EngineError` when no replica took it."""
        fut: concurrent.futures.Future[int] = concurrent.futures.Future()
        with self._lock:
            if self._closed:
                fut.set_exception(EngineClosedError("engine is closed"))
                return fut
            if not isinstance(name, str) or not name:
                fut.set_exception(ValueError("an adapter needs a non-empty name"))
                return fut
            current = self._user_max.get(name)
            if current is not None and version <= current:
                fut.set_exception(ValueError(
                    f"adapter {name!r}: versions only increase ({version} <= {current})"))  # fmt: skip
                return fut
            self._publishes.add(fut)
        fut.add_done_callback(self._publishes.discard)
        path = Path(adapter_dir).resolve()
        asyncio.run_coroutine_threadsafe(self._settle_with(fut, self._load_user(name, int(version), path)),
                                         self._loop)  # fmt: skip
        return fut

    async def _settle_with(
        self, fut: concurrent.futures.Future[Any], coro: Coroutine[Any, Any, Any]
    ) -> None:
        try:
            result = await coro
        except BaseException as e:
            _settle(fut, error=e if isinstance(e, Exception) else EngineClosedError(str(e)))
            if not isinstance(e, Exception):
                raise
        else:
            _settle(fut, result=result)

    async def _load_user(self, name: str, version: int, path: Path) -> int:
        if not (path / "adapter_config.json").is_file():
            raise ValueError(
                f"{path} is not a PEFT LoRA adapter directory (no adapter_config.json)"
            )
        async with self._publish_lock:
            current = self._user_max.get(name)  # loads of one name: one at a time, in order
            if current is not None and version <= current:
                raise ValueError(f"adapter {name!r}: versions only increase ({version} <= "
                                 f"{current})")  # fmt: skip
            policy = self._versions[self.policy_version]
            if policy.adapter is not None:
                raise ValueError(_lora_policy(self.policy_version))
            digest = hashlib.sha256(name.encode()).hexdigest()[:12]
            info = _Version(f"{ADAPTER_PREFIX}{self._run}-u{digest}-v{version}", adapter=path,
                            user_version=version)  # fmt: skip
            live = [r for r in self.replicas if r.healthy]
            if not live:
                raise EngineUnavailableError("no vLLM replica is available")
            try:
                await self._ensure_base_adapter(path)  # base requests never share its slot
                await self._on_replicas(live, lambda r: self._load_adapter(r, info.name, path),
                                        "load a user's adapter")  # fmt: skip
            except EngineError as e:
                if " HTTP 400" in str(e) or " HTTP 422" in str(e):  # vLLM refused the adapter
                    raise ValueError(str(e)) from e
                raise  # passing (a replica restarting): the same version may be tried again
            self._users.setdefault(name, {})[version] = info
            self._user_latest[name] = version
            self._user_max[name] = version  # only a version that loaded counts
        await self._retire_idle()
        return version

    def unload_adapter(self, name: str) -> concurrent.futures.Future[None]:
        """Stop serving ``name``: later requests naming it fail with :class:`EngineError`;
        those running finish, then its adapters are unloaded from the replicas. Unknown names
        resolve at once."""
        fut: concurrent.futures.Future[None] = concurrent.futures.Future()
        if self._closed:
            fut.set_exception(EngineClosedError("engine is closed"))
            return fut

        async def unload() -> None:
            async with self._publish_lock:  # not while a replica is given the users' adapters
                self._user_latest.pop(name, None)
            await self._retire_idle()

        asyncio.run_coroutine_threadsafe(self._settle_with(fut, unload()), self._loop)
        return fut

    def load_policy(self, version: int, weights: Any) -> concurrent.futures.Future[int]:
        """Publish ``weights`` as ``version`` on every healthy replica; see the module
        docstring. ``weights``: a PEFT LoRA adapter directory, a model directory (full
        weights), or a state dict (written under ``publish_dir`` first). Versions are published
        one at a time, in the order given; the future resolves with ``version`` once new
        requests get it (or with the error that refused it; :class:`EngineClosedError` when the
        engine closes first).

        Raises:
            ValueError: ``version`` is not greater than every version given before.
            EngineClosedError: the engine was closed.
        """
        fut: concurrent.futures.Future[int] = concurrent.futures.Future()
        with self._lock:
            if self._closed:
                raise EngineClosedError("engine is closed")
            if version <= max(self._queued, self.policy_version):
                raise ValueError(
                    f"policy versions only increase: {version} <= "
                    f"{max(self._queued, self.policy_version)}"
                )
            self._queued = int(version)
            self._publishes.add(fut)
        fut.add_done_callback(self._publishes.discard)
        asyncio.run_coroutine_threadsafe(self._publish_into(fut, int(version), weights), self._loop)
        return fut

    async def _publish_into(
        self, fut: concurrent.futures.Future[int], version: int, weights: Any
    ) -> None:
        try:
            result = await self._publish(version, weights)
        except BaseException as e:  # settle the caller's future whatever happened
            _settle(fut, error=e if isinstance(e, Exception) else EngineClosedError(str(e)))
            if not isinstance(e, Exception):
                raise
        else:
            _settle(fut, result=result)

    async def _publish(self, version: int, weights: Any) -> int:
        async with self._publish_lock:
            written = isinstance(weights, dict)
            if written:
                weights = await asyncio.to_thread(self._write_state_dict, version, weights)
            path = Path(weights).resolve()
            live = [r for r in self.replicas if r.healthy]
            if not live:
                raise EngineUnavailableError("no vLLM replica is available to publish to")
            if (path / "adapter_config.json").is_file():
                await self._ensure_base_adapter(path)
                info = _Version(f"{ADAPTER_PREFIX}{self._run}-v{version}", adapter=path)
                took = await self._on_replicas(
                    live, lambda r: self._load_adapter(r, info.name, path), "load the adapter"
                )
            elif any(path.glob("*.safetensors")):
                info = _Version(self.base_name, weights=path, written=written)
                took = await self._reload_full(live, path)
            else:
                raise EngineError(f"{path} is neither a PEFT adapter nor a safetensors model dir")
            self._versions[version] = info
            for r in took:
                r.synced_version = version
            self.policy_version = version
        await self._retire_idle()
        return version

    async def _on_replicas(
        self, live: list[Replica], step: Callable[[Replica], Coroutine[Any, Any, None]], what: str
    ) -> list[Replica]:
        """Run ``step`` on every live replica; those that fail are taken out until resynced.

        Raises:
            EngineError: every replica failed (nothing changed).
        """
        results = await asyncio.gather(*(step(r) for r in live), return_exceptions=True)
        took = [
            r for r, res in zip(live, results, strict=True) if not isinstance(res, BaseException)
        ]
        errors = [res for res in results if isinstance(res, BaseException)]
        if not took:
            raise errors[0] if isinstance(errors[0], EngineError) else EngineError(str(errors[0]))
        for r, res in zip(live, results, strict=True):
            if isinstance(res, BaseException):
                self._take_out(r, f"could not {what}: {res}", unsynced=True)
        return took

    def _write_state_dict(self, version: int, state: dict[str, Any]) -> Path:
        from safetensors.torch import save_file

        root = self._publish_dir or Path(_temp_dir())
        target = root / f"v{version}"
        target.mkdir(parents=True, exist_ok=True)
        save_file({k: v.detach().cpu().contiguous().clone() for k, v in state.items()},
                  str(target / "model.safetensors"))  # fmt: skip
        return target

    async def _reload_full(self, live: list[Replica], path: Path) -> list[Replica]:
        """Reload full weights without aborting anything: hold new requests, let the ones in
        flight finish, reload every replica, let the held requests go."""
        self._gate.clear()
        try:
            while any(v.inflight for v in self._versions.values()) or any(
                i.inflight for versions in self._users.values() for i in versions.values()
            ):  # users' adapter requests run on the base weights too
                await asyncio.sleep(0.01)
            body = {"method": "reload_weights", "kwargs": {"weights_path": str(path)}}
            return await self._on_replicas(
                live, lambda r: self._rpc(r, "/collective_rpc", body, timeout=600.0),
                "reload the weights",
            )  # fmt: skip
        finally:
            self._gate.set()

    async def _unload_ours(self, replica: Replica) -> None:
        """Unload every adapter of this engine (``clawrl-<run>-...``) the replica lists."""
        r = await self._client.get(f"{replica.url}/v1/models", timeout=10.0)
        mine = f"{ADAPTER_PREFIX}{self._run}-"
        for model in r.json().get("data", []):
            name = str(model.get("id", ""))
            if name.startswith(mine):
                with contextlib.suppress(EngineError):
                    await self._rpc(replica, "/v1/unload_lora_adapter", {"lora_name": name},
                                    timeout=10.0)  # fmt: skip

    async def _retire_idle(self) -> None:
        """Forget superseded versions no request uses: unload their adapters, delete weights
        this engine wrote. The entries leave ``_versions`` before any await, so two passes never
        retire one version twice."""
        stale = [v for v, info in self._versions.items()
                 if 0 < v < self.policy_version and not info.inflight]  # fmt: skip
        retired = [self._versions.pop(v) for v in stale]
        for user in list(self._users):  # users' versions no request gets or uses any more
            versions = self._users[user]
            latest = self._user_latest.get(user)
            for v in [v for v, i in versions.items() if v != latest and not i.inflight]:
                retired.append(versions.pop(v))
            if not versions:
                del self._users[user]
        for info in retired:
            if info.adapter is not None:
                for r in self.replicas:
                    if r.healthy:
                        with contextlib.suppress(EngineError):
                            await self._rpc(r, "/v1/unload_lora_adapter", {"lora_name": info.name})
            if info.written and info.weights is not None:
                await asyncio.to_thread(shutil.rmtree, info.weights, True)

    # ------------------------------------------------------------------ generation

    def _check_prompt(
        self, prompt_ids: Sequence[int], params: SamplingParams | None = None
    ) -> list[int]:
        prompt = inputs.prompt_ids(prompt_ids, self.max_context)
        if self._closed:
            raise EngineClosedError("engine is closed")
        return prompt

    async def _acquire(
        self, serving: bool = False, adapter: str | None = None
    ) -> tuple[int, _Version, Replica]:
        """A replica and the version to use (``adapter``: that user's newest adapter version,
        ``info.user_version``); ``serving``: a generation request (scoring yields to it until
        :meth:`_release` with ``serving=True``).

        Raises:
            EngineError: no adapter of that name is loaded, or the policy is a LoRA version.
        """
        await self._gate.wait()
        version = self.policy_version
        info = self._versions[version]
        if adapter is not None:
            latest = self._user_latest.get(adapter)
            if latest is None:
                known = ", ".join(sorted(self._user_latest)[:10]) or "none"
                raise EngineError(f"no adapter named {adapter!r} is loaded (loaded: {known})")
            if info.adapter is not None:
                raise EngineError(_lora_policy(version))
            info = self._users[adapter][latest]
        replica = self._pick()
        info.inflight += 1
        replica.inflight += 1
        self.stats.batch_size += 1
        if serving and replica.scoring is not None:
            replica.scoring.serving_started()
        return version, info, replica

    def _release(self, info: _Version, replica: Replica, serving: bool = False) -> None:
        info.inflight -= 1
        replica.inflight -= 1
        self.stats.batch_size -= 1
        if serving and replica.scoring is not None:
            replica.scoring.serving_ended()
        if info.inflight == 0 and not self._loop.is_closed():
            # a stream abandoned by its caller is finalised by the garbage collector, possibly
            # after the engine's loop closed: nothing is left to retire then
            self._spawn(self._retire_idle())

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Completion:
        """Sample one completion (non-streamed request); see :meth:`clawrl.engine.Engine.generate`.

        Raises:
            ContextLengthError: the prompt leaves no room for a completion.
            EngineUnavailableError: no replica could serve it, its replica died, or vLLM
                aborted it.
            EngineError: vLLM failed or answered without ids / log-probs.
        """
        prompt = self._check_prompt(prompt_ids, params)
        return await self._on_loop(self._generate(prompt, params))

    def _stopping(self, params: SamplingParams) -> SamplingParams:
        """``params`` with the engine's stop ids added (vLLM stops by itself only on the ids of
        the model's generation config; a chat template's end-of-turn token, e.g. Gemma's
        ``<end_of_turn>``, and ``model.stop_ids`` must be sent), unless ``ignore_eos``."""
        if params.ignore_eos:
            return params
        extra = sorted(self.eos_token_ids - set(params.stop_token_ids))
        if not extra:
            return params
        return dataclasses.replace(params, stop_token_ids=(*params.stop_token_ids, *extra))

    async def _generate(self, prompt: list[int], params: SamplingParams) -> Completion:
        start = time.perf_counter()
        version, info, replica = await self._acquire(serving=True, adapter=params.adapter)
        try:
            body = protocol.completion_body(info.name, prompt, self._stopping(params),
                                            self._max_new(prompt, params), stream=False)  # fmt: skip
            payload = await self._post_json(replica, "/v1/completions", body, len(prompt))
        finally:
            self._release(info, replica, serving=True)
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
            adapter_version=info.user_version,
        )  # fmt: skip

    async def generate_stream(
        self, prompt_ids: Sequence[int], params: SamplingParams
    ) -> AsyncIterator[TokenEvent]:
        """Yield each sampled token as its chunk arrives; the last event has a finish reason.

        Closing the iterator early aborts the request on the server (the HTTP stream closes).

        Raises:
            as :meth:`generate`; a chunk without token ids (or anything else malformed) raises
            :class:`EngineError`: the choice is recorded with its error, never stored shorter
            than what was sampled.
        """
        prompt = self._check_prompt(prompt_ids, params)
        loop = asyncio.get_running_loop()
        q: asyncio.Queue[TokenEvent | BaseException | None] = asyncio.Queue()

        def emit(item: TokenEvent | BaseException | None) -> None:
            if not loop.is_closed():
                loop.call_soon_threadsafe(q.put_nowait, item)

        with self._lock:
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

    async def _stream(self, prompt: list[int], params: SamplingParams, emit: Emit) -> None:
        try:
            version, info, replica = await self._acquire(serving=True, adapter=params.adapter)
        except Exception as e:
            emit(e)
            return
        outcome: BaseException | None = None  # None: finished
        try:
            await self._relay(prompt, params, emit, version, info, replica)
            replica.failures = 0
        except httpx.HTTPError as e:
            self._failed(replica, str(e), connection=isinstance(e, httpx.ConnectError))
            outcome = EngineUnavailableError(f"vLLM replica {replica.url} failed: {e}")
        except EngineError as e:
            outcome = e
        except Exception as e:  # an odd chunk must end the stream with an error, never hang it
            outcome = EngineError(f"vLLM stream failed: {type(e).__name__}: {e}")
        finally:
            self._release(info, replica, serving=True)  # before the caller hears the end
        emit(outcome)

    async def _relay(
        self, prompt: list[int], params: SamplingParams, emit: Emit, version: int,
        info: _Version, replica: Replica,
    ) -> None:  # fmt: skip
        body = protocol.completion_body(info.name, prompt, self._stopping(params),
                                        self._max_new(prompt, params), stream=True)  # fmt: skip
        sent = 0
        finished = False
        async with self._client.stream("POST", f"{replica.url}/v1/completions", json=body) as r:
            if r.status_code != 200:
                text = (await r.aread()).decode(errors="replace")
                self._on_status(replica, r.status_code, info.name)
                protocol.raise_for_error(r.status_code, text, len(prompt), self.max_context)
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if isinstance(chunk, dict) and "error" in chunk:
                    protocol.raise_stream_error(chunk["error"])
                if isinstance(chunk, dict) and not chunk.get("choices"):
                    continue  # a usage-only chunk
                delta = protocol.parse_choice(chunk, want_top=params.logprobs_top_k)
                self._check_echo(delta, prompt)
                if finished and delta.token_ids:
                    raise EngineError("vLLM sent tokens after the completion finished")
                if delta.finish_reason is not None and not delta.token_ids:
                    raise EngineError("vLLM ended the stream with a chunk holding no token")
                for i, tok in enumerate(delta.token_ids):
                    last = i == len(delta.token_ids) - 1
                    top = delta.top_logprobs[i] if delta.top_logprobs else []
                    emit(TokenEvent(tok, delta.logprobs[i], top,
                                    delta.finish_reason if last else None, version,
                                    adapter_version=info.user_version))  # fmt: skip
                    sent += 1
                    self.stats.generated_tokens += 1
                finished = finished or delta.finish_reason is not None
        if not finished:
            raise EngineUnavailableError(f"vLLM replica {replica.url} ended the stream before "
                                         "the completion finished")  # fmt: skip
        self.stats.requests += 1
        self.stats.prompt_tokens += len(prompt)

    def _max_new(self, prompt: list[int], params: SamplingParams) -> int:
        return max(1, min(int(params.max_tokens), self.max_context - len(prompt)))

    def _check_echo(self, choice: protocol.ChoiceDelta, prompt: list[int]) -> None:
        if choice.prompt_token_ids is not None and choice.prompt_token_ids != prompt:
            raise EngineError("vLLM read other prompt ids than clawrl sent")

    def _on_status(self, replica: Replica, status: int, name: str) -> None:
        """Book a non-200 answer against ``replica``.

        Raises:
            EngineUnavailableError: it no longer knows one of this engine's adapters (a server
                restarted between health checks): taken out until resynced.
        """
        if status >= 500:
            self._failed(replica, f"HTTP {status}")
        elif status == 404 and name.startswith(ADAPTER_PREFIX):
            self._take_out(replica, f"lost adapter {name}", unsynced=True)
            raise EngineUnavailableError(f"vLLM replica {replica.url} lost adapter {name}")

    async def _post_json(
        self, replica: Replica, path: str, body: dict[str, Any], prompt_tokens: int
    ) -> dict[str, Any]:
        try:
            r = await self._client.post(f"{replica.url}{path}", json=body)
        except httpx.HTTPError as e:
            self._failed(replica, str(e), connection=isinstance(e, httpx.ConnectError))
            raise EngineUnavailableError(f"vLLM replica {replica.url} failed: {e}") from e
        if r.status_code != 200:
            self._on_status(replica, r.status_code, str(body.get("model", "")))
            protocol.raise_for_error(r.status_code, r.text, prompt_tokens, self.max_context)
        replica.failures = 0
        try:
            out = r.json()
        except ValueError as e:
            raise EngineError(f"vLLM answered with something that is not JSON: {e}") from e
        if not isinstance(out, dict):
            raise EngineError(f"vLLM answered {type(out).__name__}, not an object")
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

    async def _scored(
        self, replica: Replica, body: dict[str, Any], prompt_tokens: int, *, sample: bool = True
    ) -> Any:
        """One scoring request, yielding to generation on ``replica``; ``sample``: it scores
        a whole sample (one of the replica's scoring slots), else one target position (no
        plugin) or one next-token judge prompt of many (bounded by :data:`SCORE_CONCURRENCY`
        only)."""

        async def send() -> dict[str, Any]:
            async with self._score_slots:
                return await self._post_json(replica, "/v1/completions", body, prompt_tokens)

        if replica.scoring is None:
            return await send()
        return await replica.scoring.run(send, slot=sample)

    async def _score_one(
        self, prompt: list[int], target: list[int], temperature: float, base: bool
    ) -> list[float]:
        if not target:
            return []
        _version, info, replica = await self._acquire()
        name = self._base_served if base else info.name
        try:
            if abs(temperature - 1.0) < 1e-9 or replica.prompt_temperature:
                body = protocol.prompt_logprobs_body(name, prompt, target, temperature)
                payload = await self._scored(replica, body, len(prompt))
                return protocol.parse_prompt_logprobs(payload, len(prompt), target)
            bodies = [
                protocol.next_token_body(name, prompt + target[:i], [target[i]], temperature)
                for i in range(len(target))
            ]
            payloads = await asyncio.gather(
                *(self._scored(replica, b, len(prompt), sample=False) for b in bodies)
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
                payload = await self._scored(replica, body, len(prompt), sample=False)
            finally:
                self._release(info, replica)
            return protocol.parse_next_token(payload, candidates)

        return list(await asyncio.gather(*(one(p) for p in prompts)))

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Stop: requests in flight and pending publishes end with :class:`EngineClosedError`;
        later calls raise it; this engine's adapters are unloaded; then ``on_close`` (e.g. the
        launched server stops). Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            emitters, pending, publishes = (
                list(self._emitters),
                list(self._pending),
                list(self._publishes),
            )
        closed = EngineClosedError("engine closed")
        for emit in emitters:  # streams in flight end with the error
            emit(closed)
        for fut in pending:
            fut.cancel()
        for pub in publishes:
            _settle(pub, error=closed)

        async def shutdown() -> None:
            for task in list(self._tasks):
                task.cancel()
            # a shared server keeps no adapter of ours: each replica's own list, so an adapter
            # whose unloading a cancelled task left undone goes too
            await asyncio.gather(*(self._unload_ours(r) for r in self.replicas),
                                 return_exceptions=True)  # fmt: skip
            client = getattr(self, "_client", None)
            if client is not None:
                await client.aclose()
            if self._base_adapter is not None:
                await asyncio.to_thread(shutil.rmtree, self._scratch(), True)

        with contextlib.suppress(Exception):
            self._call(shutdown(), timeout=60)

        def stop() -> None:
            for task in asyncio.all_tasks(self._loop):  # whatever raced past the snapshot above
                task.cancel()
            self._loop.stop()

        self._loop.call_soon_threadsafe(stop)
        self._thread.join(timeout=30)
        if self._on_close is not None:
            self._on_close()


def _settle(
    future: concurrent.futures.Future[Any],
    *,
    result: Any = None,
    error: BaseException | None = None,
) -> None:
    """Resolve ``future`` unless it is already done (a close may settle it first)."""
    if future.done():
        return
    with contextlib.suppress(concurrent.futures.InvalidStateError):
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)


def _write_zero_adapter(adapter: Path, target: Path) -> Path:
    """A copy of the PEFT adapter at ``adapter`` with every ``lora_B`` tensor zeroed, written to
    ``target``: a LoRA whose delta is exactly zero (the base model's output).

    Raises:
        EngineError: ``adapter`` has no ``adapter_config.json`` or no safetensors weights.
    """
    from safetensors.torch import load_file, save_file

    weights = adapter / "adapter_model.safetensors"
    if not (adapter / "adapter_config.json").is_file() or not weights.is_file():
        raise EngineError(f"{adapter} is not a PEFT adapter with adapter_model.safetensors")
    state = load_file(str(weights))
    zeroed = {k: (v.zero_() if "lora_B" in k or "lora_embedding_B" in k else v)
              for k, v in state.items()}  # fmt: skip
    target.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(adapter / "adapter_config.json", target / "adapter_config.json")
    save_file(zeroed, str(target / "adapter_model.safetensors"))
    return target


def _base_url(url: str) -> str:
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def _temp_dir() -> str:
    import tempfile

    return tempfile.mkdtemp(prefix="clawrl-vllm-weights-")
