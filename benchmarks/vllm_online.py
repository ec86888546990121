"""Serving latency on vLLM while the online loop trains with Combined (Binary RL + OPD), beside
the same server idle, in one run.

    .venv/bin/python benchmarks/vllm_online.py [--steps 4] [--probes 20]

Needs vLLM (``make vllm``). Launches one vLLM server of the embedded model (float32, clawrl's
plugin loaded), then:

* **idle**: a clawrl gateway over it with no training; an ``openai`` SDK client sends
  ``--probes`` short chat completions (8 tokens, greedy), one after another;
* **training**: the student demo's live schedule on the same server (``clawrl demo --schedule
  async --engine vllm --vllm-url URL``: simulated users talk to the gateway, the head judge judges,
  the learner steps with Combined, the OPD teacher scores on vLLM, each step's adapter is loaded
  into the server), while the same client sends the same short requests to the demo's gateway
  until ``--steps`` steps are done;
* **training off**: the same demo traffic for as long (the same simulated users, judge and
  gateway), with a learner whose batch (1024 samples) does not fill: nothing is stepped,
  scored or published.

Prints p50 / p99 / max of the short requests' latency in the three phases, the ratios (the
target: p99 with training on <= 2x training idle, i.e. on vs off under the same traffic: what
training adds; on vs nothing else running says what the traffic itself costs too), the
training steps done, the sessions and the wall time; then each demo phase on a timeline
(training on: cut at each step's start and end, where the step's adapter is published;
training off: 120 s windows), each window with its short requests, the demo turns that
started in it and the server's counters from its ``/metrics`` (requests running and
waiting, preemptions, prefix-cache hit rate, tokens, adapters running). ``--server-arg`` adds
arguments to the server (e.g. ``--server-arg=--max-num-batched-tokens=256``). The demo scores
the OPD teacher where ``trainer.teacher_scoring`` says (``--teacher-scoring``; default ``auto``:
the trainer, on vLLM).

    .venv/bin/python benchmarks/vllm_online.py --decompose [--phase-s 60]

takes the load apart instead, on one server, each phase ``--phase-s`` seconds: short requests
(8 tokens, greedy, one every second, through clawrl's vLLM engine) while nothing else runs; while
clawrl's process computes training steps (forward + backward + AdamW of the policy on 4 x 512
tokens, in a loop); while bursts of 8 teacher-scoring requests (700-token prompts, 256 target
tokens, T = 0.7) run on the server, with scoring not yielding (``scoring_defer_s = 0``, 64 in
flight) and yielding (clawrl's defaults, :mod:`clawrl.engine.vllm.yielding`); and while the
trainer scores the same bursts itself (their forward pass in clawrl's process, nothing on the
server).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import threading
import time

from clawrl.cli.common import quiet_transformers

SHORT = [{"role": "user", "content": "Say hi in three words."}]


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


class _ServerStats:
    """Polls the vLLM server's Prometheus ``/metrics`` every ``every_s`` seconds in a thread
    (started on construction, :meth:`stop` to end) and keeps (Unix time, {series: value}) of the
    scheduler's queue, preemptions, prefix-cache and token counters and the LoRA adapters its
    running / waiting requests use."""

    KEEP = ("vllm:num_requests_running", "vllm:num_requests_waiting",
            "vllm:num_preemptions_total", "vllm:prefix_cache_queries_total",
            "vllm:prefix_cache_hits_total", "vllm:prompt_tokens_total",
            "vllm:generation_tokens_total")  # fmt: skip

    def __init__(self, url: str, every_s: float = 1.0) -> None:
        self.url, self.every_s = url, every_s
        self.samples: list[tuple[float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import re

        import httpx

        lora = re.compile(r'running_lora_adapters="([^"]*)"')
        waiting = re.compile(r'waiting_lora_adapters="([^"]*)"')
        with httpx.Client(timeout=10.0) as client:
            while not self._stop.wait(self.every_s):
                try:
                    text = client.get(f"{self.url}/metrics").text
                except httpx.HTTPError:
                    continue
                row: dict[str, float] = {}
                newest = -1.0
                for line in text.splitlines():
                    if line.startswith("#") or " " not in line:
                        continue
                    name, _, value = line.rpartition(" ")
                    base = name.split("{", 1)[0]
                    if base in self.KEEP:
                        row[base] = row.get(base, 0.0) + float(value)
                    elif base == "vllm:lora_requests_info" and float(value) >= newest:
                        newest = float(value)  # the gauge's value is when it was set
                        run, wait = lora.search(name), waiting.search(name)
                        row["loras_running"] = len([x for x in (run.group(1) if run else
                                                                "").split(",") if x])  # fmt: skip
                        row["loras_waiting"] = len([x for x in (wait.group(1) if wait else
                                                                "").split(",") if x])  # fmt: skip
                self.samples.append((time.time(), row))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self, a: float, b: float) -> str:
        """The server between Unix times ``a`` and ``b``: mean running and waiting requests,
        most waiting, preemptions, prefix-cache hit rate, prompt and generated tokens, most
        distinct adapters running. Text."""
        xs = [row for t, row in self.samples if a <= t < b]
        if len(xs) < 2:
            return ""

        def delta(k: str) -> float:
            return xs[-1].get(k, 0.0) - xs[0].get(k, 0.0)

        def mean(k: str) -> float:
            return statistics.mean(r.get(k, 0.0) for r in xs)

        q = delta("vllm:prefix_cache_queries_total")
        hit = f"{delta('vllm:prefix_cache_hits_total') / q:.2f}" if q else "-"
        return (f"run {mean('vllm:num_requests_running'):.1f} wait "
                f"{mean('vllm:num_requests_waiting'):.1f}/"
                f"{max(r.get('vllm:num_requests_waiting', 0.0) for r in xs):.0f} preempt "
                f"{delta('vllm:num_preemptions_total'):.0f} hit {hit} prompt "
                f"{delta('vllm:prompt_tokens_total'):.0f} gen "
                f"{delta('vllm:generation_tokens_total'):.0f} loras "
                f"{max(r.get('loras_running', 0.0) for r in xs):.0f}")  # fmt: skip


def _probe(
    url: str,
    stop: threading.Event,
    out: list[float],
    n: int | None = None,
    starts: list[float] | None = None,
) -> None:
    """Short requests one after another until ``stop`` (or ``n`` done); each latency (s) goes to
    ``out`` and, when given, its start (Unix time, s) to ``starts``."""
    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=600)
    while not stop.is_set() and (n is None or len(out) < n):
        t, wall = time.perf_counter(), time.time()
        try:
            client.chat.completions.create(model="policy", messages=SHORT, max_tokens=8,
                                           temperature=0.0)  # fmt: skip
        except openai.APIError as e:  # a failure is reported, never timed as a result
            print(f"probe failed: {e}", flush=True)
            continue
        out.append(time.perf_counter() - t)
        if starts is not None:
            starts.append(wall)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--steps", type=int, default=4, help="training steps to run (4)")
    ap.add_argument("--batch-size", type=int, default=4, help="samples per step (4)")
    ap.add_argument("--probes", type=int, default=20, help="short requests when idle (20)")
    ap.add_argument(
        "--teacher-scoring",
        default="auto",
        choices=["auto", "engine", "trainer"],
        help="where the demo scores the OPD teacher (auto: the trainer, on vLLM)",
    )
    ap.add_argument(
        "--decompose", action="store_true", help="take the load apart instead (see above)"
    )
    ap.add_argument("--phase-s", type=float, default=60.0, help="seconds per phase (--decompose)")
    ap.add_argument(
        "--server-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="one more argument for the vLLM server, repeatable "
        "(e.g. --server-arg=--max-num-batched-tokens=256)",
    )
    args = ap.parse_args()
    quiet_transformers()
    if args.decompose:
        decompose(args.phase_s)
        return
    import logging

    logging.getLogger("clawrl").setLevel(logging.ERROR)

    from clawrl.config import validate_config
    from clawrl.demo import DemoSettings
    from clawrl.engine.vllm import VLLMEngine, VLLMServer
    from clawrl.gateway import create_app
    from clawrl.gateway.server import LiveServer
    from clawrl.models import load_policy
    from clawrl.store import Store

    policy = load_policy("smollm2-135m")
    with tempfile.TemporaryDirectory(prefix="clawrl-bench-") as tmp:
        server = VLLMServer(policy.path, run_dir=f"{tmp}/vllm",
                            extra_args=["--dtype", "float32", "--max-model-len", "4096",
                                        *args.server_arg])  # fmt: skip
        t0 = time.perf_counter()
        url = server.start()
        # what follows clawrl's fixed flags: its defaults (the CPU build's too) and --server-arg
        flags = " ".join(server.args[server.args.index("--max-loras") + 2 :])
        print(f"vLLM server up in {time.perf_counter() - t0:.0f} s ({url}; {flags})", flush=True)
        try:
            # idle: a gateway over the server, nothing training
            engine = VLLMEngine([url], policy.tokenizer)
            store = Store(f"{tmp}/idle.db")
            app = create_app(engine, policy.tokenizer, store, model_name="policy")
            gateway = LiveServer(app).start()
            idle: list[float] = []
            try:
                _probe(gateway.base_url.removesuffix("/v1"), threading.Event(), [], 2)  # warm-up
                _probe(gateway.base_url.removesuffix("/v1"), threading.Event(), idle, args.probes)
            finally:
                gateway.stop()
                engine.close()
                store.close()
            print(f"idle: {len(idle)} short requests, p50 {statistics.median(idle):.2f} s, "
                  f"p99 {_pct(idle, 0.99):.2f} s", flush=True)  # fmt: skip

            # training: the demo's live schedule on the same server, probed meanwhile
            cfg = validate_config(
                {
                    "engine": {"backend": "vllm", "vllm_urls": [url]},
                    "trainer": {"teacher_scoring": args.teacher_scoring},
                }
            )
            settings = DemoSettings(
                methods=("combine",), steps=args.steps, eval_steps=(args.steps,),
                batch_size=args.batch_size, eval_problems=4, out_dir=f"{tmp}/demo",
                schedule="async",
            )  # fmt: skip
            starts: list[float] = []
            on_stats = _ServerStats(url)
            during, sessions, steps, wall = _demo_phase(settings, cfg, args.steps, starts)
            on_stats.stop()
            step_s = _step_seconds(f"{tmp}/demo")
            by_step = _by_step(during, starts, f"{tmp}/demo", on_stats)
            print(by_step, flush=True)
            print(f"training on: {_turn_sizes(f'{tmp}/demo')}", flush=True)
            print(f"training: {len(during)} short requests, {steps} steps, {sessions} sessions "
                  f"in {wall:.0f} s, p50 {statistics.median(during):.2f} s, p99 "
                  f"{_pct(during, 0.99):.2f} s, step {step_s}", flush=True)  # fmt: skip

            # the same traffic with training off: the same demo, for as long, but its learner
            # never has a batch (every judged turn still judged, nothing stepped or scored)
            off_settings = dataclasses.replace(
                settings, batch_size=1024, timeout_s=wall, out_dir=f"{tmp}/demo-off"
            )
            off_starts: list[float] = []
            off_stats = _ServerStats(url)
            off, off_sessions, _, off_wall = _demo_phase(off_settings, cfg, None, off_starts)
            off_stats.stop()
            print(_by_step(off, off_starts, f"{tmp}/demo-off", off_stats).replace(
                "training on", "training off"))  # fmt: skip
            print(f"training off: {len(off)} short requests, {off_sessions} sessions in "
                  f"{off_wall:.0f} s, p50 {statistics.median(off):.2f} s, p99 "
                  f"{_pct(off, 0.99):.2f} s; {_turn_sizes(f'{tmp}/demo-off')}",
                  flush=True)  # fmt: skip
        finally:
            server.stop()
    if not during or not off:
        raise SystemExit("no short request finished while the demo ran")
    print(f"\nshort requests (8 tokens, greedy) through clawrl's gateway on one vLLM CPU server; "
          f"Combined, batch {args.batch_size}, {steps} steps in {wall / 60:.1f} min "
          f"({sessions} sessions), training off: {off_sessions} sessions in "
          f"{off_wall / 60:.1f} min; teacher scoring: {args.teacher_scoring}; server flags "
          f"{flags}; training step "
          f"(time/step_total) {step_s}")  # fmt: skip
    print(f"{'phase':<30} {'n':>4} {'p50 s':>7} {'p99 s':>7} {'max s':>7}")
    for name, xs in (("idle", idle), ("demo traffic, training off", off),
                     ("demo traffic, training on", during)):  # fmt: skip
        print(f"{name:<30} {len(xs):>4} {statistics.median(xs):>7.2f} {_pct(xs, 0.99):>7.2f} "
              f"{max(xs):>7.2f}")  # fmt: skip
    print(
        f"p99 training on / training idle (same traffic): "
        f"{_pct(during, 0.99) / _pct(off, 0.99):.1f}x (target <= 2x: what training adds); "
        f"training on / nothing else running: {_pct(during, 0.99) / _pct(idle, 0.99):.1f}x"
    )
    print("\n" + by_step)


def _by_step(
    lat: list[float], starts: list[float], out_dir: str, stats: _ServerStats | None = None
) -> str:
    """The training-on phase's short requests on a timeline cut at each training step's start
    and end (``time - time/step_total`` and ``time`` of a metrics.jsonl row; a step's adapter
    is published at its end): n, p50, p99 and max of the requests that started in each window,
    then the same pooled over the windows in a step and those between steps, and the five
    slowest requests with when they started (s from the first request). Without steps (training
    off) the windows are 120 s each. With ``stats``, each window also gets the server's
    (:meth:`_ServerStats.summary`). Text."""
    import json
    from pathlib import Path

    n = min(len(lat), len(starts))  # a request may still be finishing in the probe's thread
    lat, starts = lat[:n], starts[:n]
    if not starts:
        return "training on: no short request finished"
    steps = sorted((row["time"] - row["time/step_total"], row["time"])
                   for path in Path(out_dir).rglob("metrics.jsonl")
                   for row in map(json.loads, path.read_text().splitlines())
                   if "time/step_total" in row)  # fmt: skip
    t0 = min(starts)
    cuts = [(t0, "start")]
    for k, (a, b) in enumerate(steps, 1):
        cuts += [(a, f"step {k}"), (b, f"after step {k}")]
    if not steps:
        cuts += [(t, "") for t in range(int(t0) + 120, int(max(starts)), 120)]
    windows: list[tuple[str, float, float, list[float]]] = []
    for i, (t, name) in enumerate(cuts):
        end = cuts[i + 1][0] if i + 1 < len(cuts) else float("inf")
        xs = [x for x, s in zip(lat, starts, strict=True) if t <= s < end]
        windows.append((name, t - t0, end - t0, xs))
    demo = _demo_turns(out_dir)
    lines = [f"training on, by when the request started (s from the first; {len(steps)} steps; "
             "demo turns started in the window: count, mean prompt / completion tokens, "
             "versions):",
             f"{'window':<26} {'n':>4} {'p50 s':>7} {'p99 s':>7} {'max s':>7}   demo turns"]  # fmt: skip

    def row(name: str, xs: list[float]) -> str:
        if not xs:
            return f"{name:<26} {0:>4}"
        return (f"{name:<26} {len(xs):>4} {statistics.median(xs):>7.2f} {_pct(xs, 0.99):>7.2f} "
                f"{max(xs):>7.2f}")  # fmt: skip

    for name, a, b, xs in windows:
        span = f"{a:.0f}-{b:.0f} s" if b != float("inf") else f"{a:.0f} s-"
        turns = [t for t in demo if t0 + a <= t[0] < t0 + b]
        info = (f"   {len(turns)}, {statistics.mean(t[1] for t in turns):.0f} / "
                f"{statistics.mean(t[2] for t in turns):.0f}, "
                f"v{sorted({t[3] for t in turns})}" if turns else "   0")  # fmt: skip
        server = stats.summary(t0 + a, t0 + b) if stats is not None else ""
        lines.append(row(f"{name} ({span})", xs).ljust(62) + info.ljust(30) + server)
    inside = [x for name, _, _, xs in windows if name.startswith("step") for x in xs]
    between = [x for name, _, _, xs in windows if not name.startswith("step") for x in xs]
    lines += [row("all in a step", inside), row("all between steps", between)]
    slowest = sorted(zip(lat, starts, strict=True), reverse=True)[:5]
    lines.append("slowest: " + "; ".join(f"{x:.1f} s at {s - t0:.0f} s" for x, s in slowest))
    return "\n".join(lines)


def _demo_turns(out_dir: str) -> list[tuple[float, int, int, int]]:
    """(created_at, prompt tokens, completion tokens, policy version) of every simulated user's
    turn the demo under ``out_dir`` recorded (its sessions are named ``sim-...``)."""
    import sqlite3
    from pathlib import Path

    out: list[tuple[float, int, int, int]] = []
    for db in Path(out_dir).rglob("store.db"):
        with sqlite3.connect(db) as con:
            out += con.execute("SELECT created_at, prompt_len, completion_len, policy_version "
                               "FROM turns WHERE session_id LIKE 'sim-%'").fetchall()  # fmt: skip
    return out


def _turn_sizes(out_dir: str) -> str:
    """The demo's turns under ``out_dir``: count and mean prompt / completion tokens (text)."""
    turns = _demo_turns(out_dir)
    if not turns:
        return "no demo turns"
    return (f"{len(turns)} demo turns, mean {statistics.mean(t[1] for t in turns):.0f} prompt / "
            f"{statistics.mean(t[2] for t in turns):.0f} completion tokens")  # fmt: skip


