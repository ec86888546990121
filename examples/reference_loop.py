"""Reference loop: one online RL step of clawrl, top to bottom, with plain calls.

    sample  ->  judge (fixed table)  ->  drop stale  ->  advantages  ->  loss  ->  optimizer step

It documents the algorithm and is the oracle for the real trainer: ``run_reference_step(model,
batch, ...)`` takes a policy model and a recorded batch (token ids, the engine's log-probs, the
judge's decisions) and returns the loss and the gradient norm, with nothing hidden in between.

Run it with ``.venv/bin/python examples/reference_loop.py``; it takes seconds on a CPU.

The policy is a tiny randomly initialised ``LlamaForCausalLM`` with SmolLM2's vocabulary size,
built here so that the file stands alone (``clawrl.models.tiny_policy().model`` works the same and
adds the real tokenizer, which this loop does not need). There is no tokenizer: prompts are fixed lists of integer ids. A random model has no trained
end-of-sequence token, so the ids in ``STOP_IDS`` (about 8 % of the vocabulary) end a completion;
that makes completion lengths differ and leaves some completions truncated at the length limit.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass, field
from typing import TypeVar

import torch
from torch import Tensor
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel

from clawrl.algorithms import (
    AdvantageConfig,
    AdvantageInputs,
    BinaryRLAdvantage,
    LossConfig,
    LossInputs,
    PPOClipLoss,
    compute_advantages,
    compute_loss,
    drop_stale,
)

_T = TypeVar("_T")

VOCAB_SIZE = 49152
PAD_ID = 0
STOP_IDS = range(1, 4097)
"""Ids that end a completion (stand-in for EOS on an untrained model)."""

PROMPTS: list[list[int]] = [
    [101, 2023, 2003, 1037, 3231],
    [101, 7592, 2088],
    [101, 2129, 2079, 1045, 2424, 1996, 5371],
    [101, 4067, 2017, 2005],
]
"""Fixed prompts as token ids (no tokenizer needed)."""

JUDGE_TABLE: dict[tuple[int, int], int] = {
    (0, 0): 1, (0, 1): -1, (0, 2): 1, (0, 3): 0,
    (1, 0): -1, (1, 1): -1, (1, 2): 1, (1, 3): 1,
    (2, 0): 1, (2, 1): 0, (2, 2): -1, (2, 3): 1,
    (3, 0): 0, (3, 1): 1, (3, 2): -1, (3, 3): -1,
}  # fmt: skip
"""PRM judge decision (+1 / -1 / 0) per (prompt index, sample index): a fixed stand-in judge."""


def tiny_policy(seed: int = 0) -> LlamaForCausalLM:
    """A ~6M-parameter Llama with SmolLM2's vocabulary, randomly initialised from ``seed``."""
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        pad_token_id=PAD_ID,
    )
    with torch.random.fork_rng():  # seeded init without touching the caller's RNG state
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model


@dataclass(frozen=True)
class ReferenceBatch:
    """A recorded batch: what the gateway stores per turn plus the judge's decision.

    Lists are per completion ``i``; ``sampling_logprobs[i][t]`` is the engine's log-prob (after
    temperature) of ``completion_ids[i][t]``.
    """

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    sampling_logprobs: list[list[float]]
    truncated: list[bool]
    group_ids: list[int]
    policy_versions: list[int]
    rewards: list[float] = field(default_factory=list)
    """Judge rewards; empty until ``judge`` fills them."""

    def select(self, indices: tuple[int, ...]) -> ReferenceBatch:
        """The completions at ``indices``, in that order."""

        def pick(values: list[_T]) -> list[_T]:
            return [values[i] for i in indices]

        return ReferenceBatch(
            prompt_ids=pick(self.prompt_ids),
            completion_ids=pick(self.completion_ids),
            sampling_logprobs=pick(self.sampling_logprobs),
            truncated=pick(self.truncated),
            group_ids=pick(self.group_ids),
            policy_versions=pick(self.policy_versions),
            rewards=pick(self.rewards) if self.rewards else [],
        )


# ---------------------------------------------------------------------------------------------
# 1. Sample (the engine's job): token ids in, token ids and log-probs out.
# ---------------------------------------------------------------------------------------------


