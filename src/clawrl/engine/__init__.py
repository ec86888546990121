"""Token-level generation and scoring (DESIGN.md: ``clawrl.engine``).

``generate(prompt_ids, params)``, ``generate_stream``, ``score(prompt_ids, target_ids)`` and
``load_policy(version, weights)`` over token ids. The default backend is the in-process
:class:`TransformersEngine` with continuous batching.
"""

from clawrl.engine.sampling import processed_logprobs, sample_rows
from clawrl.engine.transformers_engine import EngineStats, TransformersEngine
from clawrl.engine.types import Completion, Engine, FinishReason, SamplingParams, TokenEvent

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
