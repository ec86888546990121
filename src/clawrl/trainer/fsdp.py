"""The trainer over N ranks with FSDP2 (``torch.distributed.fsdp.fully_shard``).

:class:`ShardedTrainer` is :class:`clawrl.trainer.Trainer` with its model sharded: each decoder
layer is an FSDP2 unit and the :class:`~clawrl.trainer.batch.TokenLogprobs` wrapper is the root
(embeddings, final norm and the tied output layer), for LoRA (frozen base shards, trainable
adapter shards) and full fine-tuning alike. One step over a batch of B samples:

* every rank gets the whole batch from rank 0 and computes the advantages and the loss
  normalisers over all of it (GRPO groups whole), as the one-process trainer does;
* rank r takes the contiguous rows ``[r·B/N, (r+1)·B/N)`` in micro-batches; each micro-batch's
  loss is already divided by the *whole* batch's normalisers, so the gradient of the step is the
  **sum** over ranks: the reduce-scatter's divide factor is set to 1 (FSDP2 averages by
  default). Every rank makes the same number of passes (FSDP2's all-gathers are collective); a
  rank with fewer rows makes a pass whose loss is multiplied by 0; gradients of the
  micro-batches accumulate unsharded on each rank and are reduce-scattered once, at the last
  backward (``set_requires_gradient_sync``);
* the global gradient norm is taken over every rank's shards (``DTensor.full_tensor``), then
  clipping and AdamW act on each rank's shard.

So a 2-rank step equals the one-process step on the same batch up to summation order
(``tests/trainer/test_fsdp_equivalence.py``, float64). Weights are published from a full state
dict gathered on rank 0; checkpoints are ``torch.distributed.checkpoint`` (DCP) directories,
resharded on load, so a run resumes with a different number of ranks.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard

from clawrl.config import TrainerConfig
from clawrl.errors import TrainerError
from clawrl.store import FULL_WEIGHTS_FILE
from clawrl.trainer.distributed import DistEnv, barrier, gather_objects
from clawrl.trainer.trainer import (
    Trainer,
    checkpoint_path,
    commit_checkpoint,
    fresh_dir,
    replace_dir,
)

CHECKPOINT_FORMAT = "dcp"
"""``meta.json``'s ``format`` for checkpoints this trainer writes (the one-process trainer's
have none: ``state.pt``)."""


def shard_model(root: torch.nn.Module, layer_classes: set[str], mesh: Any) -> None:
    """``fully_shard`` every module of a class in ``layer_classes`` (the decoder layers), then
    ``root``; gradients are summed over ranks, not averaged (module docstring)."""
    for module in list(root.modules()):
        if module is not root and type(module).__name__ in layer_classes:
            fully_shard(module, mesh=mesh)
    fully_shard(root, mesh=mesh)
    for module in root.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            # a plain SUM: with a factor set, FSDP2 otherwise reduces float32/bfloat16 with
            # PREMUL_SUM, which gloo does not have
            module.set_force_sum_reduction_for_comms(True)


class ShardedTrainer(Trainer):
    """:class:`~clawrl.trainer.Trainer` over the ranks of ``env`` (module docstring).

    Every rank builds it from the same weights and config (so LoRA starts equal everywhere) and
    calls the same methods in the same order with the same batch: :meth:`train_step`,
    :meth:`teacher_logprobs`, :meth:`save_weights`, :meth:`save_checkpoint` and
    :meth:`load_checkpoint` are collective.

    Args:
        base_model: the policy's weights, trained in place (not copied).
        config: the training settings.
        env: this rank's place in the process group (:func:`clawrl.trainer.distributed.
            init_distributed`).
        output_dir: versions and checkpoints (every rank must see the same directory).
        policy_version: the version the weights are.
        computes_teacher: see :class:`~clawrl.trainer.Trainer`.

    Raises:
        ConfigError: the method trains nothing.
        TrainerError: the model declares no decoder layer class to shard
            (``_no_split_modules``).
    """

    def __init__(
        self,
        base_model: torch.nn.Module,
        config: TrainerConfig,
        env: DistEnv,
        output_dir: str | Path | None = None,
        *,
        policy_version: int = 0,
        computes_teacher: bool = False,
    ) -> None:
        self.env = env
        self._layer_classes = set(getattr(base_model, "_no_split_modules", None) or [])
        if not self._layer_classes:
            raise TrainerError(
                f"{type(base_model).__name__} declares no decoder layer class "
                "(_no_split_modules): FSDP2 does not know what to shard"
            )
        base_model.to(env.device)
        super().__init__(
            base_model, config, output_dir, policy_version=policy_version, copy_model=False,
            computes_teacher=computes_teacher,
        )  # fmt: skip

    # ----------------------------------------------------------------- data parallelism

    def _shard(self) -> None:
        mesh = init_device_mesh(self.env.device.type, (self.env.world_size,))
        shard_model(self.policy_logprobs, self._layer_classes, mesh)
        if self.ref_logprobs is not None:
            shard_model(self.ref_logprobs, self._layer_classes, mesh)

    def _rank_rows(self, n: int) -> range:
        r, w = self.env.rank, self.env.world_size
        return range(r * n // w, (r + 1) * n // w)

    def _passes(self, n: int, micro_batch: int) -> int:
        w = self.env.world_size
        return max(-(-((r + 1) * n // w - r * n // w) // micro_batch) for r in range(w))

    def _before_backward(self, index: int, passes: int) -> None:
        # gradient accumulation: micro-batches add up unsharded gradients locally; only the
        # last backward reduce-scatters them over the ranks and reshards the parameters (one
        # reduce-scatter and one all-gather fewer per extra micro-batch)
        last = index == passes - 1
        root = self.policy_logprobs
        if isinstance(root, FSDPModule):
            root.set_requires_gradient_sync(last)
            root.set_reshard_after_backward(last)

    def _gather(self, parts: list[Any]) -> list[Any]:
        return [p for rank_parts in gather_objects(parts, self.env) for p in rank_parts]

    # ----------------------------------------------------------------- publishing

    def _options(self, *, full: bool) -> StateDictOptions:
        """Trainable weights only for LoRA (the frozen base is the model's own: loading leaves
        it as it is, so not strict; DCP itself refuses a checkpoint that lacks a trainable
        weight); all of them for full fine-tuning. ``full``: gathered whole on rank 0 (CPU)."""
        return StateDictOptions(
            full_state_dict=full, cpu_offload=full, strict=False,
            ignore_frozen_params=not self.config.full_finetune,
        )  # fmt: skip

    def _trainable_only(self, state: dict[str, Any]) -> dict[str, Any]:
        """``state`` without frozen weights for LoRA: DCP's ``ignore_frozen_params`` keeps a
        frozen weight tied to another (the output layer tied to the embeddings: 113 MB of
        SmolLM2-135M in every checkpoint otherwise)."""
        if self.config.full_finetune:
            return state
        names = {n for n, p in self.policy_logprobs.named_parameters() if p.requires_grad}
        return {k: v for k, v in state.items() if k in names}

    def full_weights(self) -> dict[str, torch.Tensor]:
        """The trainable weights (all of them with full fine-tuning), whole, keyed as the
        model (PEFT model) names them; on rank 0 (the other ranks get ``{}``). Collective."""
        state = get_model_state_dict(self.policy_logprobs, options=self._options(full=True))
        return {k.removeprefix("model."): v for k, v in self._trainable_only(state).items()}

    def save_weights(self, version: int) -> Path:
        """Save the weights as ``version`` under ``policies/vN``; collective, rank 0 writes.

        A LoRA adapter is a PEFT directory (``adapter_config.json`` + weights); full
        fine-tuning writes :data:`clawrl.store.FULL_WEIGHTS_FILE` (safetensors). Either is
        loadable by a gateway in another process that sees this directory. Returns the
        directory."""
        weights = self.full_weights()
        target = self.output_dir / "policies" / f"v{version}"
        if self.env.is_main:
            tmp = fresh_dir(target.with_name(target.name + ".tmp"))
            if self.config.full_finetune:
                from safetensors.torch import save_file

                tmp.mkdir(parents=True)
                # tied weights share storage: safetensors stores each tensor once, so copy
                save_file({k: v.contiguous().clone() for k, v in weights.items()},
                          str(tmp / FULL_WEIGHTS_FILE))  # fmt: skip
            else:
                self.model.save_pretrained(str(tmp), state_dict=weights)  # type: ignore[operator]
            replace_dir(tmp, target)
        barrier(self.env)
        return target

    # ----------------------------------------------------------------- checkpoints

    def _state(self) -> dict[str, Any]:
        model, optim = get_state_dict(
            self.policy_logprobs, self.optimizer, options=self._options(full=False)
        )
        return {"model": self._trainable_only(model), "optim": optim}

    def save_checkpoint(self, extra: dict[str, Any] | None = None) -> Path:
        """Write a DCP checkpoint (sharded weights and optimizer state, every rank its part)
        plus rank 0's ``extra.pt`` (scheduler, random state) and ``meta.json``; atomic:
        ``latest`` points at it only once it is whole. Collective."""
        root = self.output_dir / "checkpoints"
        target = root / f"step-{self.step:06d}"
        tmp = root / f".tmp-step-{self.step:06d}"
        if self.env.is_main:
            root.mkdir(parents=True, exist_ok=True)
            fresh_dir(tmp)
        barrier(self.env)
        dcp.save(self._state(), checkpoint_id=str(tmp))
        if self.env.is_main:
            torch.save(
                {
                    "scheduler": self.scheduler.state_dict(),
                    "rng_torch": torch.get_rng_state(),
                    "rng_python": random.getstate(),
                },
                tmp / "extra.pt",
            )
            meta = {
                "step": self.step, "policy_version": self.policy_version,
                "format": CHECKPOINT_FORMAT, "world_size": self.env.world_size, **(extra or {}),
            }  # fmt: skip
            commit_checkpoint(tmp, target, meta, keep=self.config.keep_checkpoints)
        barrier(self.env)
        return target

    def load_checkpoint(self, path: str | Path | None = None) -> dict[str, Any] | None:
        """Restore the latest (or given) checkpoint, whatever number of ranks wrote it (DCP
        reshards); returns its meta, or None if there is none. Collective.

        Raises:
            TrainerError: the checkpoint is the one-process trainer's (``clawrl serve
                --method ...``: ``state.pt``), or its weights do not match this model.
        """
        path = checkpoint_path(self.output_dir, path)
        if path is None:
            return None
        meta = json.loads((path / "meta.json").read_text())
        if meta.get("format") != CHECKPOINT_FORMAT:
            raise TrainerError(
                f"checkpoint {path} was written by the in-process trainer (clawrl serve "
                "--method ...); clawrl train reads its own (torch.distributed.checkpoint) "
                "checkpoints: give it another --output-dir"
            )
        state = self._state()
        try:
            dcp.load(state, checkpoint_id=str(path))
        except (CheckpointException, RuntimeError, ValueError, KeyError) as e:
            raise TrainerError(f"checkpoint {path} does not match the model: {_why(e)}") from e
        set_state_dict(
            self.policy_logprobs, self.optimizer, model_state_dict=state["model"],
            optim_state_dict=state["optim"], options=self._options(full=False),
        )  # fmt: skip
        extra = torch.load(path / "extra.pt", weights_only=False)
        self.scheduler.load_state_dict(extra["scheduler"])
        torch.set_rng_state(extra["rng_torch"])
        random.setstate(extra["rng_python"])
        self.step = int(meta["step"])
        self.policy_version = int(meta["policy_version"])
        return meta


def _why(error: BaseException) -> str:
    """The first rank's underlying error of a DCP ``CheckpointException`` (its message is a
    traceback per rank), else the error itself."""
    failures = getattr(error, "failures", None)
    if isinstance(failures, dict) and failures:
        first = next(iter(failures.values()))  # (exception, traceback)
        inner = first[0] if isinstance(first, tuple) else first
        return f"{type(inner).__name__}: {inner}"
    return f"{type(error).__name__}: {error}"
