"""Training a :class:`~clawrl.judge.head.HeadSet` (``clawrl judge train``).

Everything is chosen on training data, never on a held-out set:

1. features of the ``train`` and ``val`` synthetic cases (:mod:`clawrl.judge.synthetic`; ``val``
   is phrased with pool entries ``train`` never uses);
2. the L2 strength: the grid value whose all-layer probe, fit on ``train``, is most accurate on
   ``val``;
3. ``min_confidence``: the top-probability quantile of vote 0 on ``val`` that keeps
   ``coverage`` of the cases (a vote below it abstains);
4. the probes, refit on ``train`` + ``val`` (+ ``extra``, human-written labeled cases, each
   counted ``extra_weight`` times): probe 0 on all layers and all cases, then every feature set
   (all layers, each layer alone) in turn, each on its own bootstrap resample; every probe with
   its hint gate (a binary probe on the same features and resample: does the next state carry a
   directive?).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from clawrl.judge.cases import JudgeCase
from clawrl.judge.head import FeatureExtractor, HeadSet, fit_probe, label_index, next_state_view

Progress = Callable[[str], None]


def _features(
    extractor: FeatureExtractor,
    cases: Sequence[JudgeCase],
    progress: Progress = lambda line: None,
    what: str = "cases",
) -> torch.Tensor:
    """Features of ``cases``, reporting about every 10 % with the time left (the judge model's
    forward passes are most of a head's training time)."""
    t0 = time.perf_counter()
    step = max(1, len(cases) // 10)
    marks = {"next": step}

    def on_batch(done: int, total: int) -> None:
        if done < marks["next"] and done < total:
            return
        marks["next"] = done + step
        elapsed = time.perf_counter() - t0
        left = elapsed / done * (total - done)
        progress(f"{what}: {done}/{total} features, {elapsed:.0f} s, about {left:.0f} s left")

    return extractor.features([next_state_view(c.input) for c in cases], on_batch)


def _labels(cases: Sequence[JudgeCase]) -> torch.Tensor:
    return torch.tensor([label_index(c.expected_score) for c in cases], dtype=torch.long)


def feature_sets(extractor: FeatureExtractor) -> list[tuple[str, torch.Tensor]]:
    """``(name, columns)``: all layers first, then each layer's block alone."""
    h = extractor.hidden
    sets = [("all", torch.arange(extractor.dim))]
    for k, layer in enumerate(extractor.layers):
        sets.append((f"layer{layer}", torch.arange(k * h, (k + 1) * h)))
    return sets


def train_head_set(
    extractor: FeatureExtractor,
    train: Sequence[JudgeCase],
    val: Sequence[JudgeCase],
    *,
    extra: Sequence[JudgeCase] = (),
    extra_weight: float = 3.0,
    probes: int = 32,
    l2_grid: Sequence[float] = (0.01, 0.03, 0.1, 0.3),
    coverage: float = 0.95,
    seed: int = 0,
    progress: Progress = lambda line: None,
) -> HeadSet:
    """Train the probes of a judge head (see the module docstring).

    Args:
        extractor: the judge model's feature extractor.
        train / val: labeled cases (disjoint phrasing).
        extra: more labeled cases, used only in the final fit (not to choose anything).
        extra_weight: how many times each ``extra`` case counts.
        probes: how many probes (votes) the head set offers.
        l2_grid: L2 strengths tried on ``val``.
        coverage: the fraction of ``val`` cases vote 0 must not abstain on.
        seed: bootstrap resamples.
        progress: called with one line per stage.

    Raises:
        ValueError: ``train`` or ``val`` is empty, or ``probes < 1``.
    """
    if not train or not val or probes < 1:
        raise ValueError("training a judge head needs train and val cases and probes >= 1")
    t0 = time.perf_counter()
    progress(f"features of {len(train)} train + {len(val)} val cases (judge model forward passes)")
    x_train = _features(extractor, train, progress, "train")
    x_val = _features(extractor, val, progress, "val")
    y_train, y_val = _labels(train), _labels(val)
    progress(f"features done in {time.perf_counter() - t0:.0f} s")
    sets = feature_sets(extractor)
    scan: dict[str, float] = {}
    for l2 in l2_grid:
        probe = fit_probe(x_train, y_train, sets[0][1], l2=l2, name="scan")
        scan[str(l2)] = float((probe.probs(x_val).argmax(-1) == y_val).float().mean())
        progress(f"l2 {l2:g}: val accuracy {scan[str(l2)]:.3f}")
    best = max(l2_grid, key=lambda v: (scan[str(v)], v))
    first = fit_probe(x_train, y_train, sets[0][1], l2=best, name="scan")
    confidence = first.probs(x_val).max(-1).values
    threshold = float(torch.quantile(confidence, 1.0 - coverage)) if coverage < 1 else 0.0
    kept = confidence >= threshold
    val_acc = float((first.probs(x_val).argmax(-1) == y_val)[kept].float().mean())
    progress(
        f"chosen l2 {best:g}; min_confidence {threshold:.3f} keeps {float(kept.float().mean()):.3f}"
        f" of val at accuracy {val_acc:.3f}"
    )
    everything = [*train, *val, *extra]
    parts = [x_train, x_val]
    if extra:
        progress(f"features of {len(extra)} extra cases")
        parts.append(_features(extractor, extra))
    x_all, y_all = torch.cat(parts), _labels(everything)
    h_all = torch.tensor([int(c.has_hint) for c in everything], dtype=torch.long)
    base = torch.ones(len(everything), dtype=torch.float64)
    base[len(train) + len(val) :] = extra_weight
    gen = torch.Generator().manual_seed(seed)
    out, gates = [], []
    for i in range(probes):
        set_name, columns = sets[i % len(sets)]
        if i == 0:
            weights, name = base, "all/full"
        else:
            draw = torch.multinomial(base, len(base), replacement=True, generator=gen)
            weights = torch.bincount(draw, minlength=len(base)).double()
            name = f"{set_name}/bootstrap{i}"
        out.append(fit_probe(x_all, y_all, columns, l2=best, name=name, sample_weight=weights))
        gates.append(
            fit_probe(
                x_all, h_all, columns, l2=best, name=f"hint/{name}", sample_weight=weights,
                classes=2,
            )
        )  # fmt: skip
    progress(f"{probes} probes and hint gates fit in {time.perf_counter() - t0:.0f} s")
    facts: dict[str, Any] = {
        "train_cases": len(train),
        "val_cases": len(val),
        "extra_cases": len(extra),
        "extra_weight": extra_weight,
        "l2_scan_val_accuracy": scan,
        "l2": best,
        "coverage_target": coverage,
        "val_accuracy_vote0": val_acc,
        "seed": seed,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    return HeadSet(out, gates, extractor.identity, list(extractor.layers), threshold, facts)
