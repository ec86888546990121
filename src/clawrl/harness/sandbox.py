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

Both apply rlimits (CPU seconds, address space, file size, no core dumps) and a wall-clock limit
that kills the whole process group.
"""

from __future__ import annotations

import enum
import functools
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from clawrl.harness.relay import UnixToTcpRelay

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
    """

    time_s: float = 120.0
    cpu_s: int = 600
    memory_bytes: int | None = 4 << 30
    file_bytes: int = 64 << 20


@dataclass
class RunResult:
    """What a sandboxed command did."""

    returncode: int
    stdout: str
    stderr: str
    timed_out: bool
    wall_s: float


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


def choose_isolation(requested: str = "auto") -> Isolation:
    """``auto``: bwrap when it works, else the fallback; ``bwrap`` fails loudly without it."""
    if requested == "fallback":
        return Isolation.FALLBACK
    if bwrap_works():
        return Isolation.BWRAP
    if requested == "bwrap":
        from clawrl.errors import HarnessError

        raise HarnessError("bwrap was requested but cannot run here (missing or no namespaces)")
    return Isolation.FALLBACK


def _set_limits(limits: Limits) -> None:
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_bytes, limits.file_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if limits.memory_bytes is not None:
        resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))


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
        self, argv: Sequence[str], env: dict[str, str], cwd: str, gateway: bool
    ) -> list[str]:
        relay = self._relay is not None and gateway
        if relay:
            launch = [sys.executable, self.script_path(_RELAY_SCRIPT), "launch", str(INNER_PORT)]
            argv = [*launch, "/run/clawrl/gateway.sock", "--", *argv]
        out = ["bwrap", "--die-with-parent", "--new-session", "--unshare-all"]
        out += ["--hostname", "sandbox", "--clearenv"]
        # /tmp first: bwrap applies mounts in order, and a later tmpfs on /tmp would hide a
        # Python environment (or a read-only path) that lives under /tmp, e.g. a CI clone's venv
        out += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
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
            cmd, popen_env, popen_cwd = (
                self._bwrap_argv(argv, full_env, cwd, gateway),
                full_env,
                None,
            )
        else:
            cmd, popen_env, popen_cwd = list(argv), full_env, cwd
        t0 = time.monotonic()
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
            preexec_fn=lambda: _set_limits(limits),
        )
        timed_out = False
        try:
            out, err = proc.communicate(timeout=limits.time_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
        return RunResult(proc.returncode, out, err, timed_out, time.monotonic() - t0)

    def close(self) -> None:
        """Stop the relay and delete the sandbox directory."""
        if self._relay is not None:
            self._relay.stop()
            self._relay = None
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
