"""The demo's report: tables with intervals, plots with bands, examples, config and raw JSON.

``report.md`` holds, in order: the headline table (methods x evaluated steps, mean score with
its 95 % interval: over held-out problems for one seed, over seeds for several), the gain over
the base with its paired interval, the per-check pass rates at every evaluated step, the guard
metrics beside the score (a gain that comes with a guard worse beyond its noise is called out),
sessions to converge beside OpenClaw-RL's, the judge's agreement with the simulated user and its
sign-error rate, the drops explained in words, three held-out questions answered before and
after training, and where the trained adapter is with the commands that serve or export it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from clawrl.config import Config, config_to_toml
from clawrl.demo.runner import DemoSettings, MethodResult
from clawrl.stats import paired_diff_ci, seed_ci
from clawrl.store.learning import DROP_EXPLANATIONS

METHOD_NAMES = {
    "rl": "Binary RL",
    "opd": "OPD",
    "combine": "Combined",
    "memory": "Memory alone",
    "memory+combine": "Memory + Combined (distilled)",
}

WEIGHTS_ONLY = " · weights alone"
"""Appended to a memory arm's name for its evaluations without the memory in the prompt."""

OPENCLAW_SESSIONS_TO_CONVERGE = {"combine": 10.3, "rl": 14.1, "opd": 29.7}
"""OpenClaw-RL (updated paper): sessions until a preference holds in 3 sessions in a row."""

DROP_REASONS = DROP_EXPLANATIONS
"""What each drop reason means, for the report (:data:`clawrl.store.learning.DROP_EXPLANATIONS`)."""


def _name(method: str) -> str:
    base = method.removesuffix(WEIGHTS_ONLY)
    return METHOD_NAMES.get(base, base) + (WEIGHTS_ONLY if base != method else "")


def with_weights_only(results: Sequence[MethodResult]) -> list[MethodResult]:
    """``results`` and, after each memory arm, its evaluations with the weights alone as a row
    of its own (``<arm> · weights alone``; the same run, the memory left out of the prompt)."""
    out: list[MethodResult] = []
    for method, runs in _by_method(results).items():
        out += runs
        out += [replace(r, method=method + WEIGHTS_ONLY, evaluations=r.weights_only)
                for r in runs if r.weights_only]  # fmt: skip
    return out


def memory_text(results: Sequence[MethodResult]) -> list[str]:
    """Markdown: per memory run, its entries at the end and what happened to them."""
    lines: list[str] = []
    for r in results:
        if not r.memory:
            continue
        lines += ["", f"{_name(r.method)}, seed {r.seed}:", ""]
        lines += [f"- `{e['status']}` (said {e['support']}x) {e['text']}"
                  + (f" ({e['end_reason']})" if e.get("end_reason") else "")
                  for e in r.memory]  # fmt: skip
    return ["## The memory", *lines] if lines else []


def _fmt_ci(mean: float, low: float, high: float) -> str:
    if math.isnan(mean):
        return "—"
    if math.isnan(low) or low == high:
        return f"{mean:.3f}"
    return f"{mean:.3f} [{low:.3f}, {high:.3f}]"


def _by_method(results: Sequence[MethodResult]) -> dict[str, list[MethodResult]]:
    out: dict[str, list[MethodResult]] = {}
    for r in results:
        out.setdefault(r.method, []).append(r)
    return out


def _steps(results: Sequence[MethodResult]) -> list[int]:
    return sorted({s for r in results for s in r.evaluations})


def cell(runs: Sequence[MethodResult], step: int) -> tuple[float, float, float]:
    """``(mean, low, high)`` of the score at ``step``: one seed, its bootstrap interval over the
    held-out problems; several, the mean over seeds with its t-interval."""
    evs = [r.evaluations[step] for r in runs if step in r.evaluations]
    if not evs:
        return math.nan, math.nan, math.nan
    if len(evs) == 1:
        return evs[0].score, *evs[0].ci
    return seed_ci([e.score for e in evs])


