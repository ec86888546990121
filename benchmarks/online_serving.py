"""Online loop costs on the embedded model: seconds per training step at batch 16, serving
latency with training off and on, and peak memory — in one run.

    .venv/bin/python benchmarks/online_serving.py [--batch-size 16] [--requests 12]

Serving latency is the wall time of one non-streamed request (short prompt, 32 new tokens,
greedy) sent to the engine while (a) nothing else runs, (b) LoRA training steps run back to
back in a worker thread, as ``clawrl serve --method ...`` does.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import threading
import time

from clawrl.cli.common import quiet_transformers
from clawrl.config import TrainerConfig
from clawrl.engine import SamplingParams, TransformersEngine
from clawrl.models import load_policy
from clawrl.trainer import Trainer, TrainSample


def _prompt(tok, i: int) -> list[int]:
    q = f"Problem {i}: Sam has {i + 3} apples and buys {2 * i + 1} more. How many now?"
    return tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                   return_dict=False)  # fmt: skip


async def _latencies(engine, tok, n: int) -> list[float]:
    out = []
    for i in range(n):
        t = time.perf_counter()
        await engine.generate(_prompt(tok, i), SamplingParams(max_tokens=32, temperature=0,
                                                              ignore_eos=True))  # fmt: skip
        out.append(time.perf_counter() - t)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--requests", type=int, default=12)
    ap.add_argument("--completion-tokens", type=int, default=64)
    args = ap.parse_args()
    quiet_transformers()
    policy = load_policy("smollm2-135m")
    tok = policy.tokenizer
    engine = TransformersEngine.from_policy(policy)
    params = SamplingParams(max_tokens=args.completion_tokens, temperature=1.0, seed=0,
                            ignore_eos=True)  # fmt: skip

    async def collect():
        ps = [_prompt(tok, i) for i in range(args.batch_size)]
        cs = await asyncio.gather(*[engine.generate(p, params) for p in ps])
        return [TrainSample(p, c.token_ids, c.logprobs, temperature=1.0,
                            reward=1.0 if i % 2 else -1.0)
                for i, (p, c) in enumerate(zip(ps, cs, strict=True))]  # fmt: skip

    samples = asyncio.run(collect())
    trainer = Trainer(policy.model, TrainerConfig(method="rl", micro_batch_size=4),
                      "/tmp/clawrl-bench-online")  # fmt: skip
    step_times = []
    for _ in range(2):
        t = time.perf_counter()
        trainer.train_step(samples)
        step_times.append(time.perf_counter() - t)
    asyncio.run(_latencies(engine, tok, 2))  # warm-up
    off = asyncio.run(_latencies(engine, tok, args.requests))
    stop = threading.Event()
    steps_during = [0]

    def train_loop() -> None:
        while not stop.is_set():
            trainer.train_step(samples)
            steps_during[0] += 1

    th = threading.Thread(target=train_loop, daemon=True)
    th.start()
    on = asyncio.run(_latencies(engine, tok, args.requests))
    stop.set()
    th.join()
    engine.close()
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2
    tokens = sum(len(s.prompt_ids) + len(s.completion_ids) for s in samples)
    print(
        f"embedded model, LoRA r16 all-linear, batch {args.batch_size} "
        f"({tokens} tokens, {args.completion_tokens} sampled per turn), micro-batch 4"
    )
    print(f"{'':28} | {'p50 (s)':>8} | {'p90 (s)':>8} | {'mean (s)':>8}")
    print("-" * 62)
    for name, xs in (("serving, training off", off), ("serving, training on", on)):
        q = statistics.quantiles(xs, n=10)
        print(f"{name:28} | {statistics.median(xs):8.2f} | {q[8]:8.2f} | "
              f"{statistics.mean(xs):8.2f}")  # fmt: skip
    print(
        f"{'training step (batch ' + str(args.batch_size) + ')':28} | "
        f"{statistics.median(step_times):8.2f} |          | {statistics.mean(step_times):8.2f}"
    )
    print(f"training steps completed during the 'on' requests: {steps_during[0]}")
    print(f"peak resident memory: {peak_gb:.2f} GB")


if __name__ == "__main__":
    main()
