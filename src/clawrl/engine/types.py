"""Engine-facing types: sampling parameters, completions, and the ``Engine`` protocol.

Everything here is in token ids; chat rendering lives in :mod:`clawrl.chat`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol, runtime_checkable


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
    """

    token_id: int
    logprob: float
    top_logprobs: list[tuple[int, float]] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    policy_version: int = 0


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


@runtime_checkable
class Engine(Protocol):
    """Token-level generation and scoring.

    Implementations: :class:`clawrl.engine.TransformersEngine` (in-process, default) and
    scripted engines in tests. All methods are safe to call concurrently from asyncio tasks.
    """

    max_context: int
    policy_version: int

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Completion:
        """Sample one completion for ``prompt_ids`` (shape ``[p]``).

        Raises:
            ContextLengthError: ``len(prompt_ids) >= max_context``.
            EngineError: generation failed.
        """
        ...

    def generate_stream(
        self, prompt_ids: Sequence[int], params: SamplingParams
    ) -> AsyncIterator[TokenEvent]:
        """Like :meth:`generate`, yielding each token as it is sampled; the last event carries
        ``finish_reason``. Closing the iterator early aborts the request."""
        ...

    async def score(
        self, prompt_ids: Sequence[int], target_ids: Sequence[int], *, temperature: float = 1.0
    ) -> list[float]:
        """Teacher-forced log-probs of ``target_ids`` (shape ``[t]``) after ``prompt_ids``, under
        the same temperature semantics as :meth:`generate`; returns shape ``[t]``."""
        ...

    def load_policy(self, version: int, weights: object) -> None:
        """Swap in new weights (a LoRA adapter dir / state dict, or full state dict) as
        ``version``; requests already running finish on the old version."""
        ...
