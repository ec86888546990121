"""``clawrl demo``: the main job — personalization by online RL from a simulated user."""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING, Any

from clawrl.cli.common import (
    MODEL_HELP,
    add_config_options,
    add_model_options,
    quiet_transformers,
    with_model_flags,
)
from clawrl.cli.options import add_engine_options, apply_engine_flags

if TYPE_CHECKING:
    from clawrl.config import Config


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "demo",
        help="the main job: a simulated user teaches the policy its preferences online",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="""\
Reproduce OpenClaw-RL's personalization experiment on the embedded model, end to end: start
the gateway with the online loop (PRM judge + trainer), score the policy's first answer to
held-out problems with the scenario's rubric (version 0), let the simulated user talk to it
while it trains, and score it again after 8 and 16 steps. The student wants homework answers
that do not look AI-written (the number first, a few casual sentences, no textbook phrasing);
the teacher wants a comment written to the student (is it right, what went well,
what to fix), not the answer. Any scenario file (TOML, see
clawrl.envs.scenario) works with --scenario FILE.

Writes demo-report/: report.md (scores with 95% intervals, each check, guards, sessions to
converge, the judge's agreement, examples before and after), scores.png, training.png,
config.toml (what ran), results.json, and each run's store and trained adapter under runs/.""",
        epilog="examples:\n  clawrl demo                          # student, combined method\n"
        "  clawrl demo --quick                  # a 4-step first look\n"
        "  clawrl demo --compare rl,opd,combine --seeds 3\n"
        "  clawrl demo --memory --seeds 3        # memory alone, Combined, memory + Combined\n"
        "  clawrl demo --users 2 --seeds 3       # student and parent: an adapter each vs shared\n"
        "  clawrl demo teacher\n"
        "  clawrl demo --quick --engine vllm    # rollouts, evaluation, scoring on a vLLM server\n"
        "  clawrl demo --scenario my_scenario.toml",
    )
    p.add_argument("scenario", nargs="?", default="student",
                   help="student (default), teacher, or a scenario file")  # fmt: skip
    p.add_argument("--scenario", dest="scenario_file", metavar="FILE",
                   help="a scenario file (same as the positional argument)")  # fmt: skip
    p.add_argument("--method", default="combine", choices=["rl", "opd", "combine"],
                   help="training method (default combine = Binary RL + OPD)")  # fmt: skip
    p.add_argument("--compare", metavar="M1,M2,...",
                   help="run several methods from the same start, e.g. rl,opd,combine (also "
                   "the memory arms: memory, memory+combine)")  # fmt: skip
    p.add_argument("--memory", action="store_true",
                   help="preference memory side by side from the same start: memory alone (the "
                   "judge's hints kept as entries in the system message, no training), "
                   "Combined, and memory + Combined distilling the memory into the weights; "
                   "memory arms are scored with the memory and with the weights alone "
                   "(= --compare memory,combine,memory+combine)")  # fmt: skip
    p.add_argument("--users", type=int, choices=[2], metavar="2",
                   help="two simulated users with conflicting wishes (student: the number "
                   "first, no steps; parent: numbered steps, 'Answer: N' last) through one "
                   "gateway, each with an API key of their own; two arms from the same start: "
                   "an adapter per user (--per-user-adapters) and one shared policy trained on "
                   "both; --steps is per user (the shared arm takes twice as many); each user is "
                   "scored on their own held-out problems and rubric")  # fmt: skip
    p.add_argument("--seeds", type=int, default=1, help="repeat every run from seeds 0..K-1 (1)")
    p.add_argument("--jobs", type=int, default=1,
                   help="runs at once (1), each in its own thread with the cores split between "
                   "them (torch threads = cores // runs at once, unless OMP_NUM_THREADS is set); "
                   "a 3-method x 3-seed comparison needs no babysitting")  # fmt: skip
    p.add_argument("--steps", type=int, help="training steps (16; --quick: 4)")
    p.add_argument("--batch-size", type=int,
                   help="samples per step (4 here to fit a laptop CPU; OpenClaw-RL uses 16; "
                   "--quick: 2)")  # fmt: skip
    p.add_argument("--eval-problems", type=int,
                   help="held-out problems (the scenario's [problems] held_out: student 32, "
                   "teacher 50)")  # fmt: skip
    p.add_argument("--max-tokens", type=int,
                   help="tokens per answer (the scenario's [answer] max_tokens: 256)")  # fmt: skip
    p.add_argument("--concurrency", type=int, default=6, help="simulated sessions at once (6)")
    p.add_argument("--schedule", choices=["fixed", "async"], default="fixed",
                   help="fixed (default): waves of --concurrency sessions with seeded sampling, "
                   "then the steps they allow, samples in a fixed order: one seed gives one "
                   "table on one machine; async: as a live server trains, sessions keep "
                   "running while the learner steps whenever a batch is ready (faster; which "
                   "samples share a step depends on timing)")  # fmt: skip
    p.add_argument("--dataset", help="GSM8K-format JSONL (default: the scenario's problems)")
    p.add_argument("--out", default="demo-report", help="report directory (demo-report)")
    p.add_argument("--quick", action="store_true",
                   help="a first look: 4 steps of 2 samples, evaluated at 0, 2, 4 on 20 problems "
                   "(--steps, --batch-size and --eval-problems given with it win)")  # fmt: skip
    p.add_argument("--seed", type=int, default=0, help="the first seed (0)")
    p.add_argument("--validation", action="store_true",
                   help="evaluate on validation problems carved out of the training split "
                   "(and kept out of training) instead of the held-out ones: choose "
                   "hyperparameters with this, never on held-out scores")  # fmt: skip
    p.add_argument("--store", metavar="URL",
                   help="keep each run's store in this PostgreSQL database "
                   "(postgresql://USER@HOST:PORT/DB), one schema per run (clawrl_demo_METHOD_"
                   "seedN, emptied first); default: a SQLite file per run under --out")  # fmt: skip
    add_model_options(
        p, model_help=MODEL_HELP + " (the scenario's user, judge and rubric stay the same)"
    )
    add_config_options(p)
    add_engine_options(p)
    p.set_defaults(func=run)


