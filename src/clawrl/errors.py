"""Typed errors, one class per boundary.

Each boundary error maps once to an HTTP status (in the gateway) or to a recorded reason
(in the store / trainer). Catch these, not ``Exception``.
"""

from __future__ import annotations


class ClawrlError(Exception):
    """Base class of every error clawrl raises on purpose."""


class ConfigError(ClawrlError):
    """A configuration file or ``--set`` override is invalid (bad key, bad value, bad TOML)."""


class ModelLoadError(ClawrlError):
    """A model spec could not be resolved or loaded (missing package, bad path, no network)."""


class ClientInputError(ClawrlError):
    """The client sent something wrong; the gateway answers 4xx in the client's error shape.

    Attributes:
        status: HTTP status code to answer with (400 by default).
        param: name of the offending request field, when known (e.g. ``messages[3].tool_calls``).
        code: a short machine-readable code (e.g. ``context_length_exceeded``).
    """

    def __init__(
        self, message: str, *, status: int = 400, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.code = code


class ContextLengthError(ClientInputError):
    """A prompt does not fit the policy's context window.

    Attributes:
        prompt_tokens: length of the prompt in tokens.
        max_context: the model's context window in tokens.
    """

    def __init__(self, prompt_tokens: int, max_context: int) -> None:
        super().__init__(
            f"prompt is too long: {prompt_tokens} tokens > {max_context} maximum context length "
            f"(the prompt must leave at least 1 token for the completion)",
            code="context_length_exceeded",
            param="messages",
        )
        self.prompt_tokens = prompt_tokens
        self.max_context = max_context


class MaxTokensBeyondContextError(ContextLengthError):
    """A request's prompt fits, but not with the completion budget it asked for: OpenAI's and
    Anthropic's APIs answer 400 before generating (a 100,000-token budget would otherwise run
    until the request timeout on a small model).

    Attributes:
        prompt_tokens, max_context: as :class:`ContextLengthError`.
        max_tokens: the budget the client asked for.
    """

    def __init__(self, prompt_tokens: int, max_tokens: int, max_context: int, param: str) -> None:
        ClientInputError.__init__(
            self,
            f"This model's maximum context length is {max_context} tokens. However, you "
            f"requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, "
            f"{max_tokens} in the completion). Please reduce the length of the messages or "
            f"`{param}` (or start clawrl with --set sampling.max_tokens_beyond_context=clamp "
            "to generate what fits)",
            code="context_length_exceeded",
            param=param,
        )
        self.prompt_tokens = prompt_tokens
        self.max_context = max_context
        self.max_tokens = max_tokens


class EngineError(ClawrlError):
    """Generation or scoring failed inside the engine (not the client's fault): HTTP 500/503."""


class EngineClosedError(EngineError):
    """The engine has been shut down and takes no more requests."""


class EngineUnavailableError(EngineError):
    """No engine replica could serve the request, or the one serving it died (HTTP 503: the
    client may retry; the turn is recorded incomplete)."""


class StoreError(ClawrlError):
    """The trajectory store could not read or write a record."""


class JudgeError(ClawrlError):
    """The PRM judge backend failed (timeout, bad endpoint); recorded on the turn, never a crash."""


class TrainerError(ClawrlError):
    """Training could not proceed (e.g. adapter keys do not match the model)."""


class EvaluationError(ClawrlError):
    """An evaluation could not score what it was asked to: the policy's calls failed. A failed
    answer is never scored (as 0 or otherwise); the run stops with this error instead."""


class HarnessError(ClawrlError):
    """An agent harness could not be started or failed inside its sandbox."""


class VerifierError(ClawrlError):
    """A task's verifier crashed or printed no valid JSON; never counted as reward 0."""
