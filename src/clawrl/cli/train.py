"""``clawrl train``: the trainer as its own process (``torchrun`` ranks with ``--nproc N``)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence

from clawrl.cli.common import (
    STORE_HELP,
    add_config_options,
    add_model_options,
    quiet_transformers,
    with_model_flags,
)
from clawrl.cli.options import add_online_method_options, config_with_flags
from clawrl.errors import ConfigError


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "train",
        help="the online trainer as its own process (FSDP2 over torchrun ranks): judged turns "
        "from the store -> steps -> published policy versions",
        description="Train the policy from the turns `clawrl judge worker` judged in the store, "
        "and publish each new version in the store, from which every `clawrl serve` loads it "
        "(run them with --external-trainer, or without --method). Rank 0 reads and writes the "
        "store; with --nproc N (or under torchrun) the policy is sharded over N ranks with "
        "FSDP2 (gloo on CPU, NCCL on CUDA). OPD teacher log-probs are computed here, with the "
        "trainer's own weights. Checkpoints (torch.distributed.checkpoint) go to --output-dir "
        "after every step; a restart with the same --store and --output-dir resumes, also "
        "with another number of ranks, training no sample twice. One console line per step "
        "and per published version.",
        epilog="examples:\n"
        "  clawrl train --store clawrl.db --output-dir runs/online --method combine\n"
        "  clawrl train --store clawrl.db --output-dir runs/online --method combine --nproc 2\n"
        "  clawrl train --store clawrl.db --output-dir runs/online --method combine --distill\n"
        "  torchrun --nproc-per-node 4 -m clawrl train --store postgresql://u@db/clawrl \\\n"
        "      --output-dir /shared/runs/online --method combine --device cuda",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_options(p)
    p.add_argument("--store", help=STORE_HELP)
    p.add_argument("--device", help="cpu (default; gloo) or cuda (NCCL; rank i on cuda:i)")
    p.add_argument("--nproc", type=int, default=1, metavar="N",
                   help="ranks on this machine: runs torchrun --nproc-per-node N (1)")  # fmt: skip
    p.add_argument("--max-steps", type=int, metavar="N",
                   help="stop after the trainer's step N (default: run until stopped)")  # fmt: skip
    g = p.add_argument_group("training")
    add_online_method_options(g, "rl: Binary RL; opd: hindsight OPD; combine: both")
    g.add_argument("--distill", action="store_true",
                   help="preference memory (gateways run with --memory): train each turn that "
                   "had memory without it, the policy with the memory its teacher, and retire "
                   "an entry once the weights alone follow it (memory.distill; opd or "
                   "combine); its turns are off-policy: add --ratio tis --opd-clip 2 "
                   "(what clawrl demo --memory runs)")  # fmt: skip
    add_config_options(p)
    p.set_defaults(func=run)


def _without_nproc(argv: Sequence[str]) -> list[str]:
    """``argv`` without ``--nproc N`` / ``--nproc=N``."""
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif a == "--nproc":
            skip = True
        elif not a.startswith("--nproc="):
            out.append(a)
    return out


def torchrun_command(train_argv: Sequence[str], nproc: int) -> list[str]:
    """The torchrun command that runs ``clawrl train`` (its arguments ``train_argv``, without
    ``train``) on ``nproc`` ranks of this machine."""
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        "--nproc-per-node", str(nproc), "-m", "clawrl", "train", *_without_nproc(train_argv),
    ]  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from clawrl.trainer.distributed import launched_by_torchrun

    if args.nproc < 1:
        raise ConfigError("--nproc must be at least 1")
    if args.nproc > 1 and not launched_by_torchrun():
        argv = list(getattr(args, "argv", None) or sys.argv[1:])
        train_argv = argv[argv.index("train") + 1 :] if "train" in argv else argv
        cmd = torchrun_command(train_argv, args.nproc)
        print("clawrl train: " + " ".join(cmd), flush=True)
        os.execv(cmd[0], cmd)  # the same pid: stopping it stops torchrun and every rank
    cfg = with_model_flags(config_with_flags(args), args)
    model, server = cfg.model, cfg.server
    if args.device:
        model = model.model_copy(update={"device": args.device})
    if args.store:
        server = server.model_copy(update={"store": args.store})
    cfg = cfg.model_copy(update={"model": model, "server": server})
    if args.distill:
        cfg = cfg.model_copy(update={"memory": cfg.memory.model_copy(update={"distill": True})})
    quiet_transformers()

    from clawrl.runtime import build_trainer_process
    from clawrl.trainer.distributed import process_group

    # left on every way out: normally after a barrier, with gloo's threads stopped
    with process_group(cfg.model.device) as env:
        proc = build_trainer_process(cfg, env, out=lambda line: print(line, flush=True))
        try:

            def stop(sig: int, frame: object) -> None:
                proc.stop_requested = True  # rank 0 sends every rank the stop order

            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, stop)
            proc.step_limit = args.max_steps
            version = proc.resume()
            print(proc.start_line(), flush=True)
            if env.is_main:
                print(f"clawrl train: store {proc.store.target if proc.store else ''}, at "
                      f"policy v{version}; waiting for judged turns", flush=True)  # fmt: skip
            steps = proc.run()
            if env.is_main:
                print(f"clawrl train: stopped after {steps} steps this run (trainer step "
                      f"{proc.trainer.step}, policy v{proc.trainer.policy_version})",
                      flush=True)  # fmt: skip
        finally:
            proc.close()
    return 0
