"""Judge settings: pydantic models with bounds, importable without torch.

The backend is picked by a discriminated union on ``kind`` (``head`` | ``choice`` |
``generative`` | ``openai``); see :func:`clawrl.judge.backends.build_backend`.
"""

from __future__ import annotations

from typing import Annotated, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class GenerativeJudgeConfig(_Section):
    """Sampled verdicts from a local engine."""

    kind: Literal["generative"] = "generative"
    max_tokens: int = Field(default=192, ge=8, le=4096, description="Most tokens per vote.")
    temperature: float = Field(
        default=0.8, gt=0.0, le=2.0, description="Sampling temperature of every vote (> 0)."
    )
    top_p: float = Field(default=0.95, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    seed: int = Field(default=0, ge=0, description="Vote i samples with seed + i.")


class HeadJudgeConfig(_Section):
    """Trained probes on the local judge model's hidden states (:mod:`clawrl.judge.head`)."""

    kind: Literal["head"] = "head"
    path: str | None = Field(
        default=None,
        description="A head set written by `clawrl judge train`; None: the one shipped for "
        "the embedded SmolLM2-135M.",
    )
    min_confidence: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description="A vote abstains below this top probability; None: the head set's own.",
    )
    hints: Literal["bad-or-gate", "gate"] = Field(
        default="bad-or-gate",
        description="Which votes look for a hint in the next state: 'bad-or-gate' (a vote that "
        "scores -1, reading the reply as a correction, or whose trained hint gate fires) or "
        "'gate' (only votes whose gate fires, every reply read as a correction: the rule before "
        "2026-12-07). Measured in README, 'The judge'.",
    )


class ChoiceJudgeConfig(_Section):
    """Calibrated choice scoring on a local engine (for small models)."""

    kind: Literal["choice"] = "choice"
    calibrate: bool = Field(
        default=True, description="Subtract the content-free ('N/A' next state) log-probs."
    )
    min_margin: float = Field(
        default=0.0, ge=0.0, description="Abstain when the best verdict wins by less (nats)."
    )


class OpenAIJudgeConfig(_Section):
    """Any OpenAI-compatible chat-completions endpoint."""

    kind: Literal["openai"] = "openai"
    url: str = Field(min_length=1, description="API base, e.g. http://127.0.0.1:8000/v1.")
    model: str = Field(min_length=1, description="The request's model field.")
    api_key_env: str | None = Field(
        default=None, description="Environment variable holding the API key (None: send no key)."
    )
    request_timeout_s: float = Field(
        default=30.0, gt=0.0, le=3600.0, description="Timeout of one HTTP request (seconds)."
    )
    max_retries: int = Field(default=2, ge=0, le=10, description="Retries after the first attempt.")
    backoff_s: float = Field(
        default=0.5, ge=0.0, le=60.0, description="First retry delay, doubled."
    )
    max_tokens: int = Field(default=256, ge=8, le=32768, description="max_tokens of each request.")
    temperature: float = Field(default=0.8, gt=0.0, le=2.0, description="Sampling temperature.")
    top_p: float = Field(default=0.95, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    seed: int = Field(default=0, ge=0, description="Vote i sends seed + i.")


BackendConfig = Annotated[
    HeadJudgeConfig | GenerativeJudgeConfig | ChoiceJudgeConfig | OpenAIJudgeConfig,
    Field(discriminator="kind"),
]


JUDGE_BACKEND_KINDS: tuple[str, ...] = tuple(
    m.model_fields["kind"].default for m in get_args(get_args(BackendConfig)[0])
)
"""The ``kind`` tags of :data:`BackendConfig` (head, generative, choice, openai)."""


def _default_backend() -> BackendConfig:
    return HeadJudgeConfig()


class JudgeConfig(_Section):
    """The PRM judge."""

    backend: BackendConfig = Field(
        default_factory=_default_backend,
        description="Which backend produces the votes (a table without kind is the default, head).",
    )
    model: str | None = Field(
        default=None, description="Local judge model spec; None: the policy's base weights."
    )
    vllm_urls: list[str] = Field(
        default_factory=list,
        description="vLLM servers that serve the judge model (a local choice or generative "
        "judge); empty: the judge runs in-process. May be the policy's own servers when the "
        "judge is the policy's base model.",
    )
    votes: int = Field(default=5, ge=1, le=32, description="Independent votes per judgment (m).")
    timeout_s: float = Field(
        default=60.0, gt=0.0, le=3600.0, description="Wall-clock limit of one judgment (seconds)."
    )

    @field_validator("backend", mode="before")
    @classmethod
    def _default_kind(cls, value: object) -> object:
        """A backend table without ``kind`` is the default backend's (``--set
        judge.backend.hints=gate`` changes the head judge's setting)."""
        if isinstance(value, dict) and "kind" not in value:
            if set(value) <= set(HeadJudgeConfig.model_fields):
                return {"kind": "head", **value}
            raise ValueError(
                f"a judge backend table without kind is the head judge's, which has no "
                f"{', '.join(sorted(set(value) - set(HeadJudgeConfig.model_fields)))}; name the "
                f'backend: judge.backend = {{ kind = "...", ... }} '
                f"({', '.join(JUDGE_BACKEND_KINDS)})"
            )
        return value

    hint_quorum: float = Field(
        default=0.5, ge=0.0, le=1.0, description="Fraction of valid votes that must carry a hint."
    )
