"""Options shared by several subcommands."""

from __future__ import annotations

import argparse

from clawrl.config import Config, load_config


def add_config_options(p: argparse.ArgumentParser) -> None:
    """``--config FILE`` and repeatable ``--set section.key=value``."""
    p.add_argument("--config", metavar="FILE", help="TOML settings file (see clawrl.config)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one setting, e.g. --set engine.max_batch=8 (repeatable)",
    )


def config_from_args(args: argparse.Namespace) -> Config:
    """Settings from ``--config`` and ``--set``; raises ConfigError on bad input."""
    return load_config(args.config, args.overrides)


def quiet_transformers() -> None:
    """Silence transformers' progress bars and deprecation chatter on the console."""
    import os
    import warnings

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    warnings.filterwarnings("ignore", category=FutureWarning)
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except ImportError:  # pragma: no cover - transformers is a hard dependency
        pass
