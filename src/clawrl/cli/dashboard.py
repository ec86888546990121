"""``clawrl dashboard``: the live dashboard alone, read-only, over a store and a trainer's output.

``clawrl serve`` and ``clawrl demo`` already serve it at ``/dashboard`` on their own port; this
command is for a finished run (``--demo demo-report``) or a store another process is writing
(``--store clawrl.db --output-dir runs/online``). The store is opened read-only
(``Store(read_only=True)``: nothing is created or migrated, every write fails).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from clawrl.cli.common import STORE_HELP
from clawrl.errors import ConfigError, StoreError


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "dashboard",
        help="serve the live dashboard (sessions, judgments, training) for a store, read-only",
        description="Serve the dashboard alone, read-only: the overview (policy version,\n"
        "traffic, judge backlog, drops), every session as its prefix tree with next states,\n"
        "judgments and hints, the training curves and the judge's score distribution. It\n"
        "reads the store and the trainer's metrics.jsonl as they grow, so it follows a run in\n"
        "progress. `clawrl serve` and `clawrl demo` serve the same pages at /dashboard.",
        epilog="examples:\n"
        "  clawrl dashboard --demo demo-report                  # a finished demo run\n"
        "  clawrl dashboard --store clawrl.db --output-dir runs/online --port 8001",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--store", help=STORE_HELP.replace("server.store, ", ""))
    p.add_argument(
        "--output-dir",
        help="the trainer's output directory (metrics.jsonl, policies/); default: runs/online "
        "when --store is left at its default and that directory exists, else no curves",
    )
    p.add_argument(
        "--demo",
        metavar="DIR",
        help="a demo report directory: its run's store, trainer output and results.json",
    )
    p.add_argument(
        "--run",
        metavar="METHOD-seedN",
        help="which run of --demo (e.g. combine-seed0; default the first)",
    )
    p.add_argument("--host", default="127.0.0.1", help="bind address (127.0.0.1)")
    p.add_argument("--port", type=int, default=8001, help="TCP port (8001; 0 picks a free one)")
    p.add_argument("--api-key", help="require this key (browsers: any user, the key as password)")
    p.set_defaults(func=run)


def _paths(args: argparse.Namespace) -> tuple[str, Path | None, Path | None, str]:
    """(store: a file or a URL, output_dir, results.json, title) from the flags.

    Raises:
        ConfigError: a path that does not exist, or a demo directory without runs.
    """
    if args.demo and (args.store or args.output_dir):
        raise ConfigError("--demo DIR names the store and the output directory: leave out "
                          "--store and --output-dir, or leave out --demo")  # fmt: skip
    if args.run and not args.demo:
        raise ConfigError("--run picks a run of --demo DIR; pass --demo too")
    if args.demo:
        root = Path(args.demo)
        runs = sorted(p for p in (root / "runs").glob("*") if _run_store(p) is not None)
        if not runs:
            raise ConfigError(f"{root} has no runs/*/store.db: is it a clawrl demo report?")
        run = next((r for r in runs if r.name == args.run), None) if args.run else runs[0]
        if run is None:
            raise ConfigError(
                f"{root} has no run {args.run!r}; it has {', '.join(r.name for r in runs)}"
            )
        results = root / "results.json"
        return (str(_run_store(run)), run / "trainer", results if results.is_file() else None,
                f"demo {root.name} · {run.name}")  # fmt: skip
    from clawrl.store import Store, is_url
    from clawrl.store.db import mask_url

    store = args.store or "clawrl.db"
    if not Store.exists(store):
        raise ConfigError(
            f"no store at {mask_url(store)}: pass --store FILE or URL (or --demo DIR)"
        )
    if args.output_dir:
        given = Path(args.output_dir)
        if not given.is_dir():
            raise ConfigError(f"no trainer output directory at {given}")
        out: Path | None = given
    else:
        # clawrl serve's default output directory, but only beside the default store: a store
        # named elsewhere must not be drawn with another run's curves
        out = Path("runs/online") if args.store is None and Path("runs/online").is_dir() else None
    return store, out, None, f"store {mask_url(store) if is_url(store) else Path(store).name}"


def _run_store(run: Path) -> str | Path | None:
    """A demo run's store: its ``store.db``, or the URL in ``store.url`` (``clawrl demo
    --store postgresql://...``); ``None`` when it has neither."""
    if (run / "store.db").is_file():
        return run / "store.db"
    if (run / "store.url").is_file():
        return (run / "store.url").read_text().strip()
    return None


def run(args: argparse.Namespace) -> int:
    import uvicorn
    from fastapi import FastAPI

    from clawrl.cli.serve import _url_host, check_bind, resolve_api_key
    from clawrl.dashboard import DashboardSource, demo_view, load_demo_result, mount_dashboard
    from clawrl.gateway.auth import ApiKeyMiddleware
    from clawrl.gateway.errors import install_error_handlers
    from clawrl.gateway.server import bind_socket
    from clawrl.store import Store

    store_path, output_dir, results, title = _paths(args)
    api_key = resolve_api_key(args.api_key, None)
    check_bind(args.host, api_key)
    sock = bind_socket(args.host, args.port)
    store = Store(store_path, read_only=True)
    try:
        source = DashboardSource(store, output_dir=output_dir, title=title, read_only=True)
        if results is not None:
            # the same run as the store: runs/<METHOD-seedN>/store.db
            try:
                result = load_demo_result(results, Path(output_dir or ".").parent.name)
            except StoreError as exc:  # an interrupted demo: its store, without evaluations
                print(f"clawrl dashboard: no evaluations shown: {exc}")
                result = None
            if result is not None:
                source.demo = lambda: demo_view(result)
                source.agreement = lambda: result.get("agreement")
        app = FastAPI(title="clawrl dashboard", docs_url=None, redoc_url=None)
        install_error_handlers(app)
        mount_dashboard(app, source)
        app.add_middleware(ApiKeyMiddleware, api_key=api_key)
        url = f"http://{_url_host(args.host)}:{sock.getsockname()[1]}/dashboard"
        print(f"clawrl dashboard: {url}  (store: {store.target}, read-only; Ctrl-C stops)")
        if output_dir is None:
            print("  no trainer output directory (--output-dir DIR): no curves; the policy "
                  "version and step shown are the latest the store recorded")  # fmt: skip
        config = uvicorn.Config(app, log_level="warning", lifespan="off")
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        store.close()
        sock.close()
    return 0
