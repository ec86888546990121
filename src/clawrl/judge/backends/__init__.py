"""Judge backends: trained head (local model, default), choice scoring and generative (local
engine), OpenAI-compatible endpoint.

:func:`build_backend` maps a typed backend config (:mod:`clawrl.config.judge`) to a backend.
"""

from __future__ import annotations

from typing import Any

from clawrl.config.judge import (
    BackendConfig,
    ChoiceJudgeConfig,
    GenerativeJudgeConfig,
    HeadJudgeConfig,
    OpenAIJudgeConfig,
)
from clawrl.errors import JudgeError
from clawrl.judge.backends.base import JudgeBackend, failed_vote, vote_from_text
from clawrl.judge.backends.choice import ChoiceBackend, calibrated_verdict, normalise
from clawrl.judge.backends.generative import GenerativeBackend
from clawrl.judge.backends.openai import OpenAIBackend


def build_backend(
    cfg: BackendConfig,
    *,
    engine: Any = None,
    tokenizer: Any = None,
    model: str = "",
    judge_model: Any = None,
) -> JudgeBackend:
    """Build the backend ``cfg`` describes.

    Args:
        cfg: the backend config.
        engine: the local engine (generative and choice only).
        tokenizer: the local judge model's tokenizer (head, generative and choice).
        model: the local judge model's name, for the record.
        judge_model: the local judge model itself (head only: its hidden states are read).

    Raises:
        JudgeError: a local backend without what it needs, a missing API key, or a head set
            trained for another judge model.
    """
    match cfg:
        case HeadJudgeConfig():
            if judge_model is None or tokenizer is None:
                raise JudgeError("the head judge backend needs the judge model and tokenizer")
            from clawrl.judge.backends.head import HeadBackend

            return HeadBackend(
                judge_model, tokenizer, head=cfg.path, model_name=model,
                min_confidence=cfg.min_confidence, hints=cfg.hints,
            )  # fmt: skip
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
