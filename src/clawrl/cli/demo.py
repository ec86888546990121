"""``clawrl demo``: the main job — personalization by online RL from a simulated user."""

from __future__ import annotations

import argparse
import time
from typing import Any

from clawrl.cli.common import add_config_options, config_from_args, quiet_transformers


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "demo",
        help="the main job: a simulated user teaches the policy its preferences online",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="""\
Reproduce OpenClaw-RL's personalization experiment on the embedded model, end to end:
start the gateway with the online loop (PRM judge + trainer), score the policy's first answer
to held-out problems with the simulated user's rubric (version 0), let the simulated user talk
to it while it trains, and score it again after 8 and 16 steps. The student wants answers that
do not look AI-written (no bold, headers, numbered steps or boilerplate; short and casual); the
teacher wants specific, friendly grading comments.

Writes demo-report/: report.md (the table), scores.png, training.png, config.toml,
results.json, and each run's store, checkpoints and metrics under runs/.""",
        epilog="examples:\n  clawrl demo                      # student, combined method\n"
        "  clawrl demo --quick              # a 4-step first look (~5 min)\n"
        "  clawrl demo teacher --compare rl,opd,combine",
    )
    p.add_argument("scenario", nargs="?", default="student", choices=["student", "teacher"])
    p.add_argument("--method", default="combine", choices=["rl", "opd", "combine"],
                   help="training method (default combine = Binary RL + OPD)")  # fmt: skip
    p.add_argument("--compare", metavar="M1,M2,...",
                   help="run several methods from the same start, e.g. rl,opd,combine")  # fmt: skip
    p.add_argument("--steps", type=int, default=16, help="training steps (16)")
    p.add_argument("--batch-size", type=int, default=4,
                   help="samples per step (4 here to fit a laptop CPU; OpenClaw-RL uses 16)")  # fmt: skip
    p.add_argument("--eval-problems", type=int, default=50, help="held-out problems (50)")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens per answer (64)")
    p.add_argument("--concurrency", type=int, default=4, help="simulated sessions at once (4)")
    p.add_argument("--dataset", help="GSM8K-format JSONL (default: built-in generated problems)")
    p.add_argument("--out", default="demo-report", help="report directory (demo-report)")
    p.add_argument("--quick", action="store_true",
                   help="a first look: 4 steps of 2 samples, evaluated at 0, 2, 4 on 20 problems")  # fmt: skip
    p.add_argument("--seed", type=int, default=0)
    add_config_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    quiet_transformers()
    import logging

    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from clawrl.demo import DemoSettings, run_demo, write_report
    from clawrl.demo.report import METHOD_NAMES, score_table

    logging.getLogger("clawrl").setLevel(logging.ERROR)
    cfg = config_from_args(args)
    methods = tuple(m.strip() for m in (args.compare or args.method).split(",") if m.strip())
    bad = [m for m in methods if m not in METHOD_NAMES]
    if bad:
        raise SystemExit(f"clawrl demo: unknown method(s) {bad}; choose from rl, opd, combine")
    steps, batch, problems = args.steps, args.batch_size, args.eval_problems
    evals = (0, steps // 2, steps)
    if args.quick:
        steps, batch, problems, evals = 4, 2, 20, (0, 2, 4)
    settings = DemoSettings(
        scenario=args.scenario, methods=methods, steps=steps, eval_steps=evals,
        batch_size=batch, eval_problems=problems, max_tokens=args.max_tokens,
        concurrency=args.concurrency, dataset=args.dataset, out_dir=args.out, seed=args.seed,
    )  # fmt: skip
    console = Console()
    console.print(
        f"[bold]clawrl demo[/]: {args.scenario} scenario, methods {', '.join(methods)}, "
        f"{steps} steps x {batch} samples, eval on {problems} held-out problems at steps "
        f"{', '.join(map(str, evals))}"
    )
    t0 = time.perf_counter()
    with Progress(
        TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(), console=console,
    ) as bars:  # fmt: skip
        step_bar = bars.add_task("steps", total=steps * len(methods), info="")
        sess_bar = bars.add_task("sessions", total=None, info="")
        sample_bar = bars.add_task("samples", total=steps * batch * len(methods), info="")
        done_steps: dict[str, int] = {}
        done_samples: dict[str, int] = {}

        def progress(event: str, info: dict[str, Any]) -> None:
            m = info["method"]
            if event == "sessions":
                st = info["status"]
                done_steps[m], done_samples[m] = st.steps, st.trained
                bars.update(sess_bar, completed=info["sessions"],
                            info=f"{m}: {info['sessions']} sessions, judged {st.judged}")  # fmt: skip
                bars.update(step_bar, completed=sum(done_steps.values()),
                            info=f"{m}: step {st.steps}, policy v{st.policy_version}")  # fmt: skip
                bars.update(sample_bar, completed=sum(done_samples.values()),
                            info=f"ready {st.ready}, drops {sum(st.drops.values())}")  # fmt: skip
            elif event == "eval":
                bars.update(step_bar, info=f"{m}: evaluating at step {info['step']}")
            elif event == "evaluated":
                console.print(f"  {METHOD_NAMES[m]} step {info['step']} (policy "
                              f"v{info['version']}): score {info['score']:.3f}")  # fmt: skip

        results = run_demo(settings, cfg, progress=progress)
    wall = time.perf_counter() - t0
    report = write_report(results, settings, cfg, wall)
    console.print()
    console.print(score_table(results, sorted(set(evals))))
    console.print(f"\nwall time {wall / 60:.1f} min; report: {report}")
    return 0
