"""A tokenizer's identity: a hash of its vocabulary and special tokens.

Two components that exchange token ids (the gateway that renders prompts, the engine that
samples, a judge engine, a remote vLLM server) must agree on what each id means. Comparing
:func:`tokenizer_fingerprint` values catches a mismatch before a single id is trusted.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import weakref
from typing import Any

_CACHE: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """``sha256:<16 hex>`` of the vocabulary (``token -> id``, sorted), the added tokens and the
    EOS / BOS / PAD ids; equal for the same tokenizer loaded twice.

    Args:
        tokenizer: a Hugging Face tokenizer (anything with ``get_vocab()``).

    Computed once per tokenizer object (about 0.15 s for a 49k vocabulary), then cached.

    Raises:
        TypeError: ``tokenizer`` has no ``get_vocab``.
    """
    try:
        return _CACHE[tokenizer]
    except (KeyError, TypeError):
        pass
    value = _fingerprint(tokenizer)
    with contextlib.suppress(TypeError):  # not weak-referenceable: computed each time
        _CACHE[tokenizer] = value
    return value


def _fingerprint(tokenizer: Any) -> str:
    vocab = tokenizer.get_vocab()
    specials = {
        name: getattr(tokenizer, name, None)
        for name in ("eos_token_id", "bos_token_id", "pad_token_id")
    }
    payload = json.dumps([sorted(vocab.items()), specials], ensure_ascii=False)
    return "sha256:" + hashlib.sha256(payload.encode("utf-8")).hexdigest()[:16]
