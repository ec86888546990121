"""``clawrl users list|adapter|forget``: whose requests a store holds (each turn records its
user), each user's own adapter versions (``clawrl serve --per-user-adapters`` serves them), and
removing everything of one user."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
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
        "0, and loads the version on that user's next request). With a training method, "
        "clawrl serve --per-user-adapters trains each user's adapter on their own judged turns "
        "and records each step's version here (training goes on from a version recorded by "
        "hand); without --per-user-adapters one shared policy learns from every user's turns "
        "served without an adapter.",
        epilog="examples:\n"
        "  clawrl users list --store clawrl.db\n"
        "  clawrl users list --json\n"
        "  clawrl sessions list --user alice         # that user's sessions\n"
        "  clawrl users adapter alice runs/alice/adapter   # alice's next adapter version\n"
        "  clawrl users forget alice --yes          # every trace of alice, store and disk\n"
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
    fg = usub.add_parser(
        "forget",
        help="remove every trace of a user: store rows and files on disk",
        description="Deletes the user's turns (with their judgments, samples and feedback), "
        "sessions left empty, memory entries that are theirs or came from their turns, and "
        "their adapter versions from the store (one transaction), then compacts the store "
        "(SQLite: VACUUM and an emptied write-ahead log; PostgreSQL: VACUUM FULL) so no byte "
        "of them stays in its files; deletes their adapter versions' directories and their "
        "trainer folder (OUTPUT_DIR/users/<digest>: checkpoints, versions). A running "
        "clawrl serve unloads their adapter within server.version_poll_s and never trains "
        "their deleted turns; compacting rewrites the whole store, so run it when the server "
        "is idle (SQLite holds its write lock meanwhile). The shared policy's "
        "weights keep what steps on their turns taught it (the count is printed). Without "
        "--yes, only says what would go.",
    )
    fg.add_argument("user_id", metavar="USER", help="the user id (as clawrl users list shows it)")
    fg.add_argument("--yes", action="store_true", help="really remove (default: a preview)")
    fg.add_argument("--output-dir", help="the trainer's output directory holding users/<digest> "
                    "(default: trainer.output_dir)")  # fmt: skip
    fg.add_argument("--store", help=STORE_HELP)
    add_config_options(fg)
    fg.set_defaults(func=run_forget)


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


def run_forget(args: argparse.Namespace) -> int:
    import re
    import shutil
    from pathlib import Path

    from clawrl.errors import ConfigError
    from clawrl.store.users import user_id_problem
    from clawrl.trainer.users import user_digest

    if (problem := user_id_problem(args.user_id)) is not None or not args.user_id:
        raise ConfigError(f"user id {args.user_id!r} {problem or 'is empty: no user to forget'}")
    config = config_from_args(args)
    digest = user_digest(args.user_id)
    trainer_dir = Path(args.output_dir or config.trainer.output_dir) / "users" / digest
    with open_existing_store(args.store or config.server.store) as store:
        if not args.yes:
            summary = next((u for u in store.users() if u.user_id == args.user_id), None)
            if summary is None and not trainer_dir.exists():
                print(f"user {args.user_id}: nothing recorded (no turn, no adapter)")
                return 0
            versions = store.user_adapter_versions(args.user_id)
            print(
                f"user {args.user_id}: would remove {summary.turns if summary else 0} turns in "
                f"{summary.sessions if summary else 0} sessions, {len(versions)} adapter "
                f"versions and {trainer_dir if trainer_dir.exists() else 'no trainer folder'}; "
                "run again with --yes to remove them"
            )
            return 0
        gone = store.forget_user(args.user_id)
    removed, kept = [], []
    for weights in gone.adapter_dirs:  # only the folders clawrl made: .../<digest>/vN
        path = Path(weights)
        if re.fullmatch(r"v\d+", path.name) and digest in path.parts:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
            parent = path.parent if path.parent.name == digest else path.parent.parent
            if parent.name == digest and parent.is_dir() and not any(parent.rglob("*.safetensors")):
                shutil.rmtree(parent, ignore_errors=True)
        else:
            kept.append(path)
    if trainer_dir.exists():
        shutil.rmtree(trainer_dir, ignore_errors=True)
        removed.append(trainer_dir)
    print(f"user {args.user_id}: removed {gone.turns} turns, {gone.sessions} sessions, "
          f"{gone.memory_entries} memory entries, {len(gone.adapter_dirs)} adapter versions; "
          f"deleted {len(removed)} folders")  # fmt: skip
    if gone.rewritten:
        print(f"  {gone.rewritten} turns of other users continued theirs: stored whole now "
              "(those requests are the other users' and stay)")  # fmt: skip
    if gone.trained_shared or gone.trained_either:
        unsure = (f" (and {gone.trained_either} that it or their own adapter did: the two "
                  "numberings coincide there)" if gone.trained_either else "")  # fmt: skip
        print(f"  the shared policy had trained on {gone.trained_shared} of their turns{unsure}: "
              "its weights keep what those steps learned")  # fmt: skip
    for path in kept:
        print(f"  left on disk (not a folder clawrl made): {path}")
    if not gone.compacted:
        print("  the store's write-ahead log is still read by another process: stop it and run "
              "clawrl users forget again to empty it", file=sys.stderr)  # fmt: skip
        return 1
    return 0
