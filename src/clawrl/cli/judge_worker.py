"""``clawrl judge worker``: the PRM judge as its own process over the store."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import time
from typing import TYPE_CHECKING

from clawrl.cli.common import STORE_HELP, add_config_options, quiet_transformers
from clawrl.cli.options import add_judge_options, config_with_flags

if TYPE_CHECKING:
    from clawrl.store import JudgmentRecord


def register(jsub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    w = jsub.add_parser(
        "worker",
        help="judge every turn of the store as its next state appears (its own process)",
        description="Poll the store for turns that have a next state (the user's reply, a "
        "tool's output, explicit feedback) and no judgment, judge each (m votes, majority, "
        "hint) and store the verdict, which `clawrl train` turns into samples. Runs beside "
        "`clawrl serve --external-trainer` and `clawrl train` on one store; any number of "
        "workers may run (each claims a turn while judging it; the first verdict stored wins). "
        "Killed, "
        "it loses nothing: an unstored judgment is redone on restart. One console line per "
        "judgment.",
        epilog="examples:\n"
        "  clawrl judge worker --store clawrl.db\n"
        "  clawrl judge worker --store postgresql://u@db/clawrl --judge openai \\\n"
        "      --judge-url http://judge-host:8000/v1 --judge-model NAME",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    w.add_argument("--store", help=STORE_HELP)
    w.add_argument("--model", help="the policy's model spec: a local judge reads its base "
                   "weights unless --judge-model names others (default: smollm2-135m)")  # fmt: skip
    w.add_argument("--concurrency", type=int, default=4, help="judgments in flight at once (4)")
    add_judge_options(w)
    add_config_options(w)
    w.set_defaults(func=run_worker)


def judgment_line(rec: JudgmentRecord) -> str:
    """One console line per stored judgment, e.g.
    ``19:04:12 judged turn 9e8d7c6b session 3f2a1b2c: +1, 3 votes, hint, 0.41 s``."""
    when = time.strftime("%H:%M:%S", time.localtime(rec.created_at))
    if rec.skipped:
        verdict = "skipped (the session ended before a next state)"
    elif rec.score is None:
        verdict = f"no judgment ({rec.reason or 'unknown'})"
    else:
        verdict = f"{rec.score:+d}, {len(rec.votes)} votes" + (", hint" if rec.hint else "")
    latency = f", {rec.latency_s:.2f} s" if rec.latency_s is not None else ""
    return f"{when} judged turn {rec.turn_id[:8]} session {rec.session_id[:8]}: {verdict}{latency}"


def run_worker(args: argparse.Namespace) -> int:
    cfg = config_with_flags(args)
    overrides: dict[str, object] = {}
    if args.model:
        overrides["model"] = cfg.model.model_copy(update={"spec": args.model})
    if args.store:
        overrides["server"] = cfg.server.model_copy(update={"store": args.store})
    cfg = cfg.model_copy(update=overrides)
    quiet_transformers()
    from clawrl.runtime import build_judge_worker

    worker, close = build_judge_worker(cfg)
    worker.concurrency = max(1, args.concurrency)
    worker.on_judgment = lambda rec: print(judgment_line(rec), flush=True)

    async def go() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await worker.run(stop)

    print(f"clawrl judge worker: judging turns of {worker.store.target} with "
          f"{cfg.judge.backend.kind} x{cfg.judge.votes}", flush=True)  # fmt: skip
    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(go())
    finally:
        close()
    print(f"clawrl judge worker: stopped after {worker.judged} judgments", flush=True)
    return 0