def gain(runs: Sequence[MethodResult], step: int) -> tuple[float, float, float]:
    """``(mean, low, high)`` of the gain over step 0: one seed, the paired bootstrap over
    problems; several, the t-interval over the seeds' gains."""
    pairs = [(r.evaluations[0], r.evaluations[step]) for r in runs
             if 0 in r.evaluations and step in r.evaluations]  # fmt: skip
    if not pairs:
        return math.nan, math.nan, math.nan
    if len(pairs) == 1:
        before, after = pairs[0]
        return paired_diff_ci(before.scores, after.scores)
    return seed_ci([a.score - b.score for b, a in pairs])


def score_table(results: Sequence[MethodResult], steps: Sequence[int] | None = None) -> str:
    """Markdown: per method, the score at each evaluated step and the gain at the last one."""
    steps = list(steps or _steps(results))
    last = steps[-1] if steps else 0
    head = "| method | seeds | " + " | ".join(
        "base (v0)" if s == 0 else f"{s} steps" for s in steps
    )
    rows = [head + f" | gain at {last} |", "|---|---:|" + "---:|" * (len(steps) + 1)]
    for method, runs in _by_method(results).items():
        cells = [_fmt_ci(*cell(runs, s)) for s in steps]
        g = gain(runs, last) if last else (math.nan,) * 3
        rows.append(f"| {_name(method)} | {len(runs)} | " + " | ".join(cells)
                    + f" | {_fmt_ci(*g)} |")  # fmt: skip
    return "\n".join(rows)


