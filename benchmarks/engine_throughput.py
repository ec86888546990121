"""Generated tokens/s of TransformersEngine at 1, 4 and 16 concurrent requests.

Baseline, in the same run: Hugging Face ``model.generate`` serving the same requests one at a
time (no batching), which is what a naive server does. Every request generates exactly
``--new-tokens`` tokens (EOS ignored) so the work is equal.

    .venv/bin/python benchmarks/engine_throughput.py [--model smollm2-135m] [--new-tokens 128]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import torch

from clawrl.cli.common import quiet_transformers
from clawrl.engine import SamplingParams, TransformersEngine
from clawrl.models import load_policy

QUESTIONS = [
    "Explain how a bicycle stays upright.",
    "Write a short poem about autumn leaves.",
    "What is the capital of France and why is it famous?",
    "Give me three tips for learning to cook.",
    "Describe the water cycle for a ten year old.",
    "How do I sort a list in Python?",
    "Why is the sky blue?",
    "Summarise the plot of a heist movie you invent.",
]


def prompts(tok, n: int) -> list[list[int]]:
    out = []
    for i in range(n):
        q = QUESTIONS[i % len(QUESTIONS)]
        msgs = [{"role": "user", "content": f"{q} (request {i})"}]
        out.append(tok.apply_chat_template(msgs, add_generation_prompt=True, return_dict=False))
    return out


async def engine_run(engine: TransformersEngine, ps: list[list[int]], new: int) -> float:
    params = SamplingParams(max_tokens=new, temperature=0.7, ignore_eos=True, seed=0)
    t = time.perf_counter()
    outs = await asyncio.gather(*[engine.generate(p, params) for p in ps])
    dt = time.perf_counter() - t
    assert all(len(o.token_ids) == new for o in outs)
    return sum(len(o.token_ids) for o in outs) / dt


def hf_run(model, ps: list[list[int]], new: int) -> float:
    t = time.perf_counter()
    total = 0
    with torch.no_grad():
        for p in ps:
            out = model.generate(
                torch.tensor([p]),
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=True,
                temperature=0.7,
                top_k=0,
            )
            total += out.shape[1] - len(p)
    return total / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument(
        "--baseline-requests",
        type=int,
        default=4,
        help="requests the sequential baseline serves (its tok/s does not depend "
        "on concurrency, since it serves one at a time)",
    )
    args = ap.parse_args()
    quiet_transformers()
    policy = load_policy(args.model)
    tok = policy.tokenizer
    levels = [int(x) for x in args.concurrency.split(",")]
    print(f"model={args.model} new_tokens={args.new_tokens} threads={torch.get_num_threads()}")
    hf = hf_run(policy.model, prompts(tok, args.baseline_requests), args.new_tokens)
    engine = TransformersEngine.from_policy(policy, max_batch=max(levels))
    asyncio.run(engine_run(engine, prompts(tok, 1), 8))  # warm-up
    rows = []
    for n in levels:
        rows.append((n, asyncio.run(engine_run(engine, prompts(tok, n), args.new_tokens))))
    engine.close()
    print(
        f"{'concurrent':>10} | {'clawrl engine tok/s':>20} | {'HF generate, 1 at a time':>25} | "
        f"{'speed-up':>8}"
    )
    print("-" * 74)
    for n, tps in rows:
        print(f"{n:>10} | {tps:>20.1f} | {hf:>25.1f} | {tps / hf:>7.2f}x")


if __name__ == "__main__":
    main()
