"""A throwaway PostgreSQL server for tests and benchmarks, from Debian's PostgreSQL packages.

:func:`throwaway_cluster` runs the server's own tools (``initdb``, ``pg_ctl`` from
``/usr/lib/postgresql/N/bin``, or ``$CLAWRL_PG_BIN``): a new cluster in a temporary directory,
listening on 127.0.0.1 and a free port, stopped (``pg_ctl stop``, which signals the server's own
PID from its ``postmaster.pid``) and deleted afterwards. PostgreSQL refuses to run as root, so
as root (CI) the cluster belongs to an unprivileged system user (:data:`CLUSTER_USER`, created
with ``useradd --system`` when missing) and every tool runs through ``runuser -u USER --``.
Logins from 127.0.0.1 are trusted (``initdb --auth=trust``): the server is for this test run
only.

:func:`schema_url` gives each test its own PostgreSQL schema (``search_path``) in the one
cluster, so tests do not see each other's tables.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

from clawrl.errors import StoreError

CLUSTER_USER = "clawrl-pg"
"""The system user a root test run gives the cluster to."""
SUPERUSER = "clawrl"
"""The cluster's superuser role (``initdb -U``)."""


def find_pg_bin() -> Path | None:
    """The directory holding ``initdb`` and ``pg_ctl``: ``$CLAWRL_PG_BIN``, else the newest
    ``/usr/lib/postgresql/N/bin`` (Debian's layout), else ``None``."""
    env = os.environ.get("CLAWRL_PG_BIN")
    candidates = [Path(env)] if env else []
    root = Path("/usr/lib/postgresql")
    if root.is_dir():
        versions = [p for p in root.iterdir() if p.name.isdigit()]
        candidates += [p / "bin" for p in sorted(versions, key=lambda p: int(p.name), reverse=True)]
    for c in candidates:
        if (c / "initdb").is_file() and (c / "pg_ctl").is_file():
            return c
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ensure_user(name: str) -> None:
    if subprocess.run(["id", "-u", name], capture_output=True).returncode == 0:
        return
    subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
        check=True, capture_output=True,
    )  # fmt: skip


@contextlib.contextmanager
def throwaway_cluster(*, fsync: bool = False, user: str = CLUSTER_USER) -> Iterator[str]:
    """Start a new PostgreSQL cluster; yield its URL (``postgresql://clawrl@127.0.0.1:PORT/
    postgres``); stop and delete it on exit.

    Args:
        fsync: keep the server's ``fsync`` on (benchmarks); off by default, which is safe for
            a test cluster (only a crash of the whole machine would lose commits).
        user: the system user that owns the cluster when running as root.

    Raises:
        StoreError: PostgreSQL's tools are not installed, or the cluster did not start (the
            server log is in the message).
    """
    pg_bin = find_pg_bin()
    if pg_bin is None:
        raise StoreError("PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/initdb; "
                         "apt-get install postgresql, or set CLAWRL_PG_BIN)")  # fmt: skip
    as_root = os.geteuid() == 0
    prefix: list[str] = []
    if as_root:
        _ensure_user(user)
        prefix = ["runuser", "-u", user, "--"]
    tmp = Path(tempfile.mkdtemp(prefix="clawrl-pg-"))
    if as_root:
        shutil.chown(tmp, user, user)
    data, log = tmp / "data", tmp / "server.log"
    env = {**os.environ, "LC_ALL": "C", "LANG": "C"}
    started = False
    try:
        subprocess.run(
            [*prefix, str(pg_bin / "initdb"), "-D", str(data), "-U", SUPERUSER, "--auth=trust",
             "-E", "UTF8", "--no-locale", "--no-sync"],
            check=True, capture_output=True, env=env, cwd=tmp,
        )  # fmt: skip
        for _attempt in range(3):
            port = _free_port()
            opts = (f"-p {port} -k {tmp} -c listen_addresses=127.0.0.1 -c max_connections=200"
                    + ("" if fsync else " -c fsync=off -c full_page_writes=off"))  # fmt: skip
            proc = subprocess.run(
                [*prefix, str(pg_bin / "pg_ctl"), "-D", str(data), "-l", str(log), "-o", opts,
                 "-w", "-t", "60", "start"],
                capture_output=True, env=env, cwd=tmp,
            )  # fmt: skip
            if proc.returncode == 0:
                started = True
                break
        if not started:
            text = log.read_text() if log.exists() else proc.stderr.decode()
            raise StoreError(f"the throwaway PostgreSQL cluster did not start:\n{text[-2000:]}")
        yield f"postgresql://{SUPERUSER}@127.0.0.1:{port}/postgres"
    except subprocess.CalledProcessError as exc:
        raise StoreError(f"initdb failed: {exc.stderr.decode()[-2000:]}") from exc
    finally:
        if started:
            subprocess.run(
                [*prefix, str(pg_bin / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"],
                capture_output=True, env=env, cwd=tmp,
            )  # fmt: skip
        shutil.rmtree(tmp, ignore_errors=True)


def schema_url(cluster_url: str, schema: str | None = None) -> str:
    """A URL of ``cluster_url``'s database whose tables live in a new schema (default name
    ``t_`` + 12 hex digits): :func:`clawrl.store.postgres.schema_url`."""
    from clawrl.store.postgres import schema_url as in_schema

    return in_schema(cluster_url, schema or f"t_{uuid.uuid4().hex[:12]}")
