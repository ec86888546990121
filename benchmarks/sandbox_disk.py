"""How far a fast writer gets past a sandbox's disk budget before the watcher kills it.

``work/`` has no quota without root, so :class:`clawrl.harness.sandbox.Sandbox` polls it; a
writer passes the budget by what it writes between two checks. Runs a writer of 1 MB files
(``head -c 1000000 /dev/zero > fN`` in a loop, page-cache speed) in a bubblewrap sandbox against
a budget, with the watcher's checks (:func:`clawrl.harness.sandbox.next_disk_check`) and, as
the baseline in the same run, a fixed wait of ``disk_check_s`` between checks (the watcher
before 2026-12-05), and prints the bytes past the budget for each.

    .venv/bin/python benchmarks/sandbox_disk.py [--budget-mib 20] [--repeat 5]

Needs bubblewrap (``apt-get install bubblewrap``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from unittest import mock

from clawrl.harness import sandbox
from clawrl.harness.sandbox import Isolation, Limits, Sandbox

FILL = "i=0; while true; do head -c 1000000 /dev/zero > f$i || exit 3; i=$((i+1)); done"


def overshoot_mib(budget_mib: int) -> float:
    """MiB in ``work/`` past the budget when the writer was killed."""
    with Sandbox.create(Isolation.BWRAP) as box:
        limits = Limits(time_s=120, disk_bytes=budget_mib << 20, file_bytes=2 << 20)
        run = box.run(["sh", "-c", FILL], limits=limits)
        if run.killed_for != "disk":
            raise SystemExit(f"the writer was not killed for disk: {run}")
        used = sum(p.stat().st_size for p in box.work.iterdir())
        return (used - (budget_mib << 20)) / (1 << 20)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budget-mib", type=int, default=20, help="disk budget (20)")
    ap.add_argument("--repeat", type=int, default=5, help="runs per watcher (5)")
    args = ap.parse_args()
    if not sandbox.bwrap_works():
        print("bubblewrap does not work here: apt-get install bubblewrap", file=sys.stderr)
        return 1

    def fixed(limits: Limits, used: int, rate: float, walk_s: float) -> float:
        return limits.disk_check_s

    rows = {}
    with mock.patch.object(sandbox, "next_disk_check", fixed):
        rows["fixed 0.25 s (baseline)"] = [
            overshoot_mib(args.budget_mib) for _ in range(args.repeat)
        ]
    rows["next_disk_check"] = [overshoot_mib(args.budget_mib) for _ in range(args.repeat)]
    print(f"MiB past a {args.budget_mib} MiB budget, {args.repeat} runs each")
    print(f"{'watcher':<26} {'median':>8} {'max':>8}")
    for name, values in rows.items():
        print(f"{name:<26} {statistics.median(values):>8.1f} {max(values):>8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
