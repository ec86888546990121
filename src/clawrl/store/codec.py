"""Compact, exact encodings of token ids and log-probs, and the hashes the store indexes by.

Storage format (documented contract, also used for hashing):

- token ids: little-endian signed int32, 4 bytes per id, no header (``b""`` for none). Ids must
  lie in ``[-2**31, 2**31)``; anything else raises :class:`~clawrl.errors.StoreError`.
- log-probs: little-endian IEEE-754 float64, 8 bytes each: Python floats round-trip exactly
  (including ``-inf`` and NaN payloads).
- ``ids_digest(ids)``: sha256 hex of the int32 encoding, so equal digests mean equal ids up to
  a sha256 collision; callers that must be exact also compare the ids.
"""

from __future__ import annotations

import hashlib
import json
import sys
from array import array
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from clawrl.errors import StoreError

_BIG_ENDIAN = sys.byteorder == "big"
if array("i").itemsize != 4 or array("d").itemsize != 8:  # pragma: no cover - exotic platforms
    raise ImportError("clawrl.store needs a platform with 4-byte C int and 8-byte C double")


def encode_ids(ids: Sequence[int]) -> bytes:
    """Token ids ``[n]`` -> ``4n`` bytes (int32 little-endian).

    Raises:
        StoreError: an id is not an int in the int32 range.
    """
    try:
        arr = array("i", ids)
    except (OverflowError, TypeError) as exc:
        raise StoreError(f"token ids must be int32 integers: {exc}") from exc
    if _BIG_ENDIAN:  # pragma: no cover
        arr.byteswap()
    return arr.tobytes()


def decode_ids(data: bytes | None) -> list[int]:
    """Inverse of :func:`encode_ids`; ``None`` decodes to ``[]``."""
    if not data:
        return []
    if len(data) % 4:
        raise StoreError(f"corrupt token-id blob: {len(data)} bytes is not a multiple of 4")
    arr = array("i")
    arr.frombytes(data)
    if _BIG_ENDIAN:  # pragma: no cover
        arr.byteswap()
    return arr.tolist()


def encode_floats(values: Sequence[float]) -> bytes:
    """Log-probs ``[n]`` -> ``8n`` bytes (float64 little-endian), exact for Python floats.

    Raises:
        StoreError: a value is not a real number.
    """
    try:
        arr = array("d", values)
    except TypeError as exc:
        raise StoreError(f"log-probs must be floats: {exc}") from exc
    if _BIG_ENDIAN:  # pragma: no cover
        arr.byteswap()
    return arr.tobytes()


def decode_floats(data: bytes | None) -> list[float]:
    """Inverse of :func:`encode_floats`; ``None`` decodes to ``[]``."""
    if not data:
        return []
    if len(data) % 8:
        raise StoreError(f"corrupt log-prob blob: {len(data)} bytes is not a multiple of 8")
    arr = array("d")
    arr.frombytes(data)
    if _BIG_ENDIAN:  # pragma: no cover
        arr.byteswap()
    return arr.tolist()


def ids_digest(ids: Sequence[int]) -> str:
    """sha256 hex digest of ``encode_ids(ids)``."""
    return hashlib.sha256(encode_ids(ids)).hexdigest()


def prefix_digests(ids: Sequence[int], lengths: Iterable[int]) -> dict[int, str]:
    """Digests of ``ids[:m]`` for each ``m`` in ``lengths`` (those ``<= len(ids)``), in one pass.

    ``prefix_digests(ids, [m])[m] == ids_digest(ids[:m])``. Cost: one sha256 pass over
    ``ids`` plus one digest copy per length.
    """
    data = encode_ids(ids)
    hasher = hashlib.sha256()
    done = 0
    out: dict[int, str] = {}
    for m in sorted(set(lengths)):
        if m < 0 or m > len(ids):
            continue
        hasher.update(data[done * 4 : m * 4])
        done = m
        out[m] = hasher.copy().hexdigest()
    return out


def _canonical_arguments(args: Any) -> Any:
    if isinstance(args, str):
        try:
            return json.loads(args)
        except ValueError:
            return args
    return args


def _canonical_tool_call(call: Mapping[str, Any]) -> dict[str, Any]:
    fn = call.get("function")
    if isinstance(fn, Mapping):  # OpenAI chat shape {"type": "function", "function": {...}}
        name, args = fn.get("name"), fn.get("arguments")
    else:  # neutral {"name", "arguments"} or Anthropic tool_use {"name", "input"}
        name = call.get("name")
        args = call.get("arguments", call.get("input"))
    return {"name": name, "arguments": _canonical_arguments(args)}


def canonical_output(
    content: str | Sequence[Mapping[str, Any]] | None,
    tool_calls: Sequence[Mapping[str, Any]] | None,
) -> str:
    """Canonical JSON text of a parsed assistant output (what :func:`output_hash` hashes).

    Normalisation, chosen so an assistant message echoed back by a client hashes like the
    recorded output: ``content`` ``None`` and ``""`` are equal; a list of content parts is
    joined from its ``text`` fields; surrounding whitespace is stripped; reasoning is not
    included (clients often drop it); tool calls keep only ``name`` and ``arguments`` (ids are
    not echoed verbatim by every client), in order; string arguments are parsed as JSON when
    they are JSON (so whitespace and key order do not matter); keys are sorted.
    """
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    else:
        text = "".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))
    calls = [_canonical_tool_call(c) for c in (tool_calls or ())]
    return json.dumps(
        {"content": text.strip(), "tool_calls": calls},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )


def output_hash(
    content: str | Sequence[Mapping[str, Any]] | None,
    tool_calls: Sequence[Mapping[str, Any]] | None = None,
) -> str:
    """sha256 hex of :func:`canonical_output` (UTF-8). The gateway and the store both use this.

    Examples: ``output_hash("hi")``, ``output_hash(None, [{"name": "ls", "arguments": "{}"}])``.
    """
    return hashlib.sha256(canonical_output(content, tool_calls).encode("utf-8")).hexdigest()
