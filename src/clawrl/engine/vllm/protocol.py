"""vLLM's OpenAI-compatible completions API in token ids: request bodies and response parsing.

Pure functions, no I/O: :mod:`clawrl.engine.vllm.engine` sends what these build and reads what
they parse. Everything is token ids in and out (``prompt`` as a list of ids,
``return_token_ids``), so no text is ever re-tokenized. The server must run with
``--logprobs-mode processed_logprobs``: the log-probs it returns for sampled tokens are then
those of the distribution it sampled from (after temperature, top-k and top-p), which is what
clawrl records (the distribution actually sampled from). Checked at start by :func:`clawrl.engine.vllm.checks`.

vLLM facts this module relies on (vLLM 0.32, CPU build):

* ``/v1/completions`` with ``prompt: [ids]``, ``return_token_ids: true`` returns
  ``choices[0].token_ids`` (the sampled ids, EOS included) and ``prompt_token_ids``; streamed, each
  chunk's ``token_ids`` holds that chunk's new ids and ``logprobs.token_logprobs`` their
  log-probs.
* ``logprobs: k`` returns the sampled token's log-prob and the top k; with
  ``return_tokens_as_token_ids: true`` the alternatives are keyed ``"token_id:ID"``.
* ``prompt_logprobs: 0`` returns, per prompt position, the log-prob of the prompt's own token,
  at temperature 1 whatever the request's temperature (prompt tokens skip the sampling
  processors), unless clawrl's plugin runs in the server and the body carries
  ``vllm_xargs: {clawrl_prompt_temperature: T}`` (:mod:`clawrl.engine.vllm.server_plugin`). ``logprob_token_ids: [ids]`` returns the log-probs of those ids at the first
  generated position under the processed (temperature-scaled) distribution.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from typing import Any

from clawrl.engine.sampling import GREEDY_BELOW
from clawrl.engine.types import FinishReason, SamplingParams
from clawrl.errors import ContextLengthError, EngineError, EngineUnavailableError

TOKEN_ID_PREFIX = "token_id:"
"""How vLLM names an alternative token with ``return_tokens_as_token_ids``."""

NEUTRAL: dict[str, Any] = {
    "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "min_p": 0.0,
}  # fmt: skip
"""Sent with every request: vLLM fills a field a request leaves out from the model's
``generation_config.json`` (e.g. a repetition penalty or top-k of a Qwen model), which would
change the distribution sampled from without clawrl knowing."""


def completion_body(
    model: str, prompt_ids: list[int], params: SamplingParams, max_tokens: int, *, stream: bool
) -> dict[str, Any]:
    """The ``/v1/completions`` body that samples like :class:`SamplingParams` says.

    Args:
        model: the served name (the base model's, or a LoRA adapter's).
        prompt_ids: ``[p]`` token ids.
        params: sampling parameters (``temperature < 1e-5`` is greedy, as in
            :mod:`clawrl.engine.sampling`).
        max_tokens: new tokens at most (already clipped to the context window).
        stream: ask for server-sent events.
    """
    greedy = params.temperature < GREEDY_BELOW
    body: dict[str, Any] = {
        "model": model,
        "prompt": list(prompt_ids),
        "max_tokens": int(max_tokens),
        "temperature": 0.0 if greedy else float(params.temperature),
        "top_p": float(params.top_p),
        "top_k": int(params.top_k) if params.top_k > 0 else 0,
        "logprobs": int(params.logprobs_top_k),
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
        "skip_special_tokens": False,
        "include_stop_str_in_output": True,  # the ids that completed a stop string were sampled
        "ignore_eos": bool(params.ignore_eos),
        "stream": stream,
        **NEUTRAL,
    }
    if params.stop_token_ids:
        body["stop_token_ids"] = [int(i) for i in params.stop_token_ids]
    if params.stop:
        body["stop"] = list(params.stop)
    if params.seed is not None:
        # vLLM takes a signed 64-bit seed; clawrl's engines reduce any int mod 2**64
        seed = int(params.seed) % 2**64
        body["seed"] = seed - 2**64 if seed >= 2**63 else seed
    if stream:
        body["stream_options"] = {"include_usage": False}
    return body


PROMPT_TEMPERATURE_KEY = "clawrl_prompt_temperature"
"""The ``vllm_xargs`` key clawrl's server plugin reads (:mod:`clawrl.engine.vllm.server_plugin`,
which must name the same key: checked by a test)."""


def prompt_logprobs_body(
    model: str, prompt_ids: list[int], target_ids: list[int], temperature: float = 1.0
) -> dict[str, Any]:
    """A body whose ``prompt_logprobs`` are the log-probs of ``target_ids`` after ``prompt_ids``
    (one generated token, discarded): at temperature 1, or, with ``temperature != 1``,
    ``log_softmax(logits / temperature)`` on a server running clawrl's plugin (a server without
    it ignores the key and answers at temperature 1: :func:`clawrl.engine.vllm.checks.
    check_prompt_temperature` finds out at start)."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": list(prompt_ids) + list(target_ids),
        "max_tokens": 1,
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": 0,
        "prompt_logprobs": 0,
        "return_token_ids": True,
        "skip_special_tokens": False,
        **NEUTRAL,
    }
    if abs(temperature - 1.0) > 1e-9:
        body["vllm_xargs"] = {PROMPT_TEMPERATURE_KEY: float(temperature)}
    return body


