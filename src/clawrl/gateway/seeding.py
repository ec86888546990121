"""Seeded sampling for sessions that ask for it.

A session created with ``metadata["sampling_seed"]`` (harness rollouts:
:func:`clawrl.harness.rollout.run_rollout`) has every call that sends no ``seed`` of its own
sampled with a seed fixed by the session's seed, the prompt's token ids, how many turns of the
session were sampled from that same prompt before (a retry, or a harness asking again after an
answer it could not use, gets a fresh sample) and the choice's index. The same run of a harness
on the same weights, sending the same prompts, thus samples the same answers whatever else is in
flight; the seed is recorded with the turn's sampling params like a client's own. Sessions the
gateway infers (no session id in the path, a header or the body) are not seeded.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from clawrl.engine import SamplingParams

SESSION_SEED_KEY = "sampling_seed"
"""The session metadata key holding the session's sampling seed (an int)."""


def session_seed(metadata: Mapping[str, Any] | None) -> int | None:
    """The sampling seed a session's metadata asks for (``None``: unseeded; a bool or a
    non-integer value is no seed)."""
    value = (metadata or {}).get(SESSION_SEED_KEY)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def call_seed(seed: int, prompt_ids: Sequence[int], attempt: int, index: int) -> int:
    """The seed of choice ``index`` of a call with ``prompt_ids`` in a session seeded ``seed``,
    whose turns were sampled from the same prompt ``attempt`` times before; in
    ``[0, 2**31)``."""
    h = hashlib.sha256(f"{seed}:{attempt}:{index}:".encode())
    h.update(",".join(map(str, prompt_ids)).encode())
    return int.from_bytes(h.digest()[:8], "big") % 2**31


def seeded_params(
    params: Sequence[SamplingParams],
    seed: int | None,
    prompt_ids: Sequence[int],
    attempt: int,
) -> list[SamplingParams]:
    """``params`` with a :func:`call_seed` where the client sent none (unchanged when the
    session has no ``seed``)."""
    if seed is None:
        return list(params)
    return [
        p
        if p.seed is not None
        else dataclasses.replace(p, seed=call_seed(seed, prompt_ids, attempt, i))
        for i, p in enumerate(params)
    ]
