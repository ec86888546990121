"""Crash campaign: ``clawrl serve --method combine`` killed with SIGKILL at random points, again
and again, restarting each time on the same store and output directory; then the invariants.

Each round starts the server (a tiny random Llama saved to disk, so a round takes seconds; the
choice judge, 1 vote, batch 2, a checkpoint every step), drives it with scripted two-turn chat
sessions through the ``openai`` SDK, and ``kill -9``s it after a random delay (during a request,
a judgment, a step, a checkpoint or a publish: whatever was running; the last console line says
what had happened). A last round runs without a kill and stops cleanly. Checked at the end:

* every acknowledged turn (the SDK got a 200 with its ``x-clawrl-turn-ids``) is in the store,
  ``ok``, with as many log-probs as sampled ids and the reply's text;
* no sample trained twice: the checkpoints' turn ids are disjoint, and each matches the store's
  ``trained`` record (same step);
* none lost: every turn a checkpoint trained is recorded trained;
* versions monotonic: the steps in ``metrics.jsonl`` strictly increase, and each restart serves
  the version of the latest checkpoint;
* the run continues: the final round trains past the last checkpoint before it.

    .venv/bin/python benchmarks/crash_campaign.py --kills 20        # the full campaign
    .venv/bin/python benchmarks/crash_campaign.py --kills 5         # what CI runs

Exit status 1 when an invariant fails.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

SERVE_FLAGS = [
    "--method", "combine", "--batch-size", "2", "--port", "0",
    "--set", 'judge.backend.kind="choice"', "--set", "judge.votes=1",
    "--set", "trainer.checkpoint_every=1", "--set", "engine.max_batch=8",
]  # fmt: skip


def save_tiny_model(path: Path) -> None:
    """A tiny random Llama with the real tokenizer, as a Hugging Face directory."""
    from clawrl.models import tiny_policy

    policy = tiny_policy(seed=0)
    policy.model.save_pretrained(path)
    policy.tokenizer.save_pretrained(path)


class Server:
    """One ``clawrl serve`` process; its console lines are kept."""

    def __init__(self, model: Path, store: Path, out: Path) -> None:
        exe = str(Path(sys.executable).with_name("clawrl"))
        cmd = [exe, "serve", "--model", str(model), "--store",
               str(store), "--set", f'trainer.output_dir="{out}"', *SERVE_FLAGS]  # fmt: skip
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
        )
        self.url: str | None = None
        self._ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())
            m = re.search(r"serving .* at (http://\S+)", line)
            if m:
                self.url = m.group(1).rstrip("/")
                self._ready.set()
        self._ready.set()

    def wait_ready(self, timeout_s: float = 180) -> str:
        if not self._ready.wait(timeout_s) or self.url is None:
            raise RuntimeError("server did not start:\n" + "\n".join(self.lines[-30:]))
        return self.url

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def drive(url: str, stop: threading.Event, acked: list[dict], seed: int) -> None:
    """Two-turn sessions until ``stop``; each acknowledged turn is appended to ``acked``."""
    import openai

    base = url if url.endswith("/v1") else url + "/v1"
    client = openai.OpenAI(base_url=base, api_key="x", max_retries=0, timeout=60)
    rng = random.Random(seed)
    n = 0
    while not stop.is_set():
        n += 1
        session = f"crash-{seed}-{n}"
        messages = [{"role": "user", "content": f"What is {rng.randint(2, 99)} plus 3?"}]
        for reply in ("no, shorter please", "thanks"):
            try:
                raw = client.chat.completions.with_raw_response.create(
                    model="m", messages=messages, max_tokens=12, temperature=1.0,
                    extra_headers={"x-clawrl-session-id": session},
                )  # fmt: skip
            except (openai.APIError, openai.APIConnectionError):
                return  # the server died: the round is over
            completion = raw.parse()
            text = completion.choices[0].message.content or ""
            for tid in raw.headers.get("x-clawrl-turn-ids", "").split(","):
                if tid:
                    acked.append({"turn_id": tid, "content": text})
            messages += [{"role": "assistant", "content": text}, {"role": "user", "content": reply}]


def checkpoints(out: Path) -> list[dict]:
    """Every checkpoint's metadata under ``out/checkpoints`` (step order)."""
    metas = []
    for d in sorted((out / "checkpoints").glob("step-*")):
        meta = d / "meta.json"
        if meta.is_file():
            metas.append(json.loads(meta.read_text()))
    return metas


