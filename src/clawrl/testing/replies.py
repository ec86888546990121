"""Scripted replies for driving a real agent harness through a :class:`ScriptedEngine`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from clawrl.engine import SamplingParams

__all__ = ["harness_reply", "tool_call_text"]


def tool_call_text(name: str, arguments: dict[str, Any], content: str | None = None) -> str:
    """The exact text the policy writes for one tool call (what history renders back)."""
    from clawrl.chat import ChatMessage, ToolCall, assistant_message_text

    msg = ChatMessage(
        role="assistant", content=content, tool_calls=[ToolCall(name=name, arguments=arguments)]
    )
    return assistant_message_text(msg)


def harness_reply(
    tokenizer: Any, call: str, final: str, task_marker: str
) -> Callable[[list[int], SamplingParams], str]:
    """A :class:`clawrl.engine.scripted.ScriptedEngine` ``reply_fn`` for driving a real agent harness by the prompt.

    The answer depends only on the rendered prompt, so the order of a harness's side calls does
    not matter: no tools offered (a title request, ...) -> ``"OK."``; the last user turn holds a
    tool result -> ``final``; it holds ``task_marker`` (the task) -> ``call``; else ``"OK."``.
    """

    def reply(prompt_ids: list[int], params: SamplingParams) -> str:
        text = tokenizer.decode(prompt_ids, skip_special_tokens=False)
        last_user = text.rsplit("<|im_start|>user", 1)[-1]
        if "<tools>" not in text:
            return "OK."
        if "<tool_response>" in last_user:
            return final
        if task_marker in last_user:
            return call
        return "OK."

    return reply