def _step_seconds(out_dir: str) -> str:
    """Mean and max ``time/step_total`` over the steps the demo under ``out_dir`` wrote to its
    metrics.jsonl files, as text ("n/a" when none)."""
    import json
    from pathlib import Path

    xs = [row["time/step_total"] for path in Path(out_dir).rglob("metrics.jsonl")
          for row in map(json.loads, path.read_text().splitlines())
          if "time/step_total" in row]  # fmt: skip
    return f"mean {statistics.mean(xs):.1f} s, max {max(xs):.1f} s" if xs else "n/a"


def _demo_phase(
    settings, cfg, steps: int | None, starts: list[float] | None = None
) -> tuple[list[float], int, int, float]:
    """Run the demo with ``settings`` while a client probes its gateway with short requests,
    from the gateway's start until ``steps`` training steps are done (``None``: until the run's
    time budget ends). Returns (latencies in s, sessions finished, steps done, seconds probed);
    each request's start (Unix time) goes to ``starts`` when given."""
    from clawrl.demo import run_demo

    stop = threading.Event()
    out: list[float] = []
    seen = {"steps": 0, "sessions": 0}
    started: list[float] = []
    ended: list[float] = []

    def progress(event: str, info: dict) -> None:
        if event == "server" and not started:
            started.append(time.perf_counter())
            base = info["url"].removesuffix("/dashboard")
            threading.Thread(target=_probe, args=(base, stop, out, None, starts),
                             daemon=True).start()  # fmt: skip
            if steps is None:  # probe while sessions run, not while the run shuts down
                threading.Timer(settings.timeout_s, stop.set).start()
        elif event == "sessions" and not stop.is_set():
            seen["steps"], seen["sessions"] = info["status"].steps, info["sessions"]
            if steps is not None and seen["steps"] >= steps:
                ended.append(time.perf_counter())
                stop.set()  # the final evaluation is not training

    run_demo(settings, cfg, progress=progress)
    stop.set()
    if steps is None:
        ended.append(started[0] + settings.timeout_s if started else time.perf_counter())
    end = ended[0] if ended else time.perf_counter()
    return out, seen["sessions"], seen["steps"], end - (started[0] if started else end)