def latest_version(out: Path) -> int:
    """The policy version of the checkpoint ``latest`` points at (0 when none)."""
    latest = out / "checkpoints" / "latest"
    if not latest.is_file():
        return 0
    meta = out / "checkpoints" / latest.read_text().strip() / "meta.json"
    return int(json.loads(meta.read_text())["policy_version"]) if meta.is_file() else -1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--kills", type=int, default=20, help="rounds ended by SIGKILL (20)")
    ap.add_argument("--min-s", type=float, default=1.0, help="earliest kill after ready (1 s)")
    ap.add_argument("--max-s", type=float, default=12.0, help="latest kill after ready (12 s)")
    ap.add_argument("--final-s", type=float, default=15.0, help="the last, clean round (15 s)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dir", help="work directory (default: a fresh temporary one)")
    args = ap.parse_args(argv)

    rng = random.Random(args.seed)
    root = Path(args.dir or tempfile.mkdtemp(prefix="clawrl-crash-"))
    root.mkdir(parents=True, exist_ok=True)
    model, store_path, out = root / "model", root / "store.db", root / "trainer"
    if not (model / "config.json").exists():
        save_tiny_model(model)
    acked: list[dict] = []
    restarts: list[dict] = []
    t0 = time.monotonic()
    for round_no in range(args.kills + 1):
        final = round_no == args.kills
        before = checkpoints(out)
        expected = latest_version(out)
        server = Server(model, store_path, out)
        url = server.wait_ready()
        stop = threading.Event()
        driver = threading.Thread(target=drive, args=(url, stop, acked, round_no), daemon=True)
        driver.start()
        delay = args.final_s if final else rng.uniform(args.min_s, args.max_s)
        time.sleep(delay)
        if final:
            stop.set()
            driver.join(timeout=120)
            server.stop()
        else:
            server.kill()
            stop.set()
            driver.join(timeout=120)
        loop = next((ln for ln in server.lines if ln.startswith("clawrl online loop")), "")
        m = re.search(r"policy version (\d+)", loop)
        served = int(m.group(1)) if m else None
        last = next((ln for ln in reversed(server.lines) if ln.strip()), "")
        restarts.append({"round": round_no, "delay_s": round(delay, 1), "killed": not final,
                         "checkpoints_before": len(before), "resumed_version": served,
                         "latest_checkpoint_version": expected,
                         "last_line": last[:160]})  # fmt: skip
        print(f"round {round_no + 1}/{args.kills + 1}: {'stopped' if final else 'killed'} after "
              f"{delay:.1f} s; {len(acked)} turns acknowledged so far; last: {last[:100]}",
              flush=True)  # fmt: skip

    from clawrl.store import SampleStatus, Store, TurnStatus

    failures: list[str] = []
    store = Store(store_path)
    for a in acked:
        turn = store.get_turn(a["turn_id"])
        if turn is None:
            failures.append(f"acknowledged turn {a['turn_id']} missing")
            continue
        if turn.status != TurnStatus.OK or len(turn.completion_ids) != len(turn.sampling_logprobs):
            failures.append(f"turn {turn.id} not intact ({turn.status}, ids/logprobs differ)")
        if (turn.output or {}).get("content", "") != a["content"]:
            failures.append(f"turn {turn.id}: stored text differs from the reply")
    for r in restarts:
        if r["resumed_version"] != r["latest_checkpoint_version"]:
            failures.append(f"round {r['round']}: resumed v{r['resumed_version']}, the latest "
                            f"checkpoint is v{r['latest_checkpoint_version']}")  # fmt: skip
    metas = checkpoints(out)
    trained = Counter(t for m in metas for t in m.get("turn_ids", []))
    twice = [t for t, c in trained.items() if c > 1]
    if twice:
        failures.append(f"{len(twice)} samples trained in two steps: {twice[:3]}")
    for m in metas:
        for t in m.get("turn_ids", []):
            s = store.get_sample(t)
            if s is None or s.status != SampleStatus.TRAINED:
                failures.append(f"sample {t} of step {m['step']} not recorded trained (lost)")
            elif s.step != m["step"]:
                failures.append(f"sample {t}: store says step {s.step}, checkpoint {m['step']}")
    steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()
             if x.strip()] if (out / "metrics.jsonl").exists() else []  # fmt: skip
    if any(b <= a for a, b in itertools.pairwise(steps)):
        failures.append(f"metrics steps not strictly increasing: {steps}")
    final_before = restarts[-1]["checkpoints_before"]
    if len(metas) <= final_before:
        failures.append(f"the final round trained nothing ({len(metas)} checkpoints)")
    store.close()
    counts = Counter(s for s in ("killed",) for r in restarts if r["killed"])
    print()
    print(f"crash campaign: {counts['killed']} kills, {len(restarts)} starts, "
          f"{time.monotonic() - t0:.0f} s, work dir {root}")  # fmt: skip
    print(f"acknowledged turns: {len(acked)}, all present and intact: "
          f"{not any('turn' in f for f in failures)}")  # fmt: skip
    print(f"steps trained: {len(metas)} (checkpoints), samples trained: {sum(trained.values())}, "
          f"trained twice: {len(twice)}")  # fmt: skip
    print(f"metrics steps: {steps[:40]}{' ...' if len(steps) > 40 else ''}")
    for f in failures[:20]:
        print("FAIL:", f)
    print("all invariants hold" if not failures else f"{len(failures)} failures")
    (root / "campaign.json").write_text(json.dumps(
        {"kills": counts["killed"], "acknowledged": len(acked), "steps": len(metas),
         "samples_trained": sum(trained.values()), "failures": failures, "rounds": restarts},
        indent=1))  # fmt: skip
    return 1 if failures else 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
