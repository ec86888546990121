"""The trained judge backend: m votes from m probes on the judge model's hidden states.

One forward pass of the frozen judge model per judgment (in a thread of its own that ends with it,
:func:`clawrl.engine.threads.in_transient_thread`; the model is the
backend's own copy), then each vote ``i`` is probe ``i`` of the :class:`~clawrl.judge.head.
HeadSet` — its own feature set and bootstrap resample, so the votes are independent
classifiers. A vote below the head set's ``min_confidence`` abstains (``low_margin``). A
program's empty output (0) and its non-zero exit status (-1) are judged without a model call
(:func:`clawrl.judge.rules.program_rule`), as the choice judge does. Hints
(``hints="bad-or-gate"``, the default): a vote that scores -1 or whose trained hint gate fires
carries the directive sentences :func:`clawrl.judge.hints.extract_directive` copies from
the next state, read as a correction where the vote scores -1 (request forms then count;
otherwise only strong markers and a turn from praise to a request do), and the judge keeps a
hint that a quorum of votes carries (:func:`clawrl.judge.hints.select_hint`). With
``hints="gate"`` only a vote whose gate fires looks, reading every reply as a correction (the
rule before 2026-12-07). The gate's probability is in each vote's ``raw`` either way. Why the
default changed: README, "The judge".
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from clawrl.engine.threads import in_transient_thread
from clawrl.errors import JudgeError
from clawrl.judge.backends.base import failed_vote
from clawrl.judge.head import CLASSES, FeatureExtractor, HeadSet, default_head_path, next_state_view
from clawrl.judge.hints import extract_directive
from clawrl.judge.rules import program_rule
from clawrl.judge.types import (
    AbstainReason,
    BackendKind,
    HintStatus,
    JudgeInput,
    Score,
    Vote,
)


class HeadBackend:
    """Votes from a trained :class:`HeadSet` over a local judge model.

    Args:
        model: the judge's causal LM (a copy nothing else runs or trains).
        tokenizer: its tokenizer.
        head: the trained probes; default: the shipped set (:func:`default_head_path`).
        model_name: recorded on every judgment.
        min_confidence: override the head set's abstention threshold (``None``: keep it).
        hints: which votes look for a hint: ``"bad-or-gate"`` or ``"gate"`` (module doc).

    Raises:
        JudgeError: the head set was trained for another judge model.
    """

    kind = BackendKind.HEAD
    batched = True
    writes_hints = True

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        head: HeadSet | str | Path | None = None,
        model_name: str = "",
        min_confidence: float | None = None,
        hints: str = "bad-or-gate",
    ) -> None:
        if hints not in ("bad-or-gate", "gate"):
            raise JudgeError(f"judge.backend.hints must be 'bad-or-gate' or 'gate', not {hints!r}")
        self.hints = hints
        self.extractor = FeatureExtractor(model, tokenizer)
        path = default_head_path() if head is None else head
        self.head = path if isinstance(path, HeadSet) else HeadSet.load(path)
        if (
            self.head.identity != self.extractor.identity
            or self.head.layers != self.extractor.layers
        ):
            trained = self.head.facts.get("model", "smollm2-135m")
            raise JudgeError(
                f"the judge head was trained on judge model {trained} ({self.head.identity}, "
                f"layers {self.head.layers}), but it was given {model_name or 'another model'} "
                f"({self.extractor.identity}, layers {self.extractor.layers}). The head reads "
                "only the next state's text, so it judges any policy's turns with its own model: "
                "leave judge.model unset (drop --judge-model / --set judge.model; judge eval: "
                f"drop --model) and the judge loads {trained}. To judge with another model, "
                "train a head for it: clawrl judge train --model SPEC --out FILE, then "
                "--set judge.backend.path=FILE (judge eval: --head FILE)"
            )
        self.model = model_name
        self.min_confidence = self.head.min_confidence if min_confidence is None else min_confidence

    async def votes(self, inp: JudgeInput, indices: Sequence[int]) -> list[Vote]:
        """Votes ``indices`` (each at most ``len(probes) - 1``) for ``inp``; see the module doc."""
        if any(i >= len(self.head.probes) for i in indices):
            raise JudgeError(
                f"this judge head has {len(self.head.probes)} probes: at most that many votes"
            )
        rule = program_rule(inp.next_state)
        if rule is not None:
            return [self._vote(i, rule.score, rule.detail, {"rule": rule.rule}) for i in indices]
        start = time.perf_counter()
        try:
            # a thread that ends with the call: a live one would keep an OpenMP team that slows
            # the policy engine's thread for good (clawrl.engine.threads)
            features = await in_transient_thread(
                self.extractor.features, [next_state_view(inp)], name="clawrl-judge-head"
            )
        except (RuntimeError, ValueError) as e:  # the model failed on this input
            return [
                failed_vote(i, AbstainReason.BACKEND_ERROR, f"judge model: {e}") for i in indices
            ]
        latency = time.perf_counter() - start
        out = []
        for i in indices:
            probe = self.head.probes[i]
            probs = probe.probs(features)[0]
            top = int(probs.argmax())
            raw = {"probe": probe.name, **{c.label: round(float(probs[k]), 4)
                                           for k, c in enumerate(CLASSES)}}  # fmt: skip
            if float(probs[top]) < self.min_confidence:
                vote = Vote(
                    index=i, score=None, abstain_reason=AbstainReason.LOW_MARGIN,
                    detail=f"top probability {float(probs[top]):.2f} < {self.min_confidence:.2f}",
                    raw=json.dumps(raw), hint_status=HintStatus.ABSENT, latency_s=latency,
                )  # fmt: skip
            else:
                gate = float(self.head.hint_probes[i].probs(features)[0, 1])
                raw["hint_gate"] = round(gate, 4)
                hint = None
                bad = CLASSES[top] == Score.BAD
                if gate >= 0.5 or (bad and self.hints == "bad-or-gate"):
                    negative = bad or self.hints == "gate"
                    found = extract_directive(
                        inp.next_state.text, inp.next_state.role, negative=negative
                    )
                    hint = found.text if found is not None else None
                vote = self._vote(i, CLASSES[top], probe.name, raw, latency, hint)
            out.append(vote)
        return out

    @staticmethod
    def _vote(
        index: int,
        score: Score,
        detail: str,
        raw: dict[str, Any],
        latency: float = 0.0,
        hint: str | None = None,
    ) -> Vote:
        return Vote(
            index=index, score=score, detail=detail, raw=json.dumps(raw), hint=hint,
            hint_status=HintStatus.OK if hint else HintStatus.NONE, latency_s=latency,
        )  # fmt: skip

    async def aclose(self) -> None:
        """Nothing to release (the model is freed with the backend)."""
