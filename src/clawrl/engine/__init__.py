"""Token-level generation and scoring: the `Engine` contract and its backends.

``generate(prompt_ids, params)``, ``generate_stream``, ``score(prompt_ids, target_ids)``,
``score_batch``, ``score_next_batch``, ``load_policy(version, weights)`` and ``close`` over token
ids, with ``max_context``, ``policy_version``, ``eos_token_ids``, ``tokenizer_id`` and ``stats``:
the whole :class:`Engine` contract. The default backend is the in-process
:class:`TransformersEngine` with continuous batching.
"""

from clawrl.engine.sampling import processed_logprobs, sample_rows
from clawrl.engine.transformers_engine import TransformersEngine
from clawrl.engine.types import (
    Completion,
    Engine,
    EngineStats,
    FinishReason,
    SamplingParams,
    TokenEvent,
)

__all__ = [
    "Completion",
    "Engine",
    "EngineStats",
    "FinishReason",
    "SamplingParams",
    "TokenEvent",
    "TransformersEngine",
    "processed_logprobs",
    "sample_rows",
]
