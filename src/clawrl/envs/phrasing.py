"""Deterministic choice among phrasings, so replies vary with a seed but never at random.

Every choice hashes its key parts with SHA-256 (stable across processes, unlike ``hash()``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def stable_int(*parts: object) -> int:
    """A non-negative integer determined by ``parts`` (joined by ``:``)."""
    digest = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "big")


def choose(options: Sequence[T], *parts: object) -> T:
    """One of ``options``, chosen by ``parts``.

    Raises:
        ValueError: ``options`` is empty.
    """
    if not options:
        raise ValueError("nothing to choose from")
    return options[stable_int(*parts) % len(options)]


def shuffled(items: Sequence[T], *parts: object) -> list[T]:
    """``items`` in an order determined by ``parts``."""
    return sorted(items, key=lambda x: stable_int(*parts, x))


def capitalize_first(text: str) -> str:
    """``text`` with its first letter upper-cased (the rest unchanged)."""
    for i, ch in enumerate(text):
        if ch.isalpha():
            return text[:i] + ch.upper() + text[i + 1 :]
    return text
