"""``clawrl memory list|show|add|edit|forget``: the preference memory in a store."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from clawrl.cli.common import STORE_HELP, add_config_options, config_from_args, open_existing_store
from clawrl.errors import ClientInputError


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "memory",
        help="list, show, add, edit or forget the preference memory's entries",
        description="The preference memory (clawrl serve --memory): directives taken from "
        "judges' hindsight hints and feedback comments, kept as short entries that the gateway "
        "adds to the system message of every main call. A near-duplicate merges into an "
        "entry (its support grows), a directive that contradicts an entry replaces it, and past "
        "memory.max_entries the entry updated least recently is evicted. These commands work on "
        "the store while clawrl serve runs; it sees a change on its next call. The same over "
        "HTTP: GET/POST /v1/memory, GET/PATCH/DELETE /v1/memory/ID.",
        epilog="examples:\n"
        "  clawrl memory list --store clawrl.db\n"
        "  clawrl memory list --all                          # ended entries too\n"
        "  clawrl memory show 3f2a9c                         # an id or a unique prefix\n"
        '  clawrl memory add "Lead with the number."\n'
        '  clawrl memory edit 3f2a9c --text "Lead with the number, then one sentence."\n'
        "  clawrl memory edit 3f2a9c --off                   # keep it, stop showing it\n"
        "  clawrl memory forget 3f2a9c                       # its words are removed for good",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    msub = p.add_subparsers(dest="memory_command", metavar="ACTION", required=True)
    lst = msub.add_parser("list", help="the active entries, oldest first")
    lst.add_argument("--all", action="store_true", help="ended entries too (replaced, evicted, "
                     "retired, turned off, forgotten)")  # fmt: skip
    lst.add_argument("--json", action="store_true", help="one JSON object per line")
    _store_option(lst)
    lst.set_defaults(func=run_list)
    show = msub.add_parser("show", help="one entry with its source and history")
    show.add_argument("entry_id", metavar="ID", help="the entry id, or a unique prefix of it")
    show.add_argument("--json", action="store_true", help="as JSON")
    _store_option(show)
    show.set_defaults(func=run_show)
    add = msub.add_parser("add", help="remember a directive by hand (the rules of hints apply)")
    add.add_argument("text", help="the directive, e.g. 'Lead with the number.'")
    _store_option(add)
    add.set_defaults(func=run_add)
    edit = msub.add_parser("edit", help="change an entry's text, or turn it off or on")
    edit.add_argument("entry_id", metavar="ID", help="the entry id, or a unique prefix of it")
    edit.add_argument("--text", help="the new text")
    onoff = edit.add_mutually_exclusive_group()
    onoff.add_argument("--off", dest="active", action="store_false", default=None,
                       help="keep the entry but stop adding it to prompts")  # fmt: skip
    onoff.add_argument("--on", dest="active", action="store_true",
                       help="add a turned-off entry to prompts again")  # fmt: skip
    _store_option(edit)
    edit.set_defaults(func=run_edit)
    forget = msub.add_parser("forget", help="remove an entry's text and history for good")
    forget.add_argument("entry_id", metavar="ID", help="the entry id, or a unique prefix of it")
    _store_option(forget)
    forget.set_defaults(func=run_forget)


def _store_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", help=STORE_HELP)
    add_config_options(p)


def _keeper(args: argparse.Namespace) -> Any:
    from clawrl.memory import MemoryKeeper

    cfg = config_from_args(args)
    store = open_existing_store(args.store or cfg.server.store)
    return MemoryKeeper(store, max_entries=cfg.memory.max_entries, sync_s=0.0)


def _resolve(keeper: Any, prefix: str) -> str:
    """The full id of the entry ``prefix`` names.

    Raises:
        ClientInputError: none, or several, start with it.
    """
    ids = [e.id for e in keeper.store.memory_entries(None, active_only=False)
           if e.id.startswith(prefix) and e.user_id == keeper.user_id]  # fmt: skip
    if len(ids) == 1:
        return ids[0]
    if not ids:
        raise ClientInputError(f"no memory entry starts with {prefix!r} (clawrl memory list "
                               "--all shows them)")  # fmt: skip
    raise ClientInputError(f"{len(ids)} memory entries start with {prefix!r}: give more of it")


def _when(t: float | None) -> str:
    return "-" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def run_list(args: argparse.Namespace) -> int:
    from rich.cells import cell_len
    from rich.console import Console
    from rich.table import Table

    from clawrl.memory import entry_json

    keeper = _keeper(args)
    with keeper.store:
        entries = keeper.store.memory_entries(keeper.user_id, active_only=not args.all)
    if args.json:
        for e in entries:
            print(json.dumps(entry_json(e), ensure_ascii=False))
        return 0
    if not entries:
        print("no memory entries" + ("" if args.all else " (--all: ended ones too)"))
        return 0
    table = Table(title=f"memory: {len(entries)} entries")
    for col in ("id", "status", "source", "support", "updated"):
        table.add_column(col, no_wrap=True)
    table.add_column("text", overflow="fold", ratio=1)
    for e in entries:
        table.add_row(e.id[:12], str(e.status), str(e.source), str(e.support),
                      _when(e.updated_at), e.text)  # fmt: skip
    console = Console()
    if not console.is_terminal:  # piped: one line per entry, as wide as its text needs
        console = Console(width=max(120, 80 + max(cell_len(e.text) for e in entries)))
    console.print(table)
    return 0


def run_show(args: argparse.Namespace) -> int:
    from clawrl.memory import entry_json

    keeper = _keeper(args)
    with keeper.store:
        e = keeper.store.get_memory_entry(_resolve(keeper, args.entry_id))
    if args.json:
        print(json.dumps(entry_json(e, history=True), ensure_ascii=False, indent=2))
        return 0
    print(f"entry    {e.id}\nstatus   {e.status}" + (f" ({e.end_reason})" if e.end_reason else ""))
    print(f"text     {e.text}\nsource   {e.source}"
          + (f" (turn {e.source_turn_id}, session {e.source_session_id})" if e.source_turn_id else ""))  # fmt: skip
    print(f"support  {e.support}\ncreated  {_when(e.created_at)}\nupdated  {_when(e.updated_at)}")
    print("history")
    for ev in e.history:
        rest = {k: v for k, v in ev.items() if k not in ("at", "event")}
        print(f"  {_when(ev.get('at'))} {ev.get('event', '?')} "
              f"{json.dumps(rest, ensure_ascii=False)}")  # fmt: skip
    return 0


def run_add(args: argparse.Namespace) -> int:
    from clawrl.store.memory import MAX_TEXT_CHARS

    if len(args.text) > MAX_TEXT_CHARS:
        raise ClientInputError(f"a memory entry is at most {MAX_TEXT_CHARS} characters, got "
                               f"{len(args.text)}: keep one directive per entry")  # fmt: skip
    keeper = _keeper(args)
    with keeper.store:
        before = {e.id for e in keeper.store.memory_entries(keeper.user_id)}
        e = keeper.remember(args.text)
    if e is None:
        raise ClientInputError("a memory entry needs a text")
    what = "merged into" if e.id in before else "added"
    print(f"{what} {e.id[:12]}: {e.text}")
    return 0


def run_edit(args: argparse.Namespace) -> int:
    from clawrl.store.memory import MAX_TEXT_CHARS

    if args.text is None and args.active is None:
        raise ClientInputError("nothing to change: give --text, --off or --on")
    if args.text is not None and len(args.text) > MAX_TEXT_CHARS:
        raise ClientInputError(f"a memory entry is at most {MAX_TEXT_CHARS} characters, got "
                               f"{len(args.text)}")  # fmt: skip
    keeper = _keeper(args)
    with keeper.store:
        try:
            e = keeper.edit(_resolve(keeper, args.entry_id), text=args.text, active=args.active)
        except ValueError as exc:
            raise ClientInputError(str(exc)) from exc
    print(f"{e.id[:12]} {e.status}: {e.text}")
    return 0


def run_forget(args: argparse.Namespace) -> int:
    keeper = _keeper(args)
    with keeper.store:
        entry_id = _resolve(keeper, args.entry_id)
        if not keeper.forget(entry_id):
            print(f"{entry_id[:12]} was forgotten already", file=sys.stderr)
            return 1
    print(f"forgot {entry_id[:12]}")
    return 0
