"""The in-process engine against plain ``model.generate``, per architecture, in one run: one
stream's tokens/s, the latency the gateway adds in front of the engine, and tokens/s at 1, 4 and
16 concurrent requests (with vLLM on the same model, optionally).

Per model (``--models``: the embedded SmolLM2-135M and Gemma 3 270M, and tiny random models of
seven architectures, ``tiny:ARCH``, hidden size ``--tiny-hidden``, ``--tiny-layers`` layers):

* **one stream**: ``--rounds`` alternating rounds of the engine generating ``--new-tokens``
  tokens for one request and Hugging Face ``model.generate`` doing the same (sampling at
  temperature 0.7, top-k and top-p off, EOS ignored / ``min_new_tokens``: equal work). The
  median and the range over rounds. Each side runs alone: the model is loaded and ``generate``
  runs in threads that end before the engine starts, and the engine is closed before
  ``generate`` runs again. (A thread that ran torch ops keeps an OpenMP team while it lives; two
  teams on a machine with few cores slow every op: ``clawrl.engine.threads``. The column
  "engine, other team alive" shows that effect: the engine while a second thread that ran one
  forward pass is still alive.)
* **gateway added**: ``--latency-requests`` sequential chat completions of at most
  ``--latency-tokens`` tokens through clawrl's gateway (uvicorn in a thread of this process, as ``clawrl serve``
  runs it, recording every turn in SQLite) in front of the engine; after each, the same prompt
  ids through ``engine.generate`` alone, sampling as many tokens with the same seed (the turn
  is found by the ``x-clawrl-turn-ids`` header). Median and
  mean of the paired differences, in ms.

Concurrency (first model only, ``--concurrency``): generated tokens/s of the engine serving N
requests at once, beside ``generate`` serving them one at a time; ``--vllm`` adds a vLLM server
clawrl launches (``scripts/install_vllm.sh``) or ``--vllm-url``, measured after the in-process
engine is closed: through clawrl's vLLM engine, and driven directly by a bare ``httpx`` client
sending the same request bodies (``direct_tok_s``) to the same server, alternating.

    .venv/bin/python benchmarks/engine_throughput.py [--models smollm2-135m,tiny:gemma3]
        [--new-tokens 64] [--rounds 3] [--vllm | --vllm-url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from clawrl.cli.common import quiet_transformers
from clawrl.engine import Engine, SamplingParams, TransformersEngine
from clawrl.models import load_policy, tiny_policy
from clawrl.models.loading import TINY_ARCHS

T = TypeVar("T")

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
DEFAULT_MODELS = ",".join(["smollm2-135m", "gemma3-270m", *(f"tiny:{a}" for a in TINY_ARCHS)])


def in_thread(fn: Callable[[], T]) -> T:
    """``fn()`` in a thread that ends afterwards (so no OpenMP team of it outlives the call)."""
    box: list[Any] = []

    def run() -> None:
        try:
            box.append((fn(), None))
        except BaseException as e:
            box.append((None, e))

    th = threading.Thread(target=run)
    th.start()
    th.join()
    result, error = box[0]
    if error is not None:
        raise error
    return result


def load(spec: str, args: argparse.Namespace) -> Any:
    if spec.startswith("tiny:"):
        arch = spec.removeprefix("tiny:")
        return tiny_policy(arch=arch, hidden_size=args.tiny_hidden, num_layers=args.tiny_layers)
    return load_policy(spec)


def prompts(policy: Any, n: int) -> list[list[int]]:
    out = []
    for i in range(n):
        msgs = [{"role": "user", "content": f"{QUESTIONS[i % len(QUESTIONS)]} (request {i})"}]
        ids = policy.tokenizer.apply_chat_template(
            msgs, add_generation_prompt=True, return_dict=False
        )
        out.append(list(ids))
    return out


def engine_tok_s(engine: Engine, ps: list[list[int]], new: int) -> float:
    params = SamplingParams(max_tokens=new, temperature=0.7, ignore_eos=True, seed=0)

    async def go() -> float:
        t = time.perf_counter()
        outs = await asyncio.gather(*[engine.generate(p, params) for p in ps])
        dt = time.perf_counter() - t
        assert all(len(o.token_ids) == new for o in outs)
        return sum(len(o.token_ids) for o in outs) / dt

    return asyncio.run(go())


def direct_tok_s(url: str, model: str, ps: list[list[int]], new: int) -> float:
    """:func:`engine_tok_s` without clawrl: a bare ``httpx`` client posting the bodies clawrl's
    vLLM engine sends (same prompts, sampling and log-prob settings) to the same server."""
    import httpx

    from clawrl.engine.vllm import protocol

    params = SamplingParams(max_tokens=new, temperature=0.7, ignore_eos=True, seed=0)

    async def go() -> float:
        limits = httpx.Limits(max_connections=1024, max_keepalive_connections=256)
        async with httpx.AsyncClient(timeout=600, limits=limits) as client:
            bodies = [protocol.completion_body(model, p, params, new, stream=False) for p in ps]
            t = time.perf_counter()
            rs = await asyncio.gather(*[client.post(f"{url}/v1/completions", json=b)
                                        for b in bodies])  # fmt: skip
            dt = time.perf_counter() - t
        n = [len(r.json()["choices"][0]["token_ids"]) for r in rs]
        assert all(k == new for k in n), n
        return sum(n) / dt

    return asyncio.run(go())


def hf_tok_s(model: Any, ps: list[list[int]], new: int) -> float:
    """``model.generate`` one request at a time (no batching): generated tokens/s."""
    from transformers import GenerationConfig

    config = GenerationConfig(
        max_new_tokens=new, min_new_tokens=new, do_sample=True, temperature=0.7, top_k=0,
        top_p=1.0, pad_token_id=0, eos_token_id=model.config.eos_token_id,
    )  # fmt: skip
    t = time.perf_counter()
    total = 0
    with torch.no_grad():
        for p in ps:
            out = model.generate(
                torch.tensor([p]),
                attention_mask=torch.ones(1, len(p), dtype=torch.long),
                generation_config=config,  # nothing else from the model's generation_config
            )
            total += out.shape[1] - len(p)
    return total / (time.perf_counter() - t)


def new_engine(policy: Any, max_batch: int = 16) -> TransformersEngine:
    engine = TransformersEngine.from_policy(policy, max_batch=max_batch)
    engine_tok_s(engine, prompts(policy, 1), 4)  # warm-up
    return engine


def one_stream(policy: Any, args: argparse.Namespace) -> dict[str, list[float]]:
    p = prompts(policy, 1)
    out: dict[str, list[float]] = {"engine": [], "generate": [], "contended": []}
    in_thread(lambda: hf_tok_s(policy.model, p, 4))  # warm-up
    for r in range(args.rounds):
        order = ("engine", "generate") if r % 2 == 0 else ("generate", "engine")
        for side in order:
            if side == "generate":
                out["generate"].append(
                    in_thread(lambda: hf_tok_s(policy.model, p, args.new_tokens))
                )
            else:
                engine = new_engine(policy)
                try:
                    out["engine"].append(engine_tok_s(engine, p, args.new_tokens))
                finally:
                    engine.close()
    # the same engine while another thread that ran torch ops is alive (its OpenMP team too)
    release = threading.Event()
    ran = threading.Event()

    def other() -> None:
        with torch.no_grad():
            policy.model(torch.tensor(p))
        ran.set()
        release.wait()

    th = threading.Thread(target=other)
    th.start()
    ran.wait()
    engine = new_engine(policy)
    try:
        out["contended"].append(engine_tok_s(engine, p, args.new_tokens))
    finally:
        engine.close()
        release.set()
        th.join()
    return out


def gateway_added(policy: Any, args: argparse.Namespace) -> list[float]:
    """Per request: ms through the gateway minus ms of ``engine.generate`` alone."""
    import httpx

    from clawrl.gateway import create_app
    from clawrl.gateway.server import LiveServer
    from clawrl.store import Store

    diffs = []
    engine = new_engine(policy)
    with tempfile.TemporaryDirectory() as d:
        store = Store(f"{d}/bench.db")
        server = LiveServer(create_app(engine, policy.tokenizer, store, model_name="bench"))
        server.start()
        try:
            with httpx.Client(base_url=server.base_url, timeout=600) as client:
                for i in range(args.latency_requests + 1):  # the first call is a warm-up
                    q = QUESTIONS[i % len(QUESTIONS)]
                    body = {
                        "model": "bench",
                        "max_tokens": args.latency_tokens,
                        "temperature": 0.7,
                        "seed": i,
                        "messages": [{"role": "user", "content": f"{q} (request {i})"}],
                    }
                    t = time.perf_counter()
                    response = client.post("/chat/completions", json=body)
                    via = time.perf_counter() - t
                    response.raise_for_status()
                    turn = store.get_turn(response.headers["x-clawrl-turn-ids"])
                    assert turn is not None
                    params = SamplingParams(
                        max_tokens=len(turn.completion_ids), temperature=0.7, seed=i,
                        ignore_eos=True,
                    )  # fmt: skip
                    t = time.perf_counter()
                    asyncio.run(engine.generate(turn.prompt_ids, params))
                    direct = time.perf_counter() - t
                    if i > 0:
                        diffs.append(1000 * (via - direct))
        finally:
            server.stop()
            store.close()
            engine.close()
    return diffs


def concurrency(policy: Any, args: argparse.Namespace, levels: list[int]) -> dict[str, list[float]]:
    table: dict[str, list[float]] = {}
    engine = new_engine(policy, max_batch=max(levels))
    try:
        table["in-process"] = [
            engine_tok_s(engine, prompts(policy, n), args.new_tokens) for n in levels
        ]
    finally:
        engine.close()
    base = in_thread(lambda: hf_tok_s(policy.model, prompts(policy, 4), args.new_tokens))
    table["generate, 1 at a time"] = [base] * len(levels)
    if args.vllm or args.vllm_url:
        from clawrl.engine.vllm import VLLMEngine, VLLMServer

        if args.vllm and policy.path is None:
            raise SystemExit("--vllm launches a server of the first model: make it a saved model")

        server = None
        url = args.vllm_url
        if url is None:
            server = VLLMServer(policy.path, run_dir=tempfile.mkdtemp(prefix="clawrl-bench-"),
                                extra_args=["--dtype", "float32"])  # fmt: skip
            url = server.start()
        vllm = VLLMEngine([url], policy.tokenizer)
        try:
            engine_tok_s(vllm, prompts(policy, 1), 8)
            table["vLLM via clawrl"], table["vLLM direct"] = [], []
            for n in levels:  # alternating, so load drifts hit both alike
                ps = prompts(policy, n)
                table["vLLM via clawrl"].append(engine_tok_s(vllm, ps, args.new_tokens))
                table["vLLM direct"].append(direct_tok_s(url, vllm.base_name, ps, args.new_tokens))
        finally:
            vllm.close()
            if server is not None:
                server.stop()
    return table


def spread(xs: list[float]) -> str:
    if len(xs) == 1:
        return f"{xs[0]:.1f}"
    return f"{statistics.median(xs):.1f} ({min(xs):.1f}-{max(xs):.1f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--models", default=DEFAULT_MODELS, help="comma-separated specs or tiny:ARCH")
    ap.add_argument("--new-tokens", type=int, default=64, help="tokens per request (64)")
    ap.add_argument("--rounds", type=int, default=3, help="one-stream rounds per side (3)")
    ap.add_argument("--tiny-hidden", type=int, default=256)
    ap.add_argument("--tiny-layers", type=int, default=4)
    ap.add_argument("--latency-requests", type=int, default=16)
    ap.add_argument("--latency-tokens", type=int, default=8)
    ap.add_argument("--concurrency", default="1,4,16", help="levels for the first model ('' off)")
    ap.add_argument("--vllm", action="store_true", help="add a vLLM column (launches a server)")
    ap.add_argument("--vllm-url", help="a running vLLM server of the first model")
    ap.add_argument("--concurrency-only", action="store_true",
                    help="only the concurrency table (first model)")  # fmt: skip
    args = ap.parse_args()
    quiet_transformers()
    specs = [s for s in args.models.split(",") if s]
    print(f"new_tokens={args.new_tokens} rounds={args.rounds} threads={torch.get_num_threads()} "
          f"tiny=hidden {args.tiny_hidden} x {args.tiny_layers} layers")  # fmt: skip
    head = (f"{'model':<16} | {'engine tok/s':>22} | {'generate tok/s':>22} | "
            f"{'engine/generate':>15} | {'engine, other team alive':>24} | "
            f"{'gateway added ms, median (mean)':>31}")  # fmt: skip
    print(head)
    print("-" * len(head))
    first: Any = None
    for spec in specs[:1] if args.concurrency_only else specs:
        policy = in_thread(lambda spec=spec: load(spec, args))
        first = first or policy
        if args.concurrency_only:
            continue
        s = one_stream(policy, args)
        added = gateway_added(policy, args)
        ratio = statistics.median(s["engine"]) / statistics.median(s["generate"])
        print(f"{spec:<16} | {spread(s['engine']):>22} | {spread(s['generate']):>22} | "
              f"{ratio:>15.2f} | {spread(s['contended']):>24} | "
              f"{statistics.median(added):>+18.1f} ({statistics.mean(added):+.1f})",
              flush=True)  # fmt: skip
    levels = [int(x) for x in args.concurrency.split(",") if x]
    if levels and first is not None:
        table = concurrency(first, args, levels)
        print(f"\n{specs[0]}: generated tokens/s at N concurrent requests of {args.new_tokens}")
        names = list(table)
        print(f"{'N':>4} | " + " | ".join(f"{n:>22}" for n in names))
        for i, n in enumerate(levels):
            print(f"{n:>4} | " + " | ".join(f"{table[name][i]:>22.1f}" for name in names))


if __name__ == "__main__":
    main()