def demo_config(args: argparse.Namespace) -> Config:
    """``--config`` and ``--set``, then the engine and model flags that were given.

    Raises:
        ConfigError: a malformed setting, or a vLLM flag with ``--engine transformers``.
    """
    from clawrl.config import load_raw, validate_config

    data = load_raw(args.config, args.overrides)
    apply_engine_flags(data, args)
    return with_model_flags(validate_config(data), args)


def run_shape(args: argparse.Namespace) -> tuple[int, int, int | None, tuple[int, int, int]]:
    """``(steps, batch size, held-out problems or None for the scenario's, evaluated steps)``:
    the flags given, else ``--quick``'s (4, 2, 20) or the defaults (16, 4, the scenario's)."""
    quick = args.quick
    steps = args.steps if args.steps is not None else (4 if quick else 16)
    batch = args.batch_size if args.batch_size is not None else (2 if quick else 4)
    problems = args.eval_problems if args.eval_problems is not None else (20 if quick else None)
    return steps, batch, problems, (0, steps // 2, steps)


def run(args: argparse.Namespace) -> int:
    quiet_transformers()
    import logging

    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from clawrl.demo import DemoSettings, run_demo, write_report
    from clawrl.demo.report import METHOD_NAMES, score_table, with_weights_only
    from clawrl.demo.runner import torch_threads_per_run
    from clawrl.envs import load_scenario

    logging.getLogger("clawrl").setLevel(logging.ERROR)
    cfg = demo_config(args)
    if args.users:
        return run_users_demo(args, cfg)
    scenario = args.scenario_file or args.scenario
    spec = load_scenario(scenario)  # a malformed file fails here, before any model loads
    if args.memory and args.compare:
        raise SystemExit("clawrl demo: --memory is --compare memory,combine,memory+combine; "
                         "give one of them")  # fmt: skip
    chosen = args.compare or ("memory,combine,memory+combine" if args.memory else args.method)
    methods = tuple(m.strip() for m in chosen.split(",") if m.strip())
    bad = [m for m in methods if m not in METHOD_NAMES]
    if bad:
        raise SystemExit(f"clawrl demo: unknown method(s) {bad}; choose from "
                         f"{', '.join(METHOD_NAMES)}")  # fmt: skip
    steps, batch, problems, evals = run_shape(args)
    seeds = tuple(range(args.seed, args.seed + max(1, args.seeds)))
    settings = DemoSettings(
        scenario=scenario, methods=methods, seeds=seeds, steps=steps, eval_steps=evals,
        batch_size=batch, eval_problems=problems, max_tokens=args.max_tokens,
        concurrency=args.concurrency, dataset=args.dataset, out_dir=args.out,
        validation=args.validation, store=args.store, jobs=max(1, args.jobs),
        schedule=args.schedule,
    )  # fmt: skip
    console = Console()
    tty = console.is_terminal
    runs = len(methods) * len(seeds)
    console.print(
        f"[bold]clawrl demo[/]: {spec.name} scenario, methods {', '.join(methods)}, "
        f"seeds {', '.join(map(str, seeds))}, {steps} steps x {batch} samples, answers of "
        f"{args.max_tokens or spec.answer.max_tokens} tokens, eval on "
        f"{problems or spec.problems.held_out} "
        f"{'validation (training-split)' if args.validation else 'held-out'} problems at steps "
        f"{', '.join(map(str, evals))}"
    )
    threads = torch_threads_per_run(min(settings.jobs, runs))
    if threads is not None:
        console.print(f"{min(settings.jobs, runs)} runs at once, {threads} torch thread(s) each "
                      "(set OMP_NUM_THREADS to choose)")  # fmt: skip
    t0 = time.perf_counter()
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TextColumn("left"),
        TimeRemainingColumn(), console=console, disable=not tty,
    ) as bars:  # fmt: skip
        step_bar = bars.add_task("steps", total=steps * runs, info="")
        done_steps: dict[tuple[str, int], int] = {}
        last_line = [0.0]

        def line(text: str) -> None:
            """One plain line for logs (the bars show it all on a terminal)."""
            if not tty:
                print(text, flush=True)

        def progress(event: str, info: dict[str, Any]) -> None:
            key = (info["method"], info["seed"])
            name = f"{METHOD_NAMES[info['method']]} seed {info['seed']}"
            if event == "server":
                console.print(f"  {name}: watch it live at {info['url']}")
            elif event == "sessions":
                st = info["status"]
                before = done_steps.get(key, 0)
                done_steps[key] = st.steps
                total = sum(done_steps.values())
                bars.update(step_bar, completed=total,
                            info=f"{name}: step {st.steps}/{steps}, {info['sessions']} sessions, "
                            f"judged {st.judged}, ready {st.ready}")  # fmt: skip
                if st.steps > before or time.monotonic() - last_line[0] > 60:
                    last_line[0] = time.monotonic()
                    elapsed = time.perf_counter() - t0
                    eta = (
                        f"~{elapsed / total * (steps * runs - total) / 60:.0f} min left"
                        if total
                        else "time left known after the first step"
                    )
                    line(f"{name}: step {st.steps}/{steps} ({total}/{steps * runs} overall), "
                         f"{info['sessions']} sessions, {elapsed / 60:.1f} min elapsed, {eta}")  # fmt: skip
            elif event == "eval":
                bars.update(step_bar, info=f"{name}: evaluating at step {info['step']}")
                line(f"{name}: evaluating at step {info['step']}")
            elif event == "evaluated":
                low, high = info["ci"]
                how = (" weights alone" if info.get("weights_only")
                       else " with memory" if info["method"].startswith("memory") else "")  # fmt: skip
                console.print(f"  {name} step {info['step']} (policy v{info['version']}){how}: "
                              f"score {info['score']:.3f} [{low:.3f}, {high:.3f}]")  # fmt: skip

        results = run_demo(settings, cfg, progress=progress)
    wall = time.perf_counter() - t0
    report = write_report(results, settings, cfg, wall)
    console.print()
    console.print(score_table(with_weights_only(results)))
    console.print(f"\nwall time {wall / 60:.1f} min; report: {report}")
    sys.stdout.flush()
    return 0


