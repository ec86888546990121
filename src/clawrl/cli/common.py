"""Options shared by several subcommands."""

from __future__ import annotations

import argparse
from typing import Any

from clawrl.config import Config, load_config
from clawrl.errors import StoreError


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


MODEL_HELP = (
    "the policy: smollm2-135m (embedded, default), gemma3-270m (embedded base model), a Hugging "
    "Face model directory, a .gguf file (converted once and cached), or a hub id; check it "
    "first with `clawrl doctor --model SPEC`"
)
"""``--model`` help, the same for every command that loads the policy."""


def add_model_options(p: argparse.ArgumentParser, *, model_help: str = MODEL_HELP) -> None:
    """``--model SPEC`` and ``--chat-template FILE`` (settings ``model.spec`` and
    ``model.chat_template``; ``--set model.stop_ids=[ID, ...]`` adds stop ids)."""
    p.add_argument("--model", metavar="SPEC", help=model_help)
    p.add_argument(
        "--chat-template",
        metavar="FILE",
        help="a chat template for the policy (a .jinja file, or a tokenizer_config.json holding "
        "one) replacing its tokenizer's; a base model without a template needs one",
    )


def with_model_flags(cfg: Config, args: argparse.Namespace) -> Config:
    """``cfg`` with ``--model`` / ``--chat-template`` applied (when given)."""
    update = {}
    if getattr(args, "model", None):
        update["spec"] = args.model
    if getattr(args, "chat_template", None):
        update["chat_template"] = args.chat_template
    if not update:
        return cfg
    return cfg.model_copy(update={"model": cfg.model.model_copy(update=update)})


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


STORE_HELP = (
    "trajectory store: a SQLite file, or a PostgreSQL database as "
    "postgresql://USER[:PASSWORD]@HOST[:PORT]/DB (default: server.store, clawrl.db)"
)
"""``--store`` help, the same for every command that takes a store."""


def open_existing_store(target: str, *, read_only: bool = False) -> Any:
    """Open the store at ``target`` (a file path or a ``postgresql://`` URL) that must exist
    already; an older SQLite file is migrated unless ``read_only``.

    Raises:
        StoreError: nothing there (no file, or no store tables in the database), or it
            cannot be opened.
    """
    from clawrl.store import Store, is_url

    if not Store.exists(target):
        what = "URL" if is_url(target) else "PATH"
        raise StoreError(f"no trajectory store at {_shown(target)} (pass --store {what}; "
                         "`clawrl serve --store TARGET` creates one)")  # fmt: skip
    return Store(target, read_only=read_only)


def _shown(target: str) -> str:
    from clawrl.store.db import mask_url

    return mask_url(str(target))
