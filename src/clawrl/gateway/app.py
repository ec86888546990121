"""The gateway ASGI app, composed from small modules.

=====================  ==============================================================
module                 does
=====================  ==============================================================
``routes_openai``      ``/v1/chat/completions``, ``/v1/models`` (also under ``/s/{id}``)
``routes_anthropic``   ``/v1/messages``, ``/v1/messages/count_tokens`` (also under ``/s/{id}``)
``routes_responses``   ``/v1/responses`` (also under ``/s/{id}``)
``protocol_call``      the shared single-choice call of the Anthropic and Responses routes
``side_calls``         title / compaction side calls, by header or prompt text
``routes_clawrl``      ``/healthz``, ``/metrics``, ``/v1/sessions/{id}/end``, ``/v1/feedback``
``schemas``            the request body and the policy for each field
``prepare``            normalise + render + splice + prefill + attribute (worker thread)
``splice``             exact recorded ids for history assistant messages
``attribution``        session from URL / header / body, else by token prefix
``choices``            per-choice text, parse, finish reason (stream and non-stream)
``decode``             ids -> client-visible text (EOS dropped, stop strings cut)
``streaming``          SSE, one chunk per token, disconnect -> incomplete turn
``recorder``           turns into the store, committed before the answer
``responses``          OpenAI response / chunk / logprobs JSON
``errors``             OpenAI error shape for every error
``auth``               API key middleware, key fingerprints, loopback check
``metrics``            Prometheus text, request middleware
``server``             ``bind_socket`` and ``LiveServer`` (uvicorn in a thread)
``testing``            ``ScriptedEngine`` for tests
=====================  ==============================================================
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

from fastapi import FastAPI

from clawrl.config import SamplingConfig
from clawrl.engine import Engine
from clawrl.errors import ConfigError
from clawrl.gateway import (
    routes_anthropic,
    routes_clawrl,
    routes_memory,
    routes_openai,
    routes_responses,
)
from clawrl.gateway.auth import ApiKeyMiddleware
from clawrl.gateway.errors import install_error_handlers
from clawrl.gateway.metrics import Metrics, RequestMetricsMiddleware
from clawrl.gateway.state import GatewayState
from clawrl.gateway.user_adapters import UserAdapters
from clawrl.gateway.users import DEFAULT_USER_FROM, UserSource
from clawrl.memory import MemoryKeeper
from clawrl.store import Store


def create_app(
    engine: Engine,
    tokenizer: Any,
    store: Store,
    *,
    model_name: str,
    api_key: str | None = None,
    defaults: SamplingConfig | None = None,
    lifespan: Callable[[Any], AbstractAsyncContextManager[None]] | None = None,
    memory: MemoryKeeper | None = None,
    memory_admin: MemoryKeeper | None = None,
    user_from: Sequence[UserSource] = DEFAULT_USER_FROM,
    user_adapters: UserAdapters | None = None,
    user_keys: dict[str, str] | None = None,
) -> FastAPI:
    """Build the gateway app over an engine, the policy's tokenizer and a store.

    The app does not own its resources: whoever created the engine and the store closes them
    (``clawrl serve`` does, after uvicorn has drained the requests in flight).

    Args:
        engine: any :class:`clawrl.engine.Engine` (``TransformersEngine``, a scripted engine).
        tokenizer: the policy's Hugging Face tokenizer (its chat template renders prompts).
        store: the trajectory store every call is recorded in.
        model_name: the name served by ``/v1/models`` and echoed in responses; requests may
            name any model.
        api_key: when set, every route but ``/healthz`` requires it (401 otherwise).
        defaults: sampling defaults for fields a request leaves out.
        lifespan: an ASGI lifespan run while the server runs (the online loop,
            :meth:`clawrl.trainer.service.OnlineService.lifespan`).
        memory: the preference memory whose entries main calls get in their system message
            (``clawrl serve --memory``; ``None``: off).
        memory_admin: with memory off, the keeper ``/v1/memory`` changes entries through
            (its cap from the config; ``None``: one with the default cap, made on first use).
        user_from: where a request's user id comes from, first match wins
            (:mod:`clawrl.gateway.users`; ``server.user_from``).
        user_adapters: serve each user with their own adapter
            (:mod:`clawrl.gateway.user_adapters`; ``None``: every user gets the policy alone).
        user_keys: users' API keys, key -> user id: a request with one is that user's and
            sees only their data (:mod:`clawrl.gateway.auth`); ``api_key`` is then the admin's.

    Returns:
        The FastAPI app; ``app.state.gateway`` is its :class:`GatewayState`.

    Raises:
        ConfigError: the engine's token ids belong to another tokenizer
            (:attr:`clawrl.engine.Engine.tokenizer_id` differs from ``tokenizer``'s).
    """
    check_tokenizer(engine, tokenizer)
    metrics = Metrics()
    state = GatewayState(
        engine=engine,
        tokenizer=tokenizer,
        store=store,
        model_name=model_name,
        api_key=api_key,
        memory=memory,
        memory_admin=memory_admin,
        user_from=tuple(user_from),
        user_adapters=user_adapters,
        defaults=defaults or SamplingConfig.model_validate({}),
        metrics=metrics,
    )
    app = FastAPI(
        title="clawrl gateway",
        summary="OpenAI-compatible policy server that records every call token-exactly.",
        docs_url=None,
        redoc_url=None,
        lifespan=lifespan,
    )
    app.state.gateway = state
    install_error_handlers(
        app,
        on_error=lambda kind: metrics.inc("clawrl_gateway_errors_total", kind=kind),
        on_answer=lambda *error: [listener(*error) for listener in state.error_listeners],
    )
    app.include_router(routes_clawrl.router)
    app.include_router(routes_memory.router)
    for router in (routes_openai.router, routes_anthropic.router, routes_responses.router):
        app.include_router(router)
        app.include_router(router, prefix="/s/{session_id}")
    app.add_middleware(
        ApiKeyMiddleware,
        api_key=api_key,
        on_reject=lambda: metrics.inc("clawrl_gateway_errors_total", kind="auth"),
        user_keys=user_keys,
    )
    app.add_middleware(RequestMetricsMiddleware, metrics=metrics)
    return app


def check_tokenizer(engine: Engine, tokenizer: Any) -> None:
    """Refuse an engine whose ids mean something else than ``tokenizer``'s.

    Raises:
        ConfigError: both fingerprints are known and differ.
    """
    if not engine.tokenizer_id:
        return
    from clawrl.models import tokenizer_fingerprint

    mine = tokenizer_fingerprint(tokenizer)
    if engine.tokenizer_id != mine:
        raise ConfigError(
            f"the engine serves tokenizer {engine.tokenizer_id} but the gateway renders prompts "
            f"with {mine}: token ids would not mean the same text; serve the same model (or "
            "its tokenizer) on both sides"
        )
