"""The trainer's process group: torchrun's ranks, or one process on its own.

``torchrun --nproc-per-node N -m clawrl.trainer ...`` (or ``clawrl train --nproc N``, which runs
torchrun) starts N ranks with ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and the rendezvous in
their environment; :func:`init_distributed` joins them into one process group (gloo on CPU,
NCCL on CUDA). Without torchrun it makes a group of one (an in-memory store), so the same
sharded trainer, checkpoints included, runs in a single process. No RPC of clawrl's own: rank 0
decides each batch and :func:`broadcast_object` hands it to the others.

:func:`process_group` holds the group for a ``with`` block and leaves it on every way out; leaving
normally, the ranks first meet in a barrier and this rank's gloo threads are stopped before the
interpreter exits (:func:`shutdown_distributed`).
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import gc
import os
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from clawrl.errors import ConfigError

IDLE_TIMEOUT = datetime.timedelta(hours=24)
"""How long a collective may wait (the other ranks wait in a broadcast while rank 0 polls the
store; rank 0 sends one every poll interval, so only a hung rank comes near it)."""


@dataclass(frozen=True)
class DistEnv:
    """This rank's place in the trainer's process group.

    Attributes:
        rank: 0 .. world_size - 1; rank 0 reads the store, writes it, and publishes.
        world_size: ranks in the group.
        local_rank: the rank on this node (which GPU it uses).
        device: this rank's torch device (``cpu``, or ``cuda:LOCAL_RANK``).
        backend: ``gloo`` (CPU) or ``nccl`` (CUDA).
    """

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that reads and writes the store."""
        return self.rank == 0