@torch.no_grad()
def sample(
    model: PreTrainedModel,
    prompts: list[list[int]],
    *,
    group_size: int = 4,
    max_new_tokens: int = 8,
    temperature: float = 1.0,
    seed: int = 0,
    policy_version: int = 0,
) -> ReferenceBatch:
    """Sample ``group_size`` completions per prompt and record the sampling log-probs.

    The log-probs are those of the distribution actually sampled from: ``log_softmax(logits / T)``.
    """
    generator = torch.Generator().manual_seed(seed)
    stop = torch.zeros(VOCAB_SIZE, dtype=torch.bool)
    stop[list(STOP_IDS)] = True
    batch = ReferenceBatch([], [], [], [], [], [])
    for group_id, prompt in enumerate(prompts):
        ids = torch.tensor([prompt] * group_size)
        done = torch.zeros(group_size, dtype=torch.bool)
        completions: list[list[int]] = [[] for _ in range(group_size)]
        logprobs: list[list[float]] = [[] for _ in range(group_size)]
        for _ in range(max_new_tokens):
            logits = model(input_ids=ids).logits[:, -1, :].float() / temperature
            token_logprobs = torch.log_softmax(logits, dim=-1)
            tokens = torch.multinomial(token_logprobs.exp(), 1, generator=generator).squeeze(-1)
            chosen = token_logprobs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
            for row in range(group_size):
                if not done[row]:
                    completions[row].append(int(tokens[row]))
                    logprobs[row].append(float(chosen[row]))
            done |= stop[tokens]
            if bool(done.all()):
                break
            ids = torch.cat([ids, tokens.unsqueeze(-1)], dim=-1)
        for row in range(group_size):
            batch.prompt_ids.append(list(prompt))
            batch.completion_ids.append(completions[row])
            batch.sampling_logprobs.append(logprobs[row])
            batch.truncated.append(not bool(done[row]))
            batch.group_ids.append(group_id)
            batch.policy_versions.append(policy_version)
    return batch


# ---------------------------------------------------------------------------------------------
# 2. Judge: here a fixed table instead of PRM votes.
# ---------------------------------------------------------------------------------------------


def judge(batch: ReferenceBatch, table: dict[tuple[int, int], int] = JUDGE_TABLE) -> ReferenceBatch:
    """Fill ``rewards`` from ``table[(group id, index within group)]``."""
    seen: dict[int, int] = {}
    rewards: list[float] = []
    for group_id in batch.group_ids:
        index = seen.get(group_id, 0)
        seen[group_id] = index + 1
        rewards.append(float(table[(group_id, index)]))
    return ReferenceBatch(
        prompt_ids=batch.prompt_ids,
        completion_ids=batch.completion_ids,
        sampling_logprobs=batch.sampling_logprobs,
        truncated=batch.truncated,
        group_ids=batch.group_ids,
        policy_versions=batch.policy_versions,
        rewards=rewards,
    )


# ---------------------------------------------------------------------------------------------
# 3. Collate: right-padded [B, L] ids and [B, L-1] per-next-token tensors.
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainTensors:
    """Position ``t`` of the ``[B, L-1]`` tensors is the prediction of ``input_ids[:, t + 1]``."""

    input_ids: Tensor  # [B, L] long
    attention_mask: Tensor  # [B, L] long
    loss_mask: Tensor  # [B, L-1] bool: completion tokens
    sampling_logprobs: Tensor  # [B, L-1] float
    truncated: Tensor  # [B] bool
    rewards: Tensor  # [B] float
    group_ids: Tensor  # [B] long


def collate(batch: ReferenceBatch, dtype: torch.dtype = torch.float32) -> TrainTensors:
    """Concatenate prompt and completion ids, right-pad, and align the engine's log-probs."""
    rows = [p + c for p, c in zip(batch.prompt_ids, batch.completion_ids, strict=True)]
    length = max(len(row) for row in rows)
    size = len(rows)
    input_ids = torch.full((size, length), PAD_ID, dtype=torch.long)
    attention_mask = torch.zeros((size, length), dtype=torch.long)
    loss_mask = torch.zeros((size, length - 1), dtype=torch.bool)
    sampling = torch.zeros((size, length - 1), dtype=dtype)
    for i, row in enumerate(rows):
        input_ids[i, : len(row)] = torch.tensor(row)
        attention_mask[i, : len(row)] = 1
        start = len(batch.prompt_ids[i]) - 1  # the position that predicts the first completion id
        end = start + len(batch.completion_ids[i])
        loss_mask[i, start:end] = True
        sampling[i, start:end] = torch.tensor(batch.sampling_logprobs[i], dtype=dtype)
    return TrainTensors(
        input_ids=input_ids,
        attention_mask=attention_mask,
        loss_mask=loss_mask,
        sampling_logprobs=sampling,
        truncated=torch.tensor(batch.truncated, dtype=torch.bool),
        rewards=torch.tensor(batch.rewards, dtype=dtype),
        group_ids=torch.tensor(batch.group_ids, dtype=torch.long),
    )


