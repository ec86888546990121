"""What every engine backend checks or derives the same way: the same errors for the same bad
input, and the same stop ids, whichever engine serves (the contract suite relies on it)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from clawrl.errors import ContextLengthError, EngineError


def prompt_ids(prompt: Sequence[int], max_context: int) -> list[int]:
    """``prompt`` as ints, with room for at least one new token.

    Raises:
        EngineError: the prompt is empty.
        ContextLengthError: ``len(prompt) >= max_context``.
    """
    ids = [int(i) for i in prompt]
    if not ids:
        raise EngineError("empty prompt: at least one token id is required")
    if len(ids) >= max_context:
        raise ContextLengthError(len(ids), max_context)
    return ids


def score_items(
    items: Sequence[tuple[Sequence[int], Sequence[int]]], max_context: int
) -> list[tuple[list[int], list[int]]]:
    """``(prompt_ids, target_ids)`` pairs as ints, each fitting the context window.

    Raises:
        EngineError: a prompt is empty.
        ContextLengthError: a prompt plus its target is longer than ``max_context``.
    """
    out = []
    for p, t in items:
        prompt, target = [int(i) for i in p], [int(i) for i in t]
        if not prompt:
            raise EngineError("score needs a non-empty prompt")
        if len(prompt) + len(target) > max_context:
            raise ContextLengthError(len(prompt) + len(target), max_context)
        out.append((prompt, target))
    return out


def next_token_prompts(prompts: Sequence[Sequence[int]], max_context: int) -> list[list[int]]:
    """Prompts for next-token scoring as ints, each leaving room for one token.

    Raises:
        EngineError: a prompt is empty.
        ContextLengthError: a prompt does not fit with one more token.
    """
    out = []
    for p in prompts:
        ids = [int(i) for i in p]
        if not ids:
            raise EngineError("score_next_batch needs non-empty prompts")
        if len(ids) + 1 > max_context:
            raise ContextLengthError(len(ids) + 1, max_context)
        out.append(ids)
    return out


def policy_eos_ids(policy: Any) -> frozenset[int]:
    """The ids that end a completion for ``policy``: ``policy.stop_ids`` when the loader set
    them (:func:`clawrl.models.stops.stop_ids`: EOS, the generation config's, the chat
    template's end-of-turn tokens, ``model.stop_ids``), else derived the same way from its
    tokenizer and model. Every backend must declare them all (vLLM is sent the ones it does not
    stop on by itself)."""
    declared = getattr(policy, "stop_ids", None)
    if declared:
        return frozenset(int(i) for i in declared)
    from clawrl.models.stops import stop_ids

    return stop_ids(policy.tokenizer, policy.model)
