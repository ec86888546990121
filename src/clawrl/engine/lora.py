"""Serving a LoRA policy version from merged weights.

A trainer publishes each LoRA policy version as a PEFT adapter directory
(``adapter_config.json`` + ``adapter_model.safetensors``). Decoding through PEFT's unmerged
layers costs two more matmuls and a Python wrapper per linear layer on every decode step; on a
CPU, where a small model's decode step is bound by memory traffic and per-op overhead, that is
measurable (``benchmarks/engine_throughput.py``). So the in-process engine serves a version by
writing ``W = W_base + ΔW`` into the model's own linear layers, with ΔW as PEFT defines it
(Hu et al. 2021, "LoRA", eq. 3; PEFT ``LoraLayer.get_delta_weight``)::

    ΔW = (B @ A) · s,   s = lora_alpha / r   (rsLoRA: lora_alpha / sqrt(r))

``B`` is ``[out, r]``, ``A`` is ``[r, in]``, so ΔW has the linear weight's shape ``[out, in]``.
The base weights of every layer an adapter touches are kept (one copy, taken the first time a
layer is merged), so each version is merged onto the exact base: nothing drifts across versions,
and scoring with the base weights (the OPD ``teacher = "base"`` option) substitutes them for one
forward pass without copying (:func:`torch.func.functional_call`).

Only plain LoRA on float32 weights is merged here: an adapter with DoRA, ``fan_in_fan_out``,
bias training, ``modules_to_save``, per-module rank or alpha patterns, layers other than
``nn.Linear``, bf16 / fp16 weights (a small ΔW would round away) or a layer tied to the input
embeddings raises :class:`UnsupportedAdapter`, and the engine serves it through PEFT instead.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

ADAPTER_PREFIX = "base_model.model."
"""PEFT's prefix on a saved adapter's tensor names (before the model's own module path)."""


class UnsupportedAdapter(ValueError):
    """The adapter uses a PEFT feature this merger does not implement (served through PEFT)."""


LoraFactors = tuple[torch.Tensor, torch.Tensor, float]
"""One module's LoRA: ``A`` ``[r, in]``, ``B`` ``[out, r]`` (float32) and the scale ``s``."""


def lora_deltas(path: str | Path) -> dict[str, torch.Tensor]:
    """ΔW per module of the adapter saved in directory ``path``.

    Returns:
        module path (as in ``model.named_modules()``, e.g. ``model.layers.0.self_attn.q_proj``)
        -> ``[out, in]`` float32 tensor ``(B @ A) · s``.

    Raises:
        the errors of :func:`lora_factors`.
    """
    return {name: (b @ a) * scale for name, (a, b, scale) in lora_factors(path).items()}


def lora_factors(path: str | Path) -> dict[str, LoraFactors]:
    """``(A, B, s)`` per module of the plain LoRA adapter saved in directory ``path`` (A and B
    as float32; :class:`clawrl.engine.row_adapters.RowAdapters` applies them unmerged).

    Returns:
        module path (as in ``model.named_modules()``) -> ``(A [r, in], B [out, r], s)``.

    Raises:
        UnsupportedAdapter: a feature beyond plain LoRA (see the module docstring).
        FileNotFoundError: no ``adapter_config.json`` or ``adapter_model.safetensors``.
        ValueError: an ``A`` without its ``B`` (or back), or mismatched ranks.
    """
    from safetensors.torch import load_file

    root = Path(path)
    cfg = json.loads((root / "adapter_config.json").read_text())
    unsupported = {
        "use_dora": bool(cfg.get("use_dora")),
        "fan_in_fan_out": bool(cfg.get("fan_in_fan_out")),
        "bias": cfg.get("bias", "none") not in (None, "none"),
        "modules_to_save": bool(cfg.get("modules_to_save")),
        "rank_pattern": bool(cfg.get("rank_pattern")),
        "alpha_pattern": bool(cfg.get("alpha_pattern")),
        "peft_type": cfg.get("peft_type", "LORA") != "LORA",
    }
    used = sorted(k for k, v in unsupported.items() if v)
    if used:
        raise UnsupportedAdapter(f"{root}: adapter uses {', '.join(used)}")
    r = int(cfg["r"])
    alpha = float(cfg["lora_alpha"])
    scale = alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r
    tensors = load_file(str(root / "adapter_model.safetensors"))
    a_mats: dict[str, torch.Tensor] = {}
    b_mats: dict[str, torch.Tensor] = {}
    for key, value in tensors.items():
        name = key.removeprefix(ADAPTER_PREFIX)
        if name.endswith(".lora_A.weight"):
            a_mats[name.removesuffix(".lora_A.weight")] = value
        elif name.endswith(".lora_B.weight"):
            b_mats[name.removesuffix(".lora_B.weight")] = value
        else:
            raise UnsupportedAdapter(
                f"{root}: tensor {key!r} is not a LoRA A or B matrix (only LoRA on linear "
                "layers is served: embeddings, modules_to_save and other layers are not)"
            )
    if a_mats.keys() != b_mats.keys():
        raise ValueError(f"{root}: LoRA A and B matrices do not pair up")
    out: dict[str, LoraFactors] = {}
    for name, a in a_mats.items():
        b = b_mats[name]
        if a.shape[0] != b.shape[1]:
            raise ValueError(f"{root}: {name}: A is {tuple(a.shape)}, B is {tuple(b.shape)}")
        out[name] = (a.float(), b.float(), scale)
    return out


class MergedLora:
    """Writes ``W_base + ΔW`` into a plain model's linear layers, one policy version at a time.

    Args:
        model: the served model (not a PEFT wrapper); its linear weights are overwritten in
            place by :meth:`apply`.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self._base: dict[str, torch.Tensor] = {}  # parameter name -> base weight (a copy)

    @property
    def active(self) -> bool:
        """Whether some layer holds merged (non-base) weights."""
        return bool(self._base)

    def apply(self, deltas: dict[str, torch.Tensor]) -> None:
        """Serve ``W_base + ΔW`` for each module in ``deltas`` and the base weights elsewhere.

        Raises:
            UnsupportedAdapter: a module is missing or is not an ``nn.Linear`` of ΔW's shape
                (checked before any weight changes).
        """
        modules = dict(self.model.named_modules())
        get_embed: Any = getattr(self.model, "get_input_embeddings", None)
        embed = get_embed() if callable(get_embed) else None
        tied = getattr(embed, "weight", None)
        for name, delta in deltas.items():
            layer = modules.get(name)
            if not isinstance(layer, torch.nn.Linear):
                raise UnsupportedAdapter(f"adapter module {name!r} is not a linear layer here")
            if tuple(layer.weight.shape) != tuple(delta.shape):
                raise UnsupportedAdapter(
                    f"adapter module {name!r}: ΔW {tuple(delta.shape)} vs weight "
                    f"{tuple(layer.weight.shape)}"
                )
            if layer.weight.dtype != torch.float32:  # ΔW would round away in bf16 / fp16
                raise UnsupportedAdapter(f"adapter module {name!r}: {layer.weight.dtype} weights")
            if tied is not None and layer.weight is tied:  # merging would change the embeddings
                raise UnsupportedAdapter(f"adapter module {name!r} shares the input embeddings")
        with torch.no_grad():
            for name, delta in deltas.items():
                weight = modules[name].weight  # type: ignore[union-attr]
                key = f"{name}.weight"
                if key not in self._base:
                    self._base[key] = weight.detach().clone()
                weight.copy_(self._base[key] + delta.to(weight.device, weight.dtype))
            for key, base in self._base.items():  # layers this version does not touch
                if key.removesuffix(".weight") not in deltas:
                    self.model.get_parameter(key).copy_(base)

    def base_parameters(self) -> dict[str, torch.Tensor]:
        """Parameter name -> base weight for every merged layer (for ``functional_call``)."""
        return dict(self._base)

    def forget(self) -> None:
        """Drop the base copies: the model's current weights become the base (after a full
        state-dict load replaced them)."""
        self._base.clear()
