"""The main job: a simulated user teaches the policy its preferences while the server trains.

For each method (``rl``, ``opd``, ``combine``), from the same base weights:

1. start the gateway with the online loop (judge worker + learner) in this process;
2. evaluate version 0: the first response to each held-out problem, scored by the simulator's
   rubric (evaluation requests carry ``X-Clawrl-Eval: 1`` and are never trained on);
3. run simulated-user sessions on training problems; the learner steps every ``batch_size``
   judged samples; sessions pause at each evaluation step (8 and 16 by default), the policy is
   evaluated at exactly that version, then training goes on;
4. stop the server and collect the numbers: scores per step, per-step training metrics, and the
   judge's agreement with the simulator's own ground truth.

This mirrors OpenClaw-RL's personalization experiment (student scenario, score after 8 and 16
steps, Binary RL / OPD / combined) on a laptop-sized model.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clawrl.config import Config, expand_method

if TYPE_CHECKING:
    from clawrl.runtime import JudgeBundle
    from clawrl.trainer.service import OnlineService


@dataclass
class DemoSettings:
    """What one demo run does.

    Attributes:
        scenario: ``student`` or ``teacher``.
        methods: the methods to run, each from the base weights.
        steps: training steps per method.
        eval_steps: the steps after which the policy is evaluated (0 = before training).
        batch_size: samples per training step.
        eval_problems: held-out problems per evaluation (>= 50 for the report's numbers).
        max_tokens: most tokens per policy answer.
        temperature: sampling temperature of training sessions (evaluation is greedy).
        concurrency: simulated sessions in flight.
        max_turns: most judged answers per session.
        dataset: a GSM8K-format JSONL file, or None for the built-in generator.
        out_dir: where ``demo-report/`` goes.
        seed: problem split and user phrasing seed.
        timeout_s: give up on a method after this many seconds of training sessions.
    """

    scenario: str = "student"
    methods: tuple[str, ...] = ("combine",)
    steps: int = 16
    eval_steps: tuple[int, ...] = (0, 8, 16)
    batch_size: int = 4
    eval_problems: int = 50
    max_tokens: int = 64
    temperature: float = 1.0
    concurrency: int = 4
    max_turns: int = 4
    dataset: str | None = None
    out_dir: str = "demo-report"
    seed: int = 0
    timeout_s: float = 1800.0


@dataclass
class MethodResult:
    """The numbers of one method."""

    method: str
    scores: dict[int, float | None] = field(default_factory=dict)  # step -> mean rubric score
    versions: dict[int, int] = field(default_factory=dict)  # step -> evaluated version
    check_rates: dict[int, dict[str, float]] = field(default_factory=dict)
    # step -> guard metrics, not part of the score (clawrl.envs.guards)
    guards: dict[int, dict[str, float | None]] = field(default_factory=dict)
    steps_done: int = 0
    sessions: int = 0
    samples_trained: int = 0
    drops: dict[str, int] = field(default_factory=dict)
    agreement: dict[str, Any] = field(default_factory=dict)
    metrics: list[dict[str, Any]] = field(default_factory=list)
    wall_s: float = 0.0
    note: str = ""


Progress = Callable[[str, dict[str, Any]], None]


def _noop(event: str, info: dict[str, Any]) -> None:
    return None


def method_config(cfg: Config, method: str, settings: DemoSettings, run_dir: Path) -> Config:
    """``cfg`` with the demo's method, batch size and output directory: exactly what one
    method's run trains with (the report records it)."""
    trainer = cfg.trainer
    if trainer.method.kind != expand_method(method)["kind"]:
        trainer = trainer.model_copy(update={"method": expand_method(method)})
    data = cfg.model_dump(mode="json", exclude_none=True)
    data["trainer"] = {
        **trainer.model_dump(mode="json", exclude_none=True),
        "batch_size": settings.batch_size,
        "output_dir": str(run_dir / "trainer"),
    }
    return Config.model_validate(data)


def run_method(
    method: str,
    settings: DemoSettings,
    cfg: Config,
    *,
    judge: JudgeBundle,
    progress: Progress = _noop,
) -> MethodResult:
    """Train one method from the base weights and evaluate it at ``settings.eval_steps``."""
    from clawrl.envs import evaluate_personalization, judge_agreement, make_user, problem_split
    from clawrl.envs.sessions import run_sessions
    from clawrl.runtime import build_runtime
    from clawrl.trainer.metrics import read_metrics

    t0 = time.perf_counter()
    result = MethodResult(method)
    run_dir = Path(settings.out_dir) / "runs" / method
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    mcfg = method_config(cfg, method, settings, run_dir)
    split = problem_split(settings.dataset, held_out=settings.eval_problems, seed=settings.seed)
    runtime = build_runtime(mcfg, store=run_dir / "store.db", judge=judge)
    service = runtime.service
    assert service is not None, "the demo trains: its method is never 'off'"
    service.step_limit = 0
    server = runtime.serve()
    spec = runtime.model_name
    user = make_user(settings.scenario, "rule", seed=settings.seed)
    logs: list[Any] = []
    train_problems = list(split.train)
    cursor = 0
    try:
        for target in sorted(set(settings.eval_steps)):
            target = min(target, settings.steps)
            service.step_limit = target
            deadline = time.monotonic() + settings.timeout_s

            def reached(t: int = target) -> bool:
                return service.status().steps >= t

            while not reached():
                if time.monotonic() > deadline:
                    result.note = f"stopped at step {service.status().steps}: time budget spent"
                    break
                batch = [train_problems[(cursor + i) % len(train_problems)]
                         for i in range(settings.concurrency)]  # fmt: skip
                cursor += settings.concurrency
                done = run_sessions(
                    server.url, user, batch, concurrency=settings.concurrency,
                    temperature=settings.temperature, max_tokens=settings.max_tokens,
                    max_turns=settings.max_turns, session_prefix=f"sim-{method}-",
                    should_stop=reached,
                )  # fmt: skip
                logs.extend(done)
                result.sessions += len(done)
                progress("sessions", {"method": method, "sessions": result.sessions,
                                      "status": service.status(), "target": target})  # fmt: skip
            if result.note:
                break
            _wait_idle(service, target)
            progress("eval", {"method": method, "step": target})
            ev = evaluate_personalization(
                server.url, settings.scenario, split.held_out, model=spec,
                temperature=0.0, max_tokens=settings.max_tokens, concurrency=8,
                seed=settings.seed,
            )  # fmt: skip
            result.scores[target] = ev.mean_score
            result.versions[target] = runtime.engine.policy_version
            result.check_rates[target] = dict(ev.check_pass_rates)
            result.guards[target] = {
                "repetition_rate": ev.repetition_rate,
                "answer_accuracy": ev.answer_accuracy,
            }
            progress("evaluated", {"method": method, "step": target, "score": ev.mean_score,
                                   "version": runtime.engine.policy_version})  # fmt: skip
    finally:
        server.stop(timeout_s=60)
        status = service.status()
        result.steps_done = status.steps
        result.samples_trained = status.trained
        result.drops = dict(status.drops)
        scores = {j.turn_id: j.score for j in runtime.store.iter_judgments()}
        agree = judge_agreement(logs, scores)
        result.agreement = {
            "compared": agree.compared, "agreed": agree.agreed, "rate": agree.rate,
            "judge_neutral": agree.judge_neutral, "missing": agree.missing,
            "confusion": dict(agree.confusion),
        }  # fmt: skip
        result.metrics = read_metrics(run_dir / "trainer" / "metrics.jsonl")
        runtime.close()
        result.wall_s = time.perf_counter() - t0
    return result


def _wait_idle(service: OnlineService, target: int, timeout_s: float = 120.0) -> None:
    """Wait until the version of step ``target`` is being served (the swap is queued)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = service.status()
        if status.steps >= target and service.serving_version(status.policy_version):
            return
        time.sleep(0.2)


def run_demo(
    settings: DemoSettings, cfg: Config, *, progress: Progress = _noop
) -> list[MethodResult]:
    """Run every method of ``settings`` (the judge is built once and shared)."""
    from clawrl.runtime import build_judge

    judge = build_judge(cfg)
    results = []
    try:
        for method in settings.methods:
            results.append(run_method(method, settings, cfg, judge=judge, progress=progress))
    finally:
        judge.close()
    return results
