"""Generated tokens/s at 1, 4 and 16 concurrent requests: clawrl's in-process engine and vLLM on
the same model, side by side, and the latency clawrl's gateway adds in front of each.

Baseline, in the same run: Hugging Face ``model.generate`` serving the same requests one at a
time (no batching), which is what a naive server does. Every request generates exactly
``--new-tokens`` tokens (EOS ignored) so the work is equal. The vLLM column is a vLLM server
clawrl launches (``scripts/install_vllm.sh``; or ``--vllm-url`` for one you run, which must
serve the same model), driven through :class:`clawrl.engine.vllm.VLLMEngine` in token ids.
Gateway latency: the mean time of ``--latency-requests`` sequential chat completions of
``--latency-tokens`` tokens through the gateway, minus the same prompts' ``engine.generate``
time, per engine.

    .venv/bin/python benchmarks/engine_throughput.py [--model smollm2-135m] [--new-tokens 128]
        [--no-vllm] [--vllm-url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import torch

from clawrl.cli.common import quiet_transformers
from clawrl.engine import Engine, SamplingParams, TransformersEngine
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


async def engine_run(engine: Engine, ps: list[list[int]], new: int) -> float:
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


def gateway_added_ms(engine: Engine, policy, requests: int, new: int) -> tuple[float, float]:
    """(mean ms of a chat completion through the gateway, mean ms of ``engine.generate`` of the
    prompt ids the gateway recorded, sampling as many tokens as the gateway's call did)."""
    import tempfile

    import httpx

    from clawrl.gateway import create_app
    from clawrl.gateway.server import LiveServer
    from clawrl.store import Store

    with tempfile.TemporaryDirectory() as d:
        store = Store(f"{d}/bench.db")
        app = create_app(engine, policy.tokenizer, store, model_name="bench")
        server = LiveServer(app, lifespan="off").start()
        via = []
        try:
            with httpx.Client(base_url=server.base_url, timeout=600) as client:
                for i in range(requests):
                    q = QUESTIONS[i % len(QUESTIONS)]
                    body = {
                        "model": "bench",
                        "max_tokens": new,
                        "temperature": 0.7,
                        "seed": i,
                        "messages": [{"role": "user", "content": f"{q} (request {i})"}],
                    }
                    t = time.perf_counter()
                    client.post("/chat/completions", json=body).raise_for_status()
                    via.append(time.perf_counter() - t)
        finally:
            server.stop()
        turns = [t for sid in store.session_ids() for t in store.session_turns(sid)]
        store.close()
    direct = []
    for turn in turns:
        params = SamplingParams(max_tokens=len(turn.completion_ids), temperature=0.7,
                                seed=turn.sampling_params.get("seed"), ignore_eos=True)  # fmt: skip
        t = time.perf_counter()
        asyncio.run(engine.generate(turn.prompt_ids, params))
        direct.append(time.perf_counter() - t)
    return 1000 * sum(via) / len(via), 1000 * sum(direct) / len(direct)


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
    ap.add_argument("--no-vllm", action="store_true", help="leave out the vLLM column")
    ap.add_argument("--vllm-url", help="a running vLLM server of the same model (default: launch)")
    ap.add_argument("--latency-requests", type=int, default=8)
    ap.add_argument("--latency-tokens", type=int, default=8)
    args = ap.parse_args()
    quiet_transformers()
    policy = load_policy(args.model)
    tok = policy.tokenizer
    levels = [int(x) for x in args.concurrency.split(",")]
    print(f"model={args.model} new_tokens={args.new_tokens} threads={torch.get_num_threads()}")
    hf = hf_run(policy.model, prompts(tok, args.baseline_requests), args.new_tokens)
    engines: dict[str, Engine] = {
        "in-process": TransformersEngine.from_policy(policy, max_batch=max(levels))
    }
    server = None
    if not args.no_vllm:
        from clawrl.engine.vllm import VLLMEngine, VLLMServer

        url = args.vllm_url
        if url is None:
            import tempfile

            server = VLLMServer(policy.path, run_dir=tempfile.mkdtemp(prefix="clawrl-bench-"),
                                extra_args=["--dtype", "float32"])  # fmt: skip
            url = server.start()
        engines["vLLM"] = VLLMEngine([url], tok)
    table: dict[str, list[float]] = {}
    latency: dict[str, tuple[float, float]] = {}
    try:
        for name, engine in engines.items():
            asyncio.run(engine_run(engine, prompts(tok, 1), 8))  # warm-up
            table[name] = [
                asyncio.run(engine_run(engine, prompts(tok, n), args.new_tokens)) for n in levels
            ]
            latency[name] = gateway_added_ms(engine, policy, args.latency_requests,
                                             args.latency_tokens)  # fmt: skip
    finally:
        for engine in engines.values():
            engine.close()
        if server is not None:
            server.stop()
    names = list(table)
    head = " | ".join(f"{n + ' tok/s':>16}" for n in names)
    print(f"{'concurrent':>10} | {head} | {'HF generate, 1 at a time':>25}")
    print("-" * (40 + 19 * len(names)))
    for i, n in enumerate(levels):
        cells = " | ".join(f"{table[name][i]:>16.1f}" for name in names)
        print(f"{n:>10} | {cells} | {hf:>25.1f}")
    print(f"\ngateway in front ({args.latency_requests} sequential chat completions of "
          f"{args.latency_tokens} tokens):")  # fmt: skip
    for name, (via, direct) in latency.items():
        print(f"  {name:>10}: {via:8.1f} ms through the gateway, {direct:8.1f} ms engine alone, "
              f"added {via - direct:+.1f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
