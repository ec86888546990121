"""A/B of two checkouts' gateways, interleaved: CPU ms per request of the server process and
latency at 1 client, CPU ms per request and requests/s at 32 clients (SQLite store, the instant
engine of ``gateway_overhead.py``). CPU time per request is far less sensitive than latency to
other work on a shared machine, and interleaving the rounds exposes both sides to the same load.

    git archive OLD_COMMIT | tar -x -C /tmp/base
    .venv/bin/python benchmarks/gateway_ab.py --base /tmp/base [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import gateway_overhead as g  # noqa: E402


def start(src: str, bench: str, db: str, tmp: Path, tag: str) -> tuple[subprocess.Popen, str]:
    """A gateway child of the checkout at ``src`` (its benchmark's ``serve``); (process, URL)."""
    pf = tmp / f"port-{tag}"
    env = {**os.environ, "PYTHONPATH": src, "HF_HUB_OFFLINE": "1"}
    code = (f"import sys; sys.path.insert(0, {bench!r}); import gateway_overhead as g; "
            f"g.serve({str(pf)!r}, {db!r})")  # fmt: skip
    p = subprocess.Popen([sys.executable, "-c", code], env=env)
    while not pf.exists() or not pf.read_text():
        if p.poll() is not None:
            raise SystemExit(f"the {tag} gateway did not start")
        time.sleep(0.05)
    return p, f"http://127.0.0.1:{pf.read_text()}"


def cpu(pid: int) -> float:
    """CPU seconds (user + system) the process has used."""
    f = Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="the other checkout's root (has src/)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    base = Path(args.base)
    sides = {"base": (str(base / "src"), str(base / "benchmarks")),
             "this": (str(HERE.parent / "src"), str(HERE))}  # fmt: skip
    servers = {k: start(v[0], v[1], str(tmp / f"{k}.db"), tmp, k) for k, v in sides.items()}
    res: dict[str, dict[str, list[float]]] = {
        k: {"cpu": [], "p50": [], "cpu32": [], "rps32": []} for k in sides
    }
    for k, (_, url) in servers.items():
        asyncio.run(g.run_gateway(url, 4, 10, False, "warm" + k))
    for rnd in range(args.rounds):
        for k, (p, url) in servers.items():
            c0 = cpu(p.pid)
            lat, wall = asyncio.run(g.run_gateway(url, 1, 100, False, f"{k}{rnd}"))
            res[k]["cpu"].append((cpu(p.pid) - c0) / len(lat) * 1e3)
            res[k]["p50"].append(g.pct(lat, 0.5) * 1e3)
            c0 = cpu(p.pid)
            lat, wall = asyncio.run(g.run_gateway(url, 32, 6, False, f"{k}{rnd}x"))
            res[k]["cpu32"].append((cpu(p.pid) - c0) / len(lat) * 1e3)
            res[k]["rps32"].append(len(lat) / wall)
    print(
        f"{'':<6} | {'1 client: CPU ms/req':>20} {'p50 ms':>7} | {'32: CPU ms/req':>14} {'req/s':>6}"
    )
    for k, r in res.items():
        med = {name: statistics.median(v) for name, v in r.items()}
        print(f"{k:<6} | {med['cpu']:>20.2f} {med['p50']:>7.2f} | {med['cpu32']:>14.2f} "
              f"{med['rps32']:>6.1f}")  # fmt: skip
    for p, _ in servers.values():
        p.kill()


if __name__ == "__main__":
    main()