def next_token_body(
    model: str, prompt_ids: list[int], candidates: list[int], temperature: float
) -> dict[str, Any]:
    """A body that returns log p_T(c | prompt) for each candidate id ``c`` (the first generated
    position's processed distribution at ``temperature``)."""
    return {
        "model": model,
        "prompt": list(prompt_ids),
        "max_tokens": 1,
        "temperature": float(temperature),
        "top_p": 1.0,
        "top_k": 0,
        **NEUTRAL,
        "logprobs": 1,
        "logprob_token_ids": [int(c) for c in candidates],
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
        "skip_special_tokens": False,
    }


@dataclass
class ChoiceDelta:
    """What one response (or one streamed chunk) says about the choice.

    Attributes:
        token_ids: new sampled ids.
        logprobs: their sampling log-probs (same length).
        top_logprobs: per new id, ``[(id, logprob), ...]`` alternatives (when asked).
        finish_reason: set on the last chunk.
        stop_string: the stop string that ended it (vLLM's ``stop_reason`` when a string).
        prompt_token_ids: the prompt ids as the server read them (first chunk only).
    """

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    stop_string: str | None = None
    prompt_token_ids: list[int] | None = None


def _finish(reason: Any) -> FinishReason | None:
    if reason is None:
        return None
    if reason == "stop":
        return FinishReason.STOP
    if reason == "length":
        return FinishReason.LENGTH
    if reason == "abort":  # the server stopped it (drained, paused, shutting down): not a turn
        raise EngineUnavailableError("vLLM aborted the request (the server is stopping or paused)")
    raise EngineError(f"vLLM finished a choice for an unknown reason {reason!r}")


def _int_list(value: Any, what: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(i, int) for i in value):
        raise EngineError(f"vLLM sent {what} that are not a list of ids: {_short(value)}")
    return [int(i) for i in value]


def _alternative_id(key: str) -> int:
    if not key.startswith(TOKEN_ID_PREFIX):
        raise EngineError(
            f"vLLM named a log-prob alternative {key!r} by text, not id: the server ignored "
            "return_tokens_as_token_ids"
        )
    return int(key[len(TOKEN_ID_PREFIX) :])


def parse_choice(payload: dict[str, Any], *, want_top: int = 0) -> ChoiceDelta:
    """The choice of a completions response or stream chunk, in ids.

    Raises:
        EngineError: the server sent no ids for text it generated, log-probs that do not line
            up with the ids, or a malformed choice: a turn is never stored shorter than what
            was sampled.
    """
    choices = payload.get("choices") if isinstance(payload, dict) else None
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        raise EngineError(f"vLLM sent a response without exactly one choice: {_short(payload)}")
    ch = choices[0]
    finish = _finish(ch.get("finish_reason"))
    text = ch.get("text") or ""
    if ch.get("token_ids") is None:
        if text:
            raise EngineError("vLLM sent generated text without its token ids (return_token_ids)")
        ids: list[int] = []
    else:
        ids = _int_list(ch["token_ids"], "token ids")
    lp = ch.get("logprobs") or {}
    values = lp.get("token_logprobs") if isinstance(lp, dict) else None
    values = values or []
    if not isinstance(values, list) or len(values) != len(ids):
        raise EngineError(
            f"vLLM sent {len(ids)} token ids with {len(values) if isinstance(values, list) else 0}"
            " log-probs: is the server answering without logprobs?"
        )
    if not all(isinstance(v, int | float) and v <= 0.0 for v in values):
        raise EngineError(f"vLLM sent log-probs that are not numbers <= 0: {_short(values)}")
    top: list[list[tuple[int, float]]] = []
    if want_top:
        alternatives_list = lp.get("top_logprobs") or []
        if len(alternatives_list) != len(ids):
            raise EngineError(f"vLLM sent {len(alternatives_list)} top log-prob lists for "
                              f"{len(ids)} ids")  # fmt: skip
        for alternatives in alternatives_list:
            if not isinstance(alternatives, dict):
                raise EngineError(f"vLLM sent top log-probs that are not a table: "
                                  f"{_short(alternatives)}")  # fmt: skip
            pairs = sorted(((_alternative_id(k), float(v)) for k, v in alternatives.items()),
                           key=lambda p: -p[1])  # fmt: skip
            top.append(pairs[:want_top])
    stop_reason = ch.get("stop_reason")
    prompt_ids = ch.get("prompt_token_ids")
    return ChoiceDelta(
        token_ids=ids,
        logprobs=[float(v) for v in values],
        top_logprobs=top,
        finish_reason=finish,
        stop_string=stop_reason if isinstance(stop_reason, str) else None,
        prompt_token_ids=_int_list(prompt_ids, "prompt ids") if prompt_ids is not None else None,
    )


