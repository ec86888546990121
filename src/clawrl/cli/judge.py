"""``clawrl judge eval``: measure the PRM judge on a labeled set; ``train`` fits its head;
``worker`` (:mod:`clawrl.cli.judge_worker`) runs it over the store as its own process."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

from clawrl.cli import judge_worker
from clawrl.cli.common import add_config_options, config_from_args, quiet_transformers


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "judge",
        help="the PRM judge (turn scores and hints): eval measures it, train fits its head, "
        "worker runs it over the store",
        description="The PRM judge scores a turn +1 / -1 / 0 from what came next, by a "
        "majority of m votes, and writes a hint when the next state says how the turn should "
        "have been done.",
    )
    jsub = p.add_subparsers(dest="judge_command", metavar="SUBCOMMAND", required=True)
    e = jsub.add_parser(
        "eval",
        help="judge a labeled set; print accuracy, sign errors, hint P/R, judgments/s",
        description="Judge every case of a labeled JSONL set (default: the one shipped with "
        "clawrl; 'blind' and 'blind-b': two sets written without seeing the judge, 'blind-b' "
        "the one never used to train or choose a judge) and print "
        "accuracy, coverage, sign errors, the confusion matrix, hint precision and recall, and "
        "judgments per second. Backends: head (trained probes on the local judge model's "
        "hidden states; the default), choice (calibrated verdict log-probs), generative "
        "(sampled verdicts from a local model), openai (any OpenAI-compatible endpoint: the "
        "way to use a strong generative PRM with hints).",
        epilog="examples:\n"
        "  clawrl judge eval                              # head judge, shipped set, m=5\n"
        "  clawrl judge eval --cases blind --votes 5      # the blind held-out set\n"
        "  clawrl judge eval --backend choice --votes 3\n"
        "  JUDGE_KEY=... clawrl judge eval --backend openai --judge-url http://127.0.0.1:8000/v1 "
        "--judge-model NAME --judge-api-key-env JUDGE_KEY",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    e.add_argument(
        "--cases",
        metavar="FILE",
        help="labeled JSONL set, or 'shipped' (default), 'blind' (the first blind set) or "
        "'blind-b' (the second blind set, the held-out one)",
    )
    e.add_argument(
        "--backend",
        choices=["head", "choice", "generative", "openai"],
        default="head",
        help="where votes come from (head)",
    )
    e.add_argument("--head", metavar="FILE", help="head backend: a `clawrl judge train` file")
    e.add_argument(
        "--hints",
        choices=["bad-or-gate", "gate"],
        help="head backend: which votes look for a hint: bad-or-gate (a vote that scores -1 or "
        "whose hint gate fires; the default) or gate (only votes whose gate fires, the earlier "
        "rule)",
    )
    e.add_argument(
        "--votes",
        type=int,
        metavar="M",
        help="votes per judgment (judge.votes of --config / --set, else 5)",
    )
    e.add_argument(
        "--model",
        help="the judge's own model (default: the head's; choice/generative: model.spec)",
    )
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

    t = jsub.add_parser(
        "train",
        help="train the head judge's probes on labeled next states made from templates",
        description="Fit the head judge (clawrl.judge.head): features of synthetic labeled "
        "next states (clawrl.judge.synthetic, train and val phrasings) from the judge model's "
        "hidden states, the L2 strength and the abstention threshold chosen on val, then "
        "--probes probes (with their hint gates) refit on train + val + --extra (probe i is "
        "vote i). The blind held-out set is never used. About 15 minutes on 2 CPU cores.",
        epilog="example:\n  clawrl judge train --out judge_head.safetensors\n"
        "  clawrl judge eval --head judge_head.safetensors --cases blind",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    t.add_argument("--out", required=True, help="where the head set is written (.safetensors)")
    t.add_argument("--model", help="judge model spec (default: smollm2-135m)")
    t.add_argument("--train", type=int, default=6000, help="synthetic train cases (6000)")
    t.add_argument("--val", type=int, default=1500, help="synthetic val cases (1500)")
    t.add_argument("--probes", type=int, default=32, help="probes, i.e. most votes (32)")
    t.add_argument("--coverage", type=float, default=0.95,
                   help="fraction of val cases vote 0 must judge (0.95)")  # fmt: skip
    t.add_argument("--seed", type=int, default=0, help="synthetic draw and bootstrap seed (0)")
    t.add_argument(
        "--extra",
        default="shipped",
        metavar="FILE",
        help="human-written labeled cases added to the final fit ('shipped': the shipped set, "
        "the default; 'none')",
    )
    t.add_argument("--extra-weight", type=float, default=3.0, help="weight of each extra case (3)")
    add_config_options(t)
    t.set_defaults(func=run_train)
    judge_worker.register(jsub)


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
    from clawrl.config.judge import (
        ChoiceJudgeConfig,
        GenerativeJudgeConfig,
        HeadJudgeConfig,
        OpenAIJudgeConfig,
    )
    from clawrl.errors import JudgeError

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
    if args.backend == "choice":
        return ChoiceJudgeConfig(calibrate=not args.no_calibrate)
    given = {"path": args.head, "hints": args.hints}
    return HeadJudgeConfig(**{k: v for k, v in given.items() if v is not None})


def _cases_path(name: str | None) -> Any:
    """A labeled set by name (``shipped``, ``blind``, ``blind-b``) or path; None: the
    shipped set."""
    from clawrl.judge.cases import blind_b_cases_path, blind_cases_path

    if name == "blind":
        return blind_cases_path()
    if name == "blind-b":
        return blind_b_cases_path()
    return None if name in (None, "shipped") else name


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

    from clawrl.config.judge import JudgeConfig
    from clawrl.judge import Score, load_cases
    from clawrl.judge.evaluate import evaluate
    from clawrl.runtime import build_judge

    backend_cfg = _backend_config(args)
    cases = load_cases(_cases_path(args.cases))
    if args.limit is not None:
        cases = cases[: args.limit]
    err = Console(stderr=True)
    cfg = config_from_args(args)
    if args.backend == "head" and cfg.judge.backend.kind == "head":
        # settings given with --set / --config (min_confidence, hints) apply, the flags win
        given = {k: getattr(cfg.judge.backend, k) for k in cfg.judge.backend.model_fields_set}
        given.update(backend_cfg.model_dump(exclude_unset=True))
        backend_cfg = type(backend_cfg)(**given)
    votes = args.votes if args.votes is not None else cfg.judge.votes
    prefixes = _prefixes(args.prefixes, votes)
    # --model (else judge.model of --config / --set) names the judge's own model: explicit, so
    # a head trained on another backbone is refused (runtime.judge_model_spec); unset in both,
    # the head reads the model it was trained on. The rest of the judge's settings
    # (hint_quorum, vllm_urls, ...) come from --config / --set too: eval judges as serve would.
    judge_cfg = JudgeConfig.model_validate(
        {
            **cfg.judge.model_dump(exclude={"backend"}),
            "backend": backend_cfg,
            "model": args.model if args.model is not None else cfg.judge.model,
            "votes": votes,
            "timeout_s": args.timeout,
        }
    )
    cfg = cfg.model_copy(update={"judge": judge_cfg})
    if args.backend != "openai":
        quiet_transformers()
    with err.status(f"loading the {args.backend} judge"):
        bundle = build_judge(cfg)
    assert bundle.prm is not None
    judge = bundle.prm

    label = f"{args.backend}, m={votes}"

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
        bundle.close()

    out = Console()
    summary = Table(title=f"clawrl judge eval: {report.backend} {report.model} m={report.votes}")
    summary.add_column("metric")
    summary.add_column("value", justify="right")
    summary.add_row("cases", str(report.n))
    hints_from = getattr(cfg.judge.backend, "hints", None)  # the head judge's rule
    if hints_from is not None:
        summary.add_row("hints looked for by", f"{hints_from} votes")
    summary.add_row("hint quorum", f"{cfg.judge.hint_quorum:g}")
    summary.add_row("accuracy", _fmt(report.accuracy))
    summary.add_row("coverage (judged)", _fmt(report.coverage))
    summary.add_row("accuracy on judged", _fmt(report.judged_accuracy))
    summary.add_row("sign errors (+1 as -1 or -1 as +1)", _fmt(report.sign_error_rate))
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


def run_train(args: argparse.Namespace) -> int:
    """``clawrl judge train``: fit the head judge's probes on synthetic labeled next states."""
    import time

    from rich.console import Console

    from clawrl.judge.head import FeatureExtractor
    from clawrl.judge.head_training import train_head_set
    from clawrl.judge.synthetic import synthetic_cases
    from clawrl.models import load_policy

    quiet_transformers()
    cfg = config_from_args(args)
    spec = args.model or cfg.model.spec
    console = Console(stderr=True)
    t0 = time.perf_counter()
    with console.status(f"loading {spec}"):
        policy = load_policy(spec, dtype=cfg.model.dtype, device=cfg.model.device)
    train = synthetic_cases(args.train, split="train", seed=args.seed)
    val = synthetic_cases(args.val, split="val", seed=args.seed)
    extractor = FeatureExtractor(policy.model, policy.tokenizer)

    def progress(line: str) -> None:
        console.print(f"[{time.perf_counter() - t0:6.0f} s] {line}")

    from clawrl.judge import load_cases

    extra = [] if args.extra == "none" else load_cases(_cases_path(args.extra))
    head = train_head_set(
        extractor, train, val, extra=extra, extra_weight=args.extra_weight, probes=args.probes,
        coverage=args.coverage, seed=args.seed, progress=progress,
    )  # fmt: skip
    head.facts["extra"] = args.extra
    head.facts["model"] = spec
    path = head.save(args.out)
    print(
        f"judge head: {len(head.probes)} probes, min_confidence {head.min_confidence:.3f}, "
        f"val accuracy {head.facts['val_accuracy_vote0']:.3f} -> {path}\n"
        f"use it: clawrl judge eval --head {path}   or   --set judge.backend.path={path}"
    )
    return 0
