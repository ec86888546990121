"""Per-row logit processing and sampling, shared by generation and scoring.

The log-probs clawrl records are those of the distribution actually sampled from: logits divided
by the temperature, then top-k and top-p filtering, then log-softmax over what is left. Tokens
filtered out get ``-inf``.

Greedy decoding (``temperature == 0``) samples from a point mass, whose log-prob (0) carries no
information; for greedy rows we therefore return the log-prob under the *unfiltered temperature-1*
distribution (the model's plain log-softmax) and the turn's sampling params record temperature 0,
so a trainer knows these tokens were not sampled from a proper distribution.
"""

from __future__ import annotations

import torch

GREEDY_BELOW = 1e-5
"""Temperatures below this are greedy decoding (as vLLM's ``_SAMPLING_EPS``): dividing logits by
a temperature like 1e-40 overflows to infinities and NaN probabilities."""


def is_greedy(temperature: float) -> bool:
    """Whether ``temperature`` means greedy decoding (below :data:`GREEDY_BELOW`)."""
    return temperature < GREEDY_BELOW


def processed_logprobs(
    logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """Log-probs of the sampling distribution for each row.

    Args:
        logits: ``[B, V]`` raw next-token logits (any float dtype; computed in float32).
        temperature: ``[B]``; rows below :data:`GREEDY_BELOW` (0 included) are greedy and get the
            temperature-1 log-softmax.
        top_k: ``[B]`` int; 0 disables.
        top_p: ``[B]`` in (0, 1]; 1 disables.

    Returns:
        ``[B, V]`` float32 log-probs; filtered tokens are ``-inf``.
    """
    logits = logits.float()
    greedy = temperature < GREEDY_BELOW
    temp = torch.where(greedy, torch.ones_like(temperature), temperature).float()
    scaled = logits / temp[:, None]
    vocab = scaled.shape[-1]
    # top-k: keep tokens whose logit is >= the k-th largest (ties kept, like HF's warper)
    k = torch.where((top_k <= 0) | greedy, torch.full_like(top_k, vocab), top_k.clamp(max=vocab))
    if bool((k < vocab).any()):
        kth = torch.topk(scaled, int(k.max()), dim=-1).values  # [B, kmax]
        threshold = kth.gather(-1, (k - 1).clamp(min=0)[:, None].long())
        scaled = scaled.masked_fill(scaled < threshold, float("-inf"))
    # top-p: smallest set of most likely tokens whose mass reaches top_p
    p = torch.where(greedy, torch.ones_like(top_p), top_p).float()
    if bool((p < 1.0).any()):
        sorted_logits, order = torch.sort(scaled, descending=True, dim=-1)
        probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = torch.cumsum(probs, dim=-1) - probs
        drop_sorted = mass_before >= p[:, None]
        drop_sorted[:, 0] = False  # always keep the most likely token
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scaled = scaled.masked_fill(drop, float("-inf"))
    return torch.log_softmax(scaled, dim=-1)


def sample_rows(
    logprobs: torch.Tensor, greedy: list[bool], generators: list[torch.Generator | None]
) -> torch.Tensor:
    """Sample one token per row from ``logprobs`` (``[B, V]``); returns ``[B]`` long ids.

    Greedy rows take the argmax. Each sampled row draws from its own generator (or the global
    RNG when None), so a seeded request is reproducible whatever else is in the batch.
    """
    out = torch.empty(logprobs.shape[0], dtype=torch.long)
    probs = logprobs.exp()
    for i in range(logprobs.shape[0]):
        if greedy[i]:
            out[i] = int(torch.argmax(logprobs[i]))
        else:
            out[i] = int(torch.multinomial(probs[i], 1, generator=generators[i]))
    return out
