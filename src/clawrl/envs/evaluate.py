"""Personalization evaluation: the simulator's score of the policy's *first* answers.

For each held-out problem, the simulated user's opening message goes to the gateway once and
the answer is scored by the user's rubric (rule-based: the fraction of checks met; LLM-backed:
its rating / 10). The mean over problems is the headline number (issue 7: student 0.17 -> 0.81).

Evaluation traffic is marked so the online loop does not train on it:

* every request carries the header ``X-Clawrl-Eval: 1``;
* every session id starts with ``eval-`` (``eval-{scenario}-{run id}-{index}-{problem id}``);
* each session is ended right after its one call.

The gateway still records these calls (what version answered is part of the result); the
learner must skip sessions marked either way.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from clawrl.envs.client import DEFAULT_TIMEOUT_S, ChatClient
from clawrl.envs.errors import ChatEndpointError
from clawrl.envs.guards import final_number_correct, repeated_sentence
from clawrl.envs.problems import Problem
from clawrl.envs.scenario import ScenarioSpec, load_scenario
from clawrl.envs.sessions import DEFAULT_MODEL, new_run_id
from clawrl.envs.user import SimulatedUser
from clawrl.envs.users import make_user

EVAL_SESSION_PREFIX = "eval-"
"""Every evaluation session id starts with this."""
RECOMMENDED_PROBLEMS = 50
"""Held-out problems a reported evaluation should use at least."""


@dataclass(frozen=True)
class EvalItem:
    """The first answer to one held-out problem and its score.

    Attributes:
        problem_id: the problem.
        session_id: the evaluation session id.
        response: the policy's answer (``""`` when the call failed).
        score: in [0, 1]; ``None`` when the call failed or an LLM rating was unparseable.
        checks: check name -> passed (rule-based users; empty otherwise).
        satisfied: whether the user would have been satisfied (``None`` when unknown).
        policy_version: the version that answered, when the gateway reports it.
        turn_id: the gateway's turn id.
        error: why there is no answer (a failed call), else ``None``.
        ended: the gateway acknowledged ending the session (an unended evaluation session is
            harmless: it is marked as evaluation either way).
        repetitive: the answer repeats a sentence 3+ times (:mod:`clawrl.envs.guards`; not
            part of the score).
        correct: the answer's last number is the problem's answer (student scenario; ``None``
            where that does not apply; not part of the score).
    """

    problem_id: str
    session_id: str
    response: str
    score: float | None
    checks: dict[str, bool] = field(default_factory=dict)
    satisfied: bool | None = None
    policy_version: int | None = None
    turn_id: str | None = None
    error: str | None = None
    ended: bool = False
    repetitive: bool = False
    correct: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return dict(self.__dict__)


@dataclass
class EvalResult:
    """The evaluation of one policy version on one scenario.

    Attributes:
        scenario: ``student`` or ``teacher``.
        user_kind: ``rule`` or ``llm``.
        items: one per problem, in problem order.
        check_names: the rubric's checks (empty for an LLM user).
        wall_s: seconds the evaluation took.
    """

    scenario: str
    user_kind: str
    items: list[EvalItem]
    check_names: tuple[str, ...] = ()
    wall_s: float = 0.0

    @property
    def scored(self) -> list[EvalItem]:
        """Items with a score."""
        return [i for i in self.items if i.score is not None]

    @property
    def mean_score(self) -> float | None:
        """Mean score over scored items, in [0, 1] (``None`` when nothing was scored)."""
        s = self.scored
        return sum(i.score or 0.0 for i in s) / len(s) if s else None

    @property
    def scores(self) -> dict[str, float | None]:
        """Problem id -> score."""
        return {i.problem_id: i.score for i in self.items}

    @property
    def check_pass_rates(self) -> dict[str, float]:
        """Check name -> fraction of answers (where the check applied) that passed it."""
        out: dict[str, float] = {}
        for name in self.check_names:
            seen = [i.checks[name] for i in self.items if name in i.checks]
            if seen:
                out[name] = sum(seen) / len(seen)
        return out

    @property
    def repetition_rate(self) -> float | None:
        """Fraction of answers (calls that succeeded) that loop on a sentence (a guard metric)."""
        done = [i for i in self.items if i.error is None]
        return sum(i.repetitive for i in done) / len(done) if done else None

    @property
    def answer_accuracy(self) -> float | None:
        """Fraction of answers whose last number is the right answer (student scenario; a
        guard metric: the rubric does not check arithmetic). ``None`` where it does not apply."""
        known = [i.correct for i in self.items if i.error is None and i.correct is not None]
        return sum(known) / len(known) if known else None

    @property
    def satisfied_rate(self) -> float | None:
        """Fraction of scored answers that would have satisfied the user."""
        known = [i.satisfied for i in self.items if i.satisfied is not None]
        return sum(known) / len(known) if known else None

    @property
    def n_errors(self) -> int:
        """Problems whose call failed."""
        return sum(1 for i in self.items if i.error is not None)

    @property
    def n_unrated(self) -> int:
        """Answers without a score although the call succeeded (unparseable LLM ratings)."""
        return sum(1 for i in self.items if i.error is None and i.score is None)

    @property
    def policy_versions(self) -> list[int]:
        """The policy versions that answered, sorted (more than one: a swap mid-evaluation)."""
        return sorted({i.policy_version for i in self.items if i.policy_version is not None})

    def to_dict(self, *, items: bool = True) -> dict[str, Any]:
        """A JSON-ready dict (with per-problem items unless ``items=False``)."""
        out: dict[str, Any] = {
            "scenario": self.scenario,
            "user_kind": self.user_kind,
            "problems": len(self.items),
            "mean_score": self.mean_score,
            "satisfied_rate": self.satisfied_rate,
            "check_pass_rates": self.check_pass_rates,
            "repetition_rate": self.repetition_rate,
            "answer_accuracy": self.answer_accuracy,
            "scores": self.scores,
            "n_scored": len(self.scored),
            "n_unrated": self.n_unrated,
            "n_errors": self.n_errors,
            "policy_versions": self.policy_versions,
            "wall_s": self.wall_s,
        }
        if items:
            out["items"] = [i.to_dict() for i in self.items]
        return out


async def aevaluate_personalization(
    base_url: str,
    scenario: ScenarioSpec | str,
    problems: Sequence[Problem],
    *,
    user: SimulatedUser | None = None,
    model: str = DEFAULT_MODEL,
    temperature: float | None = 0.0,
    max_tokens: int | None = 256,
    concurrency: int = 4,
    seed: int = 0,
    system_prompt: str | None = None,
    api_key: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    progress: Callable[[EvalItem], None] | None = None,
) -> EvalResult:
    """Score the policy's first answer to each problem with the simulated user's rubric.

    Args:
        base_url: the gateway (with or without ``/v1``).
        scenario: a built-in scenario's name, a scenario file, or a loaded scenario.
        problems: held-out problems (use at least :data:`RECOMMENDED_PROBLEMS` for a report).
        user: the simulated user (default: the rule-based user of ``scenario`` with ``seed``).
        model: the model name to request.
        temperature: policy sampling temperature (default 0: greedy, so a version's score is
            reproducible); with a temperature > 0 each problem gets a fixed sampling seed.
        max_tokens: new tokens per answer at most.
        concurrency: requests in flight at once (>= 1).
        seed: the user's seed when ``user`` is not given, and the sampling seeds' base.
        system_prompt: a system message before the opening (as in training, if any).
        api_key: the gateway's API key, if it requires one.
        timeout_s: per-request timeout, seconds.
        progress: called with each finished item.

    Returns:
        The result; failed calls are items with ``error`` set (not raised).

    Raises:
        ValueError: ``concurrency < 1``, or ``user`` is of another scenario.
    """
    spec = scenario if isinstance(scenario, ScenarioSpec) else load_scenario(scenario)
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    if user is None:
        user = make_user(spec, seed=seed)
    if user.scenario != spec.name:
        raise ValueError(f"a {user.scenario} user cannot evaluate the {spec.name} scenario")
    homework = spec.task.kind == "homework"
    run_id = new_run_id()
    sem = asyncio.Semaphore(concurrency)
    start = time.perf_counter()
    items: list[EvalItem | None] = [None] * len(problems)

    async with ChatClient(base_url, api_key=api_key, timeout_s=timeout_s, eval_mode=True) as client:

        async def one(i: int, problem: Problem) -> None:
            sid = f"{EVAL_SESSION_PREFIX}{spec.name}-{run_id}-{i}-{problem.id}"
            task = user.start(problem)
            messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
            messages.append({"role": "user", "content": task.opening})
            async with sem:
                try:
                    result = await client.complete(
                        messages,
                        model=model,
                        temperature=temperature,
                        max_tokens=max_tokens,
                        seed=seed * 100_003 + i if temperature else None,
                        session_id=sid,
                    )
                except ChatEndpointError as e:
                    item = EvalItem(problem.id, sid, "", None, error=str(e))
                else:
                    try:
                        a = await user.assess(task, result.content)
                        error = None
                    except ChatEndpointError as e:  # the LLM user's endpoint
                        a, error = None, f"user model: {e}"
                    try:
                        await client.end_session(sid)
                        ended = True
                    except ChatEndpointError:
                        ended = False
                    item = EvalItem(
                        problem_id=problem.id,
                        session_id=sid,
                        response=result.content,
                        score=a.score if a else None,
                        checks=dict(a.checks) if a else {},
                        satisfied=None if a is None or a.reward is None else a.satisfied,
                        policy_version=result.policy_version,
                        turn_id=result.turn_ids[0] if result.turn_ids else None,
                        error=error,
                        ended=ended,
                        repetitive=repeated_sentence(result.content) is not None,
                        correct=final_number_correct(result.content, problem) if homework else None,
                    )
            items[i] = item
            if progress is not None:
                progress(item)

        await asyncio.gather(*(one(i, p) for i, p in enumerate(problems)))
    return EvalResult(
        scenario=spec.name,
        user_kind=user.kind.value,
        items=[i for i in items if i is not None],
        check_names=tuple(user.check_names),
        wall_s=time.perf_counter() - start,
    )


def evaluate_personalization(
    base_url: str,
    scenario: ScenarioSpec | str,
    problems: Sequence[Problem],
    *,
    user: SimulatedUser | None = None,
    model: str = DEFAULT_MODEL,
    temperature: float | None = 0.0,
    max_tokens: int | None = 256,
    concurrency: int = 4,
    seed: int = 0,
    system_prompt: str | None = None,
    api_key: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    progress: Callable[[EvalItem], None] | None = None,
) -> EvalResult:
    """Synchronous :func:`aevaluate_personalization` (same arguments; runs its own event
    loop).

    Raises:
        ValueError: as :func:`aevaluate_personalization`.
    """
    return asyncio.run(
        aevaluate_personalization(
            base_url,
            scenario,
            problems,
            user=user,
            model=model,
            temperature=temperature,
            max_tokens=max_tokens,
            concurrency=concurrency,
            seed=seed,
            system_prompt=system_prompt,
            api_key=api_key,
            timeout_s=timeout_s,
            progress=progress,
        )
    )
