"""Collating TrainSamples into right-padded tensors aligned on completion tokens."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from clawrl.engine.sampling import GREEDY_BELOW
from clawrl.trainer.types import TrainSample


@dataclass
class Batch:
    """Right-padded tensors for ``B`` samples; ``L`` = longest prompt + completion.

    ``[B, L-1]`` tensors are aligned with *next-token* positions: position ``t`` holds the
    log-prob of ``input_ids[:, t+1]``. ``loss_mask`` is True exactly on completion tokens.
    """

    input_ids: Tensor  # [B, L] long
    attention_mask: Tensor  # [B, L] long
    loss_mask: Tensor  # [B, L-1] bool
    sampling_logprobs: Tensor  # [B, L-1] float
    teacher_logprobs: Tensor  # [B, L-1] float, 0 where no hint (``has_hint`` False)
    has_hint: Tensor  # [B] bool
    rewards: Tensor  # [B] float (0 where None)
    has_reward: Tensor  # [B] bool
    temperature: Tensor  # [B] float
    truncated: Tensor  # [B] bool
    group_ids: Tensor  # [B] long
    episode_ids: Tensor  # [B] long, equal for samples of one episode (rollout)


def collate(samples: list[TrainSample], pad_id: int = 0) -> Batch:
    """Build a :class:`Batch`; raises ValueError on an empty list."""
    if not samples:
        raise ValueError("cannot collate an empty batch")
    length = max(len(s.prompt_ids) + len(s.completion_ids) for s in samples)
    b = len(samples)
    input_ids = torch.full((b, length), pad_id, dtype=torch.long)
    attention = torch.zeros((b, length), dtype=torch.long)
    loss_mask = torch.zeros((b, length - 1), dtype=torch.bool)
    sampling = torch.zeros((b, length - 1), dtype=torch.float32)
    teacher = torch.zeros((b, length - 1), dtype=torch.float32)
    for i, s in enumerate(samples):
        seq = s.prompt_ids + s.completion_ids
        input_ids[i, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        attention[i, : len(seq)] = 1
        start, end = len(s.prompt_ids) - 1, len(seq) - 1
        loss_mask[i, start:end] = True
        sampling[i, start:end] = torch.tensor(s.sampling_logprobs, dtype=torch.float32)
        if s.teacher_logprobs is not None:
            teacher[i, start:end] = torch.tensor(s.teacher_logprobs, dtype=torch.float32)
    return Batch(
        input_ids=input_ids,
        attention_mask=attention,
        loss_mask=loss_mask,
        sampling_logprobs=sampling,
        teacher_logprobs=teacher,
        has_hint=torch.tensor([s.teacher_logprobs is not None for s in samples]),
        rewards=torch.tensor([s.reward or 0.0 for s in samples], dtype=torch.float32),
        has_reward=torch.tensor([s.reward is not None for s in samples]),
        temperature=torch.tensor([s.temperature for s in samples], dtype=torch.float32),
        truncated=torch.tensor([s.truncated for s in samples]),
        group_ids=torch.tensor([s.group_id for s in samples], dtype=torch.long),
        episode_ids=torch.tensor(_episode_index(samples), dtype=torch.long),
    )


def _episode_index(samples: list[TrainSample]) -> list[int]:
    """A dense index per distinct episode; a sample without ``episode_id`` is its own."""
    index: dict[str, int] = {}
    out = []
    for i, s in enumerate(samples):
        key = f"e:{s.episode_id}" if s.episode_id else f"s:{i}"
        out.append(index.setdefault(key, len(index)))
    return out


def token_logprobs(model: torch.nn.Module, batch: Batch) -> tuple[Tensor, Tensor]:
    """Log-probs of each next token under ``model`` at each row's sampling temperature.

    Only positions from the batch's first completion token on are projected to the vocabulary
    (``logits_to_keep``): prompt positions would otherwise cost ``[B, L, vocab]`` floats several
    times over (log-softmax, entropy, autograd), which for long agent prompts is most of a
    step's memory. Log-probs are ``x_a - logsumexp(x)`` rather than a gathered log-softmax,
    and the entropy is computed row by row without gradient, so the only ``[B, K, vocab]``
    tensors autograd keeps are the logits (and the temperature-scaled copy when a row's
    temperature is not 1). Positions before ``start`` hold 0 in both outputs (they are never in
    ``loss_mask``).

    Returns:
        ``([B, L-1] log-probs with gradient, [B, L-1] entropy without gradient)``. Greedy rows
        (temperature 0) use temperature 1, matching the engine (``clawrl.engine.sampling``).
    """
    length = batch.input_ids.shape[1]
    cols = batch.loss_mask.any(0).nonzero()
    start = int(cols[0]) if cols.numel() else 0  # first next-token position any row trains
    keep = length - start  # logits of positions start .. L-1
    logits = model(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, logits_to_keep=keep
    ).logits
    if logits.shape[1] != keep:  # a model that ignores logits_to_keep returns every position
        logits = logits[:, -keep:]
    greedy = batch.temperature < GREEDY_BELOW  # as the engine: such rows are scored at 1
    temp = torch.where(greedy, torch.ones_like(batch.temperature), batch.temperature)
    x = logits[:, :-1, :]
    if x.dtype not in (torch.float32, torch.float64):  # bf16 / fp16 logits: softmax in fp32
        x = x.float()
    if bool((temp != 1).any()):
        x = x / temp[:, None, None]
    # log p(a) = x_a - logsumexp(x): unlike log_softmax, nothing [B, K, vocab] is kept for the
    # backward pass beyond the logits themselves (logsumexp saves its input by reference).
    lse = torch.logsumexp(x, dim=-1)
    chosen = x.gather(-1, batch.input_ids[:, start + 1 :, None]).squeeze(-1) - lse
    with torch.no_grad():  # H = lse - sum(p * x), one row at a time: [K, vocab] temporaries
        entropy = torch.stack(
            [lse[b] - (torch.softmax(x[b], dim=-1) * x[b]).sum(-1) for b in range(x.shape[0])]
        )
    pad = (start, 0)  # left-pad the prompt positions back: outputs are [B, L-1]
    return torch.nn.functional.pad(chosen, pad), torch.nn.functional.pad(entropy, pad)
