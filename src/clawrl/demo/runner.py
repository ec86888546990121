"""The main job: a simulated user teaches the policy its preferences while the server trains.

For each method (``rl``, ``opd``, ``combine``) and each seed, from the same base weights:

1. build the gateway with the online loop (judge worker + learner) from one config
   (:func:`clawrl.runtime.build_runtime`) and serve it on loopback;
2. evaluate version 0: the first answer to each held-out problem, greedy, scored by the
   scenario's rubric (evaluation requests carry ``X-Clawrl-Eval: 1`` and are never trained on);
3. run simulated-user sessions on training problems; the learner steps every ``batch_size``
   judged samples; sessions pause at each evaluation step (8 and 16 by default), the policy is
   evaluated at exactly that version, then training goes on. The default ``fixed`` schedule
   runs sessions in waves of ``concurrency``, each call sampled with a seed of its own
   (:func:`clawrl.envs.sessions.request_seed`); after a wave its turns are judged and the
   learner steps on them in a fixed order (:meth:`clawrl.trainer.service.OnlineService.settle`),
   so one seed gives one table. ``async`` keeps a pool of sessions running while the learner
   steps whenever a batch is ready, as live serving does (faster, but which samples share a
   step depends on timing);
4. stop the server and collect the numbers: per-problem scores and check results at every
   evaluated step, the training sessions' first answers (sessions to converge), per-step training
   metrics, the judge's agreement with the simulator's own ground truth, example answers.

This mirrors OpenClaw-RL's personalization experiment (student scenario, score after 8 and 16
steps, Binary RL / OPD / combined) on a laptop-sized model; statistics live in
:mod:`clawrl.stats`, the report in :mod:`clawrl.demo.report`.
"""

from __future__ import annotations

import copy
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from clawrl.config import Config, expand_method
from clawrl.config.method import deep_merge
from clawrl.errors import ConfigError, EvaluationError
from clawrl.stats import bootstrap_ci, sessions_to_converge

if TYPE_CHECKING:
    from clawrl.envs import EvalResult, ScenarioSpec, SessionLog
    from clawrl.envs.problems import ProblemSplit
    from clawrl.memory import MemoryKeeper
    from clawrl.models import Policy
    from clawrl.runtime import JudgeBundle
    from clawrl.trainer.service import OnlineService


@dataclass
class DemoSettings:
    """What one demo run does.

    Attributes:
        scenario: a built-in scenario's name (``student``, ``teacher``, ``parent``) or a scenario file.
        methods: the methods to run, each from the base weights.
        seeds: one run per seed and method (problem split, phrasings, trainer seed).
        steps: training steps per run.
        eval_steps: the steps after which the policy is evaluated (0 = before training).
        batch_size: samples per training step.
        eval_problems: held-out problems per evaluation (``None``: the scenario's).
        max_tokens: tokens per policy answer (``None``: the scenario's answer budget).
        temperature: sampling temperature of training sessions (``None``: the scenario's;
            evaluation is greedy).
        concurrency: simulated sessions in flight.
        eval_concurrency: evaluation requests in flight (the engine batches them).
        max_turns: most judged answers per session (``None``: the scenario's).
        dataset: a GSM8K-format JSONL file (``None``: the scenario's problems).
        out_dir: where the report goes.
        timeout_s: give up on a run after this many seconds of training sessions.
        examples: held-out questions shown with their answer before and after training.
        validation: evaluate on validation problems carved out of the training split (and
            kept out of the training sessions) instead of the held-out ones: for choosing
            hyperparameters without ever scoring on held-out problems.
        store: a ``postgresql://`` URL: each run's store is a schema of its own in that
            database (:func:`run_store`); ``None``: a SQLite file per run.
        jobs: runs at once (each a gateway, engine and trainer of its own; they share the CPU,
            so each takes longer, and its time budget grows with ``jobs``).
        schedule: ``fixed`` (waves of seeded sessions, then steps in a fixed order: the same
            seed gives the same table on one machine) or ``async`` (the live server's: a pool
            of sessions while the learner steps whenever a batch is ready).
    """

    scenario: str = "student"
    methods: tuple[str, ...] = ("combine",)
    seeds: tuple[int, ...] = (0,)
    steps: int = 16
    eval_steps: tuple[int, ...] = (0, 8, 16)
    batch_size: int = 4
    eval_problems: int | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    concurrency: int = 6
    eval_concurrency: int = 32
    max_turns: int | None = None
    dataset: str | None = None
    out_dir: str = "demo-report"
    timeout_s: float = 1800.0
    examples: int = 3
    validation: bool = False
    store: str | None = None
    jobs: int = 1
    schedule: Literal["fixed", "async"] = "fixed"


