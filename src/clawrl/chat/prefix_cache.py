"""What rendering a conversation's prefixes costs, paid once per prefix instead of once per call.

:func:`clawrl.chat.render_prompt` finds each message's token span by rendering every prefix
``messages[:k]`` of the conversation and tokenizing the text between the boundaries. An agent
sends the same conversation again with one or two new messages on every call, so on call n this
is n renders of ever longer prefixes: quadratic in the session (about 100 ms per call at 40 calls
and 14k tokens on 2 CPU cores). Both results depend only on what is rendered, so they are
remembered across calls, keyed by content:

* a prefix render by the sha1 chain over the render context (template, tools, system extras)
  and the prefix's messages (JSON): its text's length and sha1 (the text itself would make the
  memory quadratic; the caller checks ``text.startswith(prefix)`` by comparing digests);
* a segment's tokenization by the sha1 of the tokenizer's key and its text.

Both are bounded LRUs (:data:`PREFIXES`, :data:`SEGMENTS`), thread-safe.
"""

from __future__ import annotations

import hashlib
import json
import uuid
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from clawrl.chat.types import ChatMessage
from clawrl.lru import LRU

PREFIXES: LRU[tuple[int, bytes]] = LRU(65536)
"""prefix key -> (length of the rendered prefix in characters, sha1 of its UTF-8 text); length
-1 when the template rejected the prefix."""
SEGMENTS: LRU[tuple[int, ...]] = LRU(8192)
"""sha1 of (tokenizer key, a text segment) -> its token ids."""


def context_key(*parts: Any) -> bytes:
    """sha1 of everything besides the messages that a render depends on (JSON of ``parts``)."""
    data = json.dumps(parts, sort_keys=True, default=str, ensure_ascii=False)
    return hashlib.sha1(data.encode("utf-8", "surrogatepass")).digest()


def prefix_keys(context: bytes, messages: Sequence[ChatMessage]) -> list[bytes]:
    """``keys[k - 1]`` identifies the render of ``messages[:k]`` in ``context``: a sha1 chain,
    one message's JSON at a time (linear in the conversation)."""
    keys, key = [], context
    for m in messages:
        key = hashlib.sha1(key + m.model_dump_json().encode("utf-8", "surrogatepass")).digest()
        keys.append(key)
    return keys


def prefix_renders(
    render: Callable[[Sequence[ChatMessage]], str],
    messages: Sequence[ChatMessage],
    context: bytes,
    rejected: type[Exception] | tuple[type[Exception], ...],
) -> list[tuple[int, bytes]]:
    """``(length, sha1)`` of ``render(messages[:k])`` for k = 1..n (length -1: ``rejected`` was
    raised), rendering only the prefixes not remembered."""
    out = []
    for k, key in enumerate(prefix_keys(context, messages), start=1):
        entry = PREFIXES.get(key)
        if entry is None:
            try:
                text = render(messages[:k])
                entry = (len(text), hashlib.sha1(text.encode("utf-8", "surrogatepass")).digest())
            except rejected:
                entry = (-1, b"")
            PREFIXES.put(key, entry)
        out.append(entry)
    return out


def text_prefix_digests(text: str, lengths: Sequence[int]) -> dict[int, bytes]:
    """sha1 of ``text[:n]`` (UTF-8) for each ``n`` in ``lengths`` within the text, in one pass."""
    hasher = hashlib.sha1()
    done = 0
    out: dict[int, bytes] = {}
    for n in sorted(set(lengths)):
        if 0 <= n <= len(text):
            hasher.update(text[done:n].encode("utf-8", "surrogatepass"))
            done = n
            out[n] = hasher.copy().digest()
    return out


_TOKENIZER_KEYS: weakref.WeakKeyDictionary[Any, bytes] = weakref.WeakKeyDictionary()


def tokenizer_key(tokenizer: Any) -> bytes:
    """A key unique to this tokenizer object for as long as it lives (tokenizations are
    remembered per tokenizer: two tokenizers split one text differently)."""
    try:
        return _TOKENIZER_KEYS.setdefault(tokenizer, uuid.uuid4().bytes)
    except TypeError:  # not weak-referenceable: nothing is shared
        return uuid.uuid4().bytes


def encode_segments(
    segments: Sequence[str],
    encode_many: Callable[[list[str]], list[list[int]]],
    namespace: bytes,
) -> list[list[int]]:
    """Token ids of each segment, tokenizing only those not remembered under ``namespace``
    (:func:`tokenizer_key`) in one batch."""
    keys = [hashlib.sha1(namespace + s.encode("utf-8", "surrogatepass")).digest() for s in segments]
    found: list[tuple[int, ...] | None] = [SEGMENTS.get(k) for k in keys]
    missing = [i for i, f in enumerate(found) if f is None]
    if missing:
        for i, ids in zip(missing, encode_many([segments[i] for i in missing]), strict=True):
            found[i] = tuple(ids)
            SEGMENTS.put(keys[i], found[i])  # type: ignore[arg-type]
    return [list(f or ()) for f in found]
