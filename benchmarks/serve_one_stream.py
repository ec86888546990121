"""One stream through a real ``clawrl serve`` process: generated tokens/s of sequential chat
completions (openai SDK), for this checkout's ``clawrl`` and, side by side, another's (``--base
DIR``: a checkout with its own ``.venv``, e.g. main before a change).

Each server is started on an ephemeral port with its own store and output folder, warmed with one
4-token call, sent ``--requests`` completions of ``--tokens`` tokens (temperature 0.7, a seed
each), then stopped with SIGINT. Extra arguments go to ``clawrl serve`` (e.g. ``--method
combine``). One server at a time.

    .venv/bin/python benchmarks/serve_one_stream.py [--base ../other-checkout] [-- --method combine]
"""

from __future__ import annotations

import argparse
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import openai


def measure(clawrl: Path, serve_args: list[str], requests: int, tokens: int) -> list[float]:
    with tempfile.TemporaryDirectory() as d:
        cmd = [str(clawrl), "serve", "--port", "0", *serve_args,
               "--set", f'trainer.output_dir="{d}/out"', "--set", f'server.store="{d}/s.db"']  # fmt: skip
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        url, seen = None, []
        for line in proc.stdout:
            seen.append(line)
            found = re.search(r"serving \S+ at (http://\S+/v1)", line)
            if found:
                url = found.group(1)
                break
        if url is None:
            proc.wait()
            raise SystemExit(f"{clawrl} serve did not start:\n{''.join(seen)}")
        out = proc.stdout
        threading.Thread(target=lambda: [None for _ in out], daemon=True).start()
        client = openai.OpenAI(base_url=url, api_key="x")
        rates = []
        try:
            for i in range(requests + 1):
                t = time.perf_counter()
                r = client.chat.completions.create(
                    model="x", max_tokens=tokens if i else 4, temperature=0.7, seed=i,
                    messages=[{"role": "user", "content": f"Write a long story about a dragon, part {i}."}],
                )  # fmt: skip
                dt = time.perf_counter() - t
                if i and r.usage is not None:
                    rates.append(r.usage.completion_tokens / dt)
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if not rates:
            raise SystemExit(f"{clawrl} serve reported no usage: no tokens/s to show")
        return rates


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--base", type=Path, help="another checkout (with .venv) to compare against")
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=64)
    args, serve_args = ap.parse_known_args()
    serve_args = [a for a in serve_args if a != "--"]
    here = Path(sys.executable).parent / "clawrl"
    runs = {"this checkout": here}
    if args.base is not None:
        runs = {f"base ({args.base})": args.base / ".venv" / "bin" / "clawrl", **runs}
    print(f"clawrl serve {' '.join(serve_args)}: {args.requests} sequential completions of "
          f"{args.tokens} tokens, one stream")  # fmt: skip
    for name, binary in runs.items():
        rates = measure(binary, serve_args, args.requests, args.tokens)
        print(f"  {name:>40}: median {statistics.median(rates):5.1f} tok/s "
              f"(range {min(rates):.1f}-{max(rates):.1f})", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
