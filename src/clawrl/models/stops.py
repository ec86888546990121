"""Which token ids end a completion, read from the model rather than assumed.

A chat model ends its turn with the token its chat template puts after an assistant message:
``<|im_end|>`` (ChatML, SmolLM2, Qwen), ``<end_of_turn>`` (Gemma), ``<|eot_id|>`` (Llama 3),
``<|end|>`` (Phi-3). That token is often *not* the tokenizer's EOS (Gemma's EOS is ``<eos>``), so
an engine that stops only on EOS runs past the end of the answer. :func:`stop_ids` unites:

1. the tokenizer's EOS id;
2. the generation config's ``eos_token_id`` (an int or a list);
3. the template's end-of-turn ids (:func:`template_end_of_turn_ids`, from the markers
   :func:`clawrl.chat.template_stop_markers` finds by rendering probe conversations);
4. ``extra`` (the ``model.stop_ids`` setting): ids, or token strings looked up in the vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from clawrl.errors import ModelLoadError


def template_end_of_turn_ids(tokenizer: Any) -> list[int]:
    """The ids of the texts the chat template writes to end an assistant turn
    (:func:`clawrl.chat.template_stop_markers`: the end-of-turn token after an answer, the one
    after a tool call such as ``<|eom_id|>`` or ``<|call|>``, and EOS), each that is a single
    token of this tokenizer. ``[]`` when the tokenizer has no chat template."""
    from clawrl.chat import end_of_turn_ids

    return list(end_of_turn_ids(tokenizer))


def _extra_ids(tokenizer: Any, extra: Sequence[int | str]) -> set[int]:
    vocab_size = len(tokenizer)
    out: set[int] = set()
    for item in extra:
        if isinstance(item, int) or (isinstance(item, str) and item.isdigit()):
            tid = int(item)
            if not 0 <= tid < vocab_size:
                raise ModelLoadError(
                    f"stop id {tid} is outside the vocabulary (0..{vocab_size - 1})"
                )
            out.add(tid)
            continue
        ids = tokenizer.encode(item, add_special_tokens=False)
        if len(ids) != 1:
            raise ModelLoadError(
                f"stop token {item!r} is not one token of this tokenizer (it encodes to {ids}); "
                "give a single token or its id"
            )
        out.add(int(ids[0]))
    return out


def stop_ids(
    tokenizer: Any, model: Any = None, *, extra: Sequence[int | str] = ()
) -> frozenset[int]:
    """All ids that end a completion (see the module docstring).

    Args:
        tokenizer: a Hugging Face tokenizer.
        model: the causal LM (its ``generation_config``), or ``None``.
        extra: more stop ids or single-token strings (``model.stop_ids``).

    Raises:
        ModelLoadError: an ``extra`` entry is not a token of this tokenizer.
    """
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(gen_eos, int):
        ids.add(gen_eos)
    elif isinstance(gen_eos, list):
        ids.update(int(i) for i in gen_eos if i is not None)
    ids.update(template_end_of_turn_ids(tokenizer))
    ids |= _extra_ids(tokenizer, extra)
    return frozenset(ids)
