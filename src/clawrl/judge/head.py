"""A trained judge: linear probes on the frozen judge model's hidden states of the next state.

Why: the embedded SmolLM2-135M cannot follow a judging prompt (generative: no valid ``Score:``
line; choice scoring: 0.71 on the shipped set with prompts chosen on that same set), but its
hidden states separate "the user is happy / unhappy / says nothing about it" and "the command
worked / failed / printed nothing" well. A multinomial logistic regression per probe, trained on
labeled next states made from templates (:mod:`clawrl.judge.synthetic`), reads them.

Features (:class:`FeatureExtractor`): the next state alone, rendered as ``User: <text>`` (a
person: ``user``, ``feedback``) or ``Output: <text>`` (a program: ``tool``, ``environment``), cut
to :data:`~clawrl.judge.prompts.CHOICE_NEXT_STATE_CHARS` characters; the hidden states of
``layers`` (a third, half, two thirds and all of the way up) averaged over its tokens: ``[n,
len(layers) * hidden]``. The request and the answer are left out: trained on template contexts,
they made the probes worse on cases written by people (0.79 vs 0.89 on the shipped set). A
framed view (the next state inside a question, last-token + mean states) scored higher on the
synthetic val split (0.898 vs 0.873) but not on the blind set (0.814 vs 0.824), at half the
speed; the bare view is kept.

Votes (:class:`HeadSet`): probe ``i`` is an independent judgment — its own feature set (all
layers, or one layer) and its own bootstrap resample of the training data — so m votes are m
different classifiers, not one prompt repeated. A vote whose top probability is below the
head set's ``min_confidence`` abstains (``low_margin``).

The trained probes are tied to the judge model they were trained on (:func:`model_identity`);
a different judge model needs ``clawrl judge train --model SPEC``.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from clawrl.errors import JudgeError
from clawrl.judge.prompts import CHOICE_NEXT_STATE_CHARS, cut
from clawrl.judge.types import JudgeInput, NextStateRole, Score

HEAD_VERSION = 1
"""Format version of a saved head set."""

LAYER_FRACTIONS = (1 / 3, 1 / 2, 2 / 3, 1.0)
"""Which hidden layers are read, as fractions of the model's depth."""

CLASSES = (Score.BAD, Score.NEUTRAL, Score.GOOD)
"""Probe output order: column ``k`` is the probability of ``CLASSES[k]``."""

_PERSON = (NextStateRole.USER, NextStateRole.FEEDBACK)
_TENSORS = ("columns", "mean", "std", "weight", "bias")


def default_head_path() -> Path:
    """The head set shipped with clawrl, trained for the embedded SmolLM2-135M-Instruct."""
    return Path(str(resources.files("clawrl") / "data" / "judge_head.safetensors"))


def head_model_spec(path: str | Path) -> str:
    """The judge model spec a head set file was trained on (its ``facts["model"]``, written by
    ``clawrl judge train``; the embedded SmolLM2-135M for a file without one). Reads only the
    file's metadata.

    Raises:
        JudgeError: the file is missing or unreadable.
    """
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = json.loads((f.metadata() or {}).get("clawrl", "{}"))
    except (OSError, ValueError, json.JSONDecodeError) as e:
        raise JudgeError(f"cannot read the judge head {path}: {e}") from e
    model = meta.get("facts", {}).get("model") if isinstance(meta, dict) else None
    return str(model) if model else "smollm2-135m"


def next_state_view(inp: JudgeInput) -> str:
    """What the probes read: ``User: <text>`` or ``Output: <text>`` (``(empty)`` if blank)."""
    ns = inp.next_state
    text = cut(ns.text.strip(), CHOICE_NEXT_STATE_CHARS) or "(empty)"
    return f"{'User' if ns.role in _PERSON else 'Output'}: {text}"


def model_identity(model: Any, tokenizer: Any) -> str:
    """``sha256:<16 hex>`` of the tokenizer fingerprint, the model's shape and a checksum of every
    weight (sum and sum of squares of each parameter, in float64): equal for the same weights,
    different for another model, and for the same base model with a LoRA adapter merged in (which
    leaves the input embeddings as they were, so a checksum of those alone would not tell)."""
    from clawrl.models import tokenizer_fingerprint

    cfg = model.config
    checksums = []
    with torch.no_grad():
        for name, param in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            w = param.detach().double()
            checksums.append(f"{name}:{float(w.sum()):.6e}:{float(w.square().sum()):.6e}")
    payload = json.dumps(
        [tokenizer_fingerprint(tokenizer), int(cfg.hidden_size), int(cfg.num_hidden_layers),
         checksums]
    )  # fmt: skip
    return "sha256:" + hashlib.sha256(payload.encode()).hexdigest()[:16]


