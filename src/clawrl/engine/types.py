"""Engine-facing types: sampling parameters, completions, and the ``Engine`` protocol.

Everything here is in token ids; chat rendering lives in :mod:`clawrl.chat`.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol, runtime_checkable


class FinishReason(StrEnum):
    """Why generation stopped."""

    STOP = "stop"  # an EOS / stop token id or a stop string was produced
    LENGTH = "length"  # max_tokens (or the context window) was reached
    ABORTED = "aborted"  # the caller cancelled (e.g. client disconnected mid-stream)


@dataclass(frozen=True)
class SamplingParams:
    """Sampling parameters for one completion.

    Attributes:
        max_tokens: most new tokens to sample (clipped to what fits the context window).
        temperature: softmax temperature; ``0`` means greedy decoding.
        top_p: nucleus mass in (0, 1]; 1 disables.
        top_k: keep the k most likely tokens; 0 disables.
        stop_token_ids: token ids that end the completion (the tokenizer's EOS is always added
            by the engine unless ``ignore_eos``); the stop token is included in ``token_ids``.
        stop: stop strings; the completion ends as soon as its decoded text contains one. The
            tokens up to and including the one that completed the stop string are kept in
            ``token_ids`` (they were sampled); ``Completion.stop_string`` says which matched.
        seed: per-request seed; the same seed, prompt and params give the same completion
            when the request runs alone.
        logprobs_top_k: also return the top-k alternatives per position (0 = none).
        ignore_eos: do not stop at the EOS token.
        adapter: serve this request with the LoRA adapter loaded under this name
            (:meth:`Engine.load_adapter`: a user's adapter) on top of the policy; ``None``:
            the policy alone.
    """

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()
    seed: int | None = None
    logprobs_top_k: int = 0
    ignore_eos: bool = False
    adapter: str | None = None


@dataclass
class TokenEvent:
    """One sampled token, as streamed by :meth:`Engine.generate_stream`.

    Attributes:
        token_id: the sampled id.
        logprob: log-prob of ``token_id`` under the distribution actually sampled from
            (after temperature, top-k and top-p; see ``TransformersEngine`` for greedy).
        top_logprobs: ``[(token_id, logprob), ...]`` alternatives under the same distribution,
            most likely first (empty unless ``logprobs_top_k > 0``).
        finish_reason: set on the last event only.
        policy_version: version of the weights that sampled this token.
        adapter_version: version of the request's adapter (``SamplingParams.adapter``) that
            sampled it; ``None`` without one.
    """

    token_id: int
    logprob: float
    top_logprobs: list[tuple[int, float]] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    policy_version: int = 0
    adapter_version: int | None = None


@dataclass
class Completion:
    """A finished completion.

    Attributes:
        token_ids: sampled ids, shape ``[n]`` (n <= max_tokens), stop token included.
        logprobs: sampling log-probs per id, shape ``[n]`` (nats).
        top_logprobs: per position, ``[(token_id, logprob), ...]`` when requested.
        finish_reason: see :class:`FinishReason`.
        policy_version: version of the weights that sampled every token of it.
        prompt_tokens: length of the prompt in tokens.
        stop_string: the stop string that ended it, if any.
        time_to_first_token: seconds from admission to the first sampled token (prefill).
        latency: seconds from admission to the last token.
        adapter_version: version of the request's adapter that sampled every token of it
            (``None`` without one).
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    policy_version: int
    prompt_tokens: int
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    stop_string: str | None = None
    time_to_first_token: float = 0.0
    latency: float = 0.0
    adapter_version: int | None = None


@dataclass
class EngineStats:
    """Counters for metrics: tokens and requests served, current queue depth and batch size."""

    prompt_tokens: int = 0
    generated_tokens: int = 0
    requests: int = 0
    queue_depth: int = 0
    batch_size: int = 0
    decode_steps: int = 0


@runtime_checkable
class Engine(Protocol):
    """Token-level generation and scoring: everything the gateway, the judge, the trainer and the
    demo use of an engine, declared here and nowhere else.

    Implementations: :class:`clawrl.engine.TransformersEngine` (in-process, default) and
    :class:`clawrl.engine.scripted.ScriptedEngine` (given completions: the warm start, tests);
    ``tests/engine/test_engine_contract.py`` checks
    the behaviour every backend must have. All methods are safe to call concurrently from
    asyncio tasks; token ids and log-probs are those of the policy's tokenizer, log-probs in
    nats.

    Attributes:
        max_context: the context window in tokens (prompt + completion).
        policy_version: the version new requests are served with (it increases only).
        eos_token_ids: ids that always end a completion (unless ``ignore_eos``).
        tokenizer_id: :func:`clawrl.models.tokenizer_fingerprint` of the tokenizer whose ids
            this engine reads and writes (``""`` if unknown); the gateway refuses an engine
            whose ids would mean something else than its tokenizer's.
        stats: live counters (:class:`EngineStats`).
        available: whether the engine can take a request now (``False`` while every vLLM
            replica is down or behind the current version); ``/healthz`` answers 503 while not.
        needs_base_adapter: whether the engine serves the base weights through a LoRA adapter
            it must be given (:meth:`use_base_adapter`) before the first request (vLLM); an
            in-process engine serves merged weights and needs none.
    """

    max_context: int
    policy_version: int
    eos_token_ids: frozenset[int]
    tokenizer_id: str
    stats: EngineStats

    @property
    def available(self) -> bool: ...

    @property
    def needs_base_adapter(self) -> bool: ...

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Completion:
        """Sample one completion for ``prompt_ids`` (shape ``[p]``).

        Raises:
            ContextLengthError: ``len(prompt_ids) >= max_context``.
            EngineClosedError: the engine was closed.
            EngineError: generation failed.
        """
        ...

    def generate_stream(
        self, prompt_ids: Sequence[int], params: SamplingParams
    ) -> AsyncIterator[TokenEvent]:
        """Like :meth:`generate`, yielding each token as it is sampled; the last event carries
        ``finish_reason``. Closing the iterator early aborts the request (its tokens stop being
        sampled). The same seed, prompt and params give the same ids as :meth:`generate`."""
        ...

    async def score(
        self,
        prompt_ids: Sequence[int],
        target_ids: Sequence[int],
        *,
        temperature: float = 1.0,
        base: bool = False,
    ) -> list[float]:
        """Teacher-forced log-probs of ``target_ids`` (shape ``[t]``) after ``prompt_ids``, under
        the same temperature semantics as :meth:`generate` (no top-k / top-p); returns shape
        ``[t]``. ``base=True`` scores with the frozen base weights (a LoRA adapter disabled).

        Raises:
            ContextLengthError: prompt + target do not fit.
            EngineError: scoring failed.
        """
        ...

    async def score_batch(
        self,
        items: Sequence[tuple[Sequence[int], Sequence[int]]],
        *,
        temperature: float = 1.0,
        base: bool = False,
    ) -> list[list[float]]:
        """:meth:`score` for several ``(prompt_ids, target_ids)`` pairs at once; returns one
        ``[t_i]`` list per pair, in order."""
        ...

    async def score_next_batch(
        self,
        prompts: Sequence[Sequence[int]],
        candidates: Sequence[int],
        *,
        temperature: float = 1.0,
    ) -> list[list[float]]:
        """Next-token scoring: ``[len(prompts)][len(candidates)]`` log-probs of each candidate id
        right after each prompt (full-vocabulary distribution at ``temperature``); equal to
        :meth:`score` with a one-token target. Choice judges rank verdicts with it."""
        ...

    def load_policy(self, version: int, weights: Any) -> concurrent.futures.Future[int]:
        """Queue new weights (a LoRA adapter directory, or a full state dict) as ``version``;
        requests already running finish on the old version, later ones get the new one. The
        future resolves with ``version`` once it serves (or with the error that refused it).

        Raises:
            ValueError: ``version`` does not increase.
        """
        ...

    def load_adapter(
        self, name: str, version: int, adapter_dir: str | Path
    ) -> concurrent.futures.Future[int]:
        """Serve requests that name ``name`` (``SamplingParams.adapter``) with the PEFT LoRA
        adapter at ``adapter_dir`` on top of the policy, as ``version`` of that adapter (a
        user's adapter). Requests already running on an older version finish on it. The future
        resolves with ``version`` once new requests get it (or with the error that refused it:
        ``ValueError`` for a version that does not increase, ``EngineError`` where the engine
        serves no per-request adapters).
        """
        ...

    def unload_adapter(self, name: str) -> concurrent.futures.Future[None]:
        """Stop serving adapter ``name``: later requests naming it fail with ``EngineError``;
        requests running on it finish. Unknown names resolve at once."""
        ...

    def use_base_adapter(self, adapter_dir: str | Path) -> None:
        """Serve the base weights (version 0, ``base=True`` scoring) through a zero copy of the
        LoRA adapter at ``adapter_dir``; a no-op where :attr:`needs_base_adapter` is ``False``.

        Raises:
            EngineError: the adapter could not be loaded.
        """
        ...

    def close(self) -> None:
        """Stop serving: pending and running requests end with ``EngineClosedError``; later
        calls raise it. Idempotent."""
        ...


class InProcessFacts:
    """The :class:`Engine` facts every engine that holds its weights in this process shares
    (:class:`~clawrl.engine.TransformersEngine`, :class:`~clawrl.engine.scripted.ScriptedEngine`):
    available until closed (the subclass sets ``_closed``), the base weights served as they are."""

    _closed: bool

    @property
    def available(self) -> bool:
        """Whether the engine takes requests (until ``close``)."""
        return not self._closed

    needs_base_adapter = False
    """In-process weights: the base is served as is, no adapter needed."""

    def use_base_adapter(self, adapter_dir: str | Path) -> None:
        """Nothing to do: this engine serves the base weights themselves (see
        :attr:`Engine.needs_base_adapter`)."""
