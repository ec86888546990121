"""Judge backends: generative (local engine), choice scoring (local engine), OpenAI-compatible.

:func:`build_backend` maps a typed backend config (:mod:`clawrl.judge.config`) to a backend.
"""

from __future__ import annotations

from typing import Any

from clawrl.errors import JudgeError
from clawrl.judge.backends.base import JudgeBackend, failed_vote, vote_from_text
from clawrl.judge.backends.choice import ChoiceBackend, calibrated_verdict, normalise
from clawrl.judge.backends.generative import GenerativeBackend
from clawrl.judge.backends.openai import OpenAIBackend
from clawrl.judge.config import (
    BackendConfig,
    ChoiceJudgeConfig,
    GenerativeJudgeConfig,
    OpenAIJudgeConfig,
)


def build_backend(
    cfg: BackendConfig, *, engine: Any = None, tokenizer: Any = None, model: str = ""
) -> JudgeBackend:
    """Build the backend ``cfg`` describes.

    Args:
        cfg: the backend config.
        engine: the local engine (generative and choice only).
        tokenizer: the local judge model's tokenizer (generative and choice only).
        model: the local judge model's name, for the record.

    Raises:
        JudgeError: a local backend without an engine and tokenizer, or a missing API key.
    """
    match cfg:
        case OpenAIJudgeConfig():
            return OpenAIBackend(
                cfg.url,
                cfg.model,
                api_key_env=cfg.api_key_env,
                request_timeout_s=cfg.request_timeout_s,
                max_retries=cfg.max_retries,
                backoff_s=cfg.backoff_s,
                max_tokens=cfg.max_tokens,
                temperature=cfg.temperature,
                top_p=cfg.top_p,
                base_seed=cfg.seed,
            )
        case GenerativeJudgeConfig() | ChoiceJudgeConfig() if engine is None or tokenizer is None:
            raise JudgeError(f"the {cfg.kind} judge backend needs a local engine and tokenizer")
        case GenerativeJudgeConfig():
            return GenerativeBackend(
                engine,
                tokenizer,
                model=model,
                max_tokens=cfg.max_tokens,
                temperature=cfg.temperature,
                top_p=cfg.top_p,
                base_seed=cfg.seed,
            )
        case ChoiceJudgeConfig():
            return ChoiceBackend(
                engine, tokenizer, model=model, calibrate=cfg.calibrate, min_margin=cfg.min_margin
            )
    raise JudgeError(f"unknown judge backend config {cfg!r}")  # pragma: no cover


__all__ = [
    "ChoiceBackend",
    "GenerativeBackend",
    "JudgeBackend",
    "OpenAIBackend",
    "build_backend",
    "calibrated_verdict",
    "failed_vote",
    "normalise",
    "vote_from_text",
]
