"""``clawrl judge eval``: measure the PRM judge on a labeled set."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

from clawrl.cli.common import add_config_options, config_from_args, quiet_transformers


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "judge",
        help="the PRM judge (turn scores and hints); `clawrl judge eval` measures it",
        description="The PRM judge scores a turn +1 / -1 / 0 from what came next, by a "
        "majority of m votes, and writes a hint when the next state says how the turn should "
        "have been done.",
    )
    jsub = p.add_subparsers(dest="judge_command", metavar="SUBCOMMAND", required=True)
    e = jsub.add_parser(
        "eval",
        help="judge a labeled set; print accuracy, confusion matrix, hint P/R, judgments/s",
        description="Judge every case of a labeled JSONL set (default: the one shipped with "
        "clawrl) and print accuracy, the confusion matrix, hint precision and recall, and "
        "judgments per second. Backends: choice (calibrated verdict log-probs; suits small "
        "local models), generative (sampled verdicts from a local model), openai (any "
        "OpenAI-compatible endpoint).",
        epilog="examples:\n"
        "  clawrl judge eval --backend choice --votes 3\n"
        "  clawrl judge eval --backend generative --votes 5 --model smollm2-135m\n"
        "  JUDGE_KEY=... clawrl judge eval --backend openai --judge-url http://127.0.0.1:8000/v1 "
        "--judge-model smollm2-135m --judge-api-key-env JUDGE_KEY",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    e.add_argument("--cases", metavar="FILE", help="labeled JSONL set (default: the shipped one)")
    e.add_argument(
        "--backend",
        choices=["choice", "generative", "openai"],
        default="choice",
        help="where votes come from (choice)",
    )
    e.add_argument("--votes", type=int, default=3, metavar="M", help="votes per judgment (3)")
    e.add_argument("--model", help="local judge model spec (default: smollm2-135m)")
    e.add_argument("--judge-url", help="openai backend: API base, e.g. http://127.0.0.1:8000/v1")
    e.add_argument("--judge-model", help="openai backend: the request's model name")
    e.add_argument(
        "--judge-api-key-env", metavar="VAR", help="openai backend: env var holding the API key"
    )
    e.add_argument(
        "--request-timeout", type=float, default=30.0, help="openai: seconds per HTTP request (30)"
    )
    e.add_argument("--max-retries", type=int, default=2, help="openai: retries per vote (2)")
    e.add_argument("--timeout", type=float, default=120.0, help="seconds per judgment (120)")
    e.add_argument("--concurrency", type=int, default=4, help="cases judged at a time (4)")
    e.add_argument("--limit", type=int, default=None, help="judge only the first N cases")
    e.add_argument("--max-tokens", type=int, default=None, help="generative/openai: per vote")
    e.add_argument("--temperature", type=float, default=None, help="generative/openai (0.8)")
    e.add_argument("--seed", type=int, default=0, help="vote i samples with seed+i (0)")
    e.add_argument("--no-calibrate", action="store_true", help="choice: skip calibration")
    e.add_argument(
        "--prefixes",
        metavar="K[,K...]",
        help="also report m=K from the first K votes of each judgment (e.g. 1,3 with --votes 5)",
    )
    e.add_argument("--output", metavar="FILE", help="write one JSON line per case here")
    e.add_argument("--json", action="store_true", help="also print the metrics as JSON")
    add_config_options(e)
    e.set_defaults(func=run_eval)


def _backend_config(args: argparse.Namespace) -> Any:
    """The typed backend config the arguments describe.

    Raises:
        JudgeError: missing or out-of-bounds options (the message names the field).
    """
    from pydantic import ValidationError

    from clawrl.errors import JudgeError

    try:
        return _backend_config_unchecked(args)
    except ValidationError as e:
        lines = [f"  {'.'.join(map(str, x['loc']))}: {x['msg']}" for x in e.errors()]
        raise JudgeError("invalid judge options:\n" + "\n".join(lines)) from e


def _backend_config_unchecked(args: argparse.Namespace) -> Any:
    from clawrl.errors import JudgeError
    from clawrl.judge.config import ChoiceJudgeConfig, GenerativeJudgeConfig, OpenAIJudgeConfig

    sampling: dict[str, Any] = {"seed": args.seed}
    if args.max_tokens is not None:
        sampling["max_tokens"] = args.max_tokens
    if args.temperature is not None:
        sampling["temperature"] = args.temperature
    if args.backend == "openai":
        if not args.judge_url or not args.judge_model:
            raise JudgeError("--backend openai needs --judge-url and --judge-model")
        return OpenAIJudgeConfig(
            url=args.judge_url,
            model=args.judge_model,
            api_key_env=args.judge_api_key_env,
            request_timeout_s=args.request_timeout,
            max_retries=args.max_retries,
            **sampling,
        )
    if args.backend == "generative":
        return GenerativeJudgeConfig(**sampling)
    return ChoiceJudgeConfig(calibrate=not args.no_calibrate)


def _prefixes(text: str | None, votes: int) -> list[int]:
    from clawrl.errors import JudgeError

    if not text:
        return []
    try:
        ks = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError as e:
        raise JudgeError(f"--prefixes must be integers like 1,3: {text!r}") from e
    if not all(1 <= k <= votes for k in ks):
        raise JudgeError(f"--prefixes must lie in 1..{votes} (--votes): {text!r}")
    return ks


def _fmt(x: float | None, pct: bool = True) -> str:
    if x is None:
        return "n/a"
    return f"{100 * x:.1f}%" if pct else f"{x:.2f}"


def run_eval(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from clawrl.judge import Judge, Score, load_cases
    from clawrl.judge.backends import build_backend
    from clawrl.judge.evaluate import evaluate

    backend_cfg = _backend_config(args)
    prefixes = _prefixes(args.prefixes, args.votes)
    cases = load_cases(args.cases)
    if args.limit is not None:
        cases = cases[: args.limit]
    err = Console(stderr=True)
    engine = None
    model_name = ""
    tokenizer = None
    if args.backend != "openai":
        quiet_transformers()
        from clawrl.engine import TransformersEngine
        from clawrl.models import load_policy

        cfg = config_from_args(args)
        model_name = args.model or cfg.model.spec
        with err.status(f"loading {model_name}"):
            policy = load_policy(model_name, dtype=cfg.model.dtype, device=cfg.model.device)
        engine = TransformersEngine.from_policy(policy, max_batch=cfg.engine.max_batch)
        tokenizer = policy.tokenizer
    backend = build_backend(backend_cfg, engine=engine, tokenizer=tokenizer, model=model_name)
    judge = Judge(backend, votes=args.votes, timeout_s=args.timeout)

    label = f"{args.backend}, m={args.votes}"

    async def go() -> Any:
        with err.status(f"judging {len(cases)} cases ({label})") as status:

            def progress(done: int, total: int) -> None:
                status.update(f"judged {done}/{total} cases ({label})")
                # a log file gets one line per 10 cases instead of the spinner
                if not err.is_terminal and (done % 10 == 0 or done == total):
                    err.print(f"judged {done}/{total} cases ({label})")

            try:
                return await evaluate(judge, cases, concurrency=args.concurrency, progress=progress)
            finally:
                await judge.aclose()

    try:
        report = asyncio.run(go())
    finally:
        if engine is not None:
            engine.close()

    out = Console()
    summary = Table(title=f"clawrl judge eval: {report.backend} {report.model} m={report.votes}")
    summary.add_column("metric")
    summary.add_column("value", justify="right")
    summary.add_row("cases", str(report.n))
    summary.add_row("accuracy", _fmt(report.accuracy))
    summary.add_row("coverage (judged)", _fmt(report.coverage))
    summary.add_row("accuracy on judged", _fmt(report.judged_accuracy))
    summary.add_row("majority baseline", _fmt(report.majority_baseline))
    summary.add_row("hint precision", _fmt(report.hint_precision))
    summary.add_row("hint recall", _fmt(report.hint_recall))
    summary.add_row("judgments/s", _fmt(report.judgments_per_s, pct=False))
    summary.add_row("wall seconds", f"{report.wall_s:.1f}")
    ab = report.abstentions()
    summary.add_row("abstained votes", ", ".join(f"{k}={v}" for k, v in ab.items()) or "0")
    out.print(summary)

    order = [Score.GOOD, Score.BAD, Score.NEUTRAL]
    conf = report.confusion
    cm = Table(title="confusion matrix (rows: expected, columns: judged)")
    cm.add_column("expected \\ judged")
    for s in order:
        cm.add_column(s.label, justify="right")
    cm.add_column("none", justify="right")
    for exp in order:
        cells = [str(conf.get((exp, pred), 0)) for pred in order]
        cm.add_row(exp.label, *cells, str(conf.get((exp, None), 0)))
    out.print(cm)

    cat = Table(title="accuracy by category")
    cat.add_column("category")
    cat.add_column("correct", justify="right")
    for c, (ok, total) in report.per_category().items():
        cat.add_row(c.value, f"{ok}/{total}")
    out.print(cat)

    if prefixes:
        pre = Table(title="from the first K votes of the same judgments (no extra model calls)")
        for col in ("K", "accuracy", "coverage", "hint precision", "hint recall"):
            pre.add_column(col, justify="right")
        for k in prefixes:
            sub = report.first_votes(k)
            pre.add_row(
                str(k),
                _fmt(sub.accuracy),
                _fmt(sub.coverage),
                _fmt(sub.hint_precision),
                _fmt(sub.hint_recall),
            )
        out.print(pre)

    if args.output:
        with Path(args.output).open("w", encoding="utf-8") as f:
            for r in report.results:
                row = {
                    "id": r.case.id,
                    "category": r.case.category.value,
                    "expected_score": int(r.case.expected_score),
                    "has_hint": r.case.has_hint,
                    "correct": r.correct,
                    "judgment": r.judgment.model_dump(mode="json"),
                }
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    if args.json:
        print(json.dumps(report.metrics(), sort_keys=True))
    return 0
