"""Protocol-neutral chat types.

Every client protocol (OpenAI chat completions, OpenAI Responses, Anthropic Messages) is mapped
onto these types before rendering, and parsed completions are mapped back from them. They carry
only what changes the tokens the policy sees; ids are kept for the gateway but never rendered.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Role = Literal["system", "user", "assistant", "tool"]
"""Neutral roles. OpenAI ``developer`` maps to ``system``."""


class ToolCall(BaseModel):
    """One function call made by the assistant.

    Attributes:
        id: the call id as the client knows it (``call_…``); ``""`` when the client sent none.
            Never rendered into the prompt, so clients that rewrite ids change no tokens.
        name: the function name.
        arguments: the parsed JSON object of arguments (always an object, never a JSON string).
    """

    model_config = ConfigDict(frozen=True)

    id: str = ""
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class ChatMessage(BaseModel):
    """One message of a conversation, independent of the client protocol.

    Attributes:
        role: ``system``, ``user``, ``assistant`` or ``tool``.
        content: the message text; ``None`` when the message has no text (null, missing, ``""``
            or an empty list of parts all normalise to ``None``).
        reasoning: the assistant's reasoning text (``reasoning_content``), if any.
        tool_calls: the assistant's function calls (empty for every other role).
        tool_call_id: for ``tool`` messages, the id of the call this message answers.
        name: the function name of a ``tool`` message, or a participant name; never rendered.
    """

    model_config = ConfigDict(frozen=True)

    role: Role
    content: str | None = None
    reasoning: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None

    @model_validator(mode="after")
    def _assistant_only_fields(self) -> ChatMessage:
        if self.role != "assistant" and (self.tool_calls or self.reasoning is not None):
            raise ValueError(f"only assistant messages carry tool_calls/reasoning, not {self.role}")
        return self


class ToolSpec(BaseModel):
    """A function the policy may call.

    Attributes:
        name: the function name.
        description: what the function does (``""`` when the client gave none).
        parameters: the JSON schema of the arguments object.
    """

    model_config = ConfigDict(frozen=True)

    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})

    def openai_format(self) -> dict[str, Any]:
        """Return the tool in OpenAI's ``{"type": "function", "function": {...}}`` format."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


class ToolChoice(BaseModel):
    """Which tools the policy may or must call.

    Attributes:
        mode: ``auto`` (may call), ``none`` (tools are not offered), ``required`` (must call at
            least one) or ``function`` (must call the function ``name``).
        name: the function name; set exactly when ``mode == "function"``.
    """

    model_config = ConfigDict(frozen=True)

    mode: Literal["auto", "none", "required", "function"] = "auto"
    name: str | None = None

    @model_validator(mode="after")
    def _name_iff_function(self) -> ToolChoice:
        if (self.mode == "function") != (self.name is not None):
            raise ValueError("ToolChoice.name is set exactly when mode is 'function'")
        return self