def launched_by_torchrun() -> bool:
    """Whether this process is one of torchrun's ranks (``RANK`` and ``WORLD_SIZE`` are set)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def die_with_parent() -> None:
    """Have the kernel kill this process when its parent (torchrun's agent) dies (Linux
    ``PR_SET_PDEATHSIG``; a no-op elsewhere).

    torchrun stops its ranks when one fails or when it is sent SIGTERM/SIGINT, but a ``kill -9``
    of torchrun itself would leave the ranks running: rank 0 would go on training from the store
    beside the trainer restarted after it. Exits at once when the parent is already gone.
    """
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_pdeathsig = 1
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the call
        os._exit(1)


def init_distributed(device: str = "cpu") -> DistEnv:
    """Join (or make) the process group; returns this rank's :class:`DistEnv`.

    Args:
        device: ``cpu`` (gloo), or ``cuda`` / ``cuda:N`` (NCCL; each rank takes
            ``cuda:LOCAL_RANK``).

    Raises:
        ConfigError: a CUDA device without CUDA, or a group already made in this process.
    """
    if dist.is_initialized():
        raise ConfigError("a torch.distributed process group already exists in this process")
    kind = torch.device(device).type
    if kind not in ("cpu", "cuda"):
        raise ConfigError(f"the trainer runs on cpu or cuda, not {device!r}")
    if kind == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {device!r}: this torch build sees no CUDA device")
    backend = "nccl" if kind == "cuda" else "gloo"
    if launched_by_torchrun():
        die_with_parent()
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local = int(os.environ.get("LOCAL_RANK", rank))
        dev = torch.device("cuda", local) if kind == "cuda" else torch.device("cpu")
        if kind == "cuda":
            torch.cuda.set_device(dev)
        dist.init_process_group(
            backend, timeout=IDLE_TIMEOUT, device_id=dev if kind == "cuda" else None
        )
    else:
        rank, world, local = 0, 1, 0
        dev = torch.device(device) if kind == "cuda" else torch.device("cpu")
        if kind == "cuda":
            torch.cuda.set_device(dev)
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1,
                                timeout=IDLE_TIMEOUT)  # fmt: skip
    return DistEnv(rank, world, local, dev, backend)


def shutdown_distributed(env: DistEnv | None = None) -> None:
    """Leave the process group (no-op when there is none).

    Args:
        env: this rank's place, given on the clean way out only, when every rank calls this
            after its last collective: the ranks first meet in a barrier (gloo's barrier also
            waits for every collective still in flight), so none closes its connections while a
            peer still needs them; then the group's backend is released at once, which stops its
            threads. Left out (an error path, where a peer may be gone or waiting in another
            collective, so a barrier or a join could hang), the group is only destroyed, and its
            threads end with the process.

    ``destroy_process_group`` alone only forgets the group: its backend, with gloo's two worker
    threads and its TCP loop thread, lives as long as anything refers to it, and the DeviceMesh
    that FSDP2 shards over refers to it, kept by DTensor's sharding caches (global) and by the
    trainer's FSDP modules. So without ``env`` every rank reaches interpreter teardown with
    gloo's threads running, the state in which a rank can die of SIGABRT ("terminate called
    without an active exception") instead of exiting.
    """
    if not dist.is_initialized():
        return
    clean = False
    try:
        if env is not None and env.world_size > 1:
            dist.barrier()  # raises when a peer left instead: the group is destroyed all the same
        clean = env is not None
    finally:
        groups = _groups()
        dist.destroy_process_group()
        if clean:
            _release(groups)


def _groups() -> list[dist.ProcessGroup]:
    """Every process group of this process (the default one and those made from it)."""
    world = getattr(dist.distributed_c10d, "_world", None)
    groups = list(getattr(world, "pg_map", None) or {})
    default = dist.group.WORLD
    if default is not None and not any(g is default for g in groups):
        groups.append(default)
    return groups


def _release(groups: list[dist.ProcessGroup]) -> None:
    """Drop the references that keep ``groups`` (destroyed) alive, then collect garbage: a
    backend nothing else holds is destroyed here (gloo's destructor joins its threads).

    The holders are torch's DeviceMesh (its ``_pg_registry``, used only by ``torch.compile``;
    eager code resolves a group by name) and FSDP2's mesh info (its ``*_process_group``
    attributes). Call only once every collective of ``groups`` has finished: the destructor
    waits for them.
    """
    ids = {id(g) for g in groups}
    holders = tuple(
        cls
        for module, name in (
            ("torch.distributed.device_mesh", "DeviceMesh"),
            ("torch.distributed.fsdp._fully_shard._fsdp_common", "DataParallelMeshInfo"),
        )
        if isinstance(cls := getattr(sys.modules.get(module), name, None), type)
    )
    if holders:
        for obj in gc.get_objects():
            if not issubclass(type(obj), holders):
                continue
            for attr, value in list(vars(obj).items()):
                if id(value) in ids:
                    setattr(obj, attr, None)
                elif isinstance(value, dict):
                    for key in [k for k, v in value.items() if id(v) in ids]:
                        del value[key]
    groups.clear()
    gc.collect()


@contextlib.contextmanager
def process_group(device: str = "cpu") -> Iterator[DistEnv]:
    """:func:`init_distributed` for a ``with`` block, left on every way out of it.

    Leaving normally is collective: the ranks meet in a barrier, and this rank's gloo threads
    are stopped before it goes on (``shutdown_distributed(env)``). Leaving by an exception, the
    group is destroyed without waiting for the others, and the exception goes on.

    Raises:
        ConfigError: see :func:`init_distributed`.
    """
    env = init_distributed(device)
    try:
        yield env
    except BaseException:
        shutdown_distributed()
        raise
    shutdown_distributed(env)


def broadcast_object(obj: Any, env: DistEnv) -> Any:
    """Rank 0's ``obj`` on every rank (pickled; a batch's samples, a command).

    Raises:
        RuntimeError: a rank left the group (torch.distributed's error: the job ends and a
            restart resumes from the last checkpoint).
    """
    if env.world_size == 1:
        return obj
    box = [obj if env.is_main else None]
    dist.broadcast_object_list(box, src=0, device=env.device if env.backend == "nccl" else None)
    return box[0]


def gather_objects(obj: Any, env: DistEnv) -> list[Any]:
    """Every rank's ``obj``, in rank order, on every rank."""
    if env.world_size == 1:
        return [obj]
    out: list[Any] = [None] * env.world_size
    dist.all_gather_object(out, obj)
    return out


def barrier(env: DistEnv) -> None:
    """Wait until every rank is here."""
    if env.world_size > 1:
        dist.barrier()
