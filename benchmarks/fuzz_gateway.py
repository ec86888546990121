"""Fuzz the gateway's three protocols with thousands of generated bodies (tests/gateway/test_fuzz.py
at full size, random seeds) on the tiny model; prints bodies tried, answered, refused, 5xx.

Baseline, in the same run: the bounded CI size (40 per protocol, fixed examples).

    .venv/bin/python benchmarks/fuzz_gateway.py [--examples 2000]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(examples: int, random: bool) -> tuple[list[str], int, float]:
    env = {**os.environ, "CLAWRL_FUZZ_EXAMPLES": str(examples),
           "CLAWRL_FUZZ_RANDOM": "1" if random else "0"}  # fmt: skip
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "--timeout=0",
         "tests/gateway/test_fuzz.py"],
        cwd=ROOT, env=env, capture_output=True, text=True,
    )  # fmt: skip
    # pytest's progress dots may precede a line: find the summaries anywhere
    lines = re.findall(r"fuzz /\S+: \d+ bodies, \d+ answered, \d+ refused", proc.stdout)
    if proc.returncode != 0:
        print(proc.stdout[-4000:], proc.stderr[-2000:])
    return lines, proc.returncode, time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--examples", type=int, default=2000, help="bodies per protocol (2000)")
    args = ap.parse_args()
    rows = []
    for label, n, rnd in (("CI (fixed)", 40, False), ("full (random)", args.examples, True)):
        lines, rc, wall = run(n, rnd)
        for line in lines:
            m = re.match(r"fuzz (\S+): (\d+) bodies, (\d+) answered, (\d+) refused", line)
            if m:
                rows.append((label, *m.groups(), wall, rc))
        if rc != 0:
            print(f"{label}: FAILED (exit {rc})")
    print(f"{'run':<14} {'protocol':<22} {'bodies':>7} {'answered':>9} {'4xx':>6} {'5xx':>4}")
    for label, path, n, ok, refused, _wall, rc in rows:
        print(f"{label:<14} {path:<22} {n:>7} {ok:>9} {refused:>6} {0 if rc == 0 else '?':>4}")
    return 0 if all(r[-1] == 0 for r in rows) and rows else 1


if __name__ == "__main__":
    raise SystemExit(main())
