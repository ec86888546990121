"""Cost of session attribution per call (``clawrl.gateway.attribution.link_call``) on a busy store.

Fills a store with N inferred turns whose prompts share a long system prefix (a harness's
~10k-token system prompt and tools), then times ``link_call`` for three kinds of call, each
against the baseline in the same run (the exact rules only: the prefix and retry lookups the
gateway made before fuzzy inference existed):

* a continuation (rule 1 finds it: what most harness calls are);
* a new conversation (every rule runs and none matches: the worst case);
* a side call (rules 1-5 run, rule 5 matches).

    .venv/bin/python benchmarks/attribution.py [--turns 600] [--prefix 10000] [--repeat 20]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from clawrl.gateway.attribution import CallSignals, link_call
from clawrl.store import SessionSource, Store, TurnRecord

GEN = [1, 9, 2]  # a stand-in generation prompt (``<|im_start|>assistant\n``)


def fill(store: Store, turns: int, prefix: int) -> list[TurnRecord]:
    system = list(range(1000, 1000 + prefix))
    out = []
    for i in range(turns):
        session = store.new_session(SessionSource.INFERRED)
        prompt = [*system, 50_000 + i, 7, 7, *GEN]
        turn = TurnRecord(
            session.id,
            prompt,
            [60_000 + i, 8],
            [-0.1, -0.1],
            session_source=SessionSource.INFERRED,
            client={"user_agent": f"harness/{i % 7}", "api_key_fingerprint": "fp"},
        )
        store.record_turn(turn)
        out.append(turn)
    return out


def timed(fn, repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=600)
    parser.add_argument("--prefix", type=int, default=10_000, help="shared prompt tokens")
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as d:
        store = Store(Path(d) / "bench.db")
        turns = fill(store, args.turns, args.prefix)
        last = turns[-1]
        system = last.prompt_ids[: args.prefix]
        calls = {
            "continuation": ([*last.prompt_ids, *last.completion_ids, 5, *GEN], CallSignals()),
            "new conversation": ([*system, 99_999, 7, *GEN], CallSignals()),
            "side call": (
                [5, 5, 5, *GEN],
                CallSignals(
                    side=True,
                    client={
                        "user_agent": f"harness/{(args.turns - 1) % 7}",
                        "api_key_fingerprint": "fp",
                    },
                ),
            ),
        }
        print(f"{args.turns} inferred turns, {args.prefix}-token shared prefix; median of "
              f"{args.repeat} calls (ms)")  # fmt: skip
        print(f"{'call':18s} {'exact rules only':>17s} {'link_call':>10s}  rule")
        for name, (prompt, signals) in calls.items():

            def exact(prompt=prompt) -> None:
                store.find_extendable_turns(prompt, since_s=6 * 3600.0, limit=50)
                store.find_turns_by_prompt(prompt, since_s=6 * 3600.0, limit=20)

            base = timed(exact, args.repeat)
            full = timed(lambda p=prompt, s=signals: link_call(store, p, None, s, GEN), args.repeat)
            rule = link_call(store, prompt, None, signals, GEN).detail
            print(f"{name:18s} {base * 1e3:17.1f} {full * 1e3:10.1f}  {rule}")
        store.close()


if __name__ == "__main__":
    main()
