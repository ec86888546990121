"""``clawrl users list|adapter``: whose requests a store holds (each turn records its user), and
each user's own adapter versions (``clawrl serve --per-user-adapters`` serves them)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from typing import Any

from clawrl.cli.common import STORE_HELP, add_config_options, config_from_args, open_existing_store


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "users",
        help="list the users whose requests a store recorded",
        description="Each turn records its user: the x-clawrl-user header, the body's end-user "
        "field (OpenAI's user or safety_identifier, Anthropic's metadata.user_id) or the API "
        "key's fingerprint, as server.user_from says (default: header, then body). 'list' shows "
        "per user: sessions, turns, how many the judge saw and the trainer consumed, the last "
        "trainer step that used them, the version of their own adapter and when the user was "
        "last seen. 'adapter USER DIR' records a PEFT LoRA adapter directory as the user's next "
        "adapter version: clawrl serve --per-user-adapters serves their requests with it on top "
        "of the policy (a replica reads the table at most every server.version_poll_s, 2 s when "
        "0, and loads the version on that user's next request). One "
        "shared policy still learns from every user's turns served without an adapter (turns "
        "served with one are not trained): training per-user adapters is not built yet.",
        epilog="examples:\n"
        "  clawrl users list --store clawrl.db\n"
        "  clawrl users list --json\n"
        "  clawrl sessions list --user alice         # that user's sessions\n"
        "  clawrl users adapter alice runs/alice/adapter   # alice's next adapter version\n"
        "  clawrl serve --set 'server.user_from=[\"key\"]'   # the presented key's fingerprint",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    usub = p.add_subparsers(dest="users_command", metavar="ACTION", required=True)
    lst = usub.add_parser("list", help="users with counts, last seen first")
    lst.add_argument("--json", action="store_true", help="one JSON object per line")
    lst.add_argument("--store", help=STORE_HELP)
    add_config_options(lst)
    lst.set_defaults(func=run_list)
    ad = usub.add_parser("adapter", help="record a LoRA adapter as a user's next version")
    ad.add_argument("user_id", metavar="USER", help="the user id (as clawrl users list shows it)")
    ad.add_argument("adapter_dir", metavar="DIR",
                    help="a PEFT LoRA adapter directory of the served model (adapter_config.json "
                    "and adapter_model.safetensors; plain LoRA)")  # fmt: skip
    ad.add_argument("--model", help="the served model it must fit (default: model.spec, "
                    "smollm2-135m)")  # fmt: skip
    ad.add_argument("--into", default="runs/user-adapters", metavar="DIR",
                    help="where the version's copy goes (DIR/<user digest>/vN; default "
                    "runs/user-adapters): a version never changes after it is recorded")  # fmt: skip
    ad.add_argument("--store", help=STORE_HELP)
    add_config_options(ad)
    ad.set_defaults(func=run_adapter)


def _when(t: float | None) -> str:
    return "-" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def run_list(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    with open_existing_store(args.store or config_from_args(args).server.store) as store:
        users = store.users()
    if args.json:
        for u in users:
            print(json.dumps(dataclasses.asdict(u), ensure_ascii=False))
        return 0
    if not users:
        print("no turns recorded yet")
        return 0
    table = Table(title=f"users: {len(users)}")
    table.add_column("user", overflow="fold")
    for col in ("sessions", "turns", "judged", "trained", "last step", "adapter"):
        table.add_column(col, justify="right", no_wrap=True)
    table.add_column("last seen", no_wrap=True)
    for u in users:
        step = "-" if u.last_step is None else str(u.last_step)
        name = Text(u.user_id) if u.user_id else Text("(none)", style="dim")  # ids are data
        adapter = "-" if u.adapter_version is None else f"v{u.adapter_version}"
        table.add_row(name, str(u.sessions), str(u.turns), str(u.judged), str(u.trained),
                      step, adapter, _when(u.last_seen))  # fmt: skip
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)
    console.print(table)
    return 0


def run_adapter(args: argparse.Namespace) -> int:
    import hashlib
    import shutil
    from pathlib import Path

    from clawrl.errors import ConfigError
    from clawrl.store import UserAdapterRecord
    from clawrl.store.users import user_id_problem

    if (problem := user_id_problem(args.user_id)) is not None or not args.user_id:
        raise ConfigError(f"user id {args.user_id!r} {problem or 'is empty'}")
    config = config_from_args(args)
    source = Path(args.adapter_dir).resolve()
    _check_adapter(source, args.model or config.model.spec)
    with open_existing_store(args.store or config.server.store) as store:
        before = store.user_adapter_versions(args.user_id)
        version = (before[-1].version if before else 0) + 1
        user_dir = hashlib.sha256(args.user_id.encode()).hexdigest()[:16]
        snapshot = Path(args.into).resolve() / user_dir / f"v{version}"
        if snapshot.exists():
            raise ConfigError(f"{snapshot} exists already: pass another --into")
        # a snapshot: the directory given may be rewritten later; the version must not change
        shutil.copytree(source, snapshot, ignore=shutil.ignore_patterns("*.bin", "README.md"))
        try:
            store.publish_user_adapter(UserAdapterRecord(args.user_id, version, str(snapshot)))
        except BaseException:
            shutil.rmtree(snapshot, ignore_errors=True)
            raise
    print(f"user {args.user_id}: adapter v{version} = {snapshot} (copied from {source}; clawrl "
          "serve --per-user-adapters serves it from their next request)")  # fmt: skip
    return 0


def _check_adapter(path: Any, model_spec: str) -> None:
    """Refuse what the engine could not serve to users of ``model_spec``: not a plain PEFT
    LoRA directory, or modules and shapes another model has (checked on a weightless copy).

    Raises:
        ConfigError: saying what is wrong and what to give instead.
    """
    import torch

    from clawrl.engine.lora import lora_factors
    from clawrl.engine.row_adapters import check_fits
    from clawrl.errors import ConfigError
    from clawrl.models.loading import _resolve

    try:
        factors = lora_factors(path)
    except (OSError, ValueError, KeyError) as e:
        raise ConfigError(
            f"{path} is not a plain PEFT LoRA adapter directory ({e}): give the directory "
            "save_pretrained wrote (adapter_config.json, adapter_model.safetensors)"
        ) from e
    from transformers import AutoConfig, AutoModelForCausalLM

    source, _ = _resolve(model_spec)
    with torch.device("meta"):  # names and shapes only, no weights
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(source))
    try:
        check_fits(model, factors)
    except ValueError as e:
        raise ConfigError(
            f"{path} is not an adapter of {model_spec}: {e} (pass --model for another served model)"
        ) from e
