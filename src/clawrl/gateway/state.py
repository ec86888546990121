"""What every route shares: the engine, tokenizer, store, settings and metrics."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from clawrl.config import SamplingConfig
from clawrl.engine import Engine
from clawrl.gateway.metrics import Metrics
from clawrl.gateway.user_adapters import UserAdapters
from clawrl.gateway.users import DEFAULT_USER_FROM, UserSource
from clawrl.memory import MemoryKeeper
from clawrl.store import Store, TurnRecord


@dataclass
class GatewayState:
    """The gateway's shared state (``app.state.gateway``).

    Attributes:
        engine: the token-level engine (any :class:`clawrl.engine.Engine`).
        tokenizer: the policy's tokenizer (renders prompts, decodes completions).
        store: the trajectory store every call is recorded in.
        model_name: the served model name (``GET /v1/models``, the ``model`` of responses).
        api_key: the required key, or ``None`` for no auth.
        defaults: sampling defaults for fields a request leaves out.
        metrics: the Prometheus metrics.
        started_at: seconds since the epoch when the app was created.
        turn_listeners: called with each request's recorded turns, after they are durable
            (``clawrl serve``'s console line per request).
        error_listeners: called with ``(method, path, status, message)`` for each error
            answered without a recorded turn (a refused request's console line).
        memory: the preference memory main calls get (``clawrl serve --memory``; ``None``:
            off).
        memory_admin: with memory off, the keeper ``/v1/memory`` reads and changes entries
            through (made on first use).
        user_from: where a request's user id comes from (:mod:`clawrl.gateway.users`).
        user_adapters: with per-user adapters, which adapter serves each user
            (:mod:`clawrl.gateway.user_adapters`; ``None``: every user gets the policy alone).
    """

    engine: Engine
    tokenizer: Any
    store: Store
    model_name: str
    api_key: str | None = None
    defaults: SamplingConfig = field(default_factory=lambda: SamplingConfig.model_validate({}))
    metrics: Metrics = field(default_factory=Metrics)
    started_at: float = field(default_factory=time.time)
    turn_listeners: list[Callable[[list[TurnRecord]], None]] = field(default_factory=list)
    error_listeners: list[Callable[[str, str, int, str], None]] = field(default_factory=list)
    memory: MemoryKeeper | None = None
    memory_admin: MemoryKeeper | None = None
    user_from: tuple[UserSource, ...] = DEFAULT_USER_FROM
    user_adapters: UserAdapters | None = None

    @property
    def stop_token_ids(self) -> frozenset[int]:
        """Ids that always end a completion: the engine's EOS ids (never client-visible text)."""
        return self.engine.eos_token_ids
