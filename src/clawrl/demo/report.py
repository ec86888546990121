"""The demo's report: a Markdown table in the paper's shape, PNG plots, config and raw JSON."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from clawrl.config import Config, config_to_toml
from clawrl.demo.runner import DemoSettings, MethodResult

METHOD_NAMES = {"rl": "Binary RL", "opd": "OPD", "combine": "Combined"}


def _step_header(steps: list[int]) -> list[str]:
    """The two header lines of a method x evaluation-step Markdown table."""
    head = "| method | " + " | ".join("base (v0)" if s == 0 else f"{s} steps" for s in steps)
    return [head + " |", "|---|" + "---:|" * len(steps)]


def score_table(results: list[MethodResult], steps: list[int]) -> str:
    """Markdown: one row per method, one column per evaluation step (mean rubric score)."""
    rows = _step_header(steps)
    for r in results:
        cells = []
        for s in steps:
            v = r.scores.get(s)
            cells.append("—" if v is None else f"{v:.3f}")
        rows.append(f"| {METHOD_NAMES.get(r.method, r.method)} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def guard_table(results: list[MethodResult], steps: list[int]) -> str:
    """Markdown: per method and step, the answers that loop on a sentence and (student) the
    answers whose last number is right — what the rubric does not score (clawrl.envs.guards)."""
    rows = _step_header(steps)
    for r in results:
        cells = []
        for s in steps:
            g = r.guards.get(s, {})
            rep, acc = g.get("repetition_rate"), g.get("answer_accuracy")
            cell = "—" if rep is None else f"{rep:.0%} loop"
            if acc is not None:
                cell += f", {acc:.0%} right"
            cells.append(cell)
        rows.append(f"| {METHOD_NAMES.get(r.method, r.method)} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def plot(results: list[MethodResult], out: Path) -> list[Path]:
    """``scores.png`` (score vs step) and ``training.png`` (reward mean, hint rate per step)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in results:
        xs = sorted(s for s, v in r.scores.items() if v is not None)
        ax.plot(xs, [float(r.scores[x] or 0.0) for x in xs], marker="o",
                label=METHOD_NAMES.get(r.method, r.method))  # fmt: skip
    ax.set_xlabel("training step")
    ax.set_ylabel("personalization score (rubric, held-out)")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title("Score of the first response vs training step")
    fig.tight_layout()
    paths.append(out / "scores.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for r in results:
        steps = [m["step"] for m in r.metrics]
        name = METHOD_NAMES.get(r.method, r.method)
        axes[0].plot(steps, [m.get("reward/mean") for m in r.metrics], marker=".", label=name)
        axes[1].plot(steps, [m.get("hint/rate") for m in r.metrics], marker=".", label=name)
    axes[0].set_title("judge reward mean per step")
    axes[1].set_title("hint rate per step")
    for ax in axes:
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
        ax.legend()
    axes[0].set_ylim(-1.05, 1.05)
    axes[1].set_ylim(-0.05, 1.05)
    fig.tight_layout()
    paths.append(out / "training.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    return paths


def write_report(
    results: list[MethodResult], settings: DemoSettings, cfg: Config, wall_s: float
) -> Path:
    """Write ``report.md``, ``scores.png``, ``training.png``, ``config.toml``, ``results.json``."""
    out = Path(settings.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    steps = sorted({min(s, settings.steps) for s in settings.eval_steps})
    table = score_table(results, steps)
    plot(results, out)
    lines = [
        f"# clawrl demo: {settings.scenario} personalization",
        "",
        f"Policy `{cfg.model.spec}`, judge `{cfg.judge.backend.kind}` x{cfg.judge.votes}, "
        f"batch {settings.batch_size}, {settings.eval_problems} held-out problems, "
        f"wall time {wall_s / 60:.1f} min.",
        "",
        "Mean rubric score of the first response to each held-out problem (0-1):",
        "",
        table,
        "",
        "Not in the score: answers that repeat a sentence 3+ times (a decoding loop) and, for",
        "the student, answers whose last number is the right answer. A rising score with",
        "more loops or fewer right answers is the policy gaming the rubric.",
        "",
        guard_table(results, steps),
        "",
        "![score vs step](scores.png)",
        "",
        "![reward and hint rate](training.png)",
        "",
        "| method | steps | sessions | samples trained | drops | judge agrees with user |",
        "|---|---:|---:|---:|---|---:|",
    ]
    for r in results:
        drops = ", ".join(f"{k.removeprefix('drop/')}: {v}" for k, v in sorted(r.drops.items()))
        rate = r.agreement.get("rate")
        agree = "—" if rate is None else f"{rate:.2f} ({r.agreement.get('compared', 0)} turns)"
        lines.append(
            f"| {METHOD_NAMES.get(r.method, r.method)} | {r.steps_done} | {r.sessions} | "
            f"{r.samples_trained} | {drops or '—'} | {agree} |"
        )
    notes = [r.note for r in results if r.note]
    if notes:
        lines += ["", "Notes: " + "; ".join(notes)]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    (out / "config.toml").write_text(config_to_toml(cfg) + "\n[demo]\n" + "\n".join(
        f"{k} = {json.dumps(v)}" for k, v in asdict(settings).items() if v is not None
    ) + "\n")  # fmt: skip
    (out / "results.json").write_text(json.dumps([asdict(r) for r in results], indent=2))
    return out / "report.md"
