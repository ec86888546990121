"""Collating TrainSamples into right-padded tensors aligned on completion tokens."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

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
    student_logprobs: Tensor  # [B, L-1] float, the OPD advantage's student term (sampling's
    # where the sample has no ``student_logprobs``)
    has_hint: Tensor  # [B] bool
    rewards: Tensor  # [B] float (0 where None)
    has_reward: Tensor  # [B] bool
    temperature: Tensor  # [B] float
    truncated: Tensor  # [B] bool
    group_ids: Tensor  # [B] long
    episode_ids: Tensor  # [B] long, equal for samples of one episode (rollout)
    step_index: Tensor  # [B] long, the sample's step within its episode
    step_scores: Tensor  # [B] float, the judge's score of the step (0 where None)
    has_step_score: Tensor  # [B] bool

    def to(self, device: torch.device | str) -> Batch:
        """The same batch with every tensor on ``device`` (itself when they are there)."""
        device = torch.device(device)
        if self.input_ids.device == device:
            return self
        return Batch(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})


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
    student = torch.zeros((b, length - 1), dtype=torch.float32)
    for i, s in enumerate(samples):
        seq = s.prompt_ids + s.completion_ids
        input_ids[i, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        attention[i, : len(seq)] = 1
        start, end = len(s.prompt_ids) - 1, len(seq) - 1
        loss_mask[i, start:end] = True
        sampling[i, start:end] = torch.tensor(s.sampling_logprobs, dtype=torch.float32)
        if s.teacher_logprobs is not None:
            teacher[i, start:end] = torch.tensor(s.teacher_logprobs, dtype=torch.float32)
        own = s.student_logprobs if s.student_logprobs is not None else s.sampling_logprobs
        student[i, start:end] = torch.tensor(own, dtype=torch.float32)
    return Batch(
        input_ids=input_ids,
        attention_mask=attention,
        loss_mask=loss_mask,
        sampling_logprobs=sampling,
        teacher_logprobs=teacher,
        student_logprobs=student,
        has_hint=torch.tensor([s.teacher_logprobs is not None for s in samples]),
        rewards=torch.tensor([s.reward or 0.0 for s in samples], dtype=torch.float32),
        has_reward=torch.tensor([s.reward is not None for s in samples]),
        temperature=torch.tensor([s.temperature for s in samples], dtype=torch.float32),
        truncated=torch.tensor([s.truncated for s in samples]),
        group_ids=torch.tensor([s.group_id for s in samples], dtype=torch.long),
        episode_ids=torch.tensor(_episode_index(samples), dtype=torch.long),
        step_index=torch.tensor([s.step_index for s in samples], dtype=torch.long),
        step_scores=torch.tensor([s.step_score or 0.0 for s in samples], dtype=torch.float32),
        has_step_score=torch.tensor([s.step_score is not None for s in samples]),
    )


def step_reward_inputs(batch: Batch) -> tuple[Tensor, Tensor, Tensor]:
    """The step tensors :func:`clawrl.algorithms.prm_outcome_advantages` reads, for a batch
    whose rows are the turns (steps) of episodes (rollouts).

    Row ``i`` is step ``s_i`` (``step_index``) of its episode; ``S = max s_i + 1``. Each row has
    exactly its own step: ``step_mask[i, s_i]`` is True and every token of the row points to
    it, so a (group, step) cell holds one row per episode that has that step, as the formula's
    rollouts. A step without a judge score (``has_step_score`` False: no next state, a judge
    failure) contributes a PRM term of 0, so its reward is the outcome alone; the step is still
    trained (OpenClaw-RL's step_mask says which steps a rollout has, not which were judged).

    Returns:
        ``(step_scores [B, S] float, step_mask [B, S] bool, token_steps [B, T] long)`` with
        ``T = loss_mask.shape[1]``.

    Raises:
        ValueError: two rows of one episode are the same step (a step would count twice in its
            cell).
    """
    steps = batch.step_index
    pairs = torch.stack([batch.episode_ids, steps], dim=1)
    if torch.unique(pairs, dim=0).shape[0] != pairs.shape[0]:
        raise ValueError("two samples of one episode have the same step_index")
    b = steps.shape[0]
    num_steps = int(steps.max()) + 1 if b else 1
    rows = torch.arange(b)
    step_mask = torch.zeros((b, num_steps), dtype=torch.bool)
    step_mask[rows, steps] = True
    step_scores = torch.zeros((b, num_steps), dtype=batch.step_scores.dtype)
    step_scores[rows, steps] = torch.where(
        batch.has_step_score, batch.step_scores, torch.zeros_like(batch.step_scores)
    )
    token_steps = steps.unsqueeze(-1).expand(batch.loss_mask.shape).clone()
    return step_scores, step_mask, token_steps


def _episode_index(samples: list[TrainSample]) -> list[int]:
    """A dense index per distinct episode; a sample without ``episode_id`` is its own."""
    index: dict[str, int] = {}
    out = []
    for i, s in enumerate(samples):
        key = f"e:{s.episode_id}" if s.episode_id else f"s:{i}"
        out.append(index.setdefault(key, len(index)))
    return out


LOGIT_CHUNK_TOKENS = 256
"""Trained positions projected to the vocabulary at once (:func:`token_logprobs`): the largest
``[chunk, vocab]`` float32 tensor a step holds (256 x 49,152 x 4 bytes = 50 MB for SmolLM2)."""


def _decoder_and_head(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module] | None:
    """``(decoder, lm_head)`` of a Hugging Face causal LM (through a PEFT wrapper), or ``None``
    when the model's logits are not ``lm_head(decoder(...).last_hidden_state)`` as is (logit
    soft-capping or scaling, a model without the usual layout)."""
    get_base: Any = getattr(model, "get_base_model", None)
    base: Any = get_base() if callable(get_base) else model
    config = getattr(base, "config", None)
    if config is None or any(
        getattr(config, k, None) not in (None, 1.0)
        for k in ("final_logit_softcapping", "logit_scale", "logits_scaling")
    ):
        return None
    prefix = getattr(base, "base_model_prefix", "")
    decoder = getattr(base, prefix, None) if prefix else None
    get_head: Any = getattr(base, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    if not isinstance(decoder, torch.nn.Module) or not isinstance(head, torch.nn.Module):
        return None
    return decoder, head


def _chunk_logprobs(
    head: torch.nn.Module, hidden: Tensor, targets: Tensor, temperature: Tensor
) -> tuple[Tensor, Tensor]:
    """``[n]`` log-probs of ``targets`` and ``[n]`` entropies (no gradient) for ``[n, H]``
    hidden states, at per-position ``temperature`` (``[n]``)."""
    x = head(hidden).to(temperature.dtype)  # bf16 / fp16 logits: softmax in fp32
    x = x / temperature[:, None]
    lse = torch.logsumexp(x, dim=-1)
    chosen = x.gather(-1, targets[:, None]).squeeze(-1) - lse
    with torch.no_grad():
        entropy = lse - (torch.softmax(x, dim=-1) * x).sum(-1)
    return chosen, entropy


def token_logprobs(
    model: torch.nn.Module, batch: Batch, *, chunk_tokens: int = LOGIT_CHUNK_TOKENS
) -> tuple[Tensor, Tensor]:
    """Log-probs of each next token under ``model`` at each row's sampling temperature.

    Only the trained positions (``loss_mask``) are projected to the vocabulary, ``chunk_tokens``
    at a time, each chunk under activation checkpointing: the decoder runs once over the padded
    batch, its hidden states at the trained positions (``[N, H]``, N = trained tokens) go through
    the output layer chunk by chunk, and the backward pass recomputes a chunk's logits instead
    of keeping them. So no ``[B, L, vocab]`` (or ``[N, vocab]``) tensor ever exists: a step's
    logit memory is one ``[chunk, vocab]`` float32 block, whatever the prompts' lengths, where
    projecting every position from the batch's first completion token on cost
    ``B x K x vocab`` floats several times over (K spans the other rows' prompts and padding).
    The price is one more output-layer matmul per trained token in the backward pass. Log-probs
    are ``x_a - logsumexp(x)`` with ``x = logits / T``; entropies ``H = lse - sum(p * x)`` are
    computed without gradient. A model whose logits are not ``lm_head(last_hidden_state)``
    (soft-capping, logit scaling, an unusual layout) is projected whole instead.

    Returns:
        ``([B, L-1] log-probs with gradient, [B, L-1] entropy without gradient)``, 0 outside
        ``loss_mask``. Greedy rows (temperature 0) use temperature 1, matching the engine
        (``clawrl.engine.sampling``).
    """
    greedy = batch.temperature < GREEDY_BELOW  # as the engine: such rows are scored at 1
    temp = torch.where(greedy, torch.ones_like(batch.temperature), batch.temperature)
    parts = _decoder_and_head(model)
    if parts is None:
        return _token_logprobs_whole(model, batch, temp)
    decoder, head = parts
    hidden = decoder(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False
    ).last_hidden_state  # [B, L, H]
    rows, cols = batch.loss_mask.nonzero(as_tuple=True)  # position t predicts input_ids[t + 1]
    picked = hidden[rows, cols]  # [N, H]
    targets = batch.input_ids[rows, cols + 1]
    dtype = torch.float64 if picked.dtype == torch.float64 else torch.float32  # of the softmax
    row_temp = temp[rows].to(dtype)  # [N]
    chosen_parts, entropy_parts = [], []
    step = max(1, int(chunk_tokens))
    for s in range(0, picked.shape[0], step):
        args = (head, picked[s : s + step], targets[s : s + step], row_temp[s : s + step])
        if torch.is_grad_enabled():
            lp, ent = torch.utils.checkpoint.checkpoint(_chunk_logprobs, *args, use_reentrant=False)
        else:
            lp, ent = _chunk_logprobs(*args)
        chosen_parts.append(lp)
        entropy_parts.append(ent)
    shape = batch.loss_mask.shape
    chosen = torch.zeros(shape, dtype=dtype, device=picked.device)
    entropy = torch.zeros(shape, dtype=dtype, device=picked.device)
    if chosen_parts:
        chosen = chosen.index_put((rows, cols), torch.cat(chosen_parts))
        entropy[rows, cols] = torch.cat(entropy_parts).detach()
    return chosen, entropy


def _token_logprobs_whole(
    model: torch.nn.Module, batch: Batch, temp: Tensor
) -> tuple[Tensor, Tensor]:
    """:func:`token_logprobs` for models whose logits need the model's own head: every position
    from the batch's first completion token on is projected (``logits_to_keep``)."""
    length = batch.input_ids.shape[1]
    cols = batch.loss_mask.any(0).nonzero()
    start = int(cols[0]) if cols.numel() else 0  # first next-token position any row trains
    keep = length - start  # logits of positions start .. L-1
    logits = model(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, logits_to_keep=keep
    ).logits
    if logits.shape[1] != keep:  # a model that ignores logits_to_keep returns every position
        logits = logits[:, -keep:]
    x = logits[:, :-1, :]
    if x.dtype not in (torch.float32, torch.float64):  # bf16 / fp16 logits: softmax in fp32
        x = x.float()
    if bool((temp != 1).any()):
        x = x / temp[:, None, None]
    lse = torch.logsumexp(x, dim=-1)
    chosen = x.gather(-1, batch.input_ids[:, start + 1 :, None]).squeeze(-1) - lse
    with torch.no_grad():  # H = lse - sum(p * x), one row at a time: [K, vocab] temporaries
        entropy = torch.stack(
            [lse[b] - (torch.softmax(x[b], dim=-1) * x[b]).sum(-1) for b in range(x.shape[0])]
        )
    pad = (start, 0)  # left-pad the prompt positions back: outputs are [B, L-1]
    chosen = torch.nn.functional.pad(chosen, pad) * batch.loss_mask
    return chosen, torch.nn.functional.pad(entropy, pad) * batch.loss_mask


class TokenLogprobs(torch.nn.Module):
    """:func:`token_logprobs` of ``model`` as a module: ``forward(batch) -> (log-probs, entropy)``.

    The trainer calls the policy through it so that, under FSDP2, this module is the sharding
    root: its forward hooks gather the root's parameters (embeddings, final norm, the tied output
    layer) around :func:`token_logprobs`, which calls the decoder and the output layer itself
    (the decoder layers are sharded units of their own). Without FSDP it adds nothing.

    Args:
        model: a causal LM (a PEFT model included).
    """

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, batch: Batch) -> tuple[Tensor, Tensor]:
        """``([B, L-1] log-probs with gradient, [B, L-1] entropy)``; see :func:`token_logprobs`."""
        return token_logprobs(self.model, batch)
