"""Load: N concurrent streaming clients against the gateway for a while; nothing may be lost.

Each client loops until the time is up, streaming a chat completion (round-robin over the three
protocols: chat completions, Messages, Responses) and reading it to the end. Afterwards every
call the gateway acknowledged (its ``x-clawrl-turn-ids`` header) is looked up in the store.
Prints calls, errors, the share recorded, latency and time-to-first-token percentiles (seconds),
generated tokens/s, and the server process's memory over time. The baseline in the same run is
a single client for the first ``--baseline-s`` seconds (latency without contention).

    .venv/bin/python benchmarks/load_gateway.py --clients 64 --duration 300   # the full run
    .venv/bin/python benchmarks/load_gateway.py --clients 16 --duration 60 --model tiny  # CI

Exit status 1 when any call failed or any acknowledged call is missing from the store.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

PROMPTS = [
    "What is 7 times 8?",
    "Name a fruit that is yellow.",
    "Write one sentence about the sea.",
    "How many legs does a spider have?",
    "Say hello in French.",
]


@dataclass
class Stats:
    latencies: list[float] = field(default_factory=list)
    ttfts: list[float] = field(default_factory=list)
    turn_ids: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    calls: int = 0


def _request(i: int, max_tokens: int) -> tuple[str, dict, dict]:
    prompt = f"{PROMPTS[i % len(PROMPTS)]} (call {i})"
    kind = i % 3
    if kind == 0:
        body = {"model": "m", "messages": [{"role": "user", "content": prompt}],
                "max_tokens": max_tokens, "stream": True}  # fmt: skip
        return "/v1/chat/completions", body, {}
    if kind == 1:
        body = {"model": "m", "max_tokens": max_tokens, "stream": True,
                "messages": [{"role": "user", "content": prompt}]}  # fmt: skip
        return "/v1/messages", body, {"anthropic-version": "2023-06-01"}
    body = {"model": "m", "input": prompt, "max_output_tokens": max_tokens, "stream": True}
    return "/v1/responses", body, {}


async def _client(
    url: str, cid: int, deadline: float, max_tokens: int, stats: Stats, counter: list[int]
) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=300) as http:
        while time.monotonic() < deadline:
            counter[0] += 1
            path, body, headers = _request(counter[0], max_tokens)
            t0 = time.monotonic()
            first = None
            stats.calls += 1
            try:
                async with http.stream("POST", path, json=body, headers=headers) as r:
                    if r.status_code != 200:
                        stats.errors.append(f"{path}: HTTP {r.status_code} {await r.aread()!r}")
                        continue
                    ids = r.headers.get("x-clawrl-turn-ids", "")
                    async for line in r.aiter_lines():
                        if first is None and line.startswith("data:"):
                            first = time.monotonic() - t0
                        if _stream_error(line):
                            stats.errors.append(f"{path}: stream error {line[:200]}")
                stats.latencies.append(time.monotonic() - t0)
                stats.ttfts.append(first if first is not None else float("nan"))
                stats.turn_ids += [t for t in ids.split(",") if t]
            except httpx.HTTPError as e:
                stats.errors.append(f"{path}: {type(e).__name__}: {e}")


def _stream_error(line: str) -> bool:
    """Whether an SSE line reports a failure (OpenAI ``{"error"}``, Anthropic ``type: error``,
    Responses ``response.failed`` / ``error`` events)."""
    if line.startswith("event:"):
        return line.split(":", 1)[1].strip() in ("error", "response.failed")
    if not line.startswith("data:"):
        return False
    try:
        data = json.loads(line[5:])
    except ValueError:
        return False  # "[DONE]"
    return isinstance(data, dict) and ("error" in data or data.get("type") == "error")


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(x for x in xs if x == x)
    if not xs:
        return float("nan")
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def _drive(url: str, clients: int, seconds: float, max_tokens: int) -> Stats:
    stats, counter = Stats(), [0]
    deadline = time.monotonic() + seconds
    await asyncio.gather(
        *(_client(url, c, deadline, max_tokens, stats, counter) for c in range(clients))
    )
    return stats


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--clients", type=int, default=64, help="concurrent streaming clients (64)")
    ap.add_argument("--duration", type=float, default=300, help="seconds of load (300)")
    ap.add_argument("--baseline-s", type=float, default=15, help="seconds of 1 client first (15)")
    ap.add_argument("--model", default="smollm2-135m", help="smollm2-135m (default) or tiny")
    ap.add_argument("--max-tokens", type=int, default=32, help="tokens per answer (32)")
    ap.add_argument("--json", metavar="FILE", help="also write the numbers as JSON")
    args = ap.parse_args(argv)

    from clawrl.engine import TransformersEngine
    from clawrl.gateway import create_app
    from clawrl.gateway.server import LiveServer
    from clawrl.models import load_policy, tiny_policy
    from clawrl.store import Store, TurnStatus

    policy = tiny_policy(seed=0) if args.model == "tiny" else load_policy(args.model)
    engine = TransformersEngine.from_policy(policy, max_batch=max(1, args.clients))
    tmp = tempfile.mkdtemp(prefix="clawrl-load-")
    store = Store(Path(tmp) / "load.db")
    app = create_app(engine, policy.tokenizer, store, model_name="m")
    server = LiveServer(app).start()
    memory: list[tuple[float, float]] = []
    stop = threading.Event()
    t_start = time.monotonic()

    def sample() -> None:
        while not stop.is_set():
            memory.append((time.monotonic() - t_start, _rss_mb()))
            stop.wait(5)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        base = asyncio.run(_drive(server.url, 1, args.baseline_s, args.max_tokens))
        print(f"load: {args.clients} streaming clients for {args.duration:.0f} s "
              f"on {args.model}, {args.max_tokens} tokens per answer", flush=True)  # fmt: skip
        tokens_before = engine.stats.generated_tokens
        t0 = time.monotonic()
        load = asyncio.run(_drive(server.url, args.clients, args.duration, args.max_tokens))
        wall = time.monotonic() - t0
        tokens = engine.stats.generated_tokens - tokens_before
    finally:
        stop.set()
        sampler.join()
        server.stop()
        engine.close()
    missing = []
    for run in (base, load):
        for tid in run.turn_ids:
            turn = store.get_turn(tid)
            if turn is None or turn.status != TurnStatus.OK or not turn.completion_ids:
                missing.append(tid)
    store.close()
    acknowledged = len(base.turn_ids) + len(load.turn_ids)
    print(f"{'':<22} {'1 client':>10} {f'{args.clients} clients':>12}")
    rows = [
        ("calls", base.calls, load.calls),
        ("errors", len(base.errors), len(load.errors)),
        ("latency p50 (s)", _pct(base.latencies, 0.5), _pct(load.latencies, 0.5)),
        ("latency p90 (s)", _pct(base.latencies, 0.9), _pct(load.latencies, 0.9)),
        ("latency p99 (s)", _pct(base.latencies, 0.99), _pct(load.latencies, 0.99)),
        ("ttft p50 (s)", _pct(base.ttfts, 0.5), _pct(load.ttfts, 0.5)),
        ("ttft p99 (s)", _pct(base.ttfts, 0.99), _pct(load.ttfts, 0.99)),
    ]
    for name, a, b in rows:
        fa = f"{a:.2f}" if isinstance(a, float) else str(a)
        fb = f"{b:.2f}" if isinstance(b, float) else str(b)
        print(f"{name:<22} {fa:>10} {fb:>12}")
    print(f"generated tokens/s under load: {tokens / wall:.1f}")
    print(f"recorded: {acknowledged - len(missing)}/{acknowledged} acknowledged calls "
          f"({100 * (acknowledged - len(missing)) / max(1, acknowledged):.1f} %)")  # fmt: skip
    rss = [m for _, m in memory]
    if rss:
        print(f"memory (RSS, MB): start {rss[0]:.0f}, max {max(rss):.0f}, end {rss[-1]:.0f}; "
              f"mean {statistics.fmean(rss):.0f} over {len(rss)} samples")  # fmt: skip
        step = max(1, len(memory) // 12)
        print("  over time: " + ", ".join(f"{t:.0f}s {m:.0f}" for t, m in memory[::step]))
    for e in (base.errors + load.errors)[:10]:
        print("  error:", e)
    if args.json:
        Path(args.json).write_text(json.dumps({
            "clients": args.clients, "duration_s": args.duration, "calls": load.calls,
            "errors": len(load.errors) + len(base.errors), "acknowledged": acknowledged,
            "missing": len(missing), "latency_p50_s": _pct(load.latencies, 0.5),
            "latency_p99_s": _pct(load.latencies, 0.99), "memory_mb": memory,
        }))  # fmt: skip
    return 1 if (base.errors or load.errors or missing or not load.turn_ids) else 0


if __name__ == "__main__":
    sys.exit(main())
