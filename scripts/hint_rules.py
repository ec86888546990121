"""Which rule turns the head judge's votes into hints: hint precision / recall per labeled set.

A vote's hint is the directive sentences :func:`clawrl.judge.hints.extract_directive` finds in
the user's reply, and a judgment keeps a hint a quorum of votes carries. Which votes look is the
rule (``judge.backend.hints``): until 2026-12-07 only votes whose trained hint gate fired
(``gate>=0.5``), which on blind-b gave precision 0.96 and recall 0.39 (README, "The judge"): a
preference the judge never turns into a hint never reaches the preference memory. This script
judges each case once (5 votes, recording each vote's score and gate) and scores candidate rules
offline on the same votes, with the extractor as it is now:

- ``gate>=T``: only votes whose gate is at least T look, reading every reply as a correction;
- ``gate or -1``: a vote that scores -1 also looks, besides the gate;
- ``directive``: every vote that scores looks, the reply read as a correction where the vote
  scores -1;
- ``bad-or-gate``: a vote that scores -1 or whose gate fires looks, the reply read as a
  correction where the vote scores -1 (the default since 2026-12-07, chosen on ``shipped`` +
  ``blind``).

Choose on the training sets (``shipped``, ``blind``: both were used to fit or compare heads),
then score the chosen rule once on ``blind-b`` (``--sets blind-b``)::

    .venv/bin/python scripts/hint_rules.py                    # shipped + blind: choose
    .venv/bin/python scripts/hint_rules.py --sets blind-b     # once, after choosing
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Callable

from clawrl.config import load_config
from clawrl.judge.cases import JudgeCase, blind_b_cases_path, blind_cases_path, load_cases
from clawrl.judge.hints import DEFAULT_QUORUM, extract_directive, select_hint
from clawrl.judge.types import HintStatus, Vote
from clawrl.judge.votes import majority

SETS = {"shipped": None, "blind": blind_cases_path, "blind-b": blind_b_cases_path}

Rule = Callable[[int | None, float], tuple[bool, bool]]
"""(vote score, gate) -> (look for a directive, the reply counts as a correction)."""

RULES: dict[str, Rule] = {
    **{f"gate>={t}": (lambda s, g, t=t: (g >= t, True)) for t in (0.5, 0.4, 0.3, 0.2, 0.1)},
    "gate or -1": lambda s, g: (g >= 0.5 or s == -1, True),
    "directive": lambda s, g: (s is not None, s == -1),
    "bad-or-gate": lambda s, g: (g >= 0.5 or s == -1, s == -1),
}


def rescore(case: JudgeCase, votes: list[Vote], rule: Rule) -> bool:
    """Whether the judgment of ``votes`` carries a hint under ``rule``."""
    if majority(votes).score is None:
        return False
    out = []
    text, role = case.input.next_state.text, case.input.next_state.role
    for v in votes:
        if v.score is None:
            out.append(v)
            continue
        gate = float(json.loads(v.raw or "{}").get("hint_gate", 0.0))
        look, negative = rule(int(v.score), gate)
        found = extract_directive(text, role, negative=negative) if look else None
        out.append(v.model_copy(update={
            "hint": found.text if found else None,
            "hint_status": HintStatus.OK if found else HintStatus.NONE,
        }))  # fmt: skip
    return select_hint(out, quorum=DEFAULT_QUORUM) is not None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sets", default="shipped,blind", help="labeled sets (shipped,blind)")
    args = ap.parse_args()
    from clawrl.runtime import build_judge

    bundle = build_judge(load_config(None, ["judge.votes=5"]))
    try:
        for name in args.sets.split(","):
            path = SETS[name]
            cases = load_cases(path() if path else None)
            t0 = time.perf_counter()

            async def all_votes(cases: list[JudgeCase] = cases) -> list[list[Vote]]:
                return [list((await bundle.judge(c.input)).votes) for c in cases]

            votes = asyncio.run(all_votes())
            print(f"{name}: {len(cases)} cases, {sum(c.has_hint for c in cases)} want a hint "
                  f"({time.perf_counter() - t0:.0f} s)")  # fmt: skip
            for rule_name, rule in RULES.items():
                hinted = [rescore(c, v, rule) for c, v in zip(cases, votes, strict=True)]
                tp = sum(h and c.has_hint for h, c in zip(hinted, cases, strict=True))
                p = tp / max(1, sum(hinted))
                r = tp / max(1, sum(c.has_hint for c in cases))
                print(
                    f"  {rule_name:<12} precision {p:.3f}  recall {r:.3f}  ({sum(hinted)} hinted)"
                )
    finally:
        bundle.close()


if __name__ == "__main__":
    main()
