"""One LoRA adapter per user, trained on one copy of the model (``clawrl serve
--per-user-adapters`` with a training method).

Every user's adapter has the trainer's LoRA shape (``trainer.lora_rank`` on all linear layers,
``trainer.lora_alpha``), so all of them train through the same PEFT model: the trainer's own
``default`` adapter holds the weights of the user being trained, swapped in before their step
(:meth:`UserTrainers.activate`; a copy of a few MB per user). Each user has their own
:class:`clawrl.trainer.Trainer` view of that model (:meth:`clawrl.trainer.Trainer.fork`: its own
AdamW moments, warm-up schedule, step count, version and output directory
``OUTPUT_DIR/users/<digest>/``) and their own :class:`clawrl.trainer.learner.Learner`, so a
user's step is the one learner's step (checkpoint, ``samples`` rows exactly once), numbered
and recorded in the store's ``user_adapters`` table instead of ``policy_versions``.

A user's first adapter starts where every user's does: the trainer's fresh LoRA (``B = 0``, so
exactly the served policy until the first step). A user whose versions were recorded by hand
(``clawrl users adapter``) and who has no checkpoint here trains on from their newest version
(:func:`load_user_adapter`: a smaller rank is zero-padded, another ``alpha`` rescaled; exact).
At most ``keep`` users stay in memory; the least recently trained leave it and come back from
their latest checkpoint (every step writes one).
"""

from __future__ import annotations

import hashlib
import logging
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from clawrl.errors import ConfigError

if TYPE_CHECKING:
    from clawrl.trainer.trainer import Trainer

log = logging.getLogger(__name__)


def user_digest(user_id: str) -> str:
    """The 16 hex digits that name ``user_id``'s folders on disk (ids may hold any character)."""
    return hashlib.sha256(user_id.encode()).hexdigest()[:16]


def _trainable(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}


class UserTrainers:
    """Which user's adapter the shared model holds, and each user's trainer (module docstring).

    Args:
        trainer: the LoRA trainer whose model every user's adapter trains through; its adapter
            at construction is every user's starting point.
        root: the users' output folders go under it (``root/<digest>/``).
        keep: most users whose weights and optimizer state stay in memory.

    Raises:
        ConfigError: ``trainer`` fine-tunes all weights (a per-user copy would be the model).
    """

    def __init__(self, trainer: Trainer, root: Path, *, keep: int = 8) -> None:
        if trainer.config.full_finetune:
            raise ConfigError("per-user adapters are LoRA adapters: trainer.full_finetune must "
                              "be false with server.per_user_adapters")  # fmt: skip
        self.trainer = trainer
        self.root = Path(root)
        self.keep = max(1, keep)
        self.initial = _trainable(trainer)
        """The fresh adapter (``B = 0``) every user starts from."""
        self._trainers: OrderedDict[str, Trainer] = OrderedDict()
        self._weights: dict[str, dict[str, torch.Tensor]] = {}
        self.active: str | None = None

    def has(self, user_id: str) -> bool:
        """Whether ``user_id``'s trainer is in memory (else :meth:`activate` builds it)."""
        return user_id in self._trainers

    def activate(self, user_id: str) -> tuple[Trainer, bool]:
        """Put ``user_id``'s adapter weights into the model; returns their trainer and whether it
        was built now (then the caller restores its checkpoint: :meth:`Learner.resume`)."""
        if self.active == user_id:
            return self._trainers[user_id], False
        if self.active is not None and self.active in self._trainers:
            self._weights[self.active] = _trainable(self.trainer)
        created = user_id not in self._trainers
        if created:
            self._trainers[user_id] = self.trainer.fork(self.root / user_digest(user_id))
        self._trainers.move_to_end(user_id)
        self._put(self._weights.get(user_id, self.initial))
        self.active = user_id
        while len(self._trainers) > self.keep:  # its checkpoint has everything
            old, _ = self._trainers.popitem(last=False)
            self._weights.pop(old, None)
            log.info("user %r's trainer left memory (back from its checkpoint)", old)
        return self._trainers[user_id], created

    def forget(self, user_id: str) -> None:
        """Drop ``user_id``'s trainer and weights from memory (``clawrl users forget``)."""
        self._trainers.pop(user_id, None)
        self._weights.pop(user_id, None)
        if self.active == user_id:
            self._put(self.initial)
            self.active = None

    def _put(self, weights: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for n, p in self.trainer.model.named_parameters():
                if p.requires_grad:
                    p.copy_(weights[n])


def load_user_adapter(trainer: Trainer, path: str | Path) -> None:
    """Set ``trainer``'s LoRA weights to the plain PEFT LoRA adapter saved in ``path`` (a version
    recorded by ``clawrl users adapter``), so that training goes on from it. Exact: a rank
    below the trainer's is zero-padded (the extra rows of ``A`` times zero columns of ``B``),
    another scale is folded into ``B`` (``B' = B · s / s_trainer``); layers the adapter leaves
    out keep ``B = 0``. (Padded ranks get no gradient: the adapter keeps its own rank.)

    Raises:
        ConfigError: the adapter cannot be expressed in the trainer's LoRA (a rank above
            ``trainer.lora_rank``, a layer the trainer has no LoRA on, another shape, or not a
            plain LoRA).
    """
    from clawrl.engine.lora import lora_factors

    try:
        factors = lora_factors(path)
    except (OSError, ValueError, KeyError) as e:
        raise ConfigError(f"{path} is not a plain LoRA adapter ({e})") from e
    layers = {
        name.removeprefix("base_model.model."): m
        for name, m in trainer.model.named_modules()
        if hasattr(m, "lora_A") and "default" in getattr(m, "lora_A", {})
    }
    unknown = sorted(set(factors) - set(layers))
    if unknown:
        raise ConfigError(f"{path} adapts layers the trainer has no LoRA on: {unknown[:5]}")
    with torch.no_grad():
        for name, m in layers.items():
            b_param = m.lora_B["default"].weight  # [out, r_t]
            if name not in factors:
                b_param.zero_()
                continue
            a, b, s = factors[name]
            a_param = m.lora_A["default"].weight  # [r_t, in]
            r = a.shape[0]
            fits = a.shape[1] == a_param.shape[1] and b.shape[0] == b_param.shape[0]
            if r > a_param.shape[0] or not fits:
                raise ConfigError(
                    f"{path}: layer {name} has A {tuple(a.shape)}, B {tuple(b.shape)}; the "
                    f"trainer's LoRA is A {tuple(a_param.shape)}, B {tuple(b_param.shape)} "
                    "(raise trainer.lora_rank to at least the adapter's rank)"
                )
            scale = float(m.scaling["default"])
            a_param.zero_()
            b_param.zero_()
            a_param[:r].copy_(a.to(a_param.dtype))
            b_param[:, :r].copy_((b * (s / scale)).to(b_param.dtype))