def run_store(settings: DemoSettings, run_dir: Path) -> str:
    """One run's fresh store: ``run_dir/store.db``, or with ``settings.store`` a PostgreSQL URL
    a schema of its own in that database (``clawrl_demo_<run>``, emptied first; the URL is
    written to ``run_dir/store.url`` for ``clawrl dashboard --demo``)."""
    from clawrl.store import is_url

    if settings.store is None:
        return str(run_dir / "store.db")
    if not is_url(settings.store):
        raise ConfigError("clawrl demo --store takes a postgresql:// URL (each run keeps its "
                          "SQLite store under its run directory)")  # fmt: skip
    from clawrl.store.postgres import schema_url

    name = "clawrl_demo_" + "".join(c if c.isalnum() else "_" for c in run_dir.name.lower())
    url = schema_url(settings.store, name, fresh=True)
    (run_dir / "store.url").write_text(url + "\n")
    return url


_BUILDING = threading.Lock()
"""Held while a run loads its policy and builds its runtime (``--jobs``: concurrent imports
inside transformers' lazy module fail with ImportError)."""

SESSIONS_PER_POOL = 8
"""Training sessions offered to one pool of simulated users, per session slot (the pool stops
starting sessions once the next evaluation step is reached)."""

VALIDATION_SALT = 1_000_003
"""Added to the seed to carve the validation problems out of the training split."""


def run_split(settings: DemoSettings, spec: ScenarioSpec, seed: int) -> ProblemSplit:
    """The problems one run trains on and is evaluated on.

    The held-out split is the scenario's (:func:`clawrl.envs.problem_split` with ``seed``). With
    ``settings.validation``, the run never sees it: its evaluation problems are carved out of
    the training split (ranked with ``seed + VALIDATION_SALT``), and it trains on the rest.

    Raises:
        ValueError: too few distinct questions for the split.
    """
    from clawrl.envs import problem_split
    from clawrl.envs.problems import split_problems

    held_out = settings.eval_problems or spec.problems.held_out
    split = problem_split(settings.dataset or spec.dataset(), held_out=held_out, seed=seed)
    if not settings.validation:
        return split
    return split_problems(split.train, held_out=held_out, seed=seed + VALIDATION_SALT)


@dataclass
class Evaluation:
    """One evaluated version of one run.

    Attributes:
        step: the training step it follows.
        version: the policy version evaluated.
        score: mean rubric score over the held-out problems.
        ci: its 95 % bootstrap interval over the problems.
        scores: per-problem scores, in problem order.
        check_rates: check name -> pass rate.
        checks: per problem, check name -> passed.
        guards: guard metrics (not in the score): ``repetition_rate``, ``answer_accuracy``,
            ``no_number_rate``, with per-problem flags under ``items``.
        answers: per problem, the answer text.
    """

    step: int
    version: int
    score: float
    ci: tuple[float, float]
    scores: list[float]
    check_rates: dict[str, float]
    checks: list[dict[str, bool]]
    guards: dict[str, Any]
    answers: list[str]


