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
target: p99 with training on <= 2x idle; on vs off says what training adds to the same
traffic), the training steps done, the sessions and the wall time. The demo scores
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


def _probe(url: str, stop: threading.Event, out: list[float], n: int | None = None) -> None:
    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=600)
    while not stop.is_set() and (n is None or len(out) < n):
        t = time.perf_counter()
        try:
            client.chat.completions.create(model="policy", messages=SHORT, max_tokens=8,
                                           temperature=0.0)  # fmt: skip
        except openai.APIError as e:  # a failure is reported, never timed as a result
            print(f"probe failed: {e}", flush=True)
            continue
        out.append(time.perf_counter() - t)


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
                            extra_args=["--dtype", "float32", "--max-model-len", "4096"])  # fmt: skip
        t0 = time.perf_counter()
        url = server.start()
        print(f"vLLM server up in {time.perf_counter() - t0:.0f} s ({url})", flush=True)
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
            during, sessions, steps, wall = _demo_phase(settings, cfg, args.steps)
            step_s = _step_seconds(f"{tmp}/demo")
            print(f"training: {len(during)} short requests, {steps} steps, {sessions} sessions "
                  f"in {wall:.0f} s, p50 {statistics.median(during):.2f} s, p99 "
                  f"{_pct(during, 0.99):.2f} s, step {step_s}", flush=True)  # fmt: skip

            # the same traffic with training off: the same demo, for as long, but its learner
            # never has a batch (every judged turn still judged, nothing stepped or scored)
            off_settings = dataclasses.replace(
                settings, batch_size=1024, timeout_s=wall, out_dir=f"{tmp}/demo-off"
            )
            off, off_sessions, _, off_wall = _demo_phase(off_settings, cfg, None)
            print(f"training off: {len(off)} short requests, {off_sessions} sessions in "
                  f"{off_wall:.0f} s, p50 {statistics.median(off):.2f} s, p99 "
                  f"{_pct(off, 0.99):.2f} s", flush=True)  # fmt: skip
        finally:
            server.stop()
    if not during or not off:
        raise SystemExit("no short request finished while the demo ran")
    print(f"\nshort requests (8 tokens, greedy) through clawrl's gateway on one vLLM CPU server; "
          f"Combined, batch {args.batch_size}, {steps} steps in {wall / 60:.1f} min "
          f"({sessions} sessions), training off: {off_sessions} sessions in "
          f"{off_wall / 60:.1f} min; teacher scoring: {args.teacher_scoring}; training step "
          f"(time/step_total) {step_s}")  # fmt: skip
    print(f"{'phase':<30} {'n':>4} {'p50 s':>7} {'p99 s':>7} {'max s':>7}")
    for name, xs in (("idle", idle), ("demo traffic, training off", off),
                     ("demo traffic, training on", during)):  # fmt: skip
        print(f"{name:<30} {len(xs):>4} {statistics.median(xs):>7.2f} {_pct(xs, 0.99):>7.2f} "
              f"{max(xs):>7.2f}")  # fmt: skip
    print(
        f"p99 training on / idle: {_pct(during, 0.99) / _pct(idle, 0.99):.1f}x (target <= 2x); "
        f"training on / off, same traffic: {_pct(during, 0.99) / _pct(off, 0.99):.1f}x"
    )


def _step_seconds(out_dir: str) -> str:
    """Mean and max ``time/step_total`` over the steps the demo under ``out_dir`` wrote to its
    metrics.jsonl files, as text ("n/a" when none)."""
    import json
    from pathlib import Path

    xs = [row["time/step_total"] for path in Path(out_dir).rglob("metrics.jsonl")
          for row in map(json.loads, path.read_text().splitlines())
          if "time/step_total" in row]  # fmt: skip
    return f"mean {statistics.mean(xs):.1f} s, max {max(xs):.1f} s" if xs else "n/a"


def _demo_phase(settings, cfg, steps: int | None) -> tuple[list[float], int, int, float]:
    """Run the demo with ``settings`` while a client probes its gateway with short requests,
    from the gateway's start until ``steps`` training steps are done (``None``: until the run's
    time budget ends). Returns (latencies in s, sessions finished, steps done, seconds probed)."""
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
            threading.Thread(target=_probe, args=(base, stop, out), daemon=True).start()
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
