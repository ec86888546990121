"""Choice scoring: rank the allowed verdicts by calibrated log-probs (for small local models).

A 135M model cannot follow a long answer format, but it can rank a few continuations. The
templates (:mod:`clawrl.judge.prompts`) depend on who produced the next state: a person's reply
is read as happy / unhappy / neutral about the answer (with the user's request as context), a
program's output as success / failure (with the command the turn ran). For vote ``i`` with
template ``t = templates[role][i mod k]`` the prompt is the chat-rendered system + user message,
the generation prompt, and ``t.answer_prefix``; it ends right before the verdict word.

**Empty next state.** A next state whose text is empty or whitespace carries no evidence: every
vote is 0 (``raw`` says ``"rule": "empty next state"``) and the model is not called. Nor is it
for a program's output that reports a non-zero exit status: every vote is -1
(:func:`clawrl.judge.rules.program_rule`, ``"rule": "exit_status"``).

**Scores.** For each score ``s`` the engine returns the teacher-forced log-probs of the verdict
continuation ``t.verdicts[s]`` (e.g. ``" happy"``); the verdict's score is their **sum** (the
log-probability of the whole continuation; every shipped verdict word is one SmolLM2 token, so
one forward pass per prompt suffices). They are renormalised over the template's verdict set:
``l(s|x) = log_softmax_s(sum_logprob(s|x))``.

**Calibration** (contextual calibration, Zhao et al. 2021, "Calibrate Before Use"): the same
prompt with the next state's text replaced by each of ``t.content_free`` (e.g. ``"N/A"``, ``""``,
``"[message]"``) gives content-free inputs; their renormalised log-probs are averaged into
``l(s|x_cf)`` (a geometric mean of the distributions; the paper averages the probability
vectors, an arithmetic mean, which a single extreme content-free input moves more). The calibrated score is
``c(s) = l(s|x) - l(s|x_cf)``, i.e. ``p(s|x) / p(s|x_cf)`` renormalised — the paper's
``W = diag(p_cf)^-1`` with ``b = 0``. This removes the bias the request and the verdict words'
priors contribute, leaving the evidence of the next state.

**Verdict.** ``argmax_s c(s)``; exact ties go to 0, then -1. If the best beats the runner-up by
less than ``min_margin`` nats the vote abstains (``low_margin``; default 0: never). A two-verdict
(tool) template never gives 0 except by a tie.

All prompts of all m votes are scored in one engine call (``score_next_batch``: one forward per
prompt, when every verdict is one token; else ``score_batch``). Choice votes carry no hint; see
:func:`clawrl.judge.hints.extract_directive`.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from clawrl.chat import ChatMessage, render_prompt
from clawrl.errors import ClawrlError
from clawrl.judge.backends.base import failed_vote
from clawrl.judge.prompts import CHOICE_TEMPLATES, ChoiceTemplate
from clawrl.judge.rules import RuleVerdict, program_rule
from clawrl.judge.types import (
    AbstainReason,
    BackendKind,
    HintStatus,
    JudgeInput,
    NextStateRole,
    Score,
    Vote,
)

if TYPE_CHECKING:
    from clawrl.engine import Engine


_TIE_ORDER = (Score.NEUTRAL, Score.BAD, Score.GOOD)  # earlier wins an exact tie


def normalise(logprobs: Mapping[Score, float]) -> dict[Score, float]:
    """Log-softmax over the verdict set: ``l(s) = x(s) - logsumexp_s' x(s')`` (nats)."""
    top = max(logprobs.values())
    lse = top + math.log(sum(math.exp(v - top) for v in logprobs.values()))
    return {s: v - lse for s, v in logprobs.items()}


def calibrated_verdict(
    real: Mapping[Score, float],
    content_free: Mapping[Score, float] | None,
    *,
    min_margin: float = 0.0,
) -> tuple[Score | None, dict[Score, float]]:
    """Pick the verdict from summed verdict log-probs (module doc).

    Args:
        real: summed log-prob of each verdict continuation after the real prompt (nats).
        content_free: the same after the content-free prompt, or ``None`` to skip calibration.
        min_margin: the best calibrated score must beat the runner-up by at least this (nats).

    Returns:
        ``(score or None when below the margin, calibrated scores per verdict)``.
    """
    cal = normalise(real)
    if content_free is not None:
        cf = normalise(content_free)
        cal = {s: cal[s] - cf[s] for s in cal}
    ranked = sorted(cal, key=lambda s: (-cal[s], _TIE_ORDER.index(s)))
    if len(ranked) > 1 and cal[ranked[0]] - cal[ranked[1]] < min_margin:
        return None, cal
    return ranked[0], cal


class ChoiceBackend:
    """Calibrated choice scoring on a local :class:`clawrl.engine.Engine`.

    Args:
        engine: the engine running the judge model.
        tokenizer: its tokenizer.
        model: the judge model's name, for the record.
        calibrate: subtract the content-free log-probs (default on).
        min_margin: abstain below this calibrated margin (nats, default 0: never).
        templates: the prompts per next-state role (default
            :data:`clawrl.judge.prompts.CHOICE_TEMPLATES`), or one sequence used for every role;
            vote ``i`` uses ``templates[role][i mod k]``.

    Raises:
        ValueError: a role has no template, or ``calibrate`` is on and a template has no
            content-free inputs.
    """

    kind = BackendKind.CHOICE
    batched = True
    writes_hints = False

    def __init__(
        self,
        engine: Engine,
        tokenizer: Any,
        *,
        model: str = "",
        calibrate: bool = True,
        min_margin: float = 0.0,
        templates: Mapping[NextStateRole, Sequence[ChoiceTemplate]]
        | Sequence[ChoiceTemplate] = CHOICE_TEMPLATES,
    ) -> None:
        if isinstance(templates, Mapping):
            table = {role: tuple(templates.get(role, ())) for role in NextStateRole}
        else:
            table = {role: tuple(templates) for role in NextStateRole}
        empty = [str(role) for role, ts in table.items() if not ts]
        if empty:
            raise ValueError(f"choice scoring needs at least one template for {empty}")
        uncalibrated = sorted({t.name for ts in table.values() for t in ts if not t.content_free})
        if calibrate and uncalibrated:
            raise ValueError(
                f"templates {uncalibrated} have no content_free inputs to calibrate on"
            )
        self.engine = engine
        self.tokenizer = tokenizer
        self.model = model
        self.calibrate = calibrate
        self.min_margin = min_margin
        self.templates = table
        self._in_flight: set[asyncio.Future[list[list[float]]]] = set()

    def template(self, index: int, role: NextStateRole = NextStateRole.USER) -> ChoiceTemplate:
        """The template of vote ``index`` for a next state of ``role``."""
        ts = self.templates[role]
        return ts[index % len(ts)]

    def prompt_ids(
        self, inp: JudgeInput, template: ChoiceTemplate, *, content_free: str | None = None
    ) -> list[int]:
        """Token ids of one choice prompt, ending right before the verdict word.

        ``content_free``: a text that replaces the next state (a calibration input)."""
        messages = [
            ChatMessage(role="system", content=template.system),
            ChatMessage(role="user", content=template.user_message(inp, content_free)),
        ]
        ids = render_prompt(self.tokenizer, messages).token_ids
        return ids + self.tokenizer.encode(template.answer_prefix, add_special_tokens=False)

    def verdict_ids(self, template: ChoiceTemplate) -> dict[Score, list[int]]:
        """Token ids of each verdict continuation of ``template``."""
        return {
            s: self.tokenizer.encode(w, add_special_tokens=False)
            for s, w in template.verdicts.items()
        }

    async def votes(self, inp: JudgeInput, indices: Sequence[int]) -> list[Vote]:
        """Score all votes' verdicts in one engine call; see :class:`JudgeBackend`."""
        start = time.perf_counter()
        role = inp.next_state.role
        k = len(self.templates[role])  # vote i uses template i mod k; its seed records i mod k
        if not inp.next_state.text.strip():
            rule: RuleVerdict | None = RuleVerdict(Score.NEUTRAL, "empty next state", "")
        else:
            rule = program_rule(inp.next_state)
        if rule is not None:
            raw = json.dumps({"rule": rule.rule})
            return [
                Vote(
                    index=i,
                    score=rule.score,
                    detail=rule.detail or None,
                    raw=raw,
                    hint_status=HintStatus.ABSENT,
                    seed=i % k,
                    latency_s=0.0,
                )
                for i in indices
            ]
        items: list[tuple[list[int], list[int]]] = []
        layout: list[tuple[int, ChoiceTemplate, list[Score], int]] = []
        next_prompts: list[list[int]] = []
        next_cands: list[list[int]] = []
        for i in indices:
            t = self.template(i, role)
            targets = self.verdict_ids(t)
            prompts = [self.prompt_ids(inp, t)]
            if self.calibrate:
                prompts.extend(self.prompt_ids(inp, t, content_free=cf) for cf in t.content_free)
            for p in prompts:
                items.extend((p, targets[s]) for s in targets)
                next_prompts.append(p)
                next_cands.append([targets[s][0] for s in targets])
            layout.append((i, t, list(targets), len(prompts) - 1))
        # Single-token verdicts (every shipped template's, for SmolLM2) need only the next-token
        # distribution: one forward per prompt instead of one per (prompt, verdict).
        single = all(len(ids) == 1 for _, ids in items)
        try:
            # Shielded: the engine cannot abort a queued scoring pass, so a judge timeout only
            # stops waiting for it; cancelling the engine's own future would make its thread
            # fail when it resolves it. aclose() waits for such passes.
            if single:
                task = asyncio.ensure_future(self._score_next(next_prompts, next_cands))
            else:
                task = asyncio.ensure_future(self.engine.score_batch(items))
            self._in_flight.add(task)
            task.add_done_callback(self._in_flight.discard)
            scored = await asyncio.shield(task)
        except ClawrlError as e:
            return [
                failed_vote(
                    i,
                    AbstainReason.BACKEND_ERROR,
                    f"engine: {e}",
                    seed=i % k,
                )
                for i in indices
            ]
        latency = time.perf_counter() - start
        out: list[Vote] = []
        pos = 0
        for i, t, order, n_cf in layout:
            n = len(order)
            real = {s: sum(scored[pos + k]) for k, s in enumerate(order)}
            pos += n
            cf = None
            if self.calibrate:
                cfs = []
                for _ in range(n_cf):
                    cfs.append(normalise({s: sum(scored[pos + k]) for k, s in enumerate(order)}))
                    pos += n
                cf = {s: sum(c[s] for c in cfs) / len(cfs) for s in order}
            score, cal = calibrated_verdict(real, cf, min_margin=self.min_margin)
            raw = json.dumps(
                {
                    "template": t.name,
                    "logprob": {str(int(s)): round(v, 4) for s, v in real.items()},
                    "content_free": {str(int(s)): round(v, 4) for s, v in (cf or {}).items()},
                    "calibrated": {str(int(s)): round(v, 4) for s, v in cal.items()},
                }
            )
            out.append(
                Vote(
                    index=i,
                    score=score,
                    abstain_reason=None if score is not None else AbstainReason.LOW_MARGIN,
                    detail=None if score is not None else f"margin < {self.min_margin} nats",
                    raw=raw,
                    hint_status=HintStatus.ABSENT,
                    seed=i % k,
                    latency_s=latency,
                )
            )
        return out

    async def _score_next(
        self, prompts: list[list[int]], cands: list[list[int]]
    ) -> list[list[float]]:
        """Per (prompt, verdict) log-probs, as ``score_batch`` would give, from next-token scores.

        Prompts sharing a candidate set are scored in one call (one forward per distinct
        prompt)."""
        out: list[list[float]] = []
        groups: dict[tuple[int, ...], list[int]] = {}
        for k, cand in enumerate(cands):
            groups.setdefault(tuple(cand), []).append(k)
        rows: dict[int, list[float]] = {}
        for c, ks in groups.items():
            # identical prompts (votes beyond the role's k templates repeat one) scored once
            unique: dict[tuple[int, ...], int] = {}
            for k in ks:
                unique.setdefault(tuple(prompts[k]), len(unique))
            got = await self.engine.score_next_batch([list(p) for p in unique], list(c))
            rows.update((k, got[unique[tuple(prompts[k])]]) for k in ks)
        for k in range(len(prompts)):
            out.extend([v] for v in rows[k])
        return out

    async def aclose(self, *, wait_s: float = 60.0) -> None:
        """Wait (at most ``wait_s`` seconds) for scoring passes whose judgment timed out, so
        the engine can resolve them before the loop ends. The engine belongs to the caller."""
        if self._in_flight:
            await asyncio.wait(set(self._in_flight), timeout=wait_s)
        for task in self._in_flight:
            task.add_done_callback(_retrieve)


def _retrieve(task: asyncio.Future[list[list[float]]]) -> None:
    if not task.cancelled():
        task.exception()
