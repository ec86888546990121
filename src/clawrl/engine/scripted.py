"""An engine whose completions are given, not sampled: :class:`ScriptedEngine`.

Its completions are fixed texts (or exact ids), tokenized with the real tokenizer plus EOS and
emitted token by token through the real chat, protocol and recording layers, so everything above
the engine runs as with a model. Harness mode's warm start replays recorded commands through a
harness with it (:mod:`clawrl.harness.warmstart`); tests use it where the answer must be
deterministic (tool calls, multi-turn sessions) and the tiny random model where only the
plumbing matters. ``tests/engine/test_engine_contract.py`` holds it to the :class:`Engine`
contract.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from clawrl.engine import Completion, EngineStats, FinishReason, SamplingParams, TokenEvent
from clawrl.engine.types import InProcessFacts
from clawrl.errors import ContextLengthError, EngineClosedError, EngineError
from clawrl.models import tokenizer_fingerprint

__all__ = ["Reply", "ScriptedEngine"]

Reply = str | list[int] | BaseException
"""A scripted reply: the completion text (sampled as its tokens + EOS), exact token ids (sampled
as given), or an exception to raise instead."""


class ScriptedEngine(InProcessFacts):
    """An :class:`clawrl.engine.Engine` whose completions are scripted texts.

    Each call takes the next reply from ``replies`` (then ``default_reply`` when they run out),
    or asks ``reply_fn(prompt_ids, params)``. A text reply is sampled as
    ``tokenizer.encode(text) + [EOS]`` with finish reason ``stop`` (a list of ids is sampled as
    given, e.g. a non-canonical tokenization); ``max_tokens`` cuts it
    (finish ``length``); a stop string ends it at the token completing it (finish ``stop``),
    like the real engine. An exception reply is raised (before any token). Log-probs are
    ``-0.01 * (1 + position % 10)`` nats, so they are distinguishable and exactly known.

    Args:
        tokenizer: the policy's tokenizer (real ids).
        replies: scripted replies, consumed in order.
        reply_fn: alternative to ``replies``: computes each reply from the prompt.
        default_reply: the reply once ``replies`` is exhausted.
        token_delay_s: sleep between streamed tokens (to test disconnects mid-stream).
        fail_after_tokens: streamed calls raise :class:`EngineError` after this many tokens.
        max_context: context window in tokens.

    Attributes:
        prompts: every prompt received, in order (the exact ids, for assertions).
        params: the sampling params of every call, in order.
    """

    def __init__(
        self,
        tokenizer: Any,
        replies: Sequence[Reply] = (),
        *,
        reply_fn: Callable[[list[int], SamplingParams], Reply] | None = None,
        default_reply: Reply = "OK.",
        token_delay_s: float = 0.0,
        fail_after_tokens: int | None = None,
        max_context: int = 8192,
        policy_version: int = 0,
    ) -> None:
        self.tokenizer = tokenizer
        self.replies: list[Reply] = list(replies)
        self.reply_fn = reply_fn
        self.default_reply = default_reply
        self.token_delay_s = token_delay_s
        self.fail_after_tokens = fail_after_tokens
        self.max_context = max_context
        self.policy_version = policy_version
        self.eos_token_ids = frozenset({int(tokenizer.eos_token_id)})
        self.tokenizer_id = tokenizer_fingerprint(tokenizer)
        self.stats = EngineStats()
        self.prompts: list[list[int]] = []
        self.params: list[SamplingParams] = []
        self.cancelled = 0
        self._lock = threading.Lock()
        self._closed = False
        self.adapters: dict[str, int] = {}  # name -> version (weights ignored, as the policy's)

    def _next_reply(self, prompt: list[int], params: SamplingParams) -> Reply:
        if self.reply_fn is not None:
            return self.reply_fn(prompt, params)
        with self._lock:
            return self.replies.pop(0) if self.replies else self.default_reply

    def script_ids(self, text: str) -> list[int]:
        """The ids a text reply is sampled as: its tokens followed by EOS."""
        return [*self.tokenizer.encode(text, add_special_tokens=False), self.tokenizer.eos_token_id]

    def _plan(
        self, prompt_ids: Sequence[int], params: SamplingParams
    ) -> tuple[list[int], FinishReason]:
        prompt = [int(i) for i in prompt_ids]
        if not prompt:
            raise EngineError("empty prompt: at least one token id is required")
        if len(prompt) >= self.max_context:
            raise ContextLengthError(len(prompt), self.max_context)
        if self._closed:
            raise EngineClosedError("engine is closed")
        if params.adapter is not None and params.adapter not in self.adapters:
            raise EngineError(f"no adapter named {params.adapter!r} is loaded")
        with self._lock:
            self.prompts.append(prompt)
            self.params.append(params)
            self.stats.requests += 1
            self.stats.prompt_tokens += len(prompt)
        reply = self._next_reply(prompt, params)
        if isinstance(reply, BaseException):
            raise reply
        ids = list(reply) if isinstance(reply, list) else self.script_ids(reply)
        budget = max(1, min(params.max_tokens, self.max_context - len(prompt)))
        for k in range(1, len(ids) + 1):
            text = self.tokenizer.decode(ids[:k], skip_special_tokens=False)
            if any(s and s in text for s in params.stop):
                return ids[:k], FinishReason.STOP
            if k >= budget and k < len(ids):
                return ids[:k], FinishReason.LENGTH
        return ids, FinishReason.STOP

    @staticmethod
    def logprob_at(position: int) -> float:
        """The scripted sampling log-prob of the token at ``position`` (nats)."""
        return -0.01 * (1 + position % 10)

    async def generate_stream(
        self, prompt_ids: Sequence[int], params: SamplingParams
    ) -> AsyncIterator[TokenEvent]:
        """Yield the scripted tokens one by one (``token_delay_s`` apart).

        Raises:
            ContextLengthError: the prompt does not fit.
            EngineError: an exception reply was scripted, or ``fail_after_tokens`` was reached.
        """
        ids, finish = self._plan(prompt_ids, params)
        version = self.policy_version
        adapter = None if params.adapter is None else self.adapters[params.adapter]
        done = False
        try:
            for k, token in enumerate(ids):
                if self.fail_after_tokens is not None and k >= self.fail_after_tokens:
                    raise EngineError(f"scripted failure after {k} tokens")
                if self.token_delay_s:
                    await asyncio.sleep(self.token_delay_s)
                last = k == len(ids) - 1
                tops = [(token, self.logprob_at(k))][: params.logprobs_top_k]
                if params.logprobs_top_k > 1:
                    tops += [(0, -20.0)] * (params.logprobs_top_k - 1)
                self.stats.generated_tokens += 1
                yield TokenEvent(
                    token, self.logprob_at(k), tops, finish if last else None, version, adapter
                )
            done = True
        finally:
            if not done:
                self.cancelled += 1

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Completion:
        """The whole scripted completion (no delay).

        Raises:
            ContextLengthError, EngineError: as :meth:`generate_stream`.
        """
        start = time.perf_counter()
        ids, finish = self._plan(prompt_ids, params)
        self.stats.generated_tokens += len(ids)
        tops = []
        if params.logprobs_top_k:
            tops = [[(t, self.logprob_at(k))] for k, t in enumerate(ids)]
        return Completion(
            token_ids=ids,
            logprobs=[self.logprob_at(k) for k in range(len(ids))],
            finish_reason=finish,
            policy_version=self.policy_version,
            prompt_tokens=len(prompt_ids),
            top_logprobs=tops,
            time_to_first_token=0.0,
            latency=time.perf_counter() - start,
            adapter_version=None if params.adapter is None else self.adapters[params.adapter],
        )

    async def score(
        self,
        prompt_ids: Sequence[int],
        target_ids: Sequence[int],
        *,
        temperature: float = 1.0,
        base: bool = False,
    ) -> list[float]:
        """Scripted log-probs of ``target_ids``: :meth:`logprob_at` by position (a scripted
        completion scores exactly as it was sampled)."""
        self._check_score(prompt_ids, target_ids)
        return [self.logprob_at(k) for k in range(len(target_ids))]

    async def score_batch(
        self,
        items: Sequence[tuple[Sequence[int], Sequence[int]]],
        *,
        temperature: float = 1.0,
        base: bool = False,
    ) -> list[list[float]]:
        """:meth:`score` of each pair."""
        return [await self.score(p, t, temperature=temperature, base=base) for p, t in items]

    async def score_next_batch(
        self,
        prompts: Sequence[Sequence[int]],
        candidates: Sequence[int],
        *,
        temperature: float = 1.0,
    ) -> list[list[float]]:
        """The first-position scripted log-prob for every candidate (no candidate is favoured)."""
        for p in prompts:
            self._check_score(p, [0])
        return [[self.logprob_at(0)] * len(candidates) for _ in prompts]

    def _check_score(self, prompt_ids: Sequence[int], target_ids: Sequence[int]) -> None:
        if self._closed:
            raise EngineClosedError("engine is closed")
        if not prompt_ids:
            raise EngineError("score needs a non-empty prompt")
        if len(prompt_ids) + len(target_ids) > self.max_context:
            raise ContextLengthError(len(prompt_ids) + len(target_ids), self.max_context)

    def load_policy(self, version: int, weights: object) -> concurrent.futures.Future[int]:
        """Adopt ``version`` at once (weights are ignored); returns a resolved future.

        Raises:
            ValueError: ``version`` does not increase.
        """
        if version <= self.policy_version:
            raise ValueError(f"policy versions only increase: {version} <= {self.policy_version}")
        self.policy_version = version
        fut: concurrent.futures.Future[int] = concurrent.futures.Future()
        fut.set_result(version)
        return fut

    def load_adapter(
        self, name: str, version: int, adapter_dir: object
    ) -> concurrent.futures.Future[int]:
        """Adopt ``version`` of adapter ``name`` at once (its weights are ignored, as the
        policy's); the future fails with ``ValueError`` for a version that does not increase."""
        fut: concurrent.futures.Future[int] = concurrent.futures.Future()
        current = self.adapters.get(name)
        if current is not None and version <= current:
            fut.set_exception(
                ValueError(f"adapter {name!r}: versions only increase ({version} <= {current})")
            )
            return fut
        self.adapters[name] = int(version)
        fut.set_result(int(version))
        return fut

    def unload_adapter(self, name: str) -> concurrent.futures.Future[None]:
        """Forget adapter ``name``."""
        self.adapters.pop(name, None)
        fut: concurrent.futures.Future[None] = concurrent.futures.Future()
        fut.set_result(None)
        return fut

    def close(self) -> None:
        """Refuse further requests."""
        self._closed = True