@dataclass
class MethodResult:
    """The numbers of one run (one method, one seed)."""

    method: str
    seed: int = 0
    evaluations: dict[int, Evaluation] = field(default_factory=dict)
    steps_done: int = 0
    sessions: int = 0
    samples_trained: int = 0
    drops: dict[str, int] = field(default_factory=dict)
    agreement: dict[str, Any] = field(default_factory=dict)
    converge: dict[str, int | None] = field(default_factory=dict)
    first_answers: list[dict[str, bool]] = field(default_factory=list)
    metrics: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    questions: list[str] = field(default_factory=list)
    adapter: str | None = None
    trainer_dir: str = ""
    method_config: dict[str, Any] = field(default_factory=dict)
    judge: str = ""
    wall_s: float = 0.0
    note: str = ""
    failed_sessions: int = 0
    """Training sessions that stopped on a failed call (their first error: ``session_error``)."""
    session_error: str | None = None
    eval_split: str = "held-out"
    """``held-out`` or ``validation`` (problems from the training split, for tuning)."""
    weights_only: dict[int, Evaluation] = field(default_factory=dict)
    """Arms with memory: each evaluated step again with the memory left out of the prompt
    (the weights alone); ``evaluations`` has the scores with the memory."""
    memory: list[dict[str, Any]] = field(default_factory=list)
    """Arms with memory: the memory's entries at the end (text, status, why it ended)."""

    @property
    def scores(self) -> dict[int, float]:
        """Step -> mean score (the evaluated steps)."""
        return {s: e.score for s, e in sorted(self.evaluations.items())}


Progress = Callable[[str, dict[str, Any]], None]


def _noop(event: str, info: dict[str, Any]) -> None:
    return None


DEMO_METHODS: dict[str, dict[str, Any]] = {
    "combine": {
        "kind": "combine",
        "advantage": {"w_rl": 0.25, "w_opd": 1.0},
        "hint_placement": "system",
    },
    "opd": {"kind": "opd", "hint_placement": "system"},
}
"""The demo's method tables where they differ from the shorthand's (``--config`` with a table of
the same kind replaces them), chosen with ``--validation`` (32 problems of the training split,
seed 0, never the held-out problems):

- Combined's ``w_rl = 0.25``: validation score 0.422 -> 0.555 at 8 steps against 0.422 -> 0.461
  with ``w_rl = 1.0``. The simulated user complains about nearly every first answer, so the
  judge's reward is -1 on almost every sample: a uniform push away from whatever was sampled,
  which at weight 1 outweighs the OPD term's per-token direction.
- ``hint_placement = "system"`` for OPD and Combined: with the hint appended to the user's
  message the teacher scores the end of the answer lower (OPD advantage at EOS -0.146 +- 0.077
  vs +0.024 +- 0.054 with the hint in the system message, 22 hinted turns), so training stopped
  the policy from ending its answers: sampled answers grew from 142 to 227 tokens and the
  looping-answer guard rose 16 % -> 28 % (T = 1.0) and 16 % -> 47 % (T = 0.7) in 16 steps. With
  the hint in the system message the guard fell (16 % -> 6 % at T = 0.7).

``clawrl serve --method combine`` keeps OpenClaw-RL's ``w_rl = 1.0`` and hint placement."""

MEMORY_ARMS: dict[str, dict[str, Any]] = {
    "memory": {"method": "combine", "lr": 0.0, "memory": {"enabled": True}},
    "memory+combine": {
        "method": "combine",
        "memory": {"enabled": True, "distill": True},
        # bounded off-policy updates for the distilled turns (chosen with --validation, below)
        "method_table": {
            "advantage": {"opd_clip": 2.0},
            "loss": {"eps_high": 0.28, "ratio": {"kind": "tis", "cap": 2.0}},
        },
    },
}
"""``clawrl demo --memory``'s arms besides Combined, each from the same start:

- ``memory``: the preference memory alone (the Mem0-style baseline): the gateway adds the
  entries taken from the judge's hints to every main call and nothing is trained. It runs the
  Combined learner at learning rate 0, so its "steps" come after the same samples as the
  trained arms' and the evaluation points line up (the weights never change);
- ``memory+combine``: the memory, and Combined training that distils it into the weights
  (``memory.distill``: turns are trained without their memory block, the policy with it is the
  teacher; entries the weights alone follow are retired). Its Combined table is the demo's
  with two bounds on the distilled turns' off-policy update: the OPD term clipped to
  ``[-2, 2]`` (``advantage.opd_clip``) and the ratio taken against the trainer's own log-probs
  on the prompt without the memory, with the sampling mismatch weight truncated at 2
  (``loss.ratio = tis``). Chosen with ``--validation`` (student, seed 0, 16 steps): score with
  the memory 0.781 -> 0.879, weights alone 0.566 -> 0.625, looping answers 16 % -> 12 % vs
  16 % -> 19 %; without the bounds the PPO ratio of distilled tokens reached 15 and the
  advantage 8.3, with grad-norm spikes of 2.1 and 3.6. These two settings win over a
  configured Combined table (its other settings are kept).

Both are evaluated twice at each step: with the memory in the prompt and with the weights alone.
"""

