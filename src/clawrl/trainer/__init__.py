"""Training the policy from judged turns: batches, losses from ``clawrl.algorithms``, LoRA,
optimizer steps, checkpoints, and publishing policy versions to the engine."""

from clawrl.trainer.batch import Batch, collate, token_logprobs
from clawrl.trainer.trainer import Trainer, attach_lora
from clawrl.trainer.types import TrainSample

__all__ = [
    "Batch",
    "TrainSample",
    "Trainer",
    "attach_lora",
    "collate",
    "token_logprobs",
]
