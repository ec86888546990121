"""Many LoRA adapters in one forward pass: each row of a batch served with its own adapter.

Per-user adapters (one LoRA per user on top of the served policy) must not serialise users one
after another, and must not merge into the shared weights (:mod:`clawrl.engine.lora` merges the
one policy version). So, as multi-tenant LoRA servers do (Punica, Chen et al. 2023, "Punica:
Multi-Tenant LoRA Serving"; S-LoRA, Sheng et al. 2023), the adapters stay unmerged and each
linear layer an adapter touches gets a forward hook that adds, to the output rows of the
requests served with that adapter, PEFT's unmerged LoRA term (``LoraLayer.forward``:
``result + lora_B(lora_A(x)) * scaling``; Hu et al. 2021, eq. 3)::

    y[rows] += ((x[rows] @ Aᵀ) @ Bᵀ) · s        A [r, in], B [out, r], s = alpha / r

Rows of other adapters, and rows without one, are not touched: their outputs are those of a
pass with no adapter loaded, bit for bit, whatever any other adapter holds. Each adapter has
versions that only increase; a row keeps the version it started with until it finishes (a
newer version serves the next request). A name's versions keep increasing after it is unloaded.
At most ``max_live`` adapters are held in memory: past that, the one used least recently and
not serving a row is written to the engine's own spill folder and read back on its next
request (so a user's directory that was deleted or rewritten since cannot change or break a
version the engine already took).

Storage: per linear layer, one stack of every adapter held in memory (``A`` ``[slots, r, in]``,
``B`` ``[slots, out, r]``, ranks zero-padded to the largest), written when an adapter is loaded.
A batch whose rows use one or two adapters adds each with two matmuls on its rows; more than two
gather the rows' slots and add them all with two batched matmuls (``torch.bmm``), so the cost
per layer does not grow with the number of users in the batch.

All methods run on the engine thread (the owner of the model).
"""

from __future__ import annotations

import contextlib
import itertools
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from clawrl.engine.lora import LoraFactors, lora_factors

AdapterKey = tuple[str, int]
"""An adapter version: ``(name, version)``."""


def check_fits(model: torch.nn.Module, factors: dict[str, LoraFactors]) -> None:
    """Check that every module of an adapter is a linear layer of ``model`` of its shape (a
    model on the ``meta`` device will do: only names and shapes are read).

    Raises:
        ValueError: a module the model lacks or that is not ``nn.Linear``, shapes that do not
            fit, or several scales (not plain LoRA).
    """
    modules = dict(model.named_modules())
    for name, (a, b, _) in factors.items():
        layer = modules.get(name)
        if not isinstance(layer, torch.nn.Linear):
            raise ValueError(f"adapter module {name!r} is not a linear layer of this model")
        if a.shape[1] != layer.in_features or b.shape[0] != layer.out_features:
            raise ValueError(
                f"adapter module {name!r}: A {tuple(a.shape)}, B {tuple(b.shape)} do not fit "
                f"a linear layer of {layer.in_features} -> {layer.out_features}"
            )
    scales = {s for _, _, s in factors.values()}
    if len(scales) > 1:
        raise ValueError(f"adapter has several scales {sorted(scales)}: not plain LoRA")


@dataclass
class _Version:
    path: Path
    slot: int | None  # its place in the stacks; None: spilled to ``spill``
    scale: float = 1.0
    modules: tuple[str, ...] = ()
    spill: Path | None = None
    in_use: int = 0  # rows being served with it
    last_used: int = 0


@dataclass
class AdapterStats:
    """Counters: adapters held in memory, loads from disk (first loads and reloads after an
    eviction), evictions, bytes the stacks hold, the loaded names."""

    live: int = 0
    loads: int = 0
    evictions: int = 0
    bytes: int = 0
    names: list[str] = field(default_factory=list)


GROUPED_UP_TO = 2
"""Adapters in one batch up to which each is added with its own two matmuls; above it the rows'
adapters are gathered and added with two batched matmuls."""


