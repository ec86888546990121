"""Serving many users' LoRA adapters at once on the in-process engine, beside the base alone,
in one run: generated tokens/s and resident memory with 1, 8 and 32 live adapters.

One engine (``max_batch`` = ``--requests``, ``max_adapters`` = the most adapters measured) on
the embedded SmolLM2-135M (or ``--model``). Each round sends ``--requests`` requests at once,
``--new-tokens`` tokens each (temperature 0.7, EOS ignored: equal work), in four settings:

* ``base``: no request names an adapter;
* ``1``, ``8``, ``32`` adapters: request ``i`` names adapter ``i mod N`` (with 32 requests and
  32 adapters, every row of the batch has its own user's adapter).

The settings alternate within each round (``--rounds``); the table gives the median tokens/s
and its ratio to the base of the same round. Adapters are rank ``--rank`` on every linear layer
(the trainer's default LoRA), random A and B, written once with PEFT. "resident" is the
process's resident set (``VmRSS``) after the setting's adapters were loaded; "adapter MB" what
the engine's adapter stacks hold (A and B of every slot, ranks padded to the largest, slots
grown by doubling).

    .venv/bin/python benchmarks/adapters_serving.py [--model smollm2-135m] [--requests 32]
        [--new-tokens 32] [--rounds 3] [--rank 16]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import torch

from clawrl.cli.common import quiet_transformers
from clawrl.engine import SamplingParams, TransformersEngine
from clawrl.models import load_policy

PROMPTS = [
    "Explain how a bicycle stays upright.",
    "Write a short poem about autumn leaves.",
    "Give me three tips for learning to cook.",
    "Why is the sky blue?",
]
COUNTS = (1, 8, 32)


def resident_mb() -> float:
    """This process's resident set size in MB (``VmRSS``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def write_adapters(model: torch.nn.Module, root: Path, n: int, rank: int) -> list[Path]:
    """``n`` PEFT LoRA adapters of ``model`` (rank ``rank``, all linear layers, random A and B)."""
    import copy

    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(
        copy.deepcopy(model),
        LoraConfig(r=rank, lora_alpha=2 * rank, target_modules="all-linear", task_type="CAUSAL_LM"),
    )
    out = []
    for i in range(n):
        gen = torch.Generator().manual_seed(i)
        with torch.no_grad():
            for name, p in peft_model.named_parameters():
                if "lora_" in name:
                    p.copy_(0.01 * torch.randn(p.shape, generator=gen))
        path = root / f"user{i}"
        peft_model.save_pretrained(str(path))
        out.append(path)
    return out


async def burst(engine: TransformersEngine, prompts: list[list[int]], adapters: list[str | None],
                new_tokens: int) -> float:  # fmt: skip
    """Generated tokens/s of all requests sent at once."""
    start = time.perf_counter()
    done = await asyncio.gather(*(
        engine.generate(p, SamplingParams(max_tokens=new_tokens, temperature=0.7, seed=i,
                                          ignore_eos=True, adapter=a))
        for i, (p, a) in enumerate(zip(prompts, adapters, strict=True))
    ))  # fmt: skip
    took = time.perf_counter() - start
    return sum(len(c.token_ids) for c in done) / took


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--requests", type=int, default=32, help="requests at once (32)")
    ap.add_argument("--new-tokens", type=int, default=32, help="tokens per request (32)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of every setting (3)")
    ap.add_argument("--rank", type=int, default=16, help="LoRA rank (16, the trainer's)")
    args = ap.parse_args()
    quiet_transformers()
    policy = load_policy(args.model)
    tok = policy.tokenizer
    prompts = [
        tok.apply_chat_template([{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
                                add_generation_prompt=True, return_dict=False)
        for i in range(args.requests)
    ]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        print(f"writing {max(COUNTS)} rank-{args.rank} adapters ...", flush=True)
        paths = write_adapters(policy.model, Path(tmp), max(COUNTS), args.rank)
        engine = TransformersEngine.from_policy(
            policy, max_batch=args.requests, max_adapters=max(COUNTS)
        )
        try:
            rss = {"base": resident_mb()}
            adapter_mb = {"base": 0.0}
            for i, path in enumerate(paths):
                engine.load_adapter(f"user{i}", 1, path).result(timeout=600)
                if i + 1 in COUNTS:
                    rss[str(i + 1)] = resident_mb()
                    adapter_mb[str(i + 1)] = engine.adapters.stats.bytes / 2**20
            settings = {"base": [None] * args.requests}
            for n in COUNTS:
                settings[str(n)] = [f"user{i % n}" for i in range(args.requests)]
            asyncio.run(burst(engine, prompts[:4], ["user0", None, "user1", None], 4))  # warm up
            speeds: dict[str, list[float]] = {k: [] for k in settings}
            ratios: dict[str, list[float]] = {k: [] for k in settings}
            for r in range(args.rounds):
                base = None
                for name, adapters in settings.items():
                    tps = asyncio.run(burst(engine, prompts, adapters, args.new_tokens))
                    speeds[name].append(tps)
                    base = tps if name == "base" else base
                    assert base is not None
                    ratios[name].append(tps / base)
                    print(f"round {r + 1}/{args.rounds} {name:>4}: {tps:7.1f} tokens/s", flush=True)
        finally:
            engine.close()
    print(f"\n{args.model}, {args.requests} requests at once x {args.new_tokens} tokens, "
          f"rank {args.rank}, {torch.get_num_threads()} torch threads, median of "
          f"{args.rounds} rounds")  # fmt: skip
    print(
        f"{'live adapters':>14} {'tokens/s':>9} {'vs base':>8} {'resident MB':>12} {'adapter MB':>11}"
    )
    for name in settings:
        label = "0 (base)" if name == "base" else name
        print(f"{label:>14} {statistics.median(speeds[name]):9.1f} "
              f"{statistics.median(ratios[name]):8.2f} {rss[name]:12.0f} {adapter_mb[name]:11.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