ARMS = ("rl", "opd", "combine", *MEMORY_ARMS)
"""Every method or arm ``clawrl demo`` runs."""


def method_config(
    cfg: Config, method: str, settings: DemoSettings, run_dir: Path, seed: int
) -> Config:
    """``cfg`` with the demo's method, batch size, seed and output directory: exactly what one
    run trains with (the report records it)."""
    data = cfg.model_dump(mode="json", exclude_none=True)
    trainer = data["trainer"]
    arm = MEMORY_ARMS.get(method, {})
    method = arm.get("method", method)
    if trainer["method"]["kind"] != expand_method(method)["kind"]:
        # the configured table when kinds match, else the demo's own
        trainer["method"] = copy.deepcopy(DEMO_METHODS.get(method)) or expand_method(method)
    # the arm's own settings win over either (a config.toml the demo wrote holds another arm's)
    trainer["method"] = deep_merge(trainer["method"], arm.get("method_table", {}))
    if "lr" in arm:
        trainer["lr"] = arm["lr"]
    data["memory"] = {**data.get("memory", {}), **arm.get("memory", {})}
    data["trainer"] = {
        **trainer,
        "batch_size": settings.batch_size,
        # one forward/backward over the whole batch: same gradient as micro-batches of 1
        # (tests/trainer/test_microbatch_invariance.py), far better matmul efficiency on a CPU
        "micro_batch_size": settings.batch_size,
        "output_dir": str(run_dir / "trainer"),
        "seed": seed,
        "keep_checkpoints": 1,
    }
    return Config.model_validate(data)


def _evaluation(ev: EvalResult, step: int, version: int, seed: int) -> Evaluation:
    """The numbers of one evaluation.

    Raises:
        EvaluationError: an answer's call failed (it is never scored: a failure is no answer)
            or the user could not rate an answer.
    """
    failed = [i for i in ev.items if i.error is not None or i.score is None]
    if failed:
        first = failed[0]
        raise EvaluationError(
            f"the evaluation of version {version} after step {step} failed: {len(failed)} of "
            f"{len(ev.items)} held-out answers have no score (first, problem "
            f"{first.problem_id}: {first.error or 'the user could not rate the answer'}). "
            "Failures are not scored; fix the cause (the server log above; `clawrl doctor "
            "--model SPEC` checks a model) and run again"
        )
    scores = [float(i.score or 0.0) for i in ev.items]
    no_number = [i.error is None and not any(ch.isdigit() for ch in i.response) for i in ev.items]
    guards: dict[str, Any] = {
        "repetition_rate": ev.repetition_rate,
        "answer_accuracy": ev.answer_accuracy,
        "no_number_rate": sum(no_number) / len(no_number) if no_number else None,
        "items": {
            "repetitive": [float(i.repetitive) for i in ev.items],
            "correct": [float(bool(i.correct)) for i in ev.items],
            "no_number": [float(x) for x in no_number],
        },
    }
    return Evaluation(
        step=step, version=version, score=sum(scores) / len(scores) if scores else 0.0,
        ci=bootstrap_ci(scores, seed=seed), scores=scores,
        check_rates=dict(ev.check_pass_rates), checks=[dict(i.checks) for i in ev.items],
        guards=guards, answers=[i.response for i in ev.items],
    )  # fmt: skip


def _first_answers(logs: list[SessionLog]) -> list[dict[str, bool]]:
    """Per training session, in start order, the check results of its first answer."""
    out = []
    for log in logs:
        first = next((t for t in log.turns if t.assessment is not None), None)
        if first is not None and first.assessment is not None and first.assessment.checks:
            out.append(dict(first.assessment.checks))
    return out


def converge_counts(first: list[dict[str, bool]], checks: tuple[str, ...]) -> dict[str, int | None]:
    """Sessions to converge per check and ``overall`` (every check), :func:`sessions_to_converge`."""
    out: dict[str, int | None] = {
        c: sessions_to_converge([f.get(c, False) for f in first]) for c in checks
    }
    out["overall"] = sessions_to_converge([all(f.get(c, False) for c in checks) for f in first])
    return out