def layer_indices(num_layers: int) -> list[int]:
    """Hidden-state indices (0 = embeddings) of :data:`LAYER_FRACTIONS`."""
    return sorted({max(1, round(f * num_layers)) for f in LAYER_FRACTIONS})


class FeatureExtractor:
    """Mean hidden states of ``layers`` over a text's tokens, from the frozen judge model.

    Args:
        model: the judge's causal LM (a private copy: nothing else may run or train it).
        tokenizer: its tokenizer.
        max_tokens: texts are cut to their first this many tokens.
        batch_size: texts per forward pass.

    Thread-safe: one forward pass at a time.
    """

    def __init__(
        self, model: Any, tokenizer: Any, *, max_tokens: int = 160, batch_size: int = 16
    ) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_tokens = max_tokens
        self.batch_size = batch_size
        self.layers = layer_indices(int(model.config.num_hidden_layers))
        self.hidden = int(model.config.hidden_size)
        self.identity = model_identity(model, tokenizer)
        self._lock = threading.Lock()

    @property
    def dim(self) -> int:
        """Feature width: ``len(layers) * hidden``."""
        return len(self.layers) * self.hidden

    @torch.no_grad()
    def features(
        self, texts: Sequence[str], on_batch: Callable[[int, int], None] | None = None
    ) -> Tensor:
        """``[len(texts), dim]`` float32 features (layer blocks in ``layers`` order).

        ``on_batch(done, total)`` is called after each forward pass (texts done so far)."""
        pad = self.tokenizer.pad_token_id
        if pad is None:
            pad = self.tokenizer.eos_token_id
        encoded = [
            self.tokenizer.encode(t, add_special_tokens=False)[: self.max_tokens] or [pad]
            for t in texts
        ]
        order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))  # little padding
        out = []
        with self._lock:
            for start in range(0, len(order), self.batch_size):
                chunk = [encoded[i] for i in order[start : start + self.batch_size]]
                width = max(len(ids) for ids in chunk)
                ids = torch.full((len(chunk), width), int(pad), dtype=torch.long)
                mask = torch.zeros((len(chunk), width), dtype=torch.long)
                for i, row in enumerate(chunk):
                    ids[i, : len(row)] = torch.tensor(row)
                    mask[i, : len(row)] = 1
                hidden = self.model(
                    input_ids=ids, attention_mask=mask, output_hidden_states=True
                ).hidden_states
                m = mask.unsqueeze(-1).to(hidden[0].dtype)
                pooled = [(hidden[k] * m).sum(1) / m.sum(1) for k in self.layers]
                out.append(torch.cat(pooled, dim=-1).float())
                if on_batch is not None:
                    on_batch(min(start + self.batch_size, len(order)), len(order))
        if not out:
            return torch.zeros(0, self.dim)
        features = torch.cat(out)
        return features[torch.argsort(torch.tensor(order))]  # back to the input order


@dataclass
class Probe:
    """One judgment: a multinomial logistic regression on a block of the features.

    Attributes:
        name: ``<feature set>/<resample>``, recorded in the vote.
        columns: ``[d]`` long, the feature columns it reads.
        mean, std: ``[d]`` standardisation of those columns (from its training data).
        weight: ``[d, k]``; bias: ``[k]`` (score probes: k = 3, columns in :data:`CLASSES`
            order; hint gates: k = 2, column 1 = "the next state carries a directive").
    """

    name: str
    columns: Tensor
    mean: Tensor
    std: Tensor
    weight: Tensor
    bias: Tensor

    def probs(self, features: Tensor) -> Tensor:
        """``[n, 3]`` class probabilities for ``[n, dim]`` features."""
        z = (features[:, self.columns] - self.mean) / self.std
        return torch.softmax(z @ self.weight + self.bias, dim=-1)