class RowAdapters:
    """Per-row LoRA adapters on a plain (not PEFT-wrapped) model's linear layers.

    Args:
        model: the served model; hooks are added to the linear layers adapters touch.
        max_live: most adapters held in memory (least recently used beyond it are dropped and
            reloaded from disk when next asked for; adapters serving a row are never dropped).
    """

    def __init__(self, model: torch.nn.Module, max_live: int = 8) -> None:
        if max_live < 1:
            raise ValueError(f"max_live must be >= 1, got {max_live}")
        self.model = model
        self.max_live = int(max_live)
        self.stats = AdapterStats()
        self._versions: dict[str, dict[int, _Version]] = {}
        self._latest: dict[str, int] = {}
        self._hooks: dict[str, Any] = {}
        self._a: dict[str, torch.Tensor] = {}  # module -> [slots, r, in]
        self._b: dict[str, torch.Tensor] = {}  # module -> [slots, out, r]
        self._scales = torch.zeros(0)  # [slots]
        self._slots = 0
        self._rank = 0
        self._free: list[int] = []
        self._batch: _Batch | None = None
        self._clock = itertools.count(1)
        self._max_version: dict[str, int] = {}  # kept after unload: versions only increase
        self._spill_dir: Path | None = None

    # ------------------------------------------------------------------ versions

    def latest(self, name: str) -> int | None:
        """The version of ``name`` new requests get, or ``None`` when it is not loaded."""
        return self._latest.get(name)

    def names(self) -> list[str]:
        """Every loaded adapter's name, in load order."""
        return list(self._latest)

    def load(self, name: str, version: int, path: str | Path) -> None:
        """Make ``version`` of adapter ``name`` (a PEFT LoRA directory) the one new requests
        get; rows on an older version finish on it.

        Raises:
            ValueError: ``version`` does not increase, an empty name, a module that is not a
                linear layer of the adapter's shape, or a malformed adapter.
            UnsupportedAdapter: a PEFT feature beyond plain LoRA
                (:func:`clawrl.engine.lora.lora_factors`).
            FileNotFoundError: ``path`` holds no adapter.
        """
        if not isinstance(name, str) or not name:
            raise ValueError("an adapter needs a non-empty name")
        current = self._max_version.get(name)
        if current is not None and version <= current:
            raise ValueError(f"adapter {name!r}: versions only increase ({version} <= {current})")
        factors = self._checked(lora_factors(path))
        v = _Version(Path(path), None, last_used=next(self._clock))
        self._place(v, factors)
        self._versions.setdefault(name, {})[int(version)] = v
        self._latest[name] = self._max_version[name] = int(version)
        self.stats.loads += 1
        self._drop_unused(name)
        self._evict(keep=v)

    def unload(self, name: str) -> None:
        """Stop serving ``name``: new requests naming it are refused; rows already on it
        finish. Unknown names are ignored."""
        self._latest.pop(name, None)
        self._drop_unused(name)

    def acquire(self, name: str) -> AdapterKey:
        """The version a new row of ``name`` is served with, held until :meth:`release`
        (reloaded from disk first when it was dropped from memory).

        Raises:
            LookupError: no adapter of that name is loaded.
        """
        if name not in self._latest:
            known = ", ".join(sorted(self._latest)[:10]) or "none"
            raise LookupError(f"no adapter named {name!r} is loaded (loaded: {known})")
        version = self._latest[name]
        v = self._versions[name][version]
        if v.slot is None:  # read back what the engine wrote when it evicted it
            assert v.spill is not None
            saved = torch.load(v.spill, map_location="cpu", weights_only=True)
            factors = {m: (saved["a"][m], saved["b"][m], float(saved["scale"])) for m in saved["a"]}
            self._place(v, factors)
            v.spill.unlink(missing_ok=True)
            v.spill = None
            self.stats.loads += 1
        v.in_use += 1
        v.last_used = next(self._clock)
        self._evict(keep=v)
        return name, version

    def release(self, key: AdapterKey) -> None:
        """A row served with ``key`` left the batch."""
        name, version = key
        v = self._versions.get(name, {}).get(version)
        if v is None:
            return
        v.in_use = max(0, v.in_use - 1)
        self._drop_unused(name)
        self._evict()

    @contextlib.contextmanager
    def rows(self, keys: Sequence[AdapterKey | None]) -> Iterator[None]:
        """During a forward pass over a batch whose row ``i`` is served with ``keys[i]``
        (``None``: no adapter), add each row's adapter to the linear layers' outputs."""
        if all(k is None for k in keys):
            yield
            return
        device = self._scales.device
        groups: dict[int, list[int]] = {}
        for i, key in enumerate(keys):
            if key is not None:
                slot = self._versions[key[0]][key[1]].slot
                assert slot is not None  # a version serving a row is never dropped
                groups.setdefault(slot, []).append(i)
        rows = [i for idx in groups.values() for i in idx]
        slots = [slot for slot, idx in groups.items() for _ in idx]
        self._batch = _Batch(
            grouped=[(slot, torch.tensor(idx, dtype=torch.long, device=device),
                      len(idx) == len(keys)) for slot, idx in groups.items()],
            rows=torch.tensor(rows, dtype=torch.long, device=device),
            slots=torch.tensor(slots, dtype=torch.long, device=device),
            many=len(groups) > GROUPED_UP_TO,
        )  # fmt: skip
        try:
            yield
        finally:
            self._batch = None

    # ------------------------------------------------------------------ storage

    def _checked(self, factors: dict[str, LoraFactors]) -> dict[str, LoraFactors]:
        check_fits(self.model, factors)
        return factors

    def _place(self, v: _Version, factors: dict[str, LoraFactors]) -> None:
        """Write ``factors`` into a free slot of the stacks (growing them as needed)."""
        device = next(self.model.parameters()).device
        rank = max((a.shape[0] for a, _, _ in factors.values()), default=0)
        if rank > self._rank:  # zero-pad every stack to the larger rank
            grow = rank - self._rank
            for m in self._a:
                self._a[m] = torch.nn.functional.pad(self._a[m], (0, 0, 0, grow))
                self._b[m] = torch.nn.functional.pad(self._b[m], (0, grow))
            self._rank = rank
        if not self._free:
            extra = max(1, self._slots)  # double: amortised growth
            for m in self._a:
                self._a[m] = torch.cat(
                    [self._a[m], self._a[m].new_zeros(extra, *self._a[m].shape[1:])]
                )
                self._b[m] = torch.cat(
                    [self._b[m], self._b[m].new_zeros(extra, *self._b[m].shape[1:])]
                )
            self._scales = torch.cat([self._scales.to(device), torch.zeros(extra, device=device)])
            self._free = list(range(self._slots + extra - 1, self._slots - 1, -1))
            self._slots += extra
        slot = self._free.pop()
        for m in factors:
            if m not in self._a:
                layer = self.model.get_submodule(m)
                assert isinstance(layer, torch.nn.Linear)
                self._a[m] = torch.zeros(self._slots, self._rank, layer.in_features, device=device)
                self._b[m] = torch.zeros(self._slots, layer.out_features, self._rank, device=device)
                self._hooks[m] = layer.register_forward_hook(self._adder(m))
        with torch.no_grad():
            for m in self._a:
                self._a[m][slot].zero_()
                self._b[m][slot].zero_()
                if m in factors:
                    a, b, _ = factors[m]
                    self._a[m][slot, : a.shape[0]] = a.to(device)
                    self._b[m][slot, :, : b.shape[1]] = b.to(device)
        v.scale = next(iter(factors.values()))[2] if factors else 0.0
        v.modules = tuple(factors)
        self._scales[slot] = v.scale
        v.slot = slot
        self._count()

    def _adder(self, module_name: str) -> Any:
        def add(module: torch.nn.Module, args: tuple[Any, ...], output: torch.Tensor) -> Any:
            batch = self._batch
            if batch is None:
                return None
            x = args[0]
            a_stack, b_stack = self._a[module_name], self._b[module_name]
            if batch.many:  # every row's adapter in two batched matmuls
                xs = x.index_select(0, batch.rows).to(a_stack.dtype)
                flat = xs.dim() == 2  # a layer fed [rows, in] (one token per row)
                if flat:
                    xs = xs.unsqueeze(1)
                a = a_stack.index_select(0, batch.slots)  # [n, r, in]
                b = b_stack.index_select(0, batch.slots)  # [n, out, r]
                scale = self._scales.index_select(0, batch.slots)
                delta = torch.bmm(torch.bmm(xs, a.transpose(1, 2)), b.transpose(1, 2))
                delta = delta * scale.view(-1, 1, 1)
                if flat:
                    delta = delta.squeeze(1)
                return output.index_add(0, batch.rows, delta.to(output.dtype))
            for slot, idx, whole in batch.grouped:
                a, b = a_stack[slot], b_stack[slot]
                xs = x if whole else x.index_select(0, idx)
                delta = ((xs.to(a.dtype) @ a.T) @ b.T) * float(self._scales[slot])
                if whole:
                    output = output + delta.to(output.dtype)
                else:
                    output = output.index_add(0, idx, delta.to(output.dtype))
            return output

        return add

    # ------------------------------------------------------------------ memory

    def _drop_unused(self, name: str) -> None:
        """Forget versions of ``name`` that are neither the latest nor serving a row."""
        versions = self._versions.get(name, {})
        latest = self._latest.get(name)
        for version in [v for v, a in versions.items() if v != latest and a.in_use == 0]:
            self._free_slot(versions.pop(version))
        if not versions:
            self._versions.pop(name, None)
        self._count()

    def _free_slot(self, v: _Version) -> None:
        if v.slot is not None:
            self._free.append(v.slot)
            v.slot = None
        if v.spill is not None:
            v.spill.unlink(missing_ok=True)
            v.spill = None

    def _spill(self, v: _Version) -> None:
        """Write ``v``'s slot to the spill folder and free the slot."""
        assert v.slot is not None
        if self._spill_dir is None:
            self._spill_dir = Path(tempfile.mkdtemp(prefix="clawrl-adapters-"))
        path = self._spill_dir / f"{next(self._clock)}.pt"
        saved = {
            "a": {m: self._a[m][v.slot].cpu().clone() for m in v.modules},
            "b": {m: self._b[m][v.slot].cpu().clone() for m in v.modules},
            "scale": v.scale,
        }
        torch.save(saved, path)
        self._free.append(v.slot)
        v.slot, v.spill = None, path

    def _evict(self, keep: _Version | None = None) -> None:
        """Spill the least recently used adapters that serve no row (never ``keep``, the one
        just loaded or asked for) until at most ``max_live`` are in memory."""
        while True:
            held = [v for vs in self._versions.values() for v in vs.values() if v.slot is not None]
            if len(held) <= self.max_live:
                break
            idle = [v for v in held if v.in_use == 0 and v is not keep]
            if not idle:
                break  # every other adapter in memory serves a row: over the cap until one ends
            self._spill(min(idle, key=lambda v: v.last_used))
            self.stats.evictions += 1
        self._count()

    def close(self) -> None:
        """Remove the spill folder (the engine is closing)."""
        if self._spill_dir is not None:
            shutil.rmtree(self._spill_dir, ignore_errors=True)
            self._spill_dir = None

    def _count(self) -> None:
        self.stats.live = sum(
            1 for vs in self._versions.values() for v in vs.values() if v.slot is not None
        )
        self.stats.bytes = sum(
            t.numel() * t.element_size() for d in (self._a, self._b) for t in d.values()
        )
        self.stats.names = list(self._latest)


@dataclass
class _Batch:
    """Where the adapters go in the forward pass under way."""

    grouped: list[tuple[int, torch.Tensor, bool]]  # (slot, rows, every row) per adapter
    rows: torch.Tensor  # rows with an adapter
    slots: torch.Tensor  # their slots, row by row
    many: bool  # more than GROUPED_UP_TO adapters: the batched path
