"""Pass@k: the unbiased estimator of Chen et al. 2021 ("Evaluating Large Language Models Trained
on Code", arXiv:2107.03374, §2.1)."""

from __future__ import annotations

from collections.abc import Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """``1 - C(n-c, k) / C(n, k)``: the chance that k of n samples (c correct) hold a correct one.

    Computed as ``1 - prod_{i=n-c+1}^{n} (1 - k / i)`` for numerical stability (as the paper's
    reference code).

    Raises:
        ValueError: not ``0 <= c <= n`` or not ``1 <= k <= n``.
    """
    if not (0 <= c <= n) or not (1 <= k <= n):
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def mean_pass_at_k(counts: Sequence[tuple[int, int]], k: int) -> float:
    """Mean of :func:`pass_at_k` over tasks given ``(n, c)`` per task."""
    if not counts:
        raise ValueError("no tasks")
    return sum(pass_at_k(n, c, k) for n, c in counts) / len(counts)
