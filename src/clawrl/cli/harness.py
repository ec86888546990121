"""``clawrl harness``: train and evaluate the policy through agent harnesses on verified tasks."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from clawrl.cli.common import add_config_options, with_model_flags
from clawrl.cli.options import (
    add_engine_options,
    add_judge_options,
    add_method_option,
    add_trainer_options,
    apply_flags,
)
from clawrl.config import Config, HarnessConfig, OffMethod, load_raw, validate_config
from clawrl.errors import ConfigError

if TYPE_CHECKING:
    from clawrl.harness.loop import HarnessSettings
    from clawrl.harness.rollout import Rollout
    from clawrl.harness.tasks import Task
    from clawrl.models import Policy
    from clawrl.runtime import Runtime
    from clawrl.store import Store

EPILOG = """\
examples:
  clawrl harness list
  clawrl harness eval --tasks builtin --split heldout --harness reference --k 4
  clawrl harness train --tasks builtin --harness reference --group-size 4 --steps 5 --out runs/h1
  clawrl harness eval --tasks builtin --harness reference --k 4 --run runs/h1 --version 5
  clawrl harness eval --split heldout --k 4 --run runs/h1 --version 0,5   # before vs after
  clawrl harness train --tasks builtin --harness reference,mini-swe-agent --steps 2 --out runs/mix

settings from a file (flags override it; any field: --set harness.KEY=VALUE, see [harness]):
  clawrl harness eval --config harness.toml --set harness.k=2 --set harness.limit=4
  clawrl harness train --config harness.toml --engine vllm --out runs/h2

outcome-only vs integrated PRM + outcome, from the same start (same model, tasks, seed):
  clawrl harness train --method grpo --steps 5 --out runs/outcome
  clawrl harness train --method prm_outcome --judge head --judge-votes 3 --steps 5 --out runs/prm
  clawrl harness eval --split heldout --k 4 --run runs/outcome --version 5
  clawrl harness eval --split heldout --k 4 --run runs/prm --version 5
  clawrl harness compare outcome.eval.json prm.eval.json      # (from eval --json) B - A
