"""``clawrl users list``: whose requests a store holds (each turn records its user)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

from clawrl.cli.common import STORE_HELP, add_config_options, config_from_args, open_existing_store


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "users",
        help="list the users whose requests a store recorded",
        description="Each turn records its user: the x-clawrl-user header, the body's end-user "
        "field (OpenAI's user or safety_identifier, Anthropic's metadata.user_id) or the API "
        "key's fingerprint, as server.user_from says (default: header, then body). 'list' shows "
        "per user: sessions, turns, how many the judge saw and the trainer consumed, the last "
        "trainer step that used them and when the user was last seen. One policy serves and "
        "learns from every user; per-user adapters are not built yet.",
        epilog="examples:\n"
        "  clawrl users list --store clawrl.db\n"
        "  clawrl users list --json\n"
        "  clawrl sessions list --user alice         # that user's sessions\n"
        "  clawrl serve --set 'server.user_from=[\"key\"]' --api-key ...   # a user per key",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    usub = p.add_subparsers(dest="users_command", metavar="ACTION", required=True)
    lst = usub.add_parser("list", help="users with counts, last seen first")
    lst.add_argument("--json", action="store_true", help="one JSON object per line")
    lst.add_argument("--store", help=STORE_HELP)
    add_config_options(lst)
    lst.set_defaults(func=run_list)


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
    for col in ("sessions", "turns", "judged", "trained", "last step"):
        table.add_column(col, justify="right", no_wrap=True)
    table.add_column("last seen", no_wrap=True)
    for u in users:
        step = "-" if u.last_step is None else str(u.last_step)
        name = Text(u.user_id) if u.user_id else Text("(none)", style="dim")  # ids are data
        table.add_row(name, str(u.sessions), str(u.turns), str(u.judged), str(u.trained),
                      step, _when(u.last_seen))  # fmt: skip
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)
    console.print(table)
    return 0
