"""The policy version a response carries, formatted and parsed in this one place.

A chat completion carries the version that generated it in ``system_fingerprint``
(``clawrl-policy-v3``: OpenAI's field for "which backend configuration answered", which clients
log and pass on); ``GET /v1/models`` and ``GET /healthz`` carry the version served now as the
field ``policy_version``. The gateway formats both with :func:`fingerprint` and
:func:`version_fields`; clients (the simulated users, ``clawrl eval``) read them back with
:func:`parse_fingerprint` and :func:`parse_version_fields`. Which versions exist is recorded
only in the store's ``policy_versions`` (:mod:`clawrl.store.versions`). Imports nothing of
clawrl.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

FINGERPRINT_PREFIX = "clawrl-policy-v"
"""``system_fingerprint`` = this prefix + the version number."""

VERSION_FIELD = "policy_version"
"""The JSON field of ``/v1/models`` entries and ``/healthz`` holding the version served."""


def fingerprint(version: int) -> str:
    """The ``system_fingerprint`` of ``version`` (``3`` -> ``"clawrl-policy-v3"``).

    Raises:
        ValueError: ``version`` is negative.
    """
    if version < 0:
        raise ValueError(f"policy versions are >= 0, got {version}")
    return f"{FINGERPRINT_PREFIX}{int(version)}"


def parse_fingerprint(value: Any) -> int | None:
    """The version in a ``system_fingerprint`` :func:`fingerprint` wrote; ``None`` for anything
    else (another server's fingerprint, a missing field)."""
    if isinstance(value, str) and value.startswith(FINGERPRINT_PREFIX):
        tail = value[len(FINGERPRINT_PREFIX) :]
        return int(tail) if tail.isascii() and tail.isdigit() else None
    return None


def version_fields(version: int) -> dict[str, int]:
    """The fields ``/v1/models`` entries and ``/healthz`` add for the version served."""
    return {VERSION_FIELD: int(version)}


def parse_version_fields(body: Mapping[str, Any]) -> int | None:
    """The version in a ``/v1/models`` entry or a ``/healthz`` body; ``None`` without one."""
    value = body.get(VERSION_FIELD)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