def decompose(phase_s: float) -> None:
    """One server; short requests while each load runs alone (module doc)."""
    import asyncio
    import random

    import torch

    from clawrl.engine.types import SamplingParams
    from clawrl.engine.vllm import VLLMEngine, VLLMServer
    from clawrl.models import load_policy

    policy = load_policy("smollm2-135m")
    tok = policy.tokenizer
    prompt = tok.encode("Say hi in three words.")
    rng = random.Random(0)
    burst = [([rng.randrange(1000, 20000) for _ in range(700)],
              [rng.randrange(1000, 20000) for _ in range(256)]) for _ in range(8)]  # fmt: skip

    def training(engine: VLLMEngine, stop: threading.Event) -> None:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(policy.path, dtype=torch.float32)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
        x = torch.randint(0, 1000, (4, 512))
        while not stop.is_set():
            model(input_ids=x, labels=x).loss.backward()
            opt.step()
            opt.zero_grad()

    def scoring(engine: VLLMEngine, stop: threading.Event) -> None:
        while not stop.is_set():
            asyncio.run(engine.score_batch(burst, temperature=0.7))

    def trainer_scoring(engine: VLLMEngine, stop: threading.Event) -> None:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(policy.path, dtype=torch.float32).eval()
        x = torch.tensor([p + t for p, t in burst])
        while not stop.is_set():
            with torch.no_grad():
                for row in x:  # one sample at a time, as the trainer's micro-batches of 1
                    torch.log_softmax(model(input_ids=row[None]).logits.float() / 0.7, -1)

    with tempfile.TemporaryDirectory(prefix="clawrl-bench-") as tmp:
        server = VLLMServer(policy.path, run_dir=f"{tmp}/vllm",
                            extra_args=["--dtype", "float32", "--max-model-len", "4096"])  # fmt: skip
        url = server.start()
        rows = []
        try:
            phases = [
                ("nothing else", None, {}),
                ("training steps in clawrl", training, {}),
                ("teacher scoring on vLLM, not yielding", scoring,
                 {"scoring_defer_s": 0.0, "scoring_slots": 64}),
                ("teacher scoring on vLLM, yielding", scoring, {}),
                ("teacher scoring by the trainer", trainer_scoring, {}),
            ]  # fmt: skip
            for name, load, kwargs in phases:
                engine = VLLMEngine([url], tok, **kwargs)
                stop, out = threading.Event(), []
                worker = None
                if load is not None:
                    worker = threading.Thread(target=load, args=(engine, stop), daemon=True)
                    worker.start()
                    time.sleep(3)
                t_end = time.perf_counter() + phase_s
                while time.perf_counter() < t_end:
                    t = time.perf_counter()
                    asyncio.run(engine.generate(prompt, SamplingParams(max_tokens=8,
                                                                       temperature=0.0)))  # fmt: skip
                    out.append(time.perf_counter() - t)
                    time.sleep(1.0)
                stop.set()
                if worker is not None:
                    worker.join()
                gate = engine.replicas[0].scoring
                rows.append((name, out, gate.preempted if gate else 0))
                engine.close()
                print(f"{name}: n {len(out)}, p50 {statistics.median(out):.2f} s", flush=True)
        finally:
            server.stop()
    idle = _pct(rows[0][1], 0.99)
    print("\nshort requests (8 tokens, greedy, one a second) on one vLLM CPU server, "
          f"{phase_s:.0f} s per phase")  # fmt: skip
    print(f"{'meanwhile':<40} {'n':>4} {'p50 s':>7} {'p99 s':>7} {'max s':>7} {'p99/idle':>8} "
          f"{'preempted':>9}")  # fmt: skip
    for name, xs, pre in rows:
        print(f"{name:<40} {len(xs):>4} {statistics.median(xs):>7.2f} {_pct(xs, 0.99):>7.2f} "
              f"{max(xs):>7.2f} {_pct(xs, 0.99) / idle:>7.1f}x {pre:>9}")  # fmt: skip


if __name__ == "__main__":
    main()
