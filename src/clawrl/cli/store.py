"""``clawrl store migrate|copy``: bring a store to this clawrl's schema; copy it between backends."""

from __future__ import annotations

import argparse

from clawrl.cli.common import STORE_HELP, add_config_options, config_from_args


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "store",
        help="migrate a trajectory store, or copy one between SQLite and PostgreSQL",
        description="The trajectory store is a SQLite file (the default) or a PostgreSQL "
        "database (postgresql://USER[:PASSWORD]@HOST[:PORT]/DB; the database must exist, the "
        "store's tables go into its current schema). 'migrate' creates the store, or brings an "
        "older one to this clawrl's schema (every command that writes does so too). 'copy SRC "
        "DST' copies every row into an empty store and verifies both by row counts and hashes.",
        epilog="examples:\n"
        "  clawrl store migrate --store postgresql://clawrl@db.internal:5432/clawrl\n"
        "  clawrl store copy clawrl.db postgresql://clawrl@db.internal:5432/clawrl\n"
        "  clawrl store copy postgresql://clawrl@db.internal:5432/clawrl backup.db",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ssub = p.add_subparsers(dest="store_command", metavar="ACTION", required=True)
    m = ssub.add_parser("migrate", help="create the store or migrate it to this schema")
    m.add_argument("--store", help=STORE_HELP)
    add_config_options(m)
    m.set_defaults(func=run_migrate)
    c = ssub.add_parser("copy", help="copy every row of SRC into the empty store DST, verified")
    c.add_argument("source", metavar="SRC", help="the store to copy (a file or a URL)")
    c.add_argument("dest", metavar="DST", help="an empty or new store (a file or a URL)")
    c.set_defaults(func=run_copy)


def run_migrate(args: argparse.Namespace) -> int:
    from clawrl.store import SCHEMA_VERSION, Store
    from clawrl.store.db import open_database
    from clawrl.store.migrations import applied_version

    target = args.store or config_from_args(args).server.store
    before = 0
    if Store.exists(target):
        db = open_database(target, read_only=True)
        try:
            with db.read() as conn:
                before = applied_version(conn)
        finally:
            db.close()
    with Store(target) as store:
        shown = store.target
    state = "created" if before == 0 else ("already at" if before == SCHEMA_VERSION else
                                           f"migrated from version {before} to")  # fmt: skip
    print(f"clawrl store: {shown} {state} schema version {SCHEMA_VERSION}")
    return 0


def run_copy(args: argparse.Namespace) -> int:
    from clawrl.store.copy import copy_store
    from clawrl.store.db import mask_url

    report = copy_store(args.source, args.dest)
    print(f"clawrl store: copied {mask_url(args.source)} -> {mask_url(args.dest)}")
    print(f"  {'table':<16} {'rows':>8}  sha256 (source = destination)")
    for t in report:
        print(f"  {t.table:<16} {t.rows:>8}  {t.source_digest[:16]}  verified")
    return 0