@dataclass
class HeadSet:
    """The probes of a trained judge and what they were trained for.

    Attributes:
        probes: vote ``i`` uses ``probes[i]`` (so at most ``len(probes)`` votes).
        hint_probes: vote ``i``'s hint gate ``hint_probes[i]``: does the next state say how the
            turn should have been done? (then the vote carries the directive
            :func:`clawrl.judge.hints.extract_directive` copies from it).
        identity: :func:`model_identity` of the judge model.
        layers: the hidden-state indices the features are built from.
        min_confidence: a vote abstains when its top probability is below this.
        facts: how it was trained (data, sizes, regularisation, validation accuracy).
    """

    probes: list[Probe]
    hint_probes: list[Probe]
    identity: str
    layers: list[int]
    min_confidence: float
    facts: dict[str, Any] = field(default_factory=dict)

    def save(self, path: str | Path) -> Path:
        """Write the probes as safetensors with the metadata as JSON; returns the path."""
        from safetensors.torch import save_file

        tensors: dict[str, Tensor] = {}
        names = []
        for prefix, probes in (("probe", self.probes), ("hint", self.hint_probes)):
            for i, p in enumerate(probes):
                if prefix == "probe":
                    names.append(p.name)
                for key in _TENSORS:
                    tensors[f"{prefix}{i}.{key}"] = getattr(p, key).contiguous()
        meta = {
            "version": HEAD_VERSION,
            "identity": self.identity,
            "layers": self.layers,
            "min_confidence": self.min_confidence,
            "probe_names": names,
            "facts": self.facts,
        }
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(path), metadata={"clawrl": json.dumps(meta)})
        return path

    @classmethod
    def load(cls, path: str | Path) -> HeadSet:
        """Read a head set written by :meth:`save`.

        Raises:
            JudgeError: the file is missing, unreadable or of another format version.
        """
        from safetensors import safe_open

        p = Path(path)
        try:
            with safe_open(str(p), framework="pt") as f:
                meta = json.loads((f.metadata() or {}).get("clawrl", "{}"))
                tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - not a dict
        except (OSError, ValueError, json.JSONDecodeError) as e:
            raise JudgeError(f"cannot read the judge head {p}: {e}") from e
        if meta.get("version") != HEAD_VERSION:
            raise JudgeError(
                f"{p} is judge head format {meta.get('version')!r}; this clawrl reads "
                f"{HEAD_VERSION} (retrain it with clawrl judge train)"
            )
        names = meta["probe_names"]
        probes = [
            Probe(name, *(tensors[f"probe{i}.{k}"] for k in _TENSORS))
            for i, name in enumerate(names)
        ]
        hints = [
            Probe(f"hint/{name}", *(tensors[f"hint{i}.{k}"] for k in _TENSORS))
            for i, name in enumerate(names)
        ]
        return cls(probes, hints, meta["identity"], list(meta["layers"]),
                   float(meta["min_confidence"]), dict(meta.get("facts", {})))  # fmt: skip


def fit_probe(
    features: Tensor,
    labels: Tensor,
    columns: Tensor,
    *,
    l2: float,
    name: str,
    sample_weight: Tensor | None = None,
    max_iter: int = 300,
    classes: int = len(CLASSES),
) -> Probe:
    """Fit one probe: ``min_W,b mean_i w_i CE(softmax(z_i W + b), y_i) + l2 ||W||²`` with L-BFGS
    on standardised features ``z`` (columns ``columns`` of ``features``).

    Args:
        features: ``[n, dim]``.
        labels: ``[n]`` long class indices (:data:`CLASSES` order).
        columns: ``[d]`` the columns this probe reads.
        l2: weight of the squared-norm penalty (no penalty on the bias).
        name: the probe's name.
        sample_weight: ``[n]`` per-example weights (a bootstrap draw's counts), or None.
        max_iter: L-BFGS iterations.
        classes: the number of classes (3 for scores, 2 for hint gates).
    """
    x = features[:, columns].double()
    w = (
        torch.ones(len(labels), dtype=torch.float64)
        if sample_weight is None
        else sample_weight.double()
    )
    total = w.sum()
    mean = (x * w[:, None]).sum(0) / total
    std = (((x - mean) ** 2 * w[:, None]).sum(0) / total).sqrt() + 1e-6
    z = (x - mean) / std
    weight = torch.zeros(z.shape[1], classes, dtype=torch.float64, requires_grad=True)
    bias = torch.zeros(classes, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([weight, bias], max_iter=max_iter, line_search_fn="strong_wolfe")

    def closure() -> Tensor:
        opt.zero_grad()
        ce = torch.nn.functional.cross_entropy(z @ weight + bias, labels, reduction="none")
        loss = (ce * w).sum() / total + l2 * weight.square().sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        opt.step(closure)  # type: ignore[no-untyped-call]
    return Probe(
        name, columns.clone(), mean.float(), std.float(), weight.detach().float(),
        bias.detach().float(),
    )  # fmt: skip


def label_index(score: Score | int) -> int:
    """The probe column of a score (:data:`CLASSES` order)."""
    return CLASSES.index(Score(int(score)))
