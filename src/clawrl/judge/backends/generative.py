"""Generative judging on a local engine: m sampled verdicts, run concurrently.

Each vote samples one answer to :data:`clawrl.judge.prompts.GENERATIVE_SYSTEM` +
:func:`clawrl.judge.prompts.generative_user_prompt`, rendered with the judge model's chat
template, at ``temperature`` / ``top_p`` with seed ``base_seed + index`` (so votes differ from
each other and a judgment is reproducible). The votes are submitted together; the engine's
continuous batching decodes them in one batch. Each output is read by
:mod:`clawrl.judge.parse` (designated last ``Score:`` line, ``<hint>`` tag).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from clawrl.chat import ChatMessage, render_prompt
from clawrl.errors import ClawrlError
from clawrl.judge.backends.base import failed_vote, vote_from_text
from clawrl.judge.prompts import GENERATIVE_SYSTEM, generative_user_prompt
from clawrl.judge.types import AbstainReason, BackendKind, JudgeInput, Vote

if TYPE_CHECKING:
    from clawrl.engine.types import Engine


class GenerativeBackend:
    """Sampled verdicts from a local :class:`clawrl.engine.Engine`.

    Args:
        engine: the engine running the judge model (the policy's engine or another one).
        tokenizer: the judge model's tokenizer (chat template and decoding).
        model: the judge model's name, for the record.
        max_tokens: most tokens per vote.
        temperature: sampling temperature of every vote (> 0, or all votes are equal).
        top_p: nucleus mass.
        base_seed: vote ``i`` samples with seed ``base_seed + i``.
    """

    kind = BackendKind.GENERATIVE
    batched = False
    writes_hints = True

    def __init__(
        self,
        engine: Engine,
        tokenizer: Any,
        *,
        model: str = "",
        max_tokens: int = 192,
        temperature: float = 0.8,
        top_p: float = 0.95,
        base_seed: int = 0,
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.model = model
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.top_p = top_p
        self.base_seed = base_seed

    def prompt_ids(self, inp: JudgeInput) -> list[int]:
        """The judge prompt of ``inp`` as token ids (chat template, generation prompt added)."""
        messages = [
            ChatMessage(role="system", content=GENERATIVE_SYSTEM),
            ChatMessage(role="user", content=generative_user_prompt(inp)),
        ]
        return render_prompt(self.tokenizer, messages).token_ids

    async def votes(self, inp: JudgeInput, indices: Sequence[int]) -> list[Vote]:
        """Sample the votes ``indices`` concurrently; see :class:`JudgeBackend`."""
        ids = self.prompt_ids(inp)
        return list(await asyncio.gather(*(self._vote(ids, i) for i in indices)))

    async def _vote(self, prompt_ids: list[int], index: int) -> Vote:
        # imported here so that importing clawrl.judge does not import torch
        from clawrl.engine.types import FinishReason, SamplingParams

        seed = self.base_seed + index
        params = SamplingParams(
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=seed,
        )
        start = time.perf_counter()
        try:
            completion = await self.engine.generate(prompt_ids, params)
        except ClawrlError as e:
            return failed_vote(index, AbstainReason.BACKEND_ERROR, f"engine: {e}", seed=seed)
        text = self.tokenizer.decode(completion.token_ids, skip_special_tokens=True)
        return vote_from_text(
            index,
            text,
            seed=seed,
            latency_s=time.perf_counter() - start,
            truncated=completion.finish_reason == FinishReason.LENGTH,
        )

    async def aclose(self) -> None:
        """Nothing to release: the engine belongs to the caller."""
