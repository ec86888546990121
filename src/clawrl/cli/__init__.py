"""The ``clawrl`` command. Each subcommand lives in its own module with a ``register`` function."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from clawrl import __version__
from clawrl.cli import (
    dashboard,
    demo,
    doctor,
    eval,
    export_model,
    generate,
    harness,
    judge,
    memory,
    serve,
    sessions,
    store,
    train,
    users,
)
from clawrl.errors import ClawrlError

DESCRIPTION = """\
clawrl trains an agent's policy model with reinforcement learning through the agent's real
harness: it serves the policy behind OpenAI/Anthropic-compatible endpoints, records every call
token-exactly, judges each turn from what happened next, and trains the policy online.

Start here:
  clawrl doctor                                   check the machine and the model cache
  clawrl generate "What is 2+2?"                  answer with the embedded SmolLM2-135M
  clawrl generate --show-tokens "Hi"              ...and show each token id and log-prob
  clawrl demo --quick                             the main job, a 4-step first look (~5 min)
  clawrl demo                                     the main job: 16 steps, report in demo-report/

Serve, record and train online (point any OpenAI/Anthropic client or harness at it):
  clawrl serve --port 8000                        serve and record; no training
  clawrl serve --method combine                   ...and train online (Binary RL + OPD)
  clawrl sessions list                            what was recorded
  clawrl sessions show 3f2a9c0d11e4               one session as a prefix tree (id or prefix)
  clawrl export --out trajectories.jsonl          token ids, loss masks, log-probs
  clawrl serve --memory                           ...adding what users asked for before to
  clawrl memory list                              ...the system prompt: these entries
  clawrl users list                               whose requests were recorded (a header,
                                                  the body's user field, or the API key)
  clawrl serve --store postgresql://u@db/clawrl   replicas on one PostgreSQL store
  clawrl serve --method combine --external-trainer    the same as three processes on one store:
  clawrl judge worker --store clawrl.db           ...the judge, and
  clawrl train --method combine --nproc 2         ...the trainer, FSDP2 over 2 torchrun ranks
  clawrl store copy clawrl.db postgresql://...    move a store to PostgreSQL (and back)
  clawrl dashboard --demo demo-report             the dashboard of a finished run (serve and
                                                  demo show it live at /dashboard)

Measure:
  clawrl judge eval --votes 3                     the PRM judge on 100 labeled turns
  clawrl eval personalization --base-url http://127.0.0.1:8000
  clawrl harness train --tasks builtin            GRPO through an agent harness in a sandbox
"""

_MODULES = [
    demo, generate, doctor, serve, train, sessions, store, dashboard, export_model, judge, eval,
    harness, memory, users,
]  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every subcommand registered."""
    parser = argparse.ArgumentParser(
        prog="clawrl",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"clawrl {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for mod in _MODULES:
        mod.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``clawrl`` console script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(argv) if argv is not None else sys.argv[1:]
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except ClawrlError as e:
        print(f"clawrl {args.command}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
