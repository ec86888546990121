"""Latency the gateway adds over calling the engine directly; throughput of 1 and 2 replicas on
SQLite and on PostgreSQL; storage per session before and after delta-stored prompts. One run.

The engine is a stand-in that answers at once (a fixed 24-token completion, precomputed), so
what is measured is only the gateway's own work: HTTP (uvicorn + FastAPI + JSON or SSE),
normalising and rendering the chat with the real SmolLM2 tokenizer and template, splicing and
session inference against the store, parsing the completion, and recording the turn durably
(SQLite: WAL, ``synchronous=FULL``; PostgreSQL: a throwaway local server with ``fsync`` on,
``synchronous_commit`` on) before answering.

* **direct** — ``await engine.generate(prompt_ids)`` from asyncio, same concurrency.
* **gateway** — the OpenAI chat-completions request over HTTP (``httpx.AsyncClient``) to
  ``clawrl.gateway`` served by uvicorn in *separate processes* (so the load generator does not
  share a server's GIL); non-streamed and streamed (latency to ``data: [DONE]``).
* **replicas** — 32 clients spread round-robin over 1 or 2 gateway processes on one store (what
  an HTTP load balancer does), on SQLite (one file) and on PostgreSQL: requests/s and the
  latency added over a direct engine call, p50 / p99.
* **storage** — a 50-call session (each call's prompt = the previous prompt + completion + a new
  user message) recorded with every prompt whole (before: how version 3 stored turns) and as
  deltas of the previous turn (after): payload bytes of its turn rows.

Each client sends its own conversation (a system prompt, one tool, two user turns and an
assistant turn), so calls are not retries of each other. A components section times
``prepare_call`` (normalise + render + splice + attribution) and one durable turn write alone.
On a shared 2-core machine the load generator and the gateways compete for the same cores.

    .venv/bin/python benchmarks/gateway_overhead.py [--requests 160] [--per-client 8] [--no-postgres]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from clawrl.engine import Completion, EngineStats, FinishReason, SamplingParams, TokenEvent

REPLY = "Sure. The answer is forty-two, and here is a short explanation of why that is so."
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the docs.",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        },
    }
]


def conversation(i: int) -> list[dict]:
    return [
        {"role": "system", "content": f"You are assistant number {i}. Be brief and precise."},
        {"role": "user", "content": f"Question {i}: what is six times seven?"},
        {"role": "assistant", "content": "Let me think about that for a moment."},
        {"role": "user", "content": "Please answer now, with one sentence of explanation."},
    ]


class InstantEngine:
    """An engine stand-in that answers at once with precomputed ids (no sampling work)."""

    def __init__(self, tokenizer) -> None:
        self.ids = [*tokenizer.encode(REPLY, add_special_tokens=False), tokenizer.eos_token_id]
        self.logprobs = [-0.1] * len(self.ids)
        self.max_context = 8192
        self.tokenizer_id = None  # not checked against the gateway's tokenizer
        self.policy_version = 0
        self.eos_token_ids = frozenset({tokenizer.eos_token_id})
        self.stats = EngineStats()

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Completion:
        return Completion(
            token_ids=list(self.ids),
            logprobs=list(self.logprobs),
            finish_reason=FinishReason.STOP,
            policy_version=0,
            prompt_tokens=len(prompt_ids),
        )

    async def generate_stream(
        self, prompt_ids: Sequence[int], params: SamplingParams
    ) -> AsyncIterator[TokenEvent]:
        last = len(self.ids) - 1
        for k, t in enumerate(self.ids):
            yield TokenEvent(t, -0.1, [], FinishReason.STOP if k == last else None, 0)

    async def score(self, prompt_ids, target_ids, *, temperature: float = 1.0) -> list[float]:
        return [-0.1] * len(target_ids)

    def load_policy(self, version: int, weights: object) -> None:
        self.policy_version = version


def serve(port_file: str, store_path: str) -> None:
    """Child process: the gateway over the instant engine on a free loopback port, recording
    into ``store_path`` (a SQLite file or a PostgreSQL URL)."""
    from clawrl.gateway import create_app
    from clawrl.gateway.server import LiveServer
    from clawrl.models import load_tokenizer
    from clawrl.store import Store

    tok = load_tokenizer()
    store = Store(store_path)
    server = LiveServer(create_app(InstantEngine(tok), tok, store, model_name="bench")).start()
    Path(port_file).write_text(str(server.port))
    try:
        while True:
            time.sleep(3600)
    finally:
        server.stop()
        store.close()


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


async def run_direct(engine: InstantEngine, prompts: list[list[int]], clients: int, n: int):
    params = SamplingParams(max_tokens=64)
    lat: list[float] = []

    async def client(c: int) -> None:
        for k in range(n):
            t = time.perf_counter()
            await engine.generate(prompts[(c * n + k) % len(prompts)], params)
            lat.append(time.perf_counter() - t)

    t0 = time.perf_counter()
    await asyncio.gather(*(client(c) for c in range(clients)))
    return lat, time.perf_counter() - t0


async def run_gateway(url: str | list[str], clients: int, n: int, stream: bool, tag: str):
    """``clients`` concurrent clients, ``n`` requests each; client ``c`` talks to replica
    ``c % len(urls)``. Returns (latencies in s, wall s)."""
    import httpx

    urls = [url] if isinstance(url, str) else url
    lat: list[float] = []
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    https = [httpx.AsyncClient(base_url=u, timeout=60, limits=limits) for u in urls]
    try:

        async def client(c: int) -> None:
            http = https[c % len(https)]
            for k in range(n):
                body = {
                    "model": "bench",
                    "messages": conversation(hash((tag, c, k)) % 10**9),
                    "tools": TOOLS,
                    "max_tokens": 64,
                    "stream": stream,
                }
                t = time.perf_counter()
                if stream:
                    async with http.stream("POST", "/v1/chat/completions", json=body) as r:
                        async for line in r.aiter_lines():
                            if line == "data: [DONE]":
                                break
                    assert r.status_code == 200
                else:
                    r = await http.post("/v1/chat/completions", json=body)
                    assert r.status_code == 200, r.text
                lat.append(time.perf_counter() - t)

        t0 = time.perf_counter()
        await asyncio.gather(*(client(c) for c in range(clients)))
        return lat, time.perf_counter() - t0
    finally:
        for http in https:
            await http.aclose()


def components(tok, store_path: str, reps: int) -> dict[str, float]:
    """p50 (ms) of prepare_call and of one durable turn write alone, in-process."""
    from clawrl.gateway.prepare import prepare_call
    from clawrl.store import Store, TurnRecord

    out: dict[str, float] = {}
    with Store(store_path) as store:
        prep: list[float] = []
        for i in range(reps):
            t = time.perf_counter()
            p = prepare_call(tok, store, conversation(10**9 + i), TOOLS, None, None)
            prep.append(time.perf_counter() - t)
        out["prepare_call (render+splice+attribute)"] = statistics.median(prep) * 1e3
        assert p.new_session is not None
        store.record_turns([], session=p.new_session)
        rec: list[float] = []
        for _ in range(reps):
            turn = TurnRecord(session_id=p.session_id, prompt_ids=p.prompt_ids)
            t = time.perf_counter()
            store.record_turn(turn)
            rec.append(time.perf_counter() - t)
        out["record_turn (1 durable commit)"] = statistics.median(rec) * 1e3
    return out


def session_bytes(store_path: str, calls: int = 50, delta: bool = True) -> int:
    """Payload bytes of a ``calls``-call session's turn rows: each call's prompt is the previous
    prompt + completion + 120 new tokens (a tool result, a user message), completions of 80
    tokens; messages grow alike. ``delta=False`` records every prompt whole (version 3's
    layout); ``delta=True`` names the previous turn as parent, so the store keeps a delta."""
    from clawrl.store import Store, TurnRecord

    with Store(store_path) as store:
        session = store.new_session()
        prompt: list[int] = list(range(1000, 1400))  # system prompt and tools
        messages: list[dict] = [{"role": "system", "content": "x" * 1600}]
        parent = None
        for k in range(calls):
            new = [(k * 131 + j) % 49000 for j in range(120)]
            prompt = prompt + new
            messages = [*messages, {"role": "user", "content": f"result {k} " + "y" * 480}]
            completion = [(k * 71 + j) % 49000 for j in range(80)]
            turn = TurnRecord(
                session.id, prompt, completion, [-0.5] * len(completion),
                parent_turn_id=parent if delta else None, request_messages=messages,
                output={"content": "z" * 320},
            )  # fmt: skip
            store.record_turn(turn)
            parent = turn.id
            prompt = prompt + completion
            messages = [*messages, {"role": "assistant", "content": "z" * 320}]
        turns = store.session_turns(session.id)
        assert turns[-1].prompt_ids == prompt[: -len(completion)]  # rebuilt exactly
        with store._read() as conn:
            row = conn.execute(
                "SELECT SUM(length(prompt_ids) + length(completion_ids) + "
                "length(sampling_logprobs) + length(request_messages) + length(output) + "
                "length(sampling_params) + length(client)) FROM turns WHERE session_id = ?",
                (session.id,),
            ).fetchone()
    return int(row[0])


def start_gateways(target: str, n: int, tmp: Path) -> tuple[list[subprocess.Popen], list[str]]:
    """``n`` gateway processes on one store; returns them and their URLs."""
    procs, urls = [], []
    for i in range(n):
        port_file = tmp / f"port-{len(list(tmp.glob('port-*')))}-{i}"
        procs.append(
            subprocess.Popen([sys.executable, __file__, "--serve", str(port_file), target])
        )
        deadline = time.monotonic() + 120
        while not port_file.exists() or not port_file.read_text():
            if procs[-1].poll() is not None or time.monotonic() > deadline:
                for p in procs:
                    p.kill()
                raise SystemExit("a gateway process did not start")
            time.sleep(0.05)
        urls.append(f"http://127.0.0.1:{port_file.read_text()}")
    return procs, urls


def stop_gateways(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=160, help="requests per config at 1 client")
    ap.add_argument("--per-client", type=int, default=8, help="requests per client at 32")
    ap.add_argument("--store-dir", help="where the SQLite stores go (default: a temp dir)")
    ap.add_argument("--no-postgres", action="store_true", help="SQLite only")
    ap.add_argument("--serve", nargs=2, metavar=("PORT_FILE", "STORE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(*args.serve)
        return
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from clawrl.chat import normalize_openai_messages, normalize_openai_tools, render_prompt
    from clawrl.models import load_tokenizer
    from clawrl.testing.postgres import schema_url, throwaway_cluster

    tok = load_tokenizer()
    engine = InstantEngine(tok)
    tools = normalize_openai_tools(TOOLS)
    prompts = [
        render_prompt(tok, normalize_openai_messages(conversation(i)), tools).token_ids
        for i in range(64)
    ]
    tmp = Path(args.store_dir or tempfile.mkdtemp(prefix="clawrl-bench-"))
    results, replicas, comp = [], [], {}
    with contextlib.ExitStack() as stack:
        backends = {"sqlite": lambda name: str(tmp / f"{name}.db")}
        if not args.no_postgres:
            cluster = stack.enter_context(throwaway_cluster(fsync=True))
            backends["postgresql"] = lambda name: schema_url(cluster, name)
        for backend, target in backends.items():
            procs, urls = start_gateways(target("gateway"), 2, tmp)
            try:
                asyncio.run(run_gateway(urls, 4, 3, False, "warmup"))
                if backend == "sqlite":  # the per-call overhead table: one replica
                    for clients, n in ((1, args.requests), (32, args.per_client)):
                        direct, _ = asyncio.run(run_direct(engine, prompts, clients, n))
                        for stream in (False, True):
                            tag = f"{clients}-{stream}"
                            gw, wall = asyncio.run(run_gateway(urls[0], clients, n, stream, tag))
                            results.append((clients, stream, direct, gw, len(gw) / wall))
                direct, _ = asyncio.run(run_direct(engine, prompts, 32, args.per_client))
                for n_rep in (1, 2):
                    tag = f"{backend}-{n_rep}"
                    gw, wall = asyncio.run(
                        run_gateway(urls[:n_rep], 32, args.per_client, False, tag)
                    )
                    replicas.append((backend, n_rep, direct, gw, len(gw) / wall))
            finally:
                stop_gateways(procs)
            for name, ms in components(tok, target("components"), 30).items():
                comp[f"{name} [{backend}]"] = ms
        before = session_bytes(str(tmp / "storage-whole.db"), delta=False)
        after = session_bytes(str(tmp / "storage-delta.db"), delta=True)

    print(f"\ngateway overhead over a direct engine call ({os.cpu_count()} CPUs visible)")
    print("engine stand-in answers at once with 24 tokens; latency in ms; store: SQLite\n")
    head = (
        f"{'clients':>7} {'mode':<10} | {'direct p50':>10} {'gateway p50':>11} {'added p50':>9} "
        f"| {'direct p99':>10} {'gateway p99':>11} {'added p99':>9} | {'req/s':>6}"
    )
    print(head)
    print("-" * len(head))
    for clients, stream, direct, gw, rps in results:
        d50, g50 = pct(direct, 0.5) * 1e3, pct(gw, 0.5) * 1e3
        d99, g99 = pct(direct, 0.99) * 1e3, pct(gw, 0.99) * 1e3
        mode = "stream" if stream else "non-stream"
        print(
            f"{clients:>7} {mode:<10} | {d50:>10.3f} {g50:>11.2f} {g50 - d50:>9.2f} "
            f"| {d99:>10.3f} {g99:>11.2f} {g99 - d99:>9.2f} | {rps:>6.0f}"
        )
    print("\nreplicas on one store, 32 clients spread round-robin, non-streamed (ms):\n")
    head = f"{'store':<10} {'replicas':>8} | {'req/s':>6} | {'added p50':>9} {'added p99':>9}"
    print(head)
    print("-" * len(head))
    for backend, n_rep, direct, gw, rps in replicas:
        a50 = (pct(gw, 0.5) - pct(direct, 0.5)) * 1e3
        a99 = (pct(gw, 0.99) - pct(direct, 0.99)) * 1e3
        print(f"{backend:<10} {n_rep:>8} | {rps:>6.0f} | {a50:>9.2f} {a99:>9.2f}")
    print("\ncomponents, in-process, one at a time (p50 ms):")
    for name, ms in comp.items():
        print(f"  {name:<56} {ms:7.2f}")
    print("\nstorage of one 50-call session (turn rows' payload bytes):")
    print(f"  every prompt whole (before)   {before:>10,d}")
    print(f"  prompts as deltas (after)     {after:>10,d}   ({before / after:.1f}x smaller)")
    print(json.dumps({"store_dir": str(tmp)}))


if __name__ == "__main__":
    main()