"""


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "harness",
        help="RL through unmodified agent harnesses in a sandbox (tasks with verifiers)",
        description="Run agent harnesses (clawrl's reference agent, mini-swe-agent, Claude Code, "
        "...) in sandboxes on tasks with verifiers, against the gateway; train with GRPO on the "
        "verifier's reward (or on PRM step scores + that reward), or evaluate Pass@1 / Pass@k.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    hsub = p.add_subparsers(dest="harness_command", metavar="ACTION", required=True)
    lst = hsub.add_parser("list", help="list harness adapters and whether each is installed")
    lst.set_defaults(func=cmd_list)

    t = hsub.add_parser("train", help="GRPO through harness rollouts")
    _common(t)
    t.add_argument("--group-size", type=int, help="G rollouts per task+harness (4)")
    t.add_argument("--steps", type=int, help="optimizer steps (5)")
    t.add_argument("--tasks-per-step", type=int, help="tasks per step (4)")
    t.add_argument(
        "--out",
        default="runs/harness",
        help="output dir: store.db (turns, rollouts), metrics, policies (runs/harness)",
    )
    g = t.add_argument_group(
        "training",
        "The same settings as the online loop (clawrl.config.TrainerConfig); any other: "
        "--set trainer.method.KEY=VALUE.",
    )
    add_method_option(
        g,
        ["grpo", "dr_grpo", "ppo", "prm_outcome"],
        "the rewards: outcome only, or integrated PRM + outcome. grpo (default): the "
        "verifier's outcome r, (r - mean) / std over each group's rollouts; dr_grpo: r - mean "
        "(Dr. GRPO; 'ppo' is its old name); prm_outcome: the judge (--judge, --judge-votes) "
        "also scores every turn from its next state (the tool output that followed it) and "
        "R = step score + r is normalised per (group, step) (OpenClaw-RL); the last turn, "
        "with no next state, gets r alone. Judgments go to the store; prm/* metrics",
    )
    add_trainer_options(g, batch_size=False)
    w = t.add_argument_group(
        "warm start",
        "Before the RL steps, supervised steps on the model's own successes: the rollouts in "
        "SRC's store that passed (reward 1) a task of this run (its --split train / --match / "
        "--limit; held-out tasks never), each replayed through every --harness in that "
        "harness's format (reference, mini-swe-agent-text) and verified again. Published as v1 "
        "(RL versions follow from v2). For a harness whose format the model does not produce. "
        "--steps 0: the warm start only; with RL steps, --kl-beta 0 (the KL reference would be "
        "the base weights).",
    )
    w.add_argument(
        "--warm-start",
        metavar="SRC",
        help="a 'harness eval' or 'harness train' output dir (or store) with passed rollouts, "
        "e.g. from 'clawrl harness eval --split train --k 4 --out SRC'",
    )
    w.add_argument(
        "--warm-start-epochs",
        type=int,
        help="passes over the replayed turns; a step takes tasks-per-step x group-size (2)",
    )
    w.add_argument(
        "--warm-start-per-task", type=int, help="distinct command lists per task at most (2)"
    )
    add_judge_options(t)
    t.set_defaults(func=cmd_train)

    e = hsub.add_parser("eval", help="Pass@1 and Pass@k per harness")
    _common(e)
    e.add_argument("--k", type=int, help="rollouts per task (4)")
    e.add_argument("--run", help="a 'harness train' output dir holding policies/vN")
    e.add_argument(
        "--version",
        help="policy version N of --run, or N,M,... (ascending; 0 = the base policy): each is "
        "evaluated on the same tasks, and later ones get a paired gain over the first",
    )
    e.add_argument("--json", action="store_true", help="print JSON rows")
    e.add_argument(
        "--out",
        default="runs/harness-eval",
        help="output dir; its store.db records the rollouts (runs/harness-eval)",
    )
    e.set_defaults(func=cmd_eval)

    c = hsub.add_parser(
        "compare",
        help="paired Pass@1 difference of 'harness eval --json' outputs (B - A, per run)",
        description="Compare evaluations of the same tasks (e.g. outcome-only vs PRM + outcome, "
        "a mixed-harness run vs a single-harness one, or several training seeds vs the base): "
        "per harness, each side's Pass@1 with its 95 % interval, and B - A paired over the tasks "
        "both scored, with intervals over families and over tasks within families. Given several "
        "B files (one per training run), also the mean gain over runs with a Student-t interval "
        "over runs.",
        epilog="examples:\n"
        "  clawrl harness compare outcome.eval.json prm.eval.json\n"
        "  clawrl harness compare --version-a 0 --version-b 15 base.json s0.json s1.json s2.json\n"
        "  clawrl harness compare --match='-(8|9|1[0-3])$' base.json run.json  # variants 8-13",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    c.add_argument("a", help="'clawrl harness eval --json' output (A)")
    c.add_argument("b", nargs="+", help="'clawrl harness eval --json' output(s) (B; one per run)")
    c.add_argument("--version-a", type=int, help="A's row of this version (default: its last)")
    c.add_argument("--version-b", type=int, help="each B's row of this version (default: last)")
    c.add_argument(
        "--match",
        help="compare only the tasks in which this regex is found (re.search); write "
        "--match=REGEX when it starts with -",
    )
    c.set_defaults(func=cmd_compare)


def _common(p: argparse.ArgumentParser) -> None:
    """The flags ``train`` and ``eval`` share: each is a shorthand for a ``[harness]`` or
    ``[model]`` setting (:class:`clawrl.config.HarnessConfig`), applied over ``--config`` and
    ``--set``; defaults in parentheses."""
    p.add_argument("--tasks", help="task suite dir, or 'builtin' (builtin)")
    p.add_argument("--split", choices=["train", "heldout", "all"],
                   help="task split (train for 'train', heldout for 'eval')")  # fmt: skip
    p.add_argument("--harness", help="comma-separated adapters (reference)")
    p.add_argument("--model",
                   help="the policy: smollm2-135m (default), gemma3-270m, a Hugging Face model "
                   "directory, a .gguf file, a hub id, or 'tiny' (tests)")  # fmt: skip
    p.add_argument("--chat-template", metavar="FILE",
                   help="a chat template replacing the policy tokenizer's (a base model needs "
                   "one)")  # fmt: skip
    p.add_argument("--parallel", type=int, help="rollouts in flight (4)")
    p.add_argument("--isolation", choices=["auto", "bwrap", "fallback"], help="sandbox (auto)")
    p.add_argument("--max-steps", type=int, help="reference agent step limit (task default)")
    p.add_argument(
        "--match",
        metavar="REGEX",
        help="use only the tasks whose id this regex is found in (re.search), e.g. "
        "--match='-(8|9)$' for variants 8 and 9; write --match=REGEX when it starts with -",
    )
    p.add_argument("--limit", type=int, help="use only the first N tasks (by id, after --match)")
    p.add_argument("--time-limit", type=float, help="override every task's time limit (s)")
    p.add_argument("--seed", type=int,
                   help="the run's seed (trainer.seed, 0): every rollout's sampling, and for "
                   "train the LoRA init and the warm start's shuffle (harness.seed sets the "
                   "sampling's alone, harness.seeded=false turns it off)")  # fmt: skip
    add_config_options(p)
    add_engine_options(p)


_HARNESS_FLAGS = {
    "tasks": "tasks", "split": "split", "harness": "harnesses", "parallel": "parallel",
    "isolation": "isolation", "max_steps": "max_steps", "match": "match", "limit": "limit",
    "time_limit": "time_limit_s", "group_size": "group_size", "steps": "steps",
    "tasks_per_step": "tasks_per_step", "k": "k", "warm_start": "warm_start",
    "warm_start_epochs": "warm_start_epochs", "warm_start_per_task": "warm_start_per_task",
}  # fmt: skip
"""flag dest -> ``harness`` field."""


def _config(args: argparse.Namespace, command: str) -> Config:
    """The settings of ``--config`` and ``--set``, with the flags that were given applied over
    them and validated once. ``eval`` trains nothing: its method is ``off`` whatever the file
    says; ``train``'s default method is ``grpo``.

    Raises:
        ConfigError: a malformed file or value (the message names the setting, e.g.
            ``harness.match``), or a flag that does not fit the method.
    """
    data = load_raw(args.config, args.overrides)
    apply_flags(data, args, default_method="grpo" if command == "train" else None)
    harness = data.setdefault("harness", {})
    if not isinstance(harness, dict):
        raise ConfigError("harness must be a table of settings")
    for flag, key in _HARNESS_FLAGS.items():
        value = getattr(args, flag, None)
        if value is not None:
            harness[key] = value
    if getattr(args, "seed", None) is not None:
        trainer = data.setdefault("trainer", {})
        if not isinstance(trainer, dict):
            raise ConfigError("trainer must be a table of settings")
        trainer["seed"] = args.seed
    cfg = with_model_flags(validate_config(data), args)
    if command == "eval":
        cfg = cfg.model_copy(
            update={"trainer": cfg.trainer.model_copy(update={"method": OffMethod()})}
        )
    return cfg


def _tasks(hc: HarnessConfig, split: str) -> list[Task]:
    """The tasks of ``hc`` (its suite, ``split``, ``match``, ``limit`` and time limit).

    Raises:
        ConfigError: the suite cannot be read, or no task id matches ``match``.
    """
    from clawrl.harness.tasks import load_tasks

    tasks = load_tasks(hc.tasks, split=None if split == "all" else split)
    if hc.match:
        tasks = [t for t in tasks if re.search(hc.match, t.id)]
        if not tasks:
            raise ConfigError(f"--match {hc.match!r}: no task id of --split {split} matches")
    if hc.time_limit_s:
        tasks = [dataclasses.replace(t, time_limit_s=hc.time_limit_s) for t in tasks]
    return tasks[: hc.limit] if hc.limit else tasks


def _policy(cfg: Config) -> Policy:
    """The policy of ``cfg.model`` (``tiny``: the tests' random model)."""
    from clawrl.cli.common import quiet_transformers
    from clawrl.engine.threads import call_in_transient_thread
    from clawrl.models import tiny_policy
    from clawrl.runtime import load_model

    quiet_transformers()
    # loaded in a thread that ends: the main thread would keep an OpenMP team that slows the
    # engine's rollouts (clawrl.engine.threads)
    if cfg.model.spec == "tiny":
        return call_in_transient_thread(lambda: tiny_policy(seed=0))
    return call_in_transient_thread(load_model, cfg)


def _settings(cfg: Config, model_name: str, *, group_size: int) -> HarnessSettings:
    """The runner's view of ``cfg.harness`` (:class:`clawrl.harness.loop.HarnessSettings`)."""
    from clawrl.harness.loop import HarnessSettings

    hc = cfg.harness
    return HarnessSettings(
        harnesses=list(hc.harnesses),
        group_size=group_size,
        parallel=hc.parallel,
        isolation=hc.isolation,
        options={"max_steps": hc.max_steps} if hc.max_steps else {},
        model_name=model_name,
        seed=hc.sampling_seed(cfg.trainer.seed),
    )


class RolloutProgress:
    """A console line on a long batch of rollouts, at most every ``every_s`` seconds:
    ``  rollouts 24/64: 9 passed, 3.1 min, ~5.2 min left`` (set as
    :attr:`clawrl.harness.loop.HarnessRunner.on_rollout`). Batches that end within
    ``every_s`` print nothing: the step or evaluation line follows."""

    def __init__(self, stream: TextIO, every_s: float = 30.0) -> None:
        self.stream, self.every_s = stream, every_s
        self.t0 = self.last = time.monotonic()
        self.passed = 0

    def __call__(self, rollout: Rollout | None, done: int, total: int) -> None:
        now = time.monotonic()
        if rollout is None:  # a batch starts
            self.t0 = self.last = now
            self.passed = 0
            return
        self.passed += rollout.reward is not None and rollout.reward >= 1.0
        if done == total or now - self.last < self.every_s:
            return
        self.last = now
        spent = now - self.t0
        left = spent / done * (total - done)
        print(f"  rollouts {done}/{total}: {self.passed} passed, {spent / 60:.1f} min, "
              f"~{left / 60:.1f} min left", file=self.stream, flush=True)  # fmt: skip


def cmd_list(args: argparse.Namespace) -> int:
    """Print each adapter and whether its program is installed."""
    from clawrl.harness.adapters import ADAPTERS
    from clawrl.harness.sandbox import bwrap_works

    for name, cls in ADAPTERS.items():
        why = cls().missing()  # each adapter reports what is missing, if anything
        print(f"{name:<16} {'installed' if why is None else why}")
    from collections import Counter

    from clawrl.harness.tasks import BUILTIN_TASKS, load_tasks

    splits = Counter(t.split for t in load_tasks(BUILTIN_TASKS))
    print(
        f"built-in tasks (--tasks builtin): {sum(splits.values())} "
        f"({splits['train']} train, {splits['heldout']} heldout)"
    )
    print(
        "sandbox isolation here: "
        + ("bwrap" if bwrap_works() else "none (install bubblewrap, or pass --isolation fallback)")
    )
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    """``clawrl harness train``: a line per step as it ends; ``OUT/run.json`` records the model,
    harnesses, tasks and settings (``harness eval --run OUT`` checks its ``--model`` against it).

    Run again on the same ``--out`` (after a kill, or with more ``--steps``) it resumes from the
    last checkpoint: the next step, the same task order, no group trained twice
    (:mod:`clawrl.harness.loop`).

    Raises:
        ConfigError: ``--out`` holds published versions but no checkpoint (a rerun would mix two
            runs), or it holds a run with other settings, or ``--full-finetune`` (harness mode
            publishes LoRA adapters as ``policies/vN``).
    """
    from clawrl.engine.threads import call_in_transient_thread
    from clawrl.harness.loop import HarnessRunner, read_progress, resume_point, train
    from clawrl.runtime import build_runtime

    if args.steps is not None and args.steps < 0:
        raise ConfigError(f"--steps {args.steps}: nothing to train (give --steps >= 1, or "
                          "--warm-start SRC --steps 0 for the warm start alone)")  # fmt: skip
    cfg = _config(args, "train")
    hc, split = cfg.harness, cfg.harness.split_for("train")
    if hc.steps == 0 and not hc.warm_start:
        raise ConfigError("--steps 0: nothing to train (give --steps >= 1, or --warm-start SRC "
                          "--steps 0 for the warm start alone)")  # fmt: skip
    if not hc.warm_start and (args.warm_start_epochs or args.warm_start_per_task):
        raise ConfigError("--warm-start-epochs and --warm-start-per-task need --warm-start SRC")
    if hc.group_size < 2:
        raise ConfigError(
            f"--group-size {hc.group_size} (harness.group_size): GRPO learns from the "
            "differences between rollouts of one task, so a group of one never trains; give 2 "
            "or more"
        )
    tasks = _tasks(hc, split)
    out = Path(args.out)
    resuming = any((out / "checkpoints").glob("step-*")) or read_progress(out) is not None
    if not resuming and (stale := _published(out)) and _recorded_versions(out):
        raise ConfigError(
            f"{out} already holds policy versions ({', '.join(stale[:5])}...) and no "
            "checkpoint to resume from: a second run into it would mix the two runs' "
            "versions; pick a new --out"
        )
    t0 = time.perf_counter()
    if cfg.trainer.full_finetune:
        raise ConfigError(
            "harness train publishes LoRA adapters (policies/vN) for eval and export; "
            "--full-finetune (trainer.full_finetune) is not supported in harness mode"
        )
    if hc.warm_start and not resuming:  # a resumed run's warm start is done
        _check_warm_start(cfg, split)
    cfg = cfg.model_copy(
        update={"trainer": cfg.trainer.model_copy(update={"output_dir": str(out)})}
    )
    out.mkdir(parents=True, exist_ok=True)
    run = {
        "model": cfg.model.spec, "harness": ",".join(hc.harnesses), "tasks": hc.tasks,
        "split": split, "match": hc.match, "limit": hc.limit, "time_limit": hc.time_limit_s,
        "warm_start": hc.warm_start, "warm_start_epochs": hc.warm_start_epochs,
        "warm_start_per_task": hc.warm_start_per_task, "steps": hc.steps,
        "tasks_per_step": hc.tasks_per_step, "group_size": hc.group_size,
        "trainer": cfg.trainer.model_dump(mode="json"),
        "harness_settings": hc.model_dump(mode="json"),
        "sampling_seed": hc.sampling_seed(cfg.trainer.seed),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }  # fmt: skip
    if resuming:
        _check_same_run(out, run)
        _check_resumed_warm_start(out, hc.steps, cfg)
    else:
        (out / "run.json").write_text(json.dumps(run, indent=2, default=str))
    policy = _policy(cfg)
    runtime = build_runtime(
        cfg, policy=policy, store=out / "store.db", online=False, model_name=policy.name
    )
    assert runtime.trainer is not None  # a grpo / prm_outcome method trains
    assert runtime.learner is not None
    try:
        # restores the checkpoint and serves its version (clawrl.engine.threads)
        meta = call_in_transient_thread(runtime.learner.resume)
    except BaseException:
        runtime.close()
        raise
    start = resume_point(meta, read_progress(out), runtime.trainer.policy_version)
    if resuming:
        print(f"resuming {out} after step {start.step} (policy v{runtime.trainer.policy_version})",
              flush=True)  # fmt: skip
    if start.step >= hc.steps and hc.steps > 0:
        runtime.close()
        print(f"{out}: all {hc.steps} steps are done (give more --steps to continue)", flush=True)
        return 0
    settings = _settings(cfg, policy.name, group_size=hc.group_size)
    runner = HarnessRunner(runtime.app, runtime.store, settings)
    runner.on_rollout = RolloutProgress(sys.stdout)
    judge = runtime.judge.judge if runtime.judge is not None else None
    warm = f"a warm start from {hc.warm_start}, then " if hc.warm_start else ""
    print(f"training {warm}{hc.steps} steps x {min(hc.tasks_per_step, len(tasks))} tasks x "
          f"{hc.group_size} rollouts through {','.join(hc.harnesses)} ({len(tasks)} tasks of "
          f"--split {split}); out: {out}", flush=True)  # fmt: skip

    def step_line(step: int, m: dict[str, float]) -> None:
        per = "  ".join(
            f"{k.split('/')[1]}={v:.2f}"
            for k, v in m.items()
            if k.startswith("harness/") and k.endswith("/reward_mean")
        )
        left = (time.perf_counter() - t0) / (step - start.step) * (hc.steps - step)
        print(
            f"step {step}/{hc.steps}: version={int(m['policy/version'])} "
            f"reward={m['rollout/reward_mean']:.3f} [{per}] "
            f"samples={int(m.get('samples/trained', 0))} "
            f"skipped_zero_var={int(m['group/skipped_zero_variance'])} "
            + prm_line(m)
            + f"time={m['time/harness_step']:.1f}s left~{left / 60:.0f}min",
            flush=True,
        )

    try:
        if hc.warm_start and not resuming:
            _warm_start(hc, settings, runtime, tasks)
        train(
            runner, runtime.learner, runtime.engine, tasks, steps=hc.steps,
            tasks_per_step=hc.tasks_per_step, judge=judge,
            judge_timeout_s=cfg.judge.timeout_s + 30.0, on_step=step_line, start=start,
        )  # fmt: skip
    except KeyboardInterrupt:
        print(f"\ninterrupted: the same command again resumes {out} after the last step that "
              "ended", file=sys.stderr, flush=True)  # fmt: skip
        raise
    finally:
        runner.close()
        runtime.close()
    versions = _published(out)
    published = f"{versions[0]}..{versions[-1]}" if versions else "none (no step had signal)"
    print(
        f"isolation: {runner.isolation}; total {time.perf_counter() - t0:.1f}s; out: {out} "
        f"(rollouts in {out / 'store.db'}, run {runner.run_id}); published: {published}"
    )
    return 0


_RESUME_SAME = ("model", "harness", "tasks", "split", "match", "limit", "time_limit",
                "tasks_per_step", "group_size", "sampling_seed")  # fmt: skip
"""``run.json`` fields a resumed run must keep: they decide which tasks each step trains and
how they are sampled (more ``--steps``, a warm start's flags, or trainer settings such as
``--kl-beta`` or the micro-batch size may change; ``run.json`` keeps the first run's). A field
that a run started before it existed did not record is not compared (``sampling_seed``: runs
before seeded sampling)."""


_FLAG_OF = {"sampling_seed": " (--seed / trainer.seed, or harness.seed)",
            "group_size": " (--group-size)", "tasks_per_step": " (--tasks-per-step)",
            "time_limit": " (--time-limit)"}  # fmt: skip
"""How a user sets a ``run.json`` field whose name is not its flag's (resume refusals)."""


def _kl_beta(cfg: Config) -> float:
    """The method's KL penalty weight (0 for a method that does not train)."""
    method = cfg.trainer.method
    return 0.0 if isinstance(method, OffMethod) else method.loss.kl.beta


def _check_resumed_warm_start(out: Path, steps: int, cfg: Config) -> None:
    """Refuse RL steps with a KL penalty after ``out``'s warm start (see
    :func:`_check_warm_start`): the penalty's reference is the base weights.

    Raises:
        ConfigError: the run started with a warm start and the method has ``kl.beta > 0``.
    """
    warm = json.loads((out / "run.json").read_text()).get("warm_start")
    if cfg.harness.warm_start and not warm:
        raise ConfigError(
            f"--warm-start {cfg.harness.warm_start}: {out} holds a run started without a warm "
            "start, which comes before the first step; resume without --warm-start, or start "
            "a new --out"
        )
    beta = _kl_beta(cfg)
    if warm and steps > 0 and beta > 0:
        raise ConfigError(
            f"{out} started with a warm start: RL steps with a KL penalty (beta {beta}) would "
            "pull the policy back to the base weights; add --kl-beta 0"
        )


def _recorded_versions(out: Path) -> bool:
    """Whether ``out``'s store records a published version (policy folders without one are
    left by a run killed before its first checkpoint: the rerun overwrites them)."""
    from clawrl.store import Store

    path = out / "store.db"
    if not path.is_file():
        return True  # folders without a store: not a harness run of ours, keep them
    with Store(path) as store:
        return store.latest_policy_version() is not None


def _check_same_run(out: Path, run: dict[str, Any]) -> None:
    """Refuse to resume ``out`` with settings other than those it was started with (another
    model, harness, task set or trainer setting would change what the next step trains).

    Raises:
        ConfigError: a setting differs (names each one), or ``out/run.json`` is missing.
    """
    path = out / "run.json"
    if not path.is_file():
        raise ConfigError(f"{out} has checkpoints but no run.json: not a clawrl harness run")
    before = json.loads(path.read_text())
    now = json.loads(json.dumps(run, default=str))
    differ = [
        k for k in _RESUME_SAME
        if (k in before or k != "sampling_seed")
        and _same_form(k, before.get(k)) != _same_form(k, now.get(k))
    ]  # fmt: skip
    if differ:
        shown = "; ".join(
            f"{k}{_FLAG_OF.get(k, '')}: {before.get(k)!r} -> {now[k]!r}" for k in differ
        )
        raise ConfigError(
            f"{out} holds a run started with other settings ({shown}): resuming it with these "
            "would train other tasks or another way; give the same flags, or a new --out"
        )


def _same_form(key: str, value: Any) -> Any:
    """A ``run.json`` value as resuming compares it: the harness list without spaces, and an
    unset limit, time limit or match as ``None`` (runs started before the ``[harness]`` section
    recorded ``--harness`` as typed and 0 or "" for "off")."""
    if key == "harness" and isinstance(value, str):
        return ",".join(h.strip() for h in value.split(",") if h.strip())
    if key in ("limit", "time_limit", "match") and not value:
        return None
    return value


def _source_store(spec: str) -> Store:
    """The store of a run dir (``DIR/store.db``) or a store path / URL, opened read-only.

    Raises:
        ConfigError: a directory without ``store.db``, or a path that does not exist.
    """
    from clawrl.store import Store

    path = Path(spec)
    if "://" not in spec:
        if path.is_dir():
            path = path / "store.db"
        if not path.is_file():
            raise ConfigError(f"--warm-start {spec}: no store at {path}")
        return Store(path, read_only=True)
    return Store(spec, read_only=True)


def _check_warm_start(cfg: Config, split: str) -> None:
    """Refuse a warm start that would fail or mislead, before the model loads.

    Raises:
        ConfigError: held-out tasks, a harness without a demonstration format, no store at
            ``harness.warm_start``, or RL steps with a KL penalty (it would anchor to the base
            weights, not to the warm start).
    """
    from clawrl.harness.adapters import ADAPTERS
    from clawrl.harness.warmstart import demo_replies

    hc = cfg.harness
    assert hc.warm_start is not None
    if split == "heldout":
        raise ConfigError("--warm-start trains on this run's tasks: not with --split heldout")
    for harness in hc.harnesses:
        if harness in ADAPTERS:  # an unknown one is refused with the known names later
            demo_replies(harness, ())
    _source_store(hc.warm_start).close()
    beta = _kl_beta(cfg)
    if hc.steps > 0 and beta > 0:
        raise ConfigError(
            f"--warm-start with RL steps and a KL penalty (beta {beta}): the penalty's reference "
            "is the base weights (LoRA disabled), so it would pull the policy back from the "
            "warm start; add --kl-beta 0 (trainer.method.loss.kl.beta), or --steps 0"
        )


def _warm_start(
    hc: HarnessConfig, settings: HarnessSettings, runtime: Runtime, tasks: list[Task]
) -> None:
    """Run the warm start (:mod:`clawrl.harness.warmstart`) through the runtime's replay gateway
    (:func:`clawrl.runtime.build_replay_gateway`) before the RL steps; prints a line per ten
    replays and per step, and its summary.

    Raises:
        ConfigError: no demonstration, or none passed its replay.
        StoreError: a store cannot be read or written.
    """
    from clawrl.harness.loop import HarnessRunner
    from clawrl.harness.warmstart import run_warm_start
    from clawrl.runtime import build_replay_gateway

    assert hc.warm_start is not None and runtime.trainer is not None
    assert runtime.learner is not None
    source = _source_store(hc.warm_start)
    replay = build_replay_gateway(runtime.policy, runtime.store, model_name=runtime.model_name)
    try:
        runner = HarnessRunner(
            replay.app, runtime.store, dataclasses.replace(settings, parallel=1, group_size=1)
        )
    except BaseException:
        source.close()
        raise
    t0 = time.perf_counter()

    def replay_line(done: int, total: int) -> None:
        if done % 10 == 0 or done == total:
            left = (time.perf_counter() - t0) / done * (total - done)
            print(f"warm start: replayed {done}/{total} left~{left:.0f}s", flush=True)

    def step_line(step: int, total: int, m: dict[str, float]) -> None:
        print(f"warm start step {step}/{total}: nll={-m.get('logprob/mean', float('nan')):.3f} "
              f"samples={int(m.get('samples/trained', 0))}", flush=True)  # fmt: skip

    try:
        report = run_warm_start(
            source, runner, replay.engine, runtime.learner, runtime.engine, tasks,
            epochs=hc.warm_start_epochs, batch_size=hc.tasks_per_step * hc.group_size,
            max_per_task=hc.warm_start_per_task, seed=runtime.trainer.config.seed,
            on_replay=replay_line, on_step=step_line,
        )  # fmt: skip
    finally:
        runner.close()
        source.close()
    print(report.line(), flush=True)


def _published(run: Path) -> list[str]:
    """The ``vN`` folders under ``run/policies``, by N (``vN.tmp`` being written left out)."""
    found = [p.name for p in (run / "policies").glob("v*") if re.fullmatch(r"v\d+", p.name)]
    return sorted(found, key=lambda name: int(name[1:]))


def prm_line(metrics: dict[str, float]) -> str:
    """The step line's PRM part (``""`` for an outcome-only run): judged turns, failures and
    the mean step score."""
    if "prm/judged_turns" not in metrics:
        return ""
    return (
        f"judged={int(metrics['prm/judged_turns'])} "
        f"judge_failures={int(metrics['prm/judge_failures'])} "
        f"step_score={metrics['prm/step_score_mean']:+.2f} "
    )


def _versions(args: argparse.Namespace) -> list[int]:
    """``--version`` as ascending policy versions (``[0]``: the base policy alone)."""
    if not args.version:
        return [0]
    try:
        versions = [int(v) for v in str(args.version).split(",") if v.strip()]
    except ValueError as e:
        raise ConfigError(f"--version takes N or N,M,... (integers), got {args.version!r}") from e
    if not versions or any(v < 0 for v in versions) or versions != sorted(set(versions)):
        raise ConfigError(
            f"--version takes distinct versions >= 0 in ascending order, got {args.version!r}"
        )
    if versions != [0] and not args.run:
        raise ConfigError("--version needs --run DIR (a 'harness train' output dir)")
    for v in versions:
        if v and not (Path(args.run) / "policies" / f"v{v}").is_dir():
            have = ", ".join(_published(Path(args.run))) or "none"
            raise ConfigError(
                f"no policy version {v} at {Path(args.run) / 'policies' / f'v{v}'} (published: "
                f"{have})"
            )
    return versions


def _check_run_model(args: argparse.Namespace, model: str) -> None:
    """``--model`` must be the model ``--run`` was trained on (its ``run.json``; older runs
    without one are not checked).

    Raises:
        ConfigError: the run names another model, or its run.json is unreadable.
    """
    if not args.run or not (Path(args.run) / "run.json").is_file():
        return
    try:
        trained = json.loads((Path(args.run) / "run.json").read_text())["model"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{Path(args.run) / 'run.json'} is unreadable: {e}") from e
    if trained != model:
        raise ConfigError(
            f"{args.run} was trained on --model {trained}, not {model}: pass --model {trained}"
        )


def cmd_eval(args: argparse.Namespace) -> int:
    """``clawrl harness eval``: each version of ``--version`` in turn on the same tasks."""
    from clawrl.harness.loop import HarnessRunner, evaluate, format_eval, wait_for_version
    from clawrl.runtime import build_runtime

    cfg = _config(args, "eval")
    hc, split = cfg.harness, cfg.harness.split_for("eval")
    tasks = _tasks(hc, split)
    versions = _versions(args)
    if args.run and not args.version:
        print(f"note: --run {args.run} without --version evaluates the base policy (version 0); "
              "pass --version N or 0,N", file=sys.stderr)  # fmt: skip
    if args.split is None and split != "heldout":
        print(f"note: harness.split = {split!r} from the settings: evaluating on {split} tasks, "
              "not the held-out ones (--split heldout overrides it)", file=sys.stderr)  # fmt: skip
    _check_run_model(args, cfg.model.spec)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = cfg.model_copy(
        update={"trainer": cfg.trainer.model_copy(update={"output_dir": str(out)})}
    )
    policy = _policy(cfg)
    runtime = build_runtime(
        cfg, policy=policy, store=out / "store.db", online=False, model_name=policy.name
    )
    runs = []
    try:
        settings = _settings(cfg, policy.name, group_size=1)
        runner = HarnessRunner(runtime.app, runtime.store, settings)
        runner.on_rollout = RolloutProgress(sys.stderr if args.json else sys.stdout)
        try:
            for version in versions:
                if version:
                    weights = Path(args.run) / "policies" / f"v{version}"
                    try:
                        runtime.engine.load_policy(version, str(weights)).result(timeout=300)
                    except Exception as e:
                        raise ConfigError(
                            f"cannot load policy version {version} from {weights} onto "
                            f"--model {cfg.model.spec}: {e}"
                        ) from e
                    wait_for_version(runtime.engine, version)
                t0 = time.perf_counter()
                rows = evaluate(runner, tasks, k=hc.k, policy_version=version)
                runs.append((version, rows))
                if not args.json:
                    done = ", ".join(f"{r.harness} pass@1 {r.pass_at_1:.3f}" for r in rows)
                    print(f"evaluated version {version}: {done} ({time.perf_counter() - t0:.0f}s)",
                          flush=True)  # fmt: skip
        finally:
            runner.close()
    finally:
        runtime.close()
    if args.json:
        print(json.dumps([
            {**{k: None if isinstance(v, float) and math.isnan(v) else v
                for k, v in dataclasses.asdict(r).items() if k != "counts"},
             "counts": {c.task_id: [c.n, c.c] for c in r.counts}, "version": version,
             "sampling_seed": hc.sampling_seed(cfg.trainer.seed)}
            for version, rows in runs for r in rows
        ], allow_nan=False))  # fmt: skip
    else:
        print(format_eval(runs))
        print(f"isolation: {runner.isolation}; sampling seed: "
              f"{hc.sampling_seed(cfg.trainer.seed)}; tasks: {len(tasks)} ({split}); rollouts: "
              f"{out / 'store.db'} (run {runner.run_id})")  # fmt: skip
    return 0


def _eval_rows(path: str, version: int | None) -> dict[str, dict[str, Any]]:
    """Harness -> the row of ``version`` (default: the highest) of an eval JSON file.

    Raises:
        ConfigError: unreadable, not an eval output, bad counts, duplicate rows, no such version.
    """
    bad = f"{path}: not a 'clawrl harness eval --json' output"
    try:
        rows = json.loads(Path(path).read_text())
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e}") from e
    except json.JSONDecodeError as e:
        raise ConfigError(f"{bad}: {e}") from e
    if not isinstance(rows, list) or not rows:
        raise ConfigError(f"{bad} (want a non-empty JSON list of rows)")
    for r in rows:
        if not (isinstance(r, dict) and {"harness", "version", "counts"} <= r.keys()):
            raise ConfigError(f"{bad} (a row without harness, version and counts)")
        if not isinstance(r["version"], int) or not isinstance(r["counts"], dict):
            raise ConfigError(f"{bad} (version must be an integer, counts an object)")
        for task, nc in r["counts"].items():
            ok = isinstance(nc, list) and len(nc) == 2 and all(isinstance(x, int) for x in nc)
            if not ok or not (nc[0] >= 1 and 0 <= nc[1] <= nc[0]):
                raise ConfigError(f"{bad} (task {task!r}: counts must be [n, c], 0 <= c <= n)")
    keys = [(r["harness"], r["version"]) for r in rows]
    if len(set(keys)) != len(keys):
        raise ConfigError(f"{bad} (two rows of one harness and version)")
    version = max(r["version"] for r in rows) if version is None else version
    out = {r["harness"]: r for r in rows if r["version"] == version}
    if not out:
        have = sorted({r["version"] for r in rows})
        raise ConfigError(f"{path}: no rows of version {version} (it has versions {have})")
    return out


def cmd_compare(args: argparse.Namespace) -> int:
    """``clawrl harness compare A.json B.json [B2.json ...]``: per harness in all files, each
    side's Pass@1 over the tasks all scored, B - A paired over them for each B, and with several
    B files the mean gain over them (:func:`clawrl.harness.passk.across_runs`).

    Raises:
        ConfigError: a file is not eval output, no harness or no task is in every file, or
            ``--match`` is not a valid regex.
    """
    from clawrl.harness.passk import (
        TaskCount,
        across_runs,
        describe_gain,
        mean_gain,
        pass_at_1_ci,
    )

    try:
        match = re.compile(args.match) if args.match else None
    except re.error as e:
        raise ConfigError(f"--match {args.match!r} is not a regex: {e}") from e
    a = _eval_rows(args.a, args.version_a)
    bs = [(path, _eval_rows(path, args.version_b)) for path in args.b]
    shared = [h for h in a if all(h in b for _, b in bs)]
    if not shared:
        having = "; ".join(f"{p}: {sorted(r)}" for p, r in [(args.a, a), *bs])
        raise ConfigError(f"no harness is in every file ({having})")
    names = ["B"] if len(bs) == 1 else [f"B{i + 1}" for i in range(len(bs))]
    print(
        "  ".join(f"{n} = {path}" for n, path in [("A", args.a), *zip(names, args.b, strict=True)])
    )
    if len(set(args.b)) < len(args.b):
        print("warning: a B file is given twice: the runs are not independent", file=sys.stderr)
    for h in shared:
        rows = [("A", args.a, a[h])] + [(n, p, b[h]) for n, (p, b) in zip(names, bs, strict=True)]
        tasks = [t for t in a[h]["counts"] if all(t in row["counts"] for _, _, row in rows)]
        for name, path, row in rows:
            if len(row["counts"]) > len(tasks):
                print(f"{h}: {name} ({path}) scored {len(row['counts']) - len(tasks)} tasks that "
                      f"not every file scored; comparing the {len(tasks)} all scored")  # fmt: skip
        if match:
            tasks = [t for t in tasks if match.search(t)]
            print(f"{h}: {len(tasks)} of them match {args.match!r}")
        if not tasks:
            why = f"none matches --match {args.match!r}" if match else "no task is in every file"
            raise ConfigError(f"{h}: no task to compare ({why})")
        counts = {}
        for name, _, row in rows:
            cs = [TaskCount(t, *row["counts"][t]) for t in tasks]
            mean, low, high = pass_at_1_ci(cs)
            print(f"{h} {name} (v{row['version']}): pass@1 {mean:.3f} [{low:.3f}, {high:.3f}] "
                  f"over {len(cs)} tasks")  # fmt: skip
            counts[name] = cs
        for name in names:
            print(f"{h} {name} - A (paired): {describe_gain(counts['A'], counts[name])}")
        if len(names) > 1:
            gains = [mean_gain(counts["A"], counts[n]) for n in names]
            mean, low, high = across_runs(gains)
            print(f"{h} mean B - A over {len(names)} runs: {mean:+.3f}, 95 % t-interval over "
                  f"runs [{low:+.3f}, {high:+.3f}] (runs: "
                  + ", ".join(f"{g:+.3f}" for g in gains)
                  + "; tasks held fixed, A's own rollout noise not in it)")  # fmt: skip
    return 0
