"""How the PRM judge scores a harness run's turns, next to each rollout's verifier outcome.

    .venv/bin/python scripts/judge_harness_turns.py STORE [--votes 3] [--set KEY=VALUE ...]

STORE is a harness run's or evaluation's ``store.db`` (``clawrl harness train|eval --out``).
Every trained turn of every rollout that has a next state is judged twice with the configured
judge (default: the shipped head): with its next state read as the linker's role (a harness's
``Output: ...`` user message as a person's reply, as harness mode did before) and as harness
mode reads it now (the environment's output, :func:`clawrl.judge.worker.judged_role`,
so :mod:`clawrl.judge.rules` applies). Prints, per kind of output (exit status 0 / non-zero /
none reported; empty or not) and outcome (passed: reward 1), the count of each score, and the
turns whose score agrees in sign with the outcome. Nothing is written to the store.
"""

from __future__ import annotations

import argparse
import asyncio
from collections import Counter

from clawrl.config import load_config
from clawrl.judge.rules import read_exit_status
from clawrl.judge.worker import judge_input
from clawrl.runtime import build_judge
from clawrl.store import Store, TurnKind, TurnStatus
from clawrl.trajectory import load_tree, next_state


def _kind(text: str) -> str:
    report = read_exit_status(text)
    if report is None:
        return f"exit none {'empty' if not text.strip() else 'text'}"
    code = "0" if report.status == 0 else "!=0"
    return f"exit {code:4s} {'text' if report.printed else 'empty'}"


async def _main(args: argparse.Namespace) -> None:
    store = Store(args.store, read_only=True)
    judge = build_judge(load_config(None, [f"judge.votes={args.votes}", *args.set])).judge
    items = []
    rollouts = store.rollout_results()
    for r in rollouts:
        tree = load_tree(store, r.rollout.id)
        for tid, node in tree.nodes.items():
            t = node.turn
            if t.status != TurnStatus.OK or not t.trainable or t.kind != TurnKind.MAIN:
                continue
            ns = next_state(tree, tid)
            if ns is not None and ns.messages:
                items.append((r, t, ns))
    print(f"{len(items)} turns with a next state in {len(rollouts)} rollouts", flush=True)
    table: Counter[tuple[bool, str, str, int | None]] = Counter()
    for i, (r, t, ns) in enumerate(items, 1):
        kind = _kind(judge_input(t, ns).next_state.text)
        outcome = "passed" if (r.reward or 0.0) >= 1.0 else "failed"
        for observations in (False, True):
            j = await judge(judge_input(t, ns, observations=observations))
            table[(observations, outcome, kind, j.score)] += 1
        if i % 25 == 0 or i == len(items):
            print(f"judged {i}/{len(items)}", flush=True)
    for observations in (False, True):
        title = (
            "as the environment's output (harness mode now)"
            if observations
            else "with the role the linker gave it (a harness's output as a person's reply)"
        )
        print(f"\n== next state read {title}")
        rows = sorted({(o, k) for (obs, o, k, _) in table if obs == observations})
        for outcome, kind in rows:
            counts = {s: n for (obs, o, k, s), n in table.items()
                      if (obs, o, k) == (observations, outcome, kind)}  # fmt: skip
            cells = "  ".join(f"{'none' if s is None else f'{s:+d}'}: {n}"
                              for s, n in sorted(counts.items(), key=lambda x: str(x[0])))  # fmt: skip
            print(f"{outcome:7s} {kind:16s} {cells}")
        agree = sum(n for (obs, o, _, s), n in table.items() if obs == observations
                    and s is not None and s == (1 if o == "passed" else -1))  # fmt: skip
        print(f"score agrees in sign with the outcome: {agree} of {len(items)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("store", help="a harness run's or evaluation's store.db")
    ap.add_argument("--votes", type=int, default=3, help="votes per judgment (3, as harness mode)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="config override, e.g. judge.backend.kind=choice")  # fmt: skip
    asyncio.run(_main(ap.parse_args()))


if __name__ == "__main__":
    main()