def run_users_demo(args: argparse.Namespace, cfg: Config) -> int:
    """``clawrl demo --users 2`` (:mod:`clawrl.demo.users`): both arms, every seed, one at a
    time; a line per wave and per evaluation, then the table."""
    from clawrl.demo import DemoSettings
    from clawrl.demo.users import USER_ARMS, USERS, run_users, users_table, write_users_report
    from clawrl.engine.threads import call_in_transient_thread
    from clawrl.envs import load_scenario
    from clawrl.runtime import build_judge

    specs = [load_scenario(name) for name in USERS[: args.users]]
    steps, batch, problems, evals = run_shape(args)
    seeds = tuple(range(args.seed, args.seed + max(1, args.seeds)))
    settings = DemoSettings(
        scenario=USERS[0], methods=(args.method,), seeds=seeds, steps=steps, eval_steps=evals,
        batch_size=batch, eval_problems=problems, max_tokens=args.max_tokens,
        concurrency=args.concurrency, dataset=args.dataset, out_dir=args.out,
        validation=args.validation, store=args.store,
    )  # fmt: skip
    runs = [(seed, arm) for seed in seeds for arm in USER_ARMS]
    print(f"clawrl demo --users {args.users}: {', '.join(s.name for s in specs)} through one "
          f"gateway; arms {', '.join(USER_ARMS)}; seeds {', '.join(map(str, seeds))}; {steps} "
          f"steps per user x {batch} samples; evaluated at {', '.join(map(str, evals))}",
          flush=True)  # fmt: skip
    t0 = time.perf_counter()
    total = steps * args.users * len(runs)
    done: dict[tuple[str, int], int] = {}

    def progress(event: str, info: dict[str, Any]) -> None:
        elapsed = time.perf_counter() - t0
        if event == "sessions":
            done[(info["method"], info["seed"])] = info["status"].steps
            overall = sum(done.values())
            eta = f", ~{elapsed / overall * (total - overall) / 60:.0f} min left" if overall else ""
            print(f"{info['method']} seed {info['seed']}: step {info['status'].steps}/"
                  f"{steps * args.users} ({overall}/{total} overall), {info['sessions']} "
                  f"sessions, {elapsed / 60:.1f} min{eta}", flush=True)  # fmt: skip
        elif event == "evaluated":
            low, high = info["ci"]
            print(f"  {info['method']} seed {info['seed']} step {info['step']} (version "
                  f"{info['version']}): score {info['score']:.3f} [{low:.3f}, {high:.3f}]",
                  flush=True)  # fmt: skip

    judge = call_in_transient_thread(build_judge, cfg)
    results = []
    try:
        for seed, arm in runs:
            results.append(run_users(arm, settings, cfg, specs, seed=seed, judge=judge,
                                     progress=progress))  # fmt: skip
    finally:
        judge.close()
    wall = time.perf_counter() - t0
    report = write_users_report(results, settings, wall)
    print()
    print(users_table(results, sorted(set(evals))))
    print(f"\nwall time {wall / 60:.1f} min; report: {report}", flush=True)
    return 0
