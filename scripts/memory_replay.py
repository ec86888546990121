"""Replay the directives a run's memory took through today's memory rules, and say how much of
the user's wishes the memory holds.

A memory arm of the demo (``clawrl demo --memory``) records every judge's hint and feedback
comment in its store. This script feeds them, in the order they were recorded, to a fresh
:class:`clawrl.memory.MemoryKeeper` (same cap) and measures, against the scenario's rubric, which
of the user's wishes the active entries name: an entry *names* a check when it holds one of the
check's complaint texts, or a clause of three words or more of one (the simulated user builds
every reply from them; a slot matches one to three words).
It prints the number of checks the user asked for, the checks the memory names after the last
directive and on average after each one, the entries that name no check, and the adds, merges,
replacements and evictions. The stream is the run's own, so this compares rules on one fixed
sequence of directives (the answers, and so the hints, would differ had the rules served them).

    .venv/bin/python scripts/memory_replay.py RUN/store.db [--scenario student] [--cap 8]
"""

from __future__ import annotations

import argparse
import logging
import re
import statistics
import tempfile
from collections import Counter
from typing import Any


def _norm(text: str) -> str:
    text = text.lower().replace("\u2019", "'").replace("\u201c", '"').replace("\u201d", '"')
    return " ".join(re.sub(r"[^a-z0-9']+", " ", text).split())


def check_patterns(spec: Any) -> dict[str, list[re.Pattern[str]]]:
    """Check name -> regexes of its complaint texts' clauses of three words or more
    (normalised; a ``{slot}`` matches one to three words)."""
    out: dict[str, list[re.Pattern[str]]] = {}
    for c in spec.checks:
        pats = []
        for complaint in c.complaints:
            for clause in re.split(r"[.?!;,]+", complaint):
                parts = [_norm(p) for p in re.split(r"\{[a-z_]+\}", clause)]
                if sum(len(p.split()) for p in parts) < 3:
                    continue
                slot = r" ?(?:[a-z0-9']+ ?){1,3}"
                body = slot.join(re.escape(p) for p in parts).strip()
                pats.append(re.compile(rf"(?:^| ){body}(?: |$)"))
        out[c.name] = pats
    return out


def named_checks(text: str, patterns: dict[str, list[re.Pattern[str]]]) -> set[str]:
    """The checks whose complaint texts ``text`` holds."""
    t = _norm(text)
    return {name for name, pats in patterns.items() if any(p.search(t) for p in pats)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("store", help="a memory arm's store (RUN/store.db)")
    ap.add_argument("--scenario", default="student", help="the run's scenario (student)")
    ap.add_argument("--cap", type=int, default=8, help="memory.max_entries (8)")
    ap.add_argument("--split", action="store_true", help="each sentence its own directive")
    ap.add_argument("--show", action="store_true", help="print the final entries")
    args = ap.parse_args()

    from clawrl.envs.scenario import load_scenario
    from clawrl.judge.hints import extract_directive
    from clawrl.judge.types import NextStateRole
    from clawrl.memory import MemoryKeeper
    from clawrl.store import MemorySource, Store

    logging.getLogger("clawrl").setLevel(logging.WARNING)
    spec = load_scenario(args.scenario)
    patterns = check_patterns(spec)
    src_store = Store(args.store, read_only=True)
    sources = src_store.memory_sources_since(0.0, limit=100_000)
    src_store.close()
    asked: set[str] = set()
    covered_after: list[int] = []
    with tempfile.TemporaryDirectory(prefix="clawrl-replay-") as tmp:
        store = Store(f"{tmp}/replay.db")
        keeper = MemoryKeeper(store, max_entries=args.cap)
        for src in sources:
            text = src["text"]
            if src["kind"] == "feedback":
                found = extract_directive(text, NextStateRole.FEEDBACK, negative=src["reward"] < 0)
                text = found.text if found is not None else ""
            asked |= named_checks(text, patterns)
            kind = MemorySource.HINT if src["kind"] == "hint" else MemorySource.FEEDBACK
            pieces = re.split(r"(?<=[.!?])\s+", text) if args.split else [text]
            for piece in pieces:
                keeper.remember(piece, kind, turn_id=src["turn_id"], session_id=src["session_id"])
            active = store.memory_entries("")
            covered_after.append(
                len(set().union(*(named_checks(e.text, patterns) for e in active)))
            )
        active = store.memory_entries("")
        final = [(e.text, named_checks(e.text, patterns)) for e in active]
        every = store.memory_entries("", active_only=False)
        events = Counter(h.get("event") for e in every for h in e.history)
        ended = Counter(str(e.status) for e in every)
        store.close()
    covered = set().union(*(c for _, c in final)) if final else set()
    print(f"{args.store}: {len(sources)} directives, scenario {spec.name} ({len(spec.checks)} "
          f"checks), cap {args.cap}")  # fmt: skip
    print(f"checks the directives name: {len(asked)} ({', '.join(sorted(asked))})")
    print(f"checks the memory names at the end: {len(covered)} ({', '.join(sorted(covered))})")
    if covered_after:
        print(f"checks named after each directive: mean {statistics.fmean(covered_after):.2f}")
    print(f"entries at the end: {len(final)}, naming no check: "
          f"{sum(1 for _, c in final if not c)}")  # fmt: skip
    print(f"events: {dict(events)}; entries by status: {dict(ended)}")
    if args.show:
        for text, checks in final:
            print(f"  [{', '.join(sorted(checks)) or '-'}] {text}")


if __name__ == "__main__":
    main()
