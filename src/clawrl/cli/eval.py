"""``clawrl eval personalization``: score a served policy's first answers with a simulated user."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any

API_KEY_ENV = "CLAWRL_API_KEY"
USER_API_KEY_ENV = "CLAWRL_USER_API_KEY"


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "eval",
        help="evaluate a served policy (personalization scenarios)",
        description="Evaluate the policy served at --base-url.",
    )
    esub = p.add_subparsers(dest="eval_command", metavar="SUITE", required=True)
    e = esub.add_parser(
        "personalization",
        help="score first answers to held-out problems with the simulated user's rubric",
        description="Send the simulated user's opening message for each held-out problem to "
        "the gateway once and score the first answer in [0, 1]: with the rule-based user, the "
        "fraction of its rubric's checks met; with an LLM user (--user llm), its 0-10 rating / "
        "10. Prints the mean score and each check's pass rate. Requests carry the header "
        "'X-Clawrl-Eval: 1' and session ids starting with 'eval-', so the online loop does not "
        "train on them. The held-out split is deterministic in --seed (and --dataset).",
        epilog="examples:\n  clawrl eval personalization --scenario student "
        "--base-url http://127.0.0.1:8000 --problems 50\n"
        "  clawrl eval personalization --scenario my_scenario.toml",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    e.add_argument(
        "--scenario",
        default="student",
        metavar="NAME|FILE",
        help="student (default), teacher, or a scenario file (TOML, see clawrl.envs.scenario)",
    )
    e.add_argument(
        "--base-url", default="http://127.0.0.1:8000", help="the gateway (http://127.0.0.1:8000)"
    )
    e.add_argument("--problems", type=int, default=50, help="held-out problems to score (50)")
    e.add_argument(
        "--dataset", metavar="FILE", help="GSM8K-format JSONL (default: the scenario's problems)"
    )
    e.add_argument("--seed", type=int, default=0, help="problem, split and phrasing seed (0)")
    e.add_argument("--user", choices=["rule", "llm"], default="rule", help="simulated user (rule)")
    e.add_argument("--user-url", help="LLM user: OpenAI-compatible base URL")
    e.add_argument("--user-model", help="LLM user: model name")
    e.add_argument("--user-api-key", help=f"LLM user: API key (or ${USER_API_KEY_ENV})")
    e.add_argument("--model", default="policy", help="model name sent to the gateway (policy)")
    e.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default 0)")
    e.add_argument(
        "--max-tokens", type=int, help="new tokens per answer (default: the scenario's budget)"
    )
    e.add_argument("--concurrency", type=int, default=4, help="requests in flight (4)")
    e.add_argument("--system", help="system prompt before each opening message (none)")
    e.add_argument("--timeout", type=float, default=300.0, help="per-request timeout, s (300)")
    e.add_argument("--api-key", help=f"the gateway's API key (or ${API_KEY_ENV})")
    e.add_argument("--json", action="store_true", help="print the result as JSON")
    e.set_defaults(func=run)


def _table(result: Any) -> Any:
    from rich.table import Table

    mean = result.mean_score
    versions = ",".join(str(v) for v in result.policy_versions) or "?"
    table = Table(
        title=f"personalization: {result.scenario} ({result.user_kind} user), "
        f"policy version {versions}"
    )
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("mean score", "n/a" if mean is None else f"{mean:.3f}")
    sat = result.satisfied_rate
    table.add_row("satisfied", "n/a" if sat is None else f"{sat:.0%}")
    for name, rate in result.check_pass_rates.items():
        table.add_row(f"check: {name}", f"{rate:.0%}")
    rep, acc = result.repetition_rate, result.answer_accuracy
    if rep is not None:
        table.add_row("guard: repeats a sentence 3+ times", f"{rep:.0%}")
    if acc is not None:
        table.add_row("guard: last number is the right answer", f"{acc:.0%}")
    table.add_row("problems (scored / total)", f"{len(result.scored)} / {len(result.items)}")
    if result.n_unrated:
        table.add_row("unparseable ratings", str(result.n_unrated))
    if result.n_errors:
        table.add_row("failed calls", str(result.n_errors))
    table.add_row("wall time", f"{result.wall_s:.1f} s")
    return table


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import Progress

    from clawrl.envs import aevaluate_personalization, load_scenario, make_user, problem_split
    from clawrl.envs.evaluate import RECOMMENDED_PROBLEMS
    from clawrl.errors import ConfigError

    if args.problems < 1:
        raise ConfigError("--problems must be >= 1")
    err = Console(stderr=True)
    if args.problems < RECOMMENDED_PROBLEMS:
        err.print(
            f"[yellow]note:[/] {args.problems} problems; use at least {RECOMMENDED_PROBLEMS} "
            "for a reported score"
        )
    spec = load_scenario(args.scenario)
    split = problem_split(args.dataset or spec.dataset(), held_out=args.problems, seed=args.seed)
    user = make_user(
        spec,
        args.user,
        seed=args.seed,
        user_url=args.user_url,
        user_model=args.user_model,
        user_api_key=args.user_api_key or os.environ.get(USER_API_KEY_ENV),
    )
    with Progress(console=err, transient=True, disable=args.json) as bar:
        task = bar.add_task("evaluating", total=len(split.held_out))
        result = asyncio.run(
            aevaluate_personalization(
                args.base_url,
                spec,
                split.held_out,
                user=user,
                model=args.model,
                temperature=args.temperature,
                max_tokens=args.max_tokens or spec.answer.max_tokens,
                concurrency=args.concurrency,
                seed=args.seed,
                system_prompt=args.system,
                api_key=args.api_key or os.environ.get(API_KEY_ENV),
                timeout_s=args.timeout,
                progress=lambda _item: bar.advance(task),
            )
        )
    if args.json:
        json.dump(result.to_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        Console().print(_table(result))
    if result.items and result.n_errors == len(result.items):
        first = next(i.error for i in result.items if i.error)
        err.print(f"[red]every call failed[/]; the first: {first}")
        return 1
    return 0
