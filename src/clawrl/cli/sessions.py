"""``clawrl sessions list|show`` and ``clawrl export``: read the trajectory store."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from clawrl.cli.common import STORE_HELP, add_config_options, config_from_args, open_existing_store
from clawrl.errors import StoreError


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "sessions",
        help="list recorded sessions or show one as a prefix tree",
        description="Sessions recorded by the gateway. 'list' shows counts per session (and a "
        "harness rollout's status and reward); 'show ID' prints the session's rollout, if it is "
        "one (task, harness, group, status, reward, time-out, wall time, reason), and its "
        "prefix tree: each turn with its status, tokens, whether it is trainable (and why not) "
        "and its next state.",
        epilog="examples: clawrl sessions list --store clawrl.db; clawrl sessions show 3f2a...",
    )
    ssub = p.add_subparsers(dest="sessions_command", metavar="ACTION", required=True)
    lst = ssub.add_parser("list", help="sessions with turn counts, newest first")
    lst.add_argument("--limit", type=int, default=50, help="most sessions shown (50)")
    lst.add_argument("--offset", type=int, default=0, help="skip this many newest sessions")
    lst.add_argument(
        "--user",
        metavar="USER",
        help="only sessions with this user's turns (the ids clawrl users list shows; '' for "
        "requests that named no user)",
    )
    _store_option(lst)
    lst.set_defaults(func=run_list)
    show = ssub.add_parser("show", help="one session's tree, next states and trainability")
    show.add_argument("session_id", metavar="ID", help="the session id, or a unique prefix of it")
    _store_option(show)
    show.set_defaults(func=run_show)

    e = sub.add_parser(
        "export",
        help="export trajectories (token ids, loss masks, log-probs) as JSON lines",
        description="Write one line per session: its training rows (ids, loss mask 1 exactly on "
        "sampled tokens of trainable turns, sampling log-probs), its turns with next states, "
        "its feedback and, for a harness rollout, the rollout with its verifier result (see "
        "clawrl.trajectory.export).",
        epilog="example: clawrl export --format jsonl --out trajectories.jsonl",
    )
    e.add_argument("--format", choices=["jsonl"], default="jsonl", help="output format (jsonl)")
    e.add_argument("--out", metavar="FILE", help="output file (default: standard output)")
    e.add_argument(
        "--session",
        dest="sessions",
        action="append",
        metavar="ID",
        help="only this session (an id or a unique prefix of one; repeatable)",
    )
    _store_option(e)
    e.set_defaults(func=run_export)


def _store_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", help=STORE_HELP)
    add_config_options(p)


def _open_store(args: argparse.Namespace) -> Any:
    """Open the existing store named by ``--store`` or the config (a file or a URL).

    Raises:
        StoreError: no store there.
    """
    return open_existing_store(args.store or config_from_args(args).server.store)


def run_list(args: argparse.Namespace) -> int:
    from rich.console import Console

    from clawrl.trajectory import list_sessions_table

    with _open_store(args) as store:
        console = Console()
        width: int | None = console.width
        if not console.is_terminal:  # piped: the full table, on lines wide enough for it
            console, width = Console(width=240), None
        table = list_sessions_table(
            store, limit=args.limit, offset=args.offset, width=width, user=args.user
        )
        console.print(table)
    return 0


def run_show(args: argparse.Namespace) -> int:
    from rich.console import Console

    from clawrl.trajectory import format_session

    with _open_store(args) as store:
        Console().print(format_session(store, resolve_session_id(store, args.session_id)))
    return 0


def resolve_session_id(store: Any, given: str) -> str:
    """The session id ``given`` names: itself, or the one session id it is a prefix of.

    Raises:
        StoreError: no session starts with ``given``, or several do (they are listed).
    """
    if store.get_session(given) is not None:
        return given
    matches = [sid for sid in store.session_ids() if sid.startswith(given)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise StoreError(f"no session id starts with {given!r} (see: clawrl sessions list)")
    shown = ", ".join(matches[:5]) + (" ..." if len(matches) > 5 else "")
    raise StoreError(f"{len(matches)} sessions start with {given!r}: {shown}; give more of it")


def run_export(args: argparse.Namespace) -> int:
    from clawrl.trajectory import export_jsonl

    with _open_store(args) as store:
        ids = [resolve_session_id(store, s) for s in args.sessions] if args.sessions else None
        n = export_jsonl(store, args.out if args.out else sys.stdout, ids)
    where = args.out or "standard output"
    print(f"exported {n} trajectories to {where}", file=sys.stderr)
    return 0
