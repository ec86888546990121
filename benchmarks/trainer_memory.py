"""Trainer memory on the embedded model: peak and between-step RSS, and seconds per step, for
micro-batch 4 vs 1 and with vs without returning freed heap to the OS — in one run.

    .venv/bin/python benchmarks/trainer_memory.py [--steps 3] [--max-prompt 700]

Each configuration runs in its own subprocess (peak RSS is per process) on the same random
online-style samples: 4 per step, prompts of 60..max-prompt tokens, completions of 10..64.
The baseline is what clawrl did before: micro-batch 4 and no ``malloc_trim``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time

CONFIGS = [
    ("baseline: micro-batch 4, no trim", 4, False),
    ("micro-batch 4, trim", 4, True),
    ("clawrl default: micro-batch 1, trim", 1, True),
]


def _rss_gb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e9


def _child(micro_batch: int, trim: bool, steps: int, max_prompt: int) -> None:
    import clawrl.trainer.trainer as trainer_mod
    from clawrl.cli.common import quiet_transformers
    from clawrl.config import TrainerConfig
    from clawrl.models import load_policy
    from clawrl.trainer import Trainer, TrainSample

    quiet_transformers()
    if not trim:
        trainer_mod.release_free_memory = lambda: False  # the baseline: no malloc_trim
    rng = random.Random(0)
    policy = load_policy("smollm2-135m")
    vocab = len(policy.tokenizer)
    tr = Trainer(
        policy.model,
        TrainerConfig(method="rl", micro_batch_size=micro_batch),
        tempfile.mkdtemp(),
    )
    times, between = [], []
    for step in range(steps):
        samples = []
        for i in range(4):
            p, c = rng.randint(60, max_prompt), rng.randint(10, 64)
            samples.append(
                TrainSample(
                    [rng.randrange(vocab) for _ in range(p)],
                    [rng.randrange(vocab) for _ in range(c)],
                    [-3.0] * c,
                    reward=rng.choice([1.0, -1.0]),
                    turn_id=f"{step}-{i}",
                )
            )
        t = time.perf_counter()
        tr.train_step(samples)
        times.append(time.perf_counter() - t)
        between.append(_rss_gb())
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    print(json.dumps({"peak_gb": peak, "between_gb": max(between), "step_s": times}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--max-prompt", type=int, default=700)
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(int(args.child[0]), args.child[1] == "1", args.steps, args.max_prompt)
        return
    rows = []
    for name, mb, trim in CONFIGS:
        cmd = [sys.executable, __file__, "--steps", str(args.steps),
               "--max-prompt", str(args.max_prompt), "--child", str(mb), "1" if trim else "0"]  # fmt: skip
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        r = json.loads(out.strip().splitlines()[-1])
        rows.append((name, r))
        print(f"done: {name}", file=sys.stderr)
    print(f"{'configuration':40s} {'peak RSS':>9s} {'between steps':>14s} {'s/step (mean)':>14s}")
    for name, r in rows:
        mean = sum(r["step_s"]) / len(r["step_s"])
        print(f"{name:40s} {r['peak_gb']:7.1f}GB {r['between_gb']:12.1f}GB {mean:14.1f}")


if __name__ == "__main__":
    main()
