"""processed_logprobs against hand-computed distributions."""

from __future__ import annotations

import math

import torch

from clawrl.engine import processed_logprobs, sample_rows

PROBS = [0.5, 0.2, 0.15, 0.1, 0.05]


def _lp(temperature=1.0, top_k=0, top_p=1.0):
    logits = torch.log(torch.tensor([PROBS], dtype=torch.float64)) + 3.0  # shift: no effect
    return processed_logprobs(
        logits, torch.tensor([temperature]), torch.tensor([top_k]), torch.tensor([top_p])
    )[0]


def test_plain_is_log_softmax():
    assert torch.allclose(_lp().exp(), torch.tensor(PROBS, dtype=torch.float32), atol=1e-6)


def test_top_p_keeps_smallest_set_reaching_mass():
    # mass before token: 0, 0.5, 0.7 -> with top_p 0.6 keep the first two, renormalised
    got = _lp(top_p=0.6).exp()
    assert torch.allclose(got, torch.tensor([5 / 7, 2 / 7, 0, 0, 0]), atol=1e-6)
    # top_p smaller than the first token's mass still keeps the first token
    assert torch.allclose(_lp(top_p=0.1).exp(), torch.tensor([1.0, 0, 0, 0, 0]), atol=1e-6)


def test_top_k_and_temperature():
    got = _lp(top_k=3).exp()
    assert torch.allclose(got, torch.tensor([0.5, 0.2, 0.15, 0, 0]) / 0.85, atol=1e-6)
    hot = _lp(temperature=0.5).exp()
    sq = torch.tensor(PROBS) ** 2
    assert torch.allclose(hot, sq / sq.sum(), atol=1e-6)
    assert math.isinf(float(_lp(top_k=1)[1]))


def test_greedy_row_uses_temperature_one_and_argmax():
    lp = processed_logprobs(
        torch.log(torch.tensor([PROBS, PROBS])),
        torch.tensor([0.0, 1.0]),
        torch.tensor([1, 0]),  # top_k is ignored for the greedy row
        torch.tensor([0.1, 1.0]),
    )
    assert torch.allclose(lp[0].exp(), torch.tensor(PROBS), atol=1e-6)
    ids = sample_rows(lp, [True, False], [None, torch.Generator().manual_seed(0)])
    assert int(ids[0]) == 0