def run_method(
    method: str,
    settings: DemoSettings,
    cfg: Config,
    spec: ScenarioSpec,
    *,
    seed: int = 0,
    judge: JudgeBundle,
    policy: Policy | None = None,
    progress: Progress = _noop,
) -> MethodResult:
    """Train one method from the base weights with ``seed`` and evaluate it at
    ``settings.eval_steps``.

    Args:
        policy: a freshly loaded policy to train (tests pass the tiny model); default: loaded
            from ``cfg.model``.
    """
    from clawrl.envs import evaluate_personalization, judge_agreement, make_user
    from clawrl.envs.sessions import run_sessions
    from clawrl.runtime import build_runtime
    from clawrl.trainer.metrics import read_metrics

    t0 = time.perf_counter()
    result = MethodResult(method, seed, judge=judge.description)
    run_dir = Path(settings.out_dir) / "runs" / f"{method}-seed{seed}"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    mcfg = method_config(cfg, method, settings, run_dir, seed)
    result.method_config = mcfg.trainer.method.model_dump(mode="json")
    result.trainer_dir = str(run_dir / "trainer")
    split = run_split(settings, spec, seed)
    result.eval_split = "validation" if settings.validation else "held-out"
    result.problems = [p.id for p in split.held_out]
    result.questions = [p.question for p in split.held_out]
    max_tokens = settings.max_tokens or spec.answer.max_tokens
    temperature = spec.answer.temperature if settings.temperature is None else settings.temperature
    max_turns = settings.max_turns or spec.answer.max_turns
    with _BUILDING:  # transformers' lazy imports are not thread-safe: runs build one at a time
        runtime = build_runtime(
            mcfg, policy=policy, store=run_store(settings, run_dir), judge=judge,
            schedule=settings.schedule,
        )  # fmt: skip
    service = runtime.service
    assert service is not None, "the demo trains: its method is never 'off'"
    service.step_limit = 0
    server = runtime.serve()
    user = make_user(spec, "rule", seed=seed)
    logs: list[SessionLog] = []
    if runtime.dashboard is not None:
        from clawrl.dashboard import demo_view

        def agreement() -> dict[str, Any]:
            scores = runtime.store.judgment_scores()
            return judge_agreement(list(logs), scores).to_dict()

        runtime.dashboard.demo = lambda: demo_view(result)
        runtime.dashboard.agreement = agreement
        runtime.dashboard.title = f"demo {spec.name} · {method}-seed{seed}"
        progress("server", {"method": method, "seed": seed, "url": f"{server.url}/dashboard"})
    train_problems = list(split.train)
    cursor = wave = 0
    fixed = settings.schedule == "fixed"
    wave_size = fixed_wave_size(settings, mcfg, max_turns)
    try:
        for target in sorted({min(s, settings.steps) for s in settings.eval_steps}):
            service.step_limit = target
            deadline = time.monotonic() + settings.timeout_s * max(1, settings.jobs)
            if fixed:  # samples left over from the last wave first
                _settle(service, [], runtime.app.state.gateway.memory)

            def reached(t: int = target) -> bool:
                return service.status().steps >= t

            def finished(log: SessionLog, t: int = target) -> None:
                logs.append(log)  # finish order for the live dashboard; start order below
                result.sessions += 1
                progress("sessions", {"method": method, "seed": seed, "sessions": result.sessions,
                                      "status": service.status(), "target": t})  # fmt: skip

            def stop(t: int = target, end: float = deadline) -> bool:
                return reached(t) or time.monotonic() > end

            while not reached():
                if time.monotonic() > deadline:
                    result.note = f"stopped at step {service.status().steps}: time budget spent"
                    break
                if fixed:  # a wave of seeded sessions to their end, then the steps it allows
                    batch = [train_problems[(cursor + i) % len(train_problems)]
                             for i in range(wave_size)]  # fmt: skip
                    done = run_sessions(
                        server.url, user, batch, concurrency=settings.concurrency,
                        temperature=temperature, max_tokens=max_tokens, max_turns=max_turns,
                        session_prefix=f"sim-{method}-{seed}-", progress=finished,
                        should_stop=stop,  # no step is taken mid-wave: only the time budget
                        seed=seed, run_id=f"w{wave:05d}",
                    )  # fmt: skip
                    logs[len(logs) - len(done) :] = done  # in start order
                    cursor += len(done)
                    wave += 1
                    _settle(service, [log.session_id for log in done],
                            runtime.app.state.gateway.memory)  # fmt: skip
                    continue
                # a pool, not waves: a new session starts as soon as one ends, so the engine
                # keeps ``concurrency`` sessions decoding instead of waiting for a wave's slowest
                batch = [train_problems[(cursor + i) % len(train_problems)]
                         for i in range(settings.concurrency * SESSIONS_PER_POOL)]  # fmt: skip
                start = len(logs)
                done = run_sessions(
                    server.url, user, batch, concurrency=settings.concurrency,
                    temperature=temperature, max_tokens=max_tokens, max_turns=max_turns,
                    session_prefix=f"sim-{method}-{seed}-", should_stop=stop, progress=finished,
                )  # fmt: skip
                logs[start:] = done  # the sessions that ran, in the order they started
                cursor += len(done)
            if result.note:
                break
            _wait_idle(service, target)
            progress("eval", {"method": method, "seed": seed, "step": target})
            ev = evaluate_personalization(
                server.url, spec, split.held_out, user=user, model=runtime.model_name,
                temperature=0.0, max_tokens=max_tokens, concurrency=settings.eval_concurrency,
                seed=seed,
            )  # fmt: skip
            evaluation = _evaluation(ev, target, runtime.engine.policy_version, seed)
            result.evaluations[target] = evaluation
            progress("evaluated", {"method": method, "seed": seed, "step": target,
                                   "score": evaluation.score, "ci": evaluation.ci,
                                   "version": evaluation.version})  # fmt: skip
            gateway = runtime.app.state.gateway
            if gateway.memory is not None:  # again, with the weights alone
                kept, gateway.memory = gateway.memory, None
                try:
                    alone = evaluate_personalization(
                        server.url, spec, split.held_out, user=user, model=runtime.model_name,
                        temperature=0.0, max_tokens=max_tokens,
                        concurrency=settings.eval_concurrency, seed=seed,
                    )  # fmt: skip
                finally:
                    gateway.memory = kept
                weights = _evaluation(alone, target, runtime.engine.policy_version, seed)
                result.weights_only[target] = weights
                progress("evaluated", {"method": method, "seed": seed, "step": target,
                                       "score": weights.score, "ci": weights.ci,
                                       "version": weights.version, "weights_only": True})  # fmt: skip
    finally:
        server.stop(timeout_s=60)
        status = service.status()
        result.steps_done = status.steps
        result.samples_trained = status.trained
        result.drops = dict(status.drops)
        scores = {j.turn_id: j.score for j in runtime.store.iter_judgments()}
        result.agreement = judge_agreement(logs, scores).to_dict()
        failed = [log.error for log in logs if log.error is not None]
        result.failed_sessions = len(failed)
        result.session_error = failed[0] if failed else None
        result.first_answers = _first_answers(logs)
        result.converge = converge_counts(result.first_answers, tuple(user.check_names))
        result.metrics = read_metrics(run_dir / "trainer" / "metrics.jsonl")
        if mcfg.memory.enabled:
            result.memory = [
                {"text": e.text, "status": str(e.status), "support": e.support,
                 "end_reason": e.end_reason}
                for e in runtime.store.memory_entries(active_only=False)
            ]  # fmt: skip
        runtime.close()
        result.adapter = _keep_last_policy(run_dir / "trainer")
        result.wall_s = time.perf_counter() - t0
    return result


