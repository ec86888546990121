"""Sandbox containment: what each isolation level guarantees, tested."""

from __future__ import annotations

import http.server
import threading

import pytest

from clawrl.harness.sandbox import Isolation, Limits, Sandbox, bwrap_works

needs_bwrap = pytest.mark.skipif(not bwrap_works(), reason="bwrap cannot run here")


@pytest.fixture
def http_server():
    """A plain HTTP server on 127.0.0.1 (stands in for the gateway / any other address)."""
    srv = http.server.HTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()


FETCH = "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=5).status)"


@needs_bwrap
def test_bwrap_cannot_write_outside_work_dir(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    with Sandbox.create(Isolation.BWRAP, read_only=[str(outside)]) as box:
        script = (
            f"echo in > inside.txt; echo x > {outside}/pwned; echo x > /etc/pwned; "
            f"echo x > {box.root}/pwned; echo x > /tmp/scratch; echo x > $HOME/rc; true"
        )
        r = box.run(["sh", "-c", script], limits=Limits(time_s=30))
        assert r.returncode == 0, r.stderr
        assert (box.work / "inside.txt").read_text() == "in\n"
        assert (box.home / "rc").is_file()
        assert not (outside / "pwned").exists()
        assert not (box.root / "pwned").exists()
        assert not (box.root / "tmp" / "scratch").exists()
        assert "Read-only file system" in r.stderr


@needs_bwrap
def test_bwrap_reaches_only_the_gateway(tmp_path, http_server):
    other = http.server.HTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        with Sandbox.create(Isolation.BWRAP, gateway=("127.0.0.1", http_server)) as box:
            ok = box.run(["python3", "-c", FETCH, box.gateway_base() + "/"])
            assert ok.returncode == 0 and ok.stdout.strip() == "200", ok.stderr
            port = other.server_address[1]
            blocked = box.run(["python3", "-c", FETCH, f"http://127.0.0.1:{port}/"])
            assert blocked.returncode != 0 and "Connection refused" in blocked.stderr
            no_dns = box.run(["python3", "-c", FETCH, "http://example.com/"])
            assert no_dns.returncode != 0
    finally:
        other.shutdown()
        other.server_close()


@needs_bwrap
def test_bwrap_hides_paths_and_scrubs_env(tmp_path, monkeypatch):
    secret = tmp_path / "suite"
    secret.mkdir()
    (secret / "verify").write_text("secret")
    monkeypatch.setenv("CLAWRL_SECRET_TOKEN", "s3cret")
    with Sandbox.create(Isolation.BWRAP, read_only=[str(tmp_path)], hidden=[str(secret)]) as box:
        r = box.run(["sh", "-c", f"ls -A {secret}; env"])
        assert "verify" not in r.stdout and "s3cret" not in r.stdout
        assert "HOME=/sandbox/home" in r.stdout


def test_fallback_confines_cwd_home_env_and_time(tmp_path, monkeypatch):
    monkeypatch.setenv("CLAWRL_SECRET_TOKEN", "s3cret")
    with Sandbox.create(Isolation.FALLBACK) as box:
        r = box.run(["sh", "-c", "pwd; echo $HOME; env"])
        lines = r.stdout.splitlines()
        assert lines[0] == str(box.work) and lines[1] == str(box.home)
        assert "s3cret" not in r.stdout
        slow = box.run(["sh", "-c", "sleep 30"], limits=Limits(time_s=0.5))
        assert slow.timed_out and slow.wall_s < 10


def test_file_size_limit_applies(tmp_path):
    isolation = Isolation.BWRAP if bwrap_works() else Isolation.FALLBACK
    with Sandbox.create(isolation) as box:
        r = box.run(
            ["sh", "-c", "head -c 2000000 /dev/zero > big; true"],
            limits=Limits(time_s=30, file_bytes=1 << 20),
        )
        assert r.returncode == 0
        assert (box.work / "big").stat().st_size <= 1 << 20
