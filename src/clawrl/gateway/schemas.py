"""The chat-completions request body, and what the gateway does with each field.

Honoured: ``model`` (any name is served by the one policy; the served name is returned),
``messages``, ``tools``, ``tool_choice``, ``parallel_tool_calls`` (``false`` keeps only the
first parsed call), ``n``, ``stream``, ``stream_options.include_usage``, ``stop``, ``max_tokens``
/ ``max_completion_tokens`` (the smaller wins when both are given), ``temperature``, ``top_p``,
``top_k`` (vLLM's extension), ``seed`` (choice ``i`` of ``n`` uses ``seed + i``), ``logprobs``,
``top_logprobs``, and the session fields ``session_id``, ``metadata.session_id``, ``user``.

Accepted at their neutral value only, else a 400 naming the field: ``frequency_penalty`` and
``presence_penalty`` (0), ``logit_bias`` (empty), ``response_format`` (``{"type": "text"}``),
``modalities`` (``["text"]``). Always a 400: ``audio``, ``prediction``, ``web_search_options``,
``functions`` / ``function_call`` (use ``tools``), and ``response_format`` ``json_object`` /
``json_schema`` (constrained decoding is not implemented).

Accepted without effect (they change nothing the policy samples): ``store``, ``metadata`` (other
keys), ``service_tier``, ``prompt_cache_key``, ``safety_identifier``, ``reasoning_effort``,
``verbosity``. Any other, unknown field is accepted too (clients add vendor extensions), but is
never silently dropped: it is logged, counted in ``clawrl_gateway_ignored_fields_total``, listed
in the response header ``x-clawrl-ignored-fields`` and stored with the turn's sampling params.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from clawrl.errors import ClientInputError

MAX_N = 16
MAX_STOP = 16
NO_EFFECT_FIELDS = (
    "store",
    "service_tier",
    "prompt_cache_key",
    "safety_identifier",
    "reasoning_effort",
    "verbosity",
)


class StreamOptions(BaseModel):
    """``stream_options``: only ``include_usage`` has an effect."""

    model_config = ConfigDict(extra="allow")

    include_usage: StrictBool | None = None


class ChatCompletionRequest(BaseModel):
    """A ``POST /v1/chat/completions`` body (see the module docstring for each field's effect)."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    messages: Any = Field(..., description="checked by clawrl.chat.normalize_openai_messages")
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: StrictBool | None = None
    n: int = Field(1, ge=1, le=MAX_N)
    stream: StrictBool | None = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1)
    seed: int | None = Field(None, ge=-(2**63), le=2**63 - 1)
    logprobs: StrictBool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    user: str | None = None
    metadata: dict[str, Any] | None = None
    session_id: str | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    modalities: list[str] | None = None
    audio: Any = None
    prediction: Any = None
    web_search_options: Any = None
    functions: Any = None
    function_call: Any = None


def check_supported(req: ChatCompletionRequest) -> list[str]:
    """Refuse fields the gateway cannot honour; return the unknown fields it will ignore.

    Returns:
        Names of unknown top-level fields (sorted), to be logged, counted and recorded.

    Raises:
        ClientInputError: (400, code ``unsupported_parameter`` or ``invalid_value``) a field is
            set to a value the gateway cannot honour; ``param`` names it.
    """
    for name in ("frequency_penalty", "presence_penalty"):
        value = getattr(req, name)
        if value not in (None, 0, 0.0):
            _unsupported(name, f"'{name}' is not supported (only 0)")
    if req.logit_bias:
        _unsupported("logit_bias", "'logit_bias' is not supported (only an empty object)")
    if req.response_format is not None:
        kind = req.response_format.get("type")
        if kind != "text":
            _unsupported(
                "response_format",
                f"response_format type {kind!r} is not supported: constrained decoding is not "
                "implemented (only {'type': 'text'})",
            )
    if req.modalities is not None and list(req.modalities) != ["text"]:
        _unsupported("modalities", "only the 'text' modality is supported")
    for name in ("audio", "prediction", "web_search_options"):
        if getattr(req, name) is not None:
            _unsupported(name, f"'{name}' is not supported")
    if req.functions is not None or req.function_call is not None:
        _unsupported(
            "functions" if req.functions is not None else "function_call",
            "the deprecated 'functions'/'function_call' are not supported; use 'tools' and "
            "'tool_choice'",
        )
    if req.top_logprobs and not req.logprobs:
        raise ClientInputError(
            "'top_logprobs' needs 'logprobs': true", param="top_logprobs", code="invalid_value"
        )
    if isinstance(req.stop, list) and len(req.stop) > MAX_STOP:
        raise ClientInputError(f"at most {MAX_STOP} stop sequences are supported", param="stop")
    extra = sorted(k for k in (req.model_extra or {}) if k not in NO_EFFECT_FIELDS)
    return extra


def _unsupported(param: str, message: str) -> None:
    raise ClientInputError(message, param=param, code="unsupported_parameter")


def stop_strings(req: ChatCompletionRequest) -> tuple[str, ...]:
    """The request's non-empty stop strings, in order."""
    if req.stop is None:
        return ()
    stops = [req.stop] if isinstance(req.stop, str) else list(req.stop)
    return tuple(s for s in stops if s)


def max_new_tokens(req: ChatCompletionRequest, default: int) -> int:
    """``max_completion_tokens`` / ``max_tokens`` (the smaller when both), else ``default``."""
    given = [v for v in (req.max_tokens, req.max_completion_tokens) if v is not None]
    return min(given) if given else default


def max_tokens_field(req: ChatCompletionRequest) -> str | None:
    """The field that set :func:`max_new_tokens`'s budget; ``None`` for the default."""
    if req.max_completion_tokens is not None and (
        req.max_tokens is None or req.max_completion_tokens <= req.max_tokens
    ):
        return "max_completion_tokens"
    return "max_tokens" if req.max_tokens is not None else None


def include_usage(req: ChatCompletionRequest) -> bool:
    """Whether a streamed response ends with a usage chunk."""
    return bool(req.stream_options and req.stream_options.include_usage)