def check_table(results: Sequence[MethodResult]) -> str:
    """Markdown: each check's pass rate per method and evaluated step (mean over seeds)."""
    steps = _steps(results)
    checks: list[str] = []
    for r in results:
        for e in r.evaluations.values():
            checks += [c for c in e.check_rates if c not in checks]
    head = "| check | method | " + " | ".join("v0" if s == 0 else f"{s}" for s in steps) + " |"
    rows = [head, "|---|---|" + "---:|" * len(steps)]
    for c in checks:
        for method, runs in _by_method(results).items():
            cells = []
            for s in steps:
                vals = [r.evaluations[s].check_rates.get(c) for r in runs if s in r.evaluations]
                got = [v for v in vals if v is not None]
                cells.append(f"{sum(got) / len(got):.2f}" if got else "—")
            rows.append(f"| {c} | {_name(method)} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


GUARDS = {
    "repetitive": "answers that repeat a sentence 3+ times",
    "no_number": "answers that state no number",
    "correct": "answers whose last number is right",
}
_WORSE_WHEN_UP = {"repetitive": True, "no_number": True, "correct": False}


def guard_rows(results: Sequence[MethodResult]) -> tuple[str, list[str]]:
    """Markdown table of the guard metrics at v0 and the last step, and the callouts: guards
    that got worse beyond their noise (the paired 95 % interval excludes 0)."""
    steps = _steps(results)
    last = steps[-1] if steps else 0
    rows = [
        "| method | guard | v0 | " + f"{last} steps | change [95% CI] |",
        "|---|---|---:|---:|---:|",
    ]
    callouts: list[str] = []
    for method, runs in _by_method(results).items():
        for key, words in GUARDS.items():
            before: list[float] = []
            after: list[float] = []
            for r in runs:
                if 0 in r.evaluations and last in r.evaluations:
                    before += r.evaluations[0].guards["items"][key]
                    after += r.evaluations[last].guards["items"][key]
            if not before:
                continue
            diff, low, high = paired_diff_ci(before, after)
            b, a = sum(before) / len(before), sum(after) / len(after)
            rows.append(f"| {_name(method)} | {words} | {b:.0%} | {a:.0%} | "
                        f"{diff:+.2f} [{low:+.2f}, {high:+.2f}] |")  # fmt: skip
            worse = low > 0 if _WORSE_WHEN_UP[key] else high < 0
            if worse and last:
                callouts.append(
                    f"**{_name(method)}: {words} went from {b:.0%} to {a:.0%}** (change "
                    f"{diff:+.2f}, 95% CI [{low:+.2f}, {high:+.2f}]): part of the score's gain "
                    "comes with this guard getting worse."
                )
    return "\n".join(rows), callouts


def converge_table(results: Sequence[MethodResult]) -> str:
    """Markdown: sessions to converge per method (mean over seeds that converged) and check."""
    checks: list[str] = []
    for r in results:
        checks += [c for c in r.converge if c not in checks and c != "overall"]
    cols = ["overall", *checks]
    rows = ["| method | sessions run | " + " | ".join(cols) + " | OpenClaw-RL (overall) |",
            "|---|---:|" + "---:|" * (len(cols) + 1)]  # fmt: skip
    for method, runs in _by_method(results).items():
        cells = []
        for c in cols:
            got = [r.converge.get(c) for r in runs]
            done = [g for g in got if g is not None]
            text = "—" if not done else f"{sum(done) / len(done):.1f}"
            if done and len(done) < len(got):
                text += f" ({len(done)}/{len(got)} seeds)"
            cells.append(text if done else f"not in {max(r.sessions for r in runs)}")
        paper = OPENCLAW_SESSIONS_TO_CONVERGE.get(method)
        sessions = sum(len(r.first_answers) for r in runs) / len(runs)
        rows.append(f"| {_name(method)} | {sessions:.0f} | " + " | ".join(cells)
                    + f" | {paper if paper is not None else '—'} |")  # fmt: skip
    return "\n".join(rows)


def judge_table(results: Sequence[MethodResult]) -> str:
    """Markdown: per run, steps, sessions, samples, the judge's agreement and sign errors."""
    rows = ["| method | seed | steps | sessions | samples trained | judge agrees with user | "
            "judge sign errors |", "|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in results:
        a = r.agreement
        rate = a.get("rate")
        agree = "—" if rate is None else f"{rate:.2f} ({a.get('agreed', 0)}/{a.get('compared', 0)})"
        ser = a.get("sign_error_rate")
        sign = "—" if ser is None else f"{ser:.1%} ({a.get('sign_errors', 0)})"
        rows.append(f"| {_name(r.method)} | {r.seed} | {r.steps_done} | {r.sessions} | "
                    f"{r.samples_trained} | {agree} | {sign} |")  # fmt: skip
    return "\n".join(rows)


def drops_text(results: Sequence[MethodResult]) -> list[str]:
    """One line per drop reason (summed over runs), with what it means."""
    total: dict[str, int] = {}
    for r in results:
        for k, v in r.drops.items():
            key = k.removeprefix("drop/")
            total[key] = total.get(key, 0) + v
    trained = sum(r.samples_trained for r in results)
    lines = [f"{trained} judged turns were trained on; {sum(total.values())} were not:"]
    for k, v in sorted(total.items(), key=lambda kv: -kv[1]):
        lines.append(f"- {v} {k}: {DROP_REASONS.get(k, 'see clawrl.store.DropReason')}")
    return lines


def examples_text(results: Sequence[MethodResult], n: int) -> list[str]:
    """Up to ``n`` held-out questions with the first run's answer before and after training."""
    if not results or n <= 0:
        return []
    r = results[0]
    steps = _steps([r])
    if len(steps) < 2:
        return []
    before, after = r.evaluations[steps[0]], r.evaluations[steps[-1]]
    picks = sorted(range(len(before.scores)),
                   key=lambda i: -(after.scores[i] - before.scores[i]))[:n]  # fmt: skip
    out = [f"{_name(r.method)}, seed {r.seed}: the {n} held-out questions whose score rose most."]
    for i in picks:
        q = r.questions[i] if i < len(r.questions) else r.problems[i]
        out += [
            "",
            f"**{q}**",
            "",
            f"v0 (score {before.scores[i]:.2f}):",
            "```",
            before.answers[i].strip() or "(empty)",
            "```",
            f"after {steps[-1]} steps (score {after.scores[i]:.2f}):",
            "```",
            after.answers[i].strip() or "(empty)",
            "```",
        ]
    return out


def plot(results: Sequence[MethodResult], out: Path) -> list[Path]:
    """``scores.png`` (score vs step, 95 % bands, axis scaled to the data) and ``training.png``
    (judge reward mean and hint rate per step)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    lows, highs = [], []
    for method, runs in _by_method(results).items():
        steps = _steps(runs)
        cells = [cell(runs, s) for s in steps]
        means = [c[0] for c in cells]
        lo = [c[1] for c in cells]
        hi = [c[2] for c in cells]
        line = ax.plot(steps, means, marker="o", label=f"{_name(method)} ({len(runs)} seed(s))")
        ax.fill_between(steps, lo, hi, alpha=0.2, color=line[0].get_color())
        lows += lo
        highs += hi
    if lows:
        pad = 0.05
        ax.set_ylim(max(0.0, min(lows) - pad), min(1.0, max(highs) + pad))
    ax.set_xlabel("training step")
    ax.set_ylabel("rubric score of the first answer (held-out)")
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title("Score vs training step (band: 95% interval)")
    fig.tight_layout()
    paths.append(out / "scores.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for r in results:
        steps = [m["step"] for m in r.metrics]
        name = f"{_name(r.method)} s{r.seed}"
        axes[0].plot(steps, [m.get("reward/mean") for m in r.metrics], marker=".", label=name)
        axes[1].plot(steps, [m.get("hint/rate") for m in r.metrics], marker=".", label=name)
    axes[0].set_title("judge reward mean per step")
    axes[1].set_title("hint rate per step")
    for ax in axes:
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0].set_ylim(-1.05, 1.05)
    axes[1].set_ylim(-0.05, 1.05)
    fig.tight_layout()
    paths.append(out / "training.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    return paths


def run_config(results: Sequence[MethodResult], settings: DemoSettings, cfg: Config) -> str:
    """``config.toml``: what actually ran. The ``[trainer]`` table is the first run's trainer
    config as the demo built it (method table, batch, micro-batch, checkpoints kept); the other
    runs differ only in method, seed and output directory, listed below it. ``[demo]`` holds
    the demo's settings with the scenario's answer budget resolved (tokens, temperature, turns,
    held-out problems; evaluation is greedy)."""
    from clawrl.demo.runner import method_config
    from clawrl.envs import load_scenario

    first = results[0] if results else None
    if first is not None:
        ran = method_config(cfg, first.method, settings, Path(first.trainer_dir).parent, first.seed)
    else:
        ran = cfg
    lines = [config_to_toml(ran)]
    if len(results) > 1:
        lines.append("# the other runs: the same [trainer] table with")
        for r in results[1:]:
            lines.append(f"#   {r.method} seed {r.seed}: method = {json.dumps(r.method_config)}, "
                         f"seed = {r.seed}, output_dir = {json.dumps(r.trainer_dir)}")  # fmt: skip
    spec = load_scenario(settings.scenario)
    demo = {k: v for k, v in asdict(settings).items() if v is not None}
    demo |= {
        "eval_problems": settings.eval_problems or spec.problems.held_out,
        "max_tokens": settings.max_tokens or spec.answer.max_tokens,
        "temperature": spec.answer.temperature
        if settings.temperature is None
        else settings.temperature,
        "eval_temperature": 0.0,
        "max_turns": settings.max_turns or spec.answer.max_turns,
    }
    lines += ["", "[demo]", *(f"{k} = {json.dumps(v)}" for k, v in demo.items())]
    return "\n".join(lines) + "\n"


def write_report(
    results: list[MethodResult], settings: DemoSettings, cfg: Config, wall_s: float
) -> Path:
    """Write ``report.md``, ``scores.png``, ``training.png``, ``config.toml``, ``results.json``
    under ``settings.out_dir``; returns the report's path."""
    out = Path(settings.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    steps = _steps(results)
    plot(results, out)
    guards, callouts = guard_rows(results)
    batch = cfg.trainer.model_copy(update={"batch_size": settings.batch_size})
    lines = [
        f"# clawrl demo: {settings.scenario}",
        "",
        f"Policy `{cfg.model.spec}`, judge `{results[0].judge if results else '?'}`, "
        f"{settings.steps} steps of {batch.batch_size} samples, seeds "
        f"{', '.join(map(str, settings.seeds))}, wall time {wall_s / 60:.1f} min.",
        "",
        "Mean rubric score (0-1) of the first, greedy answer to each held-out problem, with its "
        "95% interval (one seed: bootstrap over the held-out problems, i.e. the evaluation's "
        "own noise; several seeds: t-interval over the seeds). The gain is paired: the same "
        "problems before and after.",
        *(
            [
                "",
                "**Validation run** (`--validation`): the problems scored here are carved out "
                "of the training split and kept out of training; the held-out problems were "
                'not used. Read "held-out" below as "validation".',
            ]
            if settings.validation
            else []
        ),
        "",
        score_table(with_weights_only(results), steps),
        *(
            [
                "",
                "Memory arms are scored twice at each step: with the memory in the system "
                f"message (their own row) and without it ({WEIGHTS_ONLY.strip(' ·')}).",
            ]
            if any(r.weights_only for r in results)
            else []
        ),
        "",
        "![score vs step](scores.png)",
        "",
        "## Each check",
        "",
        check_table(results),
        "",
        "## Guards (not part of the score)",
        "",
        guards,
        "",
        *(callouts or ["No guard got worse beyond its noise."]),
        "",
        "## Sessions to converge",
        "",
        "Training sessions until a preference held on the session's first answer in 3 sessions "
        "in a row (OpenClaw-RL's definition, scored by the rules); per check and for every "
        "check at once (overall).",
        "",
        converge_table(results),
        "",
        "## Training and the judge",
        "",
        judge_table(results),
        "",
        "![reward and hint rate](training.png)",
        "",
        *drops_text(results),
        "",
        *memory_text(results),
        "",
    ]
    examples = examples_text(results, settings.examples)
    if examples:
        lines += ["## Before and after", "", *examples, ""]
    trained = [r for r in results if r.adapter]
    if trained:
        r = trained[0]
        version = Path(r.adapter or "").name.removeprefix("v")
        lines += [
            "## The trained policy",
            "",
            f"The adapter of {_name(r.method)} (seed {r.seed}) is `{r.adapter}`. Export it "
            "merged into the base model, and serve it:",
            "",
            "```bash",
            f"clawrl export-model --output-dir {r.trainer_dir} --version {version} "
            f"--model {cfg.model.spec} --out ./demo-policy",
            "clawrl serve --model ./demo-policy",
            "```",
            "",
        ]
    notes = [r.note for r in results if r.note]
    notes += [
        f"{_name(r.method)} seed {r.seed}: {r.failed_sessions} of {r.sessions} training sessions "
        f"stopped on a failed call (first: {r.session_error})"
        for r in results
        if r.failed_sessions
    ]
    if notes:
        lines += ["Notes: " + "; ".join(notes), ""]
    (out / "report.md").write_text("\n".join(lines))
    (out / "config.toml").write_text(run_config(results, settings, cfg))
    (out / "results.json").write_text(json.dumps([_jsonable(asdict(r)) for r in results], indent=2))
    return out / "report.md"


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and math.isnan(value):
        return None
    return value
