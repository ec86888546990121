"""``clawrl demo --users 2``: two simulated users with conflicting wishes through one gateway.

The built-in ``student`` (the number first, two casual sentences, no steps) and ``parent``
(numbered steps read out to a child, a last line ``Answer: N``) scenarios share one server,
each with an API key of their own (``--user-keys``: the gateway records each request as its
key's user). Two arms from the same base weights, with the same seeds, problems and schedule:

- ``per-user``: ``server.per_user_adapters``: each user's judged turns train their own adapter
  (:mod:`clawrl.trainer.users`), and each user is served theirs;
- ``shared``: one policy trained on both users' feedback, as one gateway does without it.

Training runs in waves (the demo's fixed schedule): each user's sessions run side by side, then
the wave's turns are judged and the learner steps on them in a fixed order. ``steps`` is per
user: the shared arm takes twice as many steps of the same batch size, so both arms train on
the same number of samples (in the per-user arm each user takes exactly ``steps``: a user
whose batches fill first waits for the other). Each user is evaluated on their own held-out problems with their
own rubric (greedy, their key: the per-user arm serves their adapter) before training and at
the evaluated steps. The report gives each user's score per arm with 95 % intervals (over the
problems for one seed, over seeds for several), the gain over the base, and the per-user arm's
advantage over the shared arm at the last step.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clawrl.config import Config
from clawrl.demo.report import _fmt_ci, cell, gain
from clawrl.demo.runner import (
    _BUILDING,
    DemoSettings,
    MethodResult,
    Progress,
    _evaluation,
    _noop,
    _settle,
    fixed_wave_size,
    method_config,
    run_split,
    run_store,
)
from clawrl.stats import paired_diff_ci, seed_ci

if TYPE_CHECKING:
    from clawrl.envs import ScenarioSpec, SessionLog
    from clawrl.models import Policy
    from clawrl.runtime import JudgeBundle

USERS = ("student", "parent")
"""The users ``--users 2`` runs (built-in scenarios whose wishes conflict)."""

USER_ARMS = ("per-user", "shared")
"""The two arms: an adapter per user, or one policy for both."""


@dataclass
class UsersRun:
    """One arm x seed: a :class:`MethodResult` per user (``method`` = ``"<arm>:<user>"``)."""

    arm: str
    seed: int
    users: list[MethodResult] = field(default_factory=list)
    steps_done: int = 0
    wall_s: float = 0.0
    note: str = ""
    drops: dict[str, int] = field(default_factory=dict)


def user_keys(specs: Sequence[ScenarioSpec]) -> dict[str, str]:
    """One API key per simulated user: key -> user id (the scenario's name)."""
    return {f"demo-key-{i}-{spec.name}": spec.name for i, spec in enumerate(specs)}


def run_users(
    arm: str,
    settings: DemoSettings,
    cfg: Config,
    specs: Sequence[ScenarioSpec],
    *,
    seed: int = 0,
    judge: JudgeBundle,
    policy: Policy | None = None,
    progress: Progress = _noop,
) -> UsersRun:
    """Train ``arm`` (``per-user`` or ``shared``) from the base weights with every user of
    ``specs`` through one gateway; evaluate each user at ``settings.eval_steps`` (steps per
    user; module docstring).

    Raises:
        ValueError: an unknown arm.
        EvaluationError: an evaluation answer failed (never scored).
    """
    from clawrl.envs import evaluate_personalization, make_user
    from clawrl.envs.sessions import run_sessions
    from clawrl.runtime import build_runtime

    if arm not in USER_ARMS:
        raise ValueError(f"unknown arm {arm!r}: {', '.join(USER_ARMS)}")
    t0 = time.perf_counter()
    n = len(specs)
    run = UsersRun(arm, seed)
    run_dir = Path(settings.out_dir) / "runs" / f"users-{arm}-seed{seed}"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    mcfg = method_config(cfg, settings.methods[0], settings, run_dir, seed)
    # both arms score the OPD teacher the same way: by the trainer, at step time (the per-user
    # learner always does: the engine's score takes no adapter)
    mcfg = mcfg.model_copy(update={
        "trainer": mcfg.trainer.model_copy(update={"teacher_scoring": "trainer"})})  # fmt: skip
    if arm == "per-user":
        server = mcfg.server.model_copy(update={"per_user_adapters": True})
        mcfg = mcfg.model_copy(update={"server": server})
    keys = user_keys(specs)
    key_of = {user: key for key, user in keys.items()}
    splits = [run_split(settings, spec, seed) for spec in specs]
    sims = [make_user(spec, "rule", seed=seed) for spec in specs]
    for spec, split in zip(specs, splits, strict=True):
        r = MethodResult(f"{arm}:{spec.name}", seed, judge=judge.description)
        r.problems = [p.id for p in split.held_out]
        r.questions = [p.question for p in split.held_out]
        r.eval_split = "validation" if settings.validation else "held-out"
        run.users.append(r)
    with _BUILDING:
        runtime = build_runtime(mcfg, policy=policy, store=run_store(settings, run_dir),
                                judge=judge, schedule="fixed", user_keys=keys)  # fmt: skip
    service = runtime.service
    assert service is not None
    service.step_limit = 0
    server_ = runtime.serve()
    gateway = runtime.app.state.gateway
    per_user = max(1, fixed_wave_size(settings, mcfg, max(s.answer.max_turns for s in specs)) // n)
    concurrency = max(1, settings.concurrency // n)
    cursors = [0] * n
    logs: list[list[SessionLog]] = [[] for _ in specs]
    wave = 0

    def sessions(i: int) -> list[SessionLog]:
        spec, split = specs[i], splits[i]
        problems = [split.train[(cursors[i] + k) % len(split.train)] for k in range(per_user)]
        return run_sessions(
            server_.url, sims[i], problems, concurrency=concurrency,
            temperature=spec.answer.temperature if settings.temperature is None
            else settings.temperature,
            max_tokens=settings.max_tokens or spec.answer.max_tokens,
            max_turns=settings.max_turns or spec.answer.max_turns,
            # the same session ids (so the same sampling seeds) in both arms: their own stores
            api_key=key_of[spec.name], session_prefix=f"sim-{seed}-{spec.name}-",
            seed=seed, run_id=f"w{wave:05d}",
        )  # fmt: skip

    def evaluate(target: int) -> None:
        if gateway.user_adapters is not None:
            gateway.user_adapters.refresh()  # each user's newest version, read now
        versions = runtime.store.latest_user_adapters()
        for i, spec in enumerate(specs):
            progress("eval", {"method": f"{arm}:{spec.name}", "seed": seed, "step": target})
            ev = evaluate_personalization(
                server_.url, spec, splits[i].held_out, user=sims[i], model=runtime.model_name,
                temperature=0.0, max_tokens=settings.max_tokens or spec.answer.max_tokens,
                concurrency=settings.eval_concurrency, seed=seed, api_key=key_of[spec.name],
            )  # fmt: skip
            version = (versions[spec.name].version if spec.name in versions else 0) \
                if arm == "per-user" else runtime.engine.policy_version  # fmt: skip
            evaluation = _evaluation(ev, target, version, seed)
            run.users[i].evaluations[target] = evaluation
            progress("evaluated", {"method": f"{arm}:{spec.name}", "seed": seed, "step": target,
                                   "score": evaluation.score, "ci": evaluation.ci,
                                   "version": version})  # fmt: skip

    try:
        for target in sorted({min(s, settings.steps) for s in settings.eval_steps}):
            service.step_limit = target * n  # the shared arm takes them all
            if arm == "per-user":  # and each user exactly ``target`` of their own
                service.learner.user_step_limit = target
            deadline = time.monotonic() + settings.timeout_s * n
            _settle(service, [])
            while service.status().steps < target * n:
                if time.monotonic() > deadline:
                    run.note = f"stopped at step {service.status().steps}: time budget spent"
                    break
                with ThreadPoolExecutor(max_workers=n) as pool:
                    done = list(pool.map(sessions, range(n)))
                for i, got in enumerate(done):
                    logs[i] += got
                    cursors[i] += len(got)
                    run.users[i].sessions += len(got)
                wave += 1
                # a user's key: the gateway stores the sessions it names as USER:NAME
                _settle(service, [f"{spec.name}:{log.session_id}"
                                  for spec, got in zip(specs, done, strict=True) for log in got])  # fmt: skip
                if gateway.user_adapters is not None:
                    gateway.user_adapters.refresh()  # the next wave gets each user's new version
                progress("sessions", {"method": arm, "seed": seed, "status": service.status(),
                                      "sessions": sum(cursors), "target": target * n})  # fmt: skip
            if run.note:
                break
            evaluate(target)
    finally:
        server_.stop(timeout_s=60)
        status = service.status()
        run.steps_done = status.steps
        run.drops = dict(status.drops)
        from clawrl.demo.runner import _first_answers, converge_counts

        for i, sim in enumerate(sims):
            run.users[i].first_answers = _first_answers(logs[i])
            run.users[i].converge = converge_counts(run.users[i].first_answers,
                                                    tuple(sim.check_names))  # fmt: skip
            failed = [log.error for log in logs[i] if log.error is not None]
            run.users[i].failed_sessions = len(failed)
            run.users[i].session_error = failed[0] if failed else None
            if arm == "per-user":
                versions = runtime.store.user_adapter_versions(specs[i].name)
                run.users[i].steps_done = sum(1 for v in versions if v.step is not None)
            else:
                run.users[i].steps_done = status.steps
        runtime.close()
        run.wall_s = time.perf_counter() - t0
    return run


def users_table(runs: Sequence[UsersRun], steps: Sequence[int]) -> str:
    """Markdown: per user and arm, the score at each evaluated step (95 % interval), the gain at
    the last step over the base, and per user the per-user arm minus the shared arm at the last
    step (paired over the problems for one seed; over seeds for several)."""
    last = steps[-1]
    head = "| user | arm | seeds | " + " | ".join(
        "base (v0)" if s == 0 else f"{s} steps" for s in steps
    )
    rows = [head + f" | gain at {last} |", "|---|---|---:|" + "---:|" * (len(steps) + 1)]
    users = list(dict.fromkeys(r.method.split(":", 1)[1] for run in runs for r in run.users))
    for user in users:
        for arm in USER_ARMS:
            mine = [r for run in runs if run.arm == arm for r in run.users
                    if r.method == f"{arm}:{user}"]  # fmt: skip
            if not mine:
                continue
            cells = [_fmt_ci(*cell(mine, s)) for s in steps]
            rows.append(f"| {user} | {arm} | {len(mine)} | " + " | ".join(cells)
                        + f" | {_fmt_ci(*gain(mine, last))} |")  # fmt: skip
    out = ["\n".join(rows), "", f"Per-user minus shared at {last} steps:", ""]
    for user in users:
        out.append(f"- {user}: {_fmt_ci(*arm_difference(runs, user, last))}")
    return "\n".join(out)


def arm_difference(runs: Sequence[UsersRun], user: str, step: int) -> tuple[float, float, float]:
    """``(mean, low, high)`` of the per-user arm's score minus the shared arm's for ``user`` at
    ``step``: one seed, paired over the held-out problems (both arms answer the same ones);
    several, the t-interval over the seeds' differences."""
    pairs = []
    for seed in sorted({run.seed for run in runs}):
        got = {}
        for run in runs:
            if run.seed != seed:
                continue
            for r in run.users:
                if r.method == f"{run.arm}:{user}" and step in r.evaluations:
                    got[run.arm] = r.evaluations[step]
        if len(got) == 2:
            pairs.append((got["shared"], got["per-user"]))
    if not pairs:
        return float("nan"), float("nan"), float("nan")
    if len(pairs) == 1:
        shared, mine = pairs[0]
        return paired_diff_ci(shared.scores, mine.scores)
    return seed_ci([m.score - s.score for s, m in pairs])


def write_users_report(runs: Sequence[UsersRun], settings: DemoSettings, wall_s: float) -> Path:
    """``OUT/report.md`` (the table, steps, sessions and drops per run) and ``results.json``."""
    import json
    from dataclasses import asdict

    out = Path(settings.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    steps = sorted({s for run in runs for r in run.users for s in r.evaluations})
    lines = [
        "# clawrl demo --users: one gateway, two users with conflicting wishes", "",
        f"Seeds {', '.join(str(s) for s in sorted({r.seed for r in runs}))}; {settings.steps} "
        f"steps per user x {settings.batch_size} samples (the shared arm: {settings.steps} x "
        f"the number of users); wall time {wall_s / 60:.1f} min.", "",
        users_table(runs, steps) if steps else "(no evaluation finished)", "",
        "| arm | seed | steps | sessions per user | drops | note |", "|---|---:|---:|---|---|---|",
    ]  # fmt: skip
    for run in runs:
        per = ", ".join(f"{r.method.split(':', 1)[1]} {r.sessions} ({r.steps_done} steps)"
                        for r in run.users)  # fmt: skip
        drops = ", ".join(f"{k} {v}" for k, v in sorted(run.drops.items())) or "-"
        lines.append(f"| {run.arm} | {run.seed} | {run.steps_done} | {per} | {drops} | "
                     f"{run.note or '-'} |")  # fmt: skip
    (out / "report.md").write_text("\n".join(lines) + "\n")

    def plain(value: Any) -> Any:
        if isinstance(value, float) and value != value:
            return None
        if isinstance(value, dict):
            return {str(k): plain(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [plain(v) for v in value]
        return value

    (out / "results.json").write_text(json.dumps(plain([asdict(r) for r in runs]), indent=1))
    return out / "report.md"
