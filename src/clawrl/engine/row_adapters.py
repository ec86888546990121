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
newer version serves the next request). At most ``max_live`` adapters are held in memory:
past that, the one used least recently and not serving a row is dropped from memory and
reloaded from its directory on its next request.

All methods run on the engine thread (the owner of the model).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from clawrl.engine.lora import LoraFactors, lora_factors

AdapterKey = tuple[str, int]
"""An adapter version: ``(name, version)``."""


@dataclass
class _Version:
    path: Path
    factors: dict[str, LoraFactors] | None  # None: dropped from memory, reloaded from ``path``
    in_use: int = 0  # rows being served with it
    last_used: int = 0


@dataclass
class AdapterStats:
    """Counters: adapters held in memory, loads from disk (first loads and reloads after an
    eviction), evictions."""

    live: int = 0
    loads: int = 0
    evictions: int = 0
    names: list[str] = field(default_factory=list)


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
        self._groups: list[tuple[AdapterKey, torch.Tensor, bool]] | None = None
        self._clock = itertools.count(1)

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
        current = self._latest.get(name)
        if current is not None and version <= current:
            raise ValueError(f"adapter {name!r}: versions only increase ({version} <= {current})")
        factors = self._checked(lora_factors(path))
        self._hook(factors)
        self._versions.setdefault(name, {})[int(version)] = _Version(
            Path(path), factors, last_used=next(self._clock)
        )
        self._latest[name] = int(version)
        self.stats.loads += 1
        self._drop_unused(name)
        self._evict()

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
        if v.factors is None:
            v.factors = self._checked(lora_factors(v.path))
            self.stats.loads += 1
        v.in_use += 1
        v.last_used = next(self._clock)
        self._evict()
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
        groups: dict[AdapterKey, list[int]] = {}
        for i, key in enumerate(keys):
            if key is not None:
                groups.setdefault(key, []).append(i)
        if not groups:
            yield
            return
        device = next(self.model.parameters()).device
        self._groups = [
            (key, torch.tensor(idx, dtype=torch.long, device=device), len(idx) == len(keys))
            for key, idx in groups.items()
        ]
        try:
            yield
        finally:
            self._groups = None

    # ------------------------------------------------------------------ internals

    def _checked(self, factors: dict[str, LoraFactors]) -> dict[str, LoraFactors]:
        modules = dict(self.model.named_modules())
        device = next(self.model.parameters()).device
        out: dict[str, LoraFactors] = {}
        for name, (a, b, scale) in factors.items():
            layer = modules.get(name)
            if not isinstance(layer, torch.nn.Linear):
                raise ValueError(f"adapter module {name!r} is not a linear layer of this model")
            if a.shape[1] != layer.in_features or b.shape[0] != layer.out_features:
                raise ValueError(
                    f"adapter module {name!r}: A {tuple(a.shape)}, B {tuple(b.shape)} do not fit "
                    f"a linear layer of {layer.in_features} -> {layer.out_features}"
                )
            out[name] = (a.to(device), b.to(device), scale)
        return out

    def _hook(self, factors: dict[str, LoraFactors]) -> None:
        for name in factors:
            if name not in self._hooks:
                layer = self.model.get_submodule(name)
                self._hooks[name] = layer.register_forward_hook(self._adder(name))

    def _adder(self, module_name: str) -> Any:
        def add(module: torch.nn.Module, args: tuple[Any, ...], output: torch.Tensor) -> Any:
            groups = self._groups
            if not groups:
                return None
            x = args[0]
            for (name, version), idx, whole in groups:
                factors = self._versions[name][version].factors
                assert factors is not None  # a version serving a row is never dropped
                found = factors.get(module_name)
                if found is None:
                    continue
                a, b, scale = found
                xs = x if whole else x.index_select(0, idx)
                delta = ((xs.to(a.dtype) @ a.T) @ b.T) * scale
                if whole:
                    output = output + delta.to(output.dtype)
                else:
                    output = output.index_add(0, idx, delta.to(output.dtype))
            return output

        return add

    def _drop_unused(self, name: str) -> None:
        """Forget versions of ``name`` that are neither the latest nor serving a row."""
        versions = self._versions.get(name, {})
        latest = self._latest.get(name)
        for version in [v for v, a in versions.items() if v != latest and a.in_use == 0]:
            del versions[version]
        if not versions:
            self._versions.pop(name, None)
        self._count()

    def _evict(self) -> None:
        while True:
            held = [(v.last_used, n, ver, v) for n, vs in self._versions.items()
                    for ver, v in vs.items() if v.factors is not None]  # fmt: skip
            if len(held) <= self.max_live:
                break
            idle = [h for h in held if h[3].in_use == 0]
            if not idle:
                break  # every adapter in memory serves a row: over the cap until one finishes
            _, _, _, victim = min(idle, key=lambda h: h[0])
            victim.factors = None
            self.stats.evictions += 1
        self._count()

    def _count(self) -> None:
        self.stats.live = sum(
            1 for vs in self._versions.values() for v in vs.values() if v.factors is not None
        )
        self.stats.names = list(self._latest)
