"""OPD teacher scoring at T != 1 on a launched vLLM server: one request per sample (clawrl's
server plugin) against one request per target token (the fallback for servers without it), and
what a short request waits meanwhile, in one run.

    .venv/bin/python benchmarks/vllm_scoring.py [--samples 4] [--target-tokens 256]

Needs vLLM (``make vllm``). Launches one server with the embedded model (float32, clawrl's
plugin loaded), then for each mode scores ``--samples`` (prompt, target) pairs at T = 0.7 with
``VLLMEngine.score_batch`` while a client sends short requests (8 new tokens, greedy) one after
another; prints the HTTP requests sent for scoring, the scoring wall time, the short requests'
p50 / p99 latency while scoring ran, and with nothing else running (the baseline), and the
largest difference between the two modes' log-probs (both are exact: it should be ~1e-5).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time

import httpx

from clawrl.cli.common import quiet_transformers
from clawrl.engine import SamplingParams
from clawrl.engine.vllm import VLLMEngine, VLLMServer
from clawrl.models import load_policy

TEXT = (
    "The teacher reads the hint and the student's answer, and scores every token of the answer "
    "under the hinted prompt; the difference to the student's own log-probs is the advantage. "
)


class Counting(httpx.AsyncHTTPTransport):
    def __init__(self) -> None:
        super().__init__()
        self.completions = 0

    async def handle_async_request(self, request):  # type: ignore[no-untyped-def]
        if request.url.path == "/v1/completions":
            self.completions += 1
        return await super().handle_async_request(request)


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


async def _short_requests(engine, prompt, stop: asyncio.Event, out: list[float]) -> None:
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    while not stop.is_set():
        t = time.perf_counter()
        await engine.generate(prompt, params)
        out.append(time.perf_counter() - t)


async def _idle(engine, prompt, n: int) -> list[float]:
    out: list[float] = []
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    for _ in range(n):
        t = time.perf_counter()
        await engine.generate(prompt, params)
        out.append(time.perf_counter() - t)
    return out


async def _scoring(engine, pairs, prompt) -> tuple[float, list[float], list[list[float]]]:
    stop = asyncio.Event()
    lat: list[float] = []
    probe = asyncio.create_task(_short_requests(engine, prompt, stop, lat))
    await asyncio.sleep(0.5)
    t = time.perf_counter()
    scored = await engine.score_batch(pairs, temperature=0.7)
    wall = time.perf_counter() - t
    stop.set()
    await probe
    return wall, lat, scored


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--samples", type=int, default=4, help="pairs scored per mode (default 4)")
    ap.add_argument("--target-tokens", type=int, default=256, help="tokens per target (256)")
    args = ap.parse_args()
    quiet_transformers()
    policy = load_policy("smollm2-135m")
    tok = policy.tokenizer
    with tempfile.TemporaryDirectory(prefix="clawrl-bench-") as run:
        server = VLLMServer(policy.path, run_dir=run,
                            extra_args=["--dtype", "float32", "--max-model-len", "2048"])  # fmt: skip
        t = time.perf_counter()
        server.start()
        print(f"vLLM server up in {time.perf_counter() - t:.0f} s ({server.url})", flush=True)
        counter = Counting()
        engine = VLLMEngine([server.url], tok, transport=counter)
        try:
            short = tok.apply_chat_template([{"role": "user", "content": "Say hi."}],
                                            add_generation_prompt=True, return_dict=False)  # fmt: skip
            long_ids = tok.encode(TEXT * 40, add_special_tokens=False)
            pairs = []
            for i in range(args.samples):
                prompt = tok.apply_chat_template(
                    [{"role": "user", "content": f"Question {i}: explain on-policy distillation."}],
                    add_generation_prompt=True, return_dict=False,
                )  # fmt: skip
                start = 7 * i
                pairs.append((prompt, long_ids[start : start + args.target_tokens]))
            assert engine.replicas[0].prompt_temperature, "the plugin is not active"
            idle = asyncio.run(_idle(engine, short, 12))
            rows = []
            results = {}
            for mode in ("plugin", "per-token"):
                engine.replicas[0].prompt_temperature = mode == "plugin"
                before = counter.completions
                wall, lat, scored = asyncio.run(_scoring(engine, pairs, short))
                sent = counter.completions - before - len(lat)
                results[mode] = scored
                rows.append((mode, sent, wall, _pct(lat, 0.5), _pct(lat, 0.99), len(lat)))
            diff = max(abs(a - b) for x, y in zip(results["plugin"], results["per-token"],
                                                  strict=True)
                       for a, b in zip(x, y, strict=True))  # fmt: skip
        finally:
            engine.close()
            server.stop()
    print(f"\nscoring {args.samples} samples x {args.target_tokens} tokens at T = 0.7, "
          f"embedded model, vLLM CPU build")  # fmt: skip
    print(f"{'mode':<10} {'requests':>8} {'scoring s':>9} {'short p50 s':>11} "
          f"{'short p99 s':>11} {'short n':>7}")  # fmt: skip
    print(f"{'idle':<10} {'-':>8} {'-':>9} {statistics.median(idle):>11.2f} "
          f"{_pct(idle, 0.99):>11.2f} {len(idle):>7}")  # fmt: skip
    for mode, sent, wall, p50, p99, n in rows:
        print(f"{mode:<10} {sent:>8} {wall:>9.1f} {p50:>11.2f} {p99:>11.2f} {n:>7}")
    print(f"largest |plugin - per-token| log-prob: {diff:.2e} nats")


if __name__ == "__main__":
    main()