def _keep_last_policy(trainer_dir: Path) -> str | None:
    """Delete every policy version but the last (the trained adapter); returns its directory."""
    versions = sorted(
        (p for p in (trainer_dir / "policies").glob("v*") if p.name[1:].isdigit()),
        key=lambda p: int(p.name[1:]),
    )
    for old in versions[:-1]:
        shutil.rmtree(old, ignore_errors=True)
    return str(versions[-1]) if versions else None


def fixed_wave_size(settings: DemoSettings, cfg: Config, max_turns: int) -> int:
    """Sessions per wave of the fixed schedule: ``settings.concurrency``, fewer when a wave's
    samples (at most ``max_turns`` per session, all sampled by one version) could fill more
    steps than ``trainer.max_staleness + 1``: the last ones would go stale before their step."""
    fits = (cfg.trainer.max_staleness + 1) * settings.batch_size // max(1, max_turns)
    return max(1, min(settings.concurrency, fits))


def _settle(
    service: OnlineService, sessions: list[str], memory: MemoryKeeper | None = None
) -> None:
    """The fixed schedule's step (:meth:`clawrl.trainer.service.OnlineService.settle`), then
    wait until the engine serves the version it ended at, so the next wave samples from it.
    With a ``memory``, the wave's hints are taken into it now (its reads are otherwise at most
    one per ``memory.sync_s``): the next wave starts with them however fast this wave ended."""
    service.settle_from_thread(sessions)
    if memory is not None:
        memory.sync(force=True)
    end = time.monotonic() + 120.0
    while not service.serving_version(service.status().policy_version):
        if time.monotonic() > end:
            raise EvaluationError(
                f"the engine did not serve policy version {service.status().policy_version} "
                "within 120 s of its step"
            )
        time.sleep(0.05)