def parse_prompt_logprobs(
    payload: dict[str, Any], prompt_len: int, target_ids: list[int]
) -> list[float]:
    """``[t]`` log-probs of ``target_ids`` from a :func:`prompt_logprobs_body` response.

    Raises:
        EngineError: the positions or ids do not match what was sent.
    """
    choices = payload.get("choices") or []
    entries = payload.get("prompt_logprobs")
    if entries is None and choices:
        entries = choices[0].get("prompt_logprobs")
    if not isinstance(entries, list) or len(entries) != prompt_len + len(target_ids):
        raise EngineError(f"vLLM sent no prompt log-probs for the scored ids: {_short(payload)}")
    out = []
    for pos, tok in enumerate(target_ids, start=prompt_len):
        entry = entries[pos] or {}
        found = entry.get(str(tok))
        if not isinstance(found, dict) or "logprob" not in found:
            raise EngineError(f"vLLM's prompt log-probs at position {pos} lack token {tok}")
        out.append(float(found["logprob"]))
    return out


def parse_next_token(payload: dict[str, Any], candidates: list[int]) -> list[float]:
    """``[len(candidates)]`` log-probs from a :func:`next_token_body` response.

    Raises:
        EngineError: a candidate is missing (a server without ``logprob_token_ids``).
    """
    choice = parse_choice(payload, want_top=len(candidates) + 1)
    if not choice.top_logprobs:
        raise EngineError("vLLM sent no log-probs for the next-token candidates")
    table = dict(choice.top_logprobs[0])
    missing = [c for c in candidates if c not in table]
    if missing:
        raise EngineError(
            f"vLLM left out candidate ids {missing[:5]} (does the server support "
            "logprob_token_ids?)"
        )
    return [table[c] for c in candidates]


def raise_for_error(status: int, text: str, prompt_tokens: int, max_context: int) -> None:
    """Map a vLLM error response to clawrl's errors.

    Raises:
        ContextLengthError: the server says the prompt does not fit its context.
        EngineError: any other error (vLLM's message included).
    """
    message = text
    with contextlib.suppress(ValueError, KeyError, TypeError):
        message = json.loads(text)["error"]["message"]
    if status == 400 and "maximum context length" in str(message):
        raise ContextLengthError(prompt_tokens, max_context)
    if status >= 500:  # the server is down or overloaded: the client may retry
        raise EngineUnavailableError(f"vLLM answered HTTP {status}: {_short(message)}")
    raise EngineError(f"vLLM answered HTTP {status}: {_short(message)}")


def raise_stream_error(error: Any) -> None:
    """Map an error event inside a vLLM stream (``{"error": {...}}``) to clawrl's errors: a
    5xx code (e.g. "EngineCore encountered an issue" when the server is going down) is
    :class:`EngineUnavailableError` (a 503 to the client, who may retry), anything else
    :class:`EngineError`.

    Raises:
        EngineUnavailableError: the error carries an HTTP code >= 500.
        EngineError: any other error.
    """
    code = error.get("code") if isinstance(error, dict) else None
    with contextlib.suppress(TypeError, ValueError):
        if code is not None and int(code) >= 500:
            raise EngineUnavailableError(f"vLLM stream error: {_short(error)}")
    raise EngineError(f"vLLM stream error: {_short(error)}")


def _short(value: Any, limit: int = 300) -> str:
    text = value if isinstance(value, str) else json.dumps(value)[: limit + 1]
    return text if len(text) <= limit else text[:limit] + "..."
