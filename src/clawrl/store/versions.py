"""Published policy versions: how gateway replicas learn what the trainer published.

One process trains (``clawrl serve --method ...``, or ``clawrl train``); after each step it
saves the new weights (a LoRA adapter directory under its output directory) and records the
version here. Every gateway replica polls :meth:`PolicyVersions.latest_policy_version` and loads
a newer version into its engine (:mod:`clawrl.gateway.versions`). The store is the only channel:
no RPC between processes. The weights must be readable by every replica at the recorded path
(one machine, or a shared filesystem).
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from clawrl.errors import StoreError
from clawrl.store.db import Conn, StoreConflict


class WeightsKind(StrEnum):
    """What a published version's ``weights`` path holds."""

    LORA = "lora"  # a PEFT adapter directory (adapter_config.json + weights)
    FULL = "full"  # a directory holding FULL_WEIGHTS_FILE (clawrl train), or ``weights`` None:
    # kept in the process of the in-process trainer (clawrl serve --method ...) only


FULL_WEIGHTS_FILE = "model.safetensors"
"""The file of a full fine-tuning version inside its published directory (safetensors)."""


@dataclass
class PolicyVersionRecord:
    """One published policy version.

    Attributes:
        version: the policy version (1, 2, ...; 0 is the base weights, never recorded).
        weights_kind: :class:`WeightsKind`.
        weights: absolute path of the weights replicas load: a LoRA adapter directory, or a
            directory holding :data:`FULL_WEIGHTS_FILE` (``None``: not loadable by another
            process).
        step: the training step that produced it.
        created_at: seconds since the epoch.
    """

    version: int
    weights_kind: WeightsKind
    weights: str | None = None
    step: int | None = None
    created_at: float = field(default_factory=time.time)


class _HasConnections(Protocol):
    def _write(self) -> AbstractContextManager[Conn]: ...
    def _read(self) -> AbstractContextManager[Conn]: ...


def _record(r: Any) -> PolicyVersionRecord:
    return PolicyVersionRecord(
        version=int(r["version"]),
        weights_kind=WeightsKind(r["weights_kind"]),
        weights=r["weights"],
        step=None if r["step"] is None else int(r["step"]),
        created_at=float(r["created_at"]),
    )


class PolicyVersions:
    """Mixin for :class:`clawrl.store.Store`: the ``policy_versions`` table."""

    def publish_policy_version(self: _HasConnections, record: PolicyVersionRecord) -> None:
        """Record a published version (durable on return); publishing the same version with
        the same weights again does nothing (a trainer that resumed from its checkpoint).

        Raises:
            StoreError: the version is not above every recorded one (two trainers on one
                store, or a trainer restarted without its checkpoints), or it is < 1.
        """
        if int(record.version) < 1:
            raise StoreError(f"policy versions start at 1, got {record.version}")
        with self._write() as conn:
            row = conn.execute("SELECT MAX(version) FROM policy_versions").fetchone()
            latest = int(row[0] or 0)
            if record.version <= latest:
                same = conn.execute(
                    "SELECT weights FROM policy_versions WHERE version = ?", (int(record.version),)
                ).fetchone()
                if same is not None and same[0] == record.weights:
                    return  # published already (a trainer resumed from its checkpoint)
                raise StoreError(
                    f"policy version {record.version} is not newer than the store's latest "
                    f"({latest}): is another trainer publishing to this store?"
                )
            try:
                conn.execute(
                    "INSERT INTO policy_versions (version, weights, weights_kind, step, "
                    "created_at) VALUES (?, ?, ?, ?, ?)",
                    (int(record.version), record.weights, str(WeightsKind(record.weights_kind)),
                     record.step, float(record.created_at)),
                )  # fmt: skip
            except StoreConflict as exc:
                raise StoreError(f"policy version {record.version} was published already") from exc

    def latest_policy_version(self: _HasConnections) -> PolicyVersionRecord | None:
        """The newest published version, or ``None`` before the first."""
        with self._read() as conn:
            r = conn.execute(
                "SELECT * FROM policy_versions ORDER BY version DESC LIMIT 1"
            ).fetchone()
        return None if r is None else _record(r)

    def policy_versions(self: _HasConnections) -> list[PolicyVersionRecord]:
        """Every published version, oldest first."""
        with self._read() as conn:
            rows = conn.execute("SELECT * FROM policy_versions ORDER BY version").fetchall()
        return [_record(r) for r in rows]