def _wait_idle(service: OnlineService, target: int, timeout_s: float = 120.0) -> None:
    """Wait until the version of step ``target`` is being served (the swap is queued)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = service.status()
        if status.steps >= target and service.serving_version(status.policy_version):
            return
        time.sleep(0.2)


def run_demo(
    settings: DemoSettings,
    cfg: Config,
    *,
    progress: Progress = _noop,
    judge: JudgeBundle | None = None,
    policy_factory: Callable[[], Any] | None = None,
) -> list[MethodResult]:
    """Run every method x seed of ``settings`` (one judge, built once and shared), up to
    ``settings.jobs`` runs at a time, each in its own thread with its own gateway, engine and
    trainer; results come back in (seed, method) order whatever order the runs end in.

    Args:
        judge: the judge to use (tests pass a scripted one); default built from ``cfg.judge``.
        policy_factory: returns a fresh policy per run (tests: the tiny model); default: load
            ``cfg.model`` each run.

    Raises:
        ConfigError: the scenario cannot be loaded.
    """
    from concurrent.futures import ThreadPoolExecutor

    import torch

    from clawrl.engine.threads import call_in_transient_thread
    from clawrl.envs import load_scenario
    from clawrl.runtime import build_judge

    spec = load_scenario(settings.scenario)
    own = judge is None
    # built in a thread that ends, as clawrl serve does (clawrl.engine.threads)
    bundle = call_in_transient_thread(build_judge, cfg) if judge is None else judge
    runs = [(seed, method) for seed in settings.seeds for method in settings.methods]

    def one(seed: int, method: str) -> MethodResult:
        with _BUILDING:
            policy = policy_factory() if policy_factory is not None else None
        return run_method(method, settings, cfg, spec, seed=seed, judge=bundle, policy=policy,
                          progress=progress)  # fmt: skip

    at_once = max(1, min(settings.jobs, len(runs)))
    threads = torch_threads_per_run(at_once)
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        with ThreadPoolExecutor(max_workers=at_once) as pool:
            futures = [pool.submit(one, seed, method) for seed, method in runs]
            return [f.result() for f in futures]
    finally:
        if threads is not None:
            torch.set_num_threads(previous)
        if own:
            bundle.close()


def torch_threads_per_run(at_once: int) -> int | None:
    """Torch's intra-op threads when ``at_once`` runs share this process's cores, or None to
    leave them (one run, or ``OMP_NUM_THREADS`` set by the user).

    Each run's threads get an OpenMP team as large as torch's thread count; several teams of
    all the cores each oversubscribe them, and libgomp's waiting workers then pay to wake on
    every parallel op (:mod:`clawrl.engine.threads`). So the cores are split: ``cores //
    at_once``, at least 1. Measured on 2 cores: two demo runs in two processes with 2 threads
    each failed their first evaluation (9 of 32 answers over the 300 s limit), and with 1 thread
    each reached step 8 in 12 minutes.
    """
    if at_once <= 1 or os.environ.get("OMP_NUM_THREADS"):
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) // at_once)