def token_logprobs(
    model: PreTrainedModel, tensors: TrainTensors, temperature: float = 1.0
) -> tuple[Tensor, Tensor]:
    """``[B, L-1]`` log-probs of the next ids (after temperature) and the per-position entropy."""
    logits = model(input_ids=tensors.input_ids, attention_mask=tensors.attention_mask).logits
    logprobs_all = torch.log_softmax(logits[:, :-1, :].float() / temperature, dim=-1)
    chosen = logprobs_all.gather(-1, tensors.input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    entropy = -(logprobs_all.exp() * logprobs_all).sum(dim=-1)
    return chosen, entropy.detach()


# ---------------------------------------------------------------------------------------------
# 4. One step: drop stale -> advantages -> loss -> backward -> (optimizer step).
# ---------------------------------------------------------------------------------------------


def run_reference_step(
    model: PreTrainedModel,
    batch: ReferenceBatch,
    *,
    advantage_config: AdvantageConfig | None = None,
    loss_config: LossConfig | None = None,
    ref_model: PreTrainedModel | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    temperature: float = 1.0,
    trainer_version: int | None = None,
    max_lag: int = 4,
) -> dict[str, object]:
    """One training step on a judged batch; the trainer's oracle.

    Args:
        model: the policy, any causal LM called as ``model(input_ids=, attention_mask=).logits``
            (e.g. ``tiny_policy()`` here or ``clawrl.models.tiny_policy().model``); its ``.grad``
            are overwritten.
        batch: judged completions (``rewards`` filled).
        advantage_config: default ``BinaryRLAdvantage()``.
        loss_config: default ``PPOClipLoss()`` (β = 0.02, so ``ref_model`` is needed).
        ref_model: frozen reference policy for the KL penalty; None when β = 0.
        optimizer: stepped (and its gradients zeroed) when given; None leaves ``.grad`` in place.
        temperature: the sampling temperature, applied to the trainer's logits too.
        trainer_version: when given, samples older than ``max_lag`` versions are dropped first.
        max_lag: staleness bound K.

    Returns:
        ``{"loss": float, "grad_norm": float, "num_samples": int, "stale/dropped": int,
        "metrics": {loss and advantage metrics}}``; ``grad_norm`` is the global L2 norm of the
        gradient before the optimizer step.
    """
    advantage_config = advantage_config if advantage_config is not None else BinaryRLAdvantage()
    loss_config = loss_config if loss_config is not None else PPOClipLoss()

    num_dropped = 0
    if trainer_version is not None:
        staleness = drop_stale(batch.policy_versions, trainer_version, max_lag=max_lag)
        batch = batch.select(staleness.kept)
        num_dropped = staleness.num_dropped

    tensors = collate(batch)
    model.zero_grad(set_to_none=True)
    policy_logprobs, entropy = token_logprobs(model, tensors, temperature)
    ref_logprobs = None
    if ref_model is not None:
        with torch.no_grad():
            ref_logprobs, _ = token_logprobs(ref_model, tensors, temperature)

    advantages = compute_advantages(
        advantage_config,
        AdvantageInputs(
            loss_mask=tensors.loss_mask, rewards=tensors.rewards, group_ids=tensors.group_ids
        ),
    )
    outputs = compute_loss(
        loss_config,
        LossInputs(
            policy_logprobs=policy_logprobs,
            sampling_logprobs=tensors.sampling_logprobs,
            advantages=advantages.advantages,
            loss_mask=tensors.loss_mask,
            ref_logprobs=ref_logprobs,
            entropy=entropy,
            truncated=tensors.truncated,
        ),
    )
    outputs.loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    grad_norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    if optimizer is not None:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return {
        "loss": float(outputs.loss.detach()),
        "grad_norm": float(grad_norm),
        "num_samples": len(batch.completion_ids),
        "stale/dropped": num_dropped,
        "metrics": {**advantages.metrics, **outputs.metrics},
    }


def main() -> None:
    """Sample, judge, and take one step on the tiny policy; print the result as JSON."""
    model = tiny_policy(seed=0)
    ref_model = copy.deepcopy(model).eval().requires_grad_(False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    batch = judge(sample(model, PROMPTS, group_size=4, max_new_tokens=8, seed=0, policy_version=0))
    result = run_reference_step(
        model, batch, ref_model=ref_model, optimizer=optimizer, trainer_version=0
    )
    assert math.isfinite(result["loss"])  # type: ignore[arg-type]
    print(json.dumps(result, indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
