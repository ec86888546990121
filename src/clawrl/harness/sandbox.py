"""Per-rollout sandboxes: bubblewrap where it runs, a documented weaker fallback elsewhere.

Every rollout gets a fresh directory holding ``work/`` (a copy of the task's files), ``home/``
(the harness's own HOME, where its adapter writes its config) and ``tmp/``.

**bwrap** (:attr:`Isolation.BWRAP`): the command runs under ``bwrap --unshare-all`` (own user,
pid, ipc, uts, cgroup and *network* namespaces): the system directories (``/usr``, ``/bin``,
``/lib*``, ``/etc``), the Python installation and any extra paths an adapter needs are mounted
read-only; ``work/`` and ``home/`` are the only writable bind mounts (at ``/sandbox/work`` and
``/sandbox/home``), ``/tmp`` is a private tmpfs; paths listed as hidden (the task suite, so the
harness never sees a verifier) are covered by empty tmpfs mounts. The network namespace has only
its own loopback: the gateway is reachable solely through one unix socket bind-mounted at
``/run/clawrl/gateway.sock`` and relayed to ``127.0.0.1:INNER_PORT`` inside
(:mod:`clawrl.harness.relay`). Nothing else off the sandbox is reachable.

**fallback** (:attr:`Isolation.FALLBACK`, when bwrap is missing or cannot create namespaces):
the command runs as a plain child process in ``work/`` with a scrubbed environment (only what
the adapter sets, plus ``PATH``), its own ``HOME`` and ``TMPDIR``. It guarantees only: the
starting directory, environment, HOME and the rlimits below. It does **not** stop the process
from writing elsewhere with absolute paths the user may write, from reading the task's verifier,
or from opening network connections.

Both apply rlimits (CPU seconds, address space, file size, no core dumps), a wall-clock limit
that kills the whole process group, a process limit (a ``pids`` cgroup where one can be created,
else ``RLIMIT_NPROC``, which the kernel does not enforce for root) and a disk budget for
``work/`` + ``home/`` (a watchdog kills the process group once they pass it; bwrap's ``/tmp``
is a tmpfs of that size). The fallback is never chosen silently: ``auto`` refuses to run
without bwrap unless the fallback is asked for by name, and every fallback rollout logs that it
is weaker.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import logging
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from clawrl.harness.relay import UnixToTcpRelay

log = logging.getLogger(__name__)

INNER_PORT = 18080
"""The gateway's port on the sandbox's private loopback (bwrap)."""

_SYSTEM_RO = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc", "/opt")
_RELAY_SCRIPT = Path(__file__).with_name("relay.py")


class Isolation(enum.StrEnum):
    """Which isolation a rollout ran under (recorded on every rollout)."""

    BWRAP = "bwrap"
    FALLBACK = "fallback"


@dataclass(frozen=True)
class Limits:
    """Resource limits of one sandboxed command.

    Attributes:
        time_s: wall-clock limit; the process group is killed after it.
        cpu_s: RLIMIT_CPU seconds.
        memory_bytes: RLIMIT_AS (virtual address space); None leaves it unlimited (Node-based
            harnesses reserve large virtual ranges).
        file_bytes: RLIMIT_FSIZE, the largest file the command may write.
        processes: most processes (and threads) alive at once.
        disk_bytes: most bytes ``work/`` + ``home/`` may hold, also the size of bwrap's
            ``/tmp`` tmpfs. ``work/`` is polled (no quota exists without root), so a writer
            passes the budget by what it writes between two checks; see ``next_disk_check``.
        disk_check_s: the longest wait between two disk checks of a tree far from its budget;
            checks come sooner near it (``next_disk_check``).
    """

    time_s: float = 120.0
    cpu_s: int = 600
    memory_bytes: int | None = 4 << 30
    file_bytes: int = 64 << 20
    processes: int = 256
    disk_bytes: int = 1 << 30
    disk_check_s: float = 0.25


@dataclass
class RunResult:
    """What a sandboxed command did."""

    returncode: int
    stdout: str
    stderr: str
    timed_out: bool
    wall_s: float
    killed_for: str | None = None
    """``"time"`` or ``"disk"`` when a limit killed the command, else None."""


@functools.cache
def bwrap_works() -> bool:
    """Whether ``bwrap`` is installed and can create its namespaces here (tried once)."""
    exe = shutil.which("bwrap")
    if exe is None:
        return False
    try:
        proc = subprocess.run(
            [exe, "--ro-bind", "/", "/", "--unshare-all", "--die-with-parent", "true"],
            capture_output=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


FALLBACK_WARNING = (
    "sandbox isolation 'fallback': the harness runs as a plain process; it can write any path "
    "this user may write, read the task's verifier and open network connections (install "
    "bubblewrap for real containment)"
)


def choose_isolation(requested: str = "auto") -> Isolation:
    """The isolation to run rollouts under.

    ``auto`` and ``bwrap``: bwrap, which must work here; ``fallback``: the weaker fallback,
    only when asked for by name (it is logged on every rollout).

    Raises:
        HarnessError: bwrap is missing or cannot create its namespaces and the fallback was not
            asked for.
    """
    if requested == "fallback":
        log.warning(FALLBACK_WARNING)
        return Isolation.FALLBACK
    if bwrap_works():
        return Isolation.BWRAP
    from clawrl.errors import HarnessError

    raise HarnessError(
        "bwrap cannot run here (missing, or no user namespaces): install it "
        "(`apt-get install bubblewrap`; `make test` does) or pass --isolation fallback to run "
        "harnesses as plain processes, with no filesystem or network containment"
    )


def _pids_cgroup(limit: int) -> Path | None:
    """A fresh ``pids`` cgroup (v1 or v2) allowing ``limit`` processes, or None where this
    process may not create one."""
    candidates = [Path("/sys/fs/cgroup/pids")]
    v2 = Path("/sys/fs/cgroup")
    try:
        if "pids" in (v2 / "cgroup.controllers").read_text().split():
            candidates.append(v2)
    except OSError:
        pass
    for base in candidates:
        if not (base / "cgroup.procs").exists():
            continue
        group = base / f"clawrl-{uuid.uuid4().hex[:12]}"
        try:
            group.mkdir()
            (group / "pids.max").write_text(str(limit))
            return group
        except OSError:
            with contextlib.suppress(OSError):
                group.rmdir()
    return None


def process_cap() -> str | None:
    """How sandboxed commands' processes are capped here: ``"cgroup"`` (a pids cgroup),
    ``"rlimit"`` (RLIMIT_NPROC, not root), or ``None`` (root without a pids cgroup: uncapped)."""
    group = _pids_cgroup(1)
    if group is not None:
        _remove_cgroup(group)
        return "cgroup"
    return None if os.getuid() == 0 else "rlimit"


def _user_processes() -> int:
    """Tasks (threads included) of this real uid now: RLIMIT_NPROC counts them all."""
    uid, n = os.getuid(), 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    n += len(os.listdir(f"/proc/{entry.name}/task"))
            except OSError:
                pass
    return n


def _set_limits(limits: Limits, cgroup: Path | None, nproc: int) -> None:
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_bytes, limits.file_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if limits.memory_bytes is not None:
        resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
    if cgroup is not None:  # join before exec: every descendant is counted
        (cgroup / "cgroup.procs").write_text(str(os.getpid()))
    else:  # counts every task of this uid, so ``nproc`` = those alive now + the limit
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))


DISK_CHECK_MIN_S = 0.01
"""Shortest wait between two disk checks (seconds)."""

DISK_FAST_WRITER = 1e9
"""Bytes per second a writer is assumed able to reach before its growth is seen (a page-cache
write of zeros runs at 0.2-1 GB/s here)."""


def next_disk_check(limits: Limits, used: int, rate: float, walk_s: float) -> float:
    """Seconds to wait before the next disk check of a sandboxed command.

    Half the time the tree would take to reach ``limits.disk_bytes`` at its last growth rate or
    at :data:`DISK_FAST_WRITER`, whichever is faster, capped at ``limits.disk_check_s``; never
    less than ``DISK_CHECK_MIN_S`` or four times the last walk (so walking the tree costs at
    most a fifth of a core, even where that exceeds ``disk_check_s``). A tree far from its
    budget is checked every ``disk_check_s``, one within reach of a fast writer every 10 ms, so
    the overshoot is what is written in about 10 ms, not in ``disk_check_s`` (which let a
    writer pass a 20 MB budget by 150-200 MB).

    Args:
        limits: the command's limits.
        used: bytes the tree held at the last check.
        rate: the tree's growth since the check before, in bytes per second (0 when it shrank).
        walk_s: seconds the last check's walk took.
    """
    floor = max(DISK_CHECK_MIN_S, 4.0 * walk_s)
    headroom = max(limits.disk_bytes - used, 0)
    wait = min(limits.disk_check_s, headroom / max(rate, DISK_FAST_WRITER) / 2.0)
    return max(floor, wait)


def _tree_bytes(*roots: Path) -> int:
    total = 0
    for root in roots:
        for dirpath, _dirs, files in os.walk(root):
            for name in files:
                with contextlib.suppress(OSError):
                    total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total


def _python_roots() -> list[str]:
    roots = {sys.prefix, sys.base_prefix, str(Path(sys.executable).resolve().parent.parent)}
    return sorted(r for r in roots if not any(r.startswith(s + "/") for s in _SYSTEM_RO))


@dataclass
class Sandbox:
    """One rollout's sandbox. Create with :meth:`create`; :meth:`close` removes everything.

    Attributes:
        root: the host directory holding ``work/``, ``home/``, ``tmp/`` and ``sock/``.
        isolation: see :class:`Isolation`.
        gateway: the gateway's host TCP address ``(host, port)``, or None.
        read_only: extra host paths mounted read-only (bwrap), e.g. a harness's install dir.
        hidden: host paths covered by an empty tmpfs inside (bwrap), e.g. the task suite.
        scripts: host files mounted read-only under ``/run/clawrl-bin`` (bwrap); see
            :meth:`script_path`.
    """

    root: Path
    isolation: Isolation
    gateway: tuple[str, int] | None = None
    read_only: list[str] = field(default_factory=list)
    hidden: list[str] = field(default_factory=list)
    scripts: dict[str, str] = field(default_factory=dict)
    _relay: UnixToTcpRelay | None = None

    @classmethod
    def create(
        cls,
        isolation: Isolation,
        *,
        files: Path | None = None,
        gateway: tuple[str, int] | None = None,
        read_only: Sequence[str] = (),
        hidden: Sequence[str] = (),
        parent: str | None = None,
    ) -> Sandbox:
        """A fresh sandbox whose ``work/`` is a copy of ``files`` (when given)."""
        root = Path(tempfile.mkdtemp(prefix="clawrl-rollout-", dir=parent))
        if files is not None and files.is_dir():
            shutil.copytree(files, root / "work", symlinks=True)
        else:
            (root / "work").mkdir()
        for name in ("home", "tmp", "sock"):
            (root / name).mkdir()
        box = cls(root, isolation, gateway, list(read_only), list(hidden))
        if isolation is Isolation.BWRAP and gateway is not None:
            box._relay = UnixToTcpRelay(str(root / "sock" / "gateway.sock"), *gateway).start()
        return box

    # ----------------------------------------------------------------- paths as seen inside

    @property
    def work(self) -> Path:
        """The work dir on the host."""
        return self.root / "work"

    @property
    def home(self) -> Path:
        """The harness's HOME on the host (adapters write configs here)."""
        return self.root / "home"

    @property
    def inner_work(self) -> str:
        """The work dir as the command sees it."""
        return "/sandbox/work" if self.isolation is Isolation.BWRAP else str(self.work)

    @property
    def inner_home(self) -> str:
        """HOME as the command sees it."""
        return "/sandbox/home" if self.isolation is Isolation.BWRAP else str(self.home)

    def script_path(self, host_file: str | Path) -> str:
        """Mount ``host_file`` read-only (bwrap: under ``/run/clawrl-bin``); its inner path."""
        host = str(Path(host_file).resolve())
        if self.isolation is not Isolation.BWRAP:
            return host
        inner = f"/run/clawrl-bin/{Path(host).name}"
        self.scripts[inner] = host
        return inner

    def gateway_base(self) -> str:
        """``http://HOST:PORT`` of the gateway as the command reaches it."""
        if self.gateway is None:
            raise ValueError("this sandbox has no gateway")
        if self.isolation is Isolation.BWRAP:
            return f"http://127.0.0.1:{INNER_PORT}"
        return f"http://{self.gateway[0]}:{self.gateway[1]}"

    # ----------------------------------------------------------------- running

    def _bwrap_argv(
        self, argv: Sequence[str], env: dict[str, str], cwd: str, gateway: bool, tmp_bytes: int
    ) -> list[str]:
        relay = self._relay is not None and gateway
        if relay:
            launch = [sys.executable, self.script_path(_RELAY_SCRIPT), "launch", str(INNER_PORT)]
            argv = [*launch, "/run/clawrl/gateway.sock", "--", *argv]
        out = ["bwrap", "--die-with-parent", "--new-session", "--unshare-all"]
        out += ["--hostname", "sandbox", "--clearenv"]
        # /tmp first: bwrap applies mounts in order, and a later tmpfs on /tmp would hide a
        # Python environment (or a read-only path) that lives under /tmp, e.g. a CI clone's venv
        out += ["--proc", "/proc", "--dev", "/dev", "--size", str(tmp_bytes), "--tmpfs", "/tmp"]
        for path in [*_SYSTEM_RO, *_python_roots(), *self.read_only]:
            if os.path.exists(path):
                out += ["--ro-bind", path, path]
        for path in self.hidden:
            if os.path.isdir(path):
                out += ["--tmpfs", path]
        out += [
            "--bind",
            str(self.work),
            "/sandbox/work",
            "--bind",
            str(self.home),
            "/sandbox/home",
        ]
        if relay:
            out += ["--ro-bind", str(self.root / "sock"), "/run/clawrl"]
        for inner, host in self.scripts.items():
            out += ["--ro-bind", host, inner]
        for key, value in env.items():
            out += ["--setenv", key, value]
        out += ["--chdir", cwd]
        return [*out, *argv]

    def run(
        self,
        argv: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        limits: Limits | None = None,
        cwd: str | None = None,
        gateway: bool = True,
    ) -> RunResult:
        """Run ``argv`` in the sandbox (cwd: the work dir) and wait, at most ``limits.time_s``.

        The environment is exactly ``PATH``, ``HOME``, ``TMPDIR``, ``LANG`` plus ``env``.
        ``gateway=False`` runs it without the gateway relay (bwrap: no network at all).
        """
        limits = limits or Limits()
        full_env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": self.inner_home,
            "TMPDIR": "/tmp" if self.isolation is Isolation.BWRAP else str(self.root / "tmp"),
            "LANG": "C.UTF-8",
            **(env or {}),
        }
        cwd = cwd or self.inner_work
        if self.isolation is Isolation.BWRAP:
            argv_full = self._bwrap_argv(argv, full_env, cwd, gateway, limits.disk_bytes)
            cmd, popen_env, popen_cwd = argv_full, full_env, None
        else:
            log.warning("rollout sandbox %s: %s", self.root.name, FALLBACK_WARNING)
            cmd, popen_env, popen_cwd = list(argv), full_env, cwd
        cgroup = _pids_cgroup(limits.processes)
        if cgroup is None and os.getuid() == 0:
            log.warning(
                "sandbox %s: processes are NOT capped (no pids cgroup can be created here, and "
                "the kernel ignores RLIMIT_NPROC for root)",
                self.root.name,
            )
        nproc = limits.processes + (_user_processes() if cgroup is None else 0)
        t0 = time.monotonic()
        try:
            proc = subprocess.Popen(
                cmd,
                env=popen_env,
                cwd=popen_cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                errors="replace",
                start_new_session=True,
                preexec_fn=lambda: _set_limits(limits, cgroup, nproc),
            )
            killed: list[str] = []
            done = threading.Event()
            watchdog = threading.Thread(
                target=self._watch_disk, args=(proc, limits, done, killed), daemon=True
            )
            watchdog.start()
            try:
                out, err = proc.communicate(timeout=limits.time_s)
            except subprocess.TimeoutExpired:
                killed.append("time")
                _kill_group(proc.pid)
                out, err = proc.communicate()
            finally:
                done.set()
                watchdog.join()
            _kill_group(proc.pid)  # background children outlive their parent otherwise
        finally:
            if cgroup is not None:
                _remove_cgroup(cgroup)
        reason = killed[0] if killed else None
        if reason == "disk":
            err += f"\n[clawrl sandbox] killed: work/ + home/ passed {limits.disk_bytes} bytes\n"
        return RunResult(proc.returncode, out, err, reason == "time", time.monotonic() - t0, reason)

    def _watch_disk(
        self, proc: subprocess.Popen[str], limits: Limits, done: threading.Event, killed: list[str]
    ) -> None:
        start = time.monotonic()
        used = _tree_bytes(self.work, self.home)  # what the task brought: growth counts from it
        at = time.monotonic()
        wait = next_disk_check(limits, used, 0.0, at - start)
        while not done.wait(wait):
            start = time.monotonic()
            now_used = _tree_bytes(self.work, self.home)
            end = time.monotonic()
            if now_used > limits.disk_bytes:
                killed.append("disk")
                _kill_group(proc.pid)
                return
            rate = max(now_used - used, 0) / max(end - at, 1e-6)
            used, at = now_used, end
            wait = next_disk_check(limits, used, rate, end - start)

    def close(self) -> None:
        """Stop the relay and delete the sandbox directory."""
        self._relay_stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def _relay_stop(self) -> None:
        if self._relay is not None:
            self._relay.stop()
            self._relay = None

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _remove_cgroup(group: Path, wait_s: float = 5.0) -> None:
    """Kill what is left in ``group`` and remove it (a cgroup with members cannot be removed)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            pids = [int(p) for p in (group / "cgroup.procs").read_text().split()]
        except OSError:
            pids = []
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        try:
            group.rmdir()
            return
        except OSError:
            if time.monotonic() > deadline:
                log.warning("could not remove cgroup %s", group)
                return
            time.sleep(0.05)
