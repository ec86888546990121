"""How often the policy follows a preference written in its system prompt, per check.

The preference memory (``clawrl serve --memory``) can only help as much as the policy obeys an
instruction in its system message. This measures that directly, with no training and no judge:
each validation problem of a scenario (the demo's ``--validation`` split: carved out of the
training problems, never the held-out ones) is answered greedily, as the demo evaluates, under

- ``none``: no system message;
- one condition per check: the memory block (:func:`clawrl.memory.prompt.memory_block`) with
  that check's directive alone, the sentence :func:`clawrl.judge.hints.extract_directive` takes
  from the first of the check's complaints that has one (as the memory would keep it from a
  feedback comment);
- ``all``: every check's directive in one block (a memory that holds all the user's wishes);
- ``all, stated``: every check's rubric description as an instruction ("Your answer: at most
  60 words."), one block: the wishes said plainly rather than in the user's words.

It prints, per check, the pass rate without a system message, with its own directive and with
all of them, and the paired change (own - none, all - none) with a 95 % bootstrap interval over
problems; the mean rubric score under ``none`` and ``all``; and writes every answer to
``--out`` (JSON).

    .venv/bin/python scripts/obedience.py [--scenario student] [--model smollm2-135m]
        [--problems 32] [--seed 0] [--out obedience.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from typing import Any


def directive_for(check: Any) -> str:
    """The directive the memory would keep for ``check``: the first complaint (slots filled
    with the check's limit) from which a directive can be extracted, else the first complaint."""
    from clawrl.judge.hints import extract_directive
    from clawrl.judge.types import NextStateRole

    texts = [c.replace("{limit}", str(check.limit)) for c in check.complaints
             if "{evidence}" not in c]  # fmt: skip
    for text in texts:
        hint = extract_directive(text, NextStateRole.FEEDBACK, negative=True)
        if hint is not None:
            return hint.text
    return texts[0] if texts else check.description


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--scenario", default="student", help="built-in name or scenario file")
    ap.add_argument("--model", default="smollm2-135m", help="model spec (clawrl models)")
    ap.add_argument("--problems", type=int, default=32, help="validation problems (32)")
    ap.add_argument("--seed", type=int, default=0, help="the demo's seed for the split (0)")
    ap.add_argument("--out", default="obedience.json", help="answers and rates (JSON)")
    args = ap.parse_args()

    from clawrl.cli.common import quiet_transformers

    quiet_transformers()
    from clawrl.config import validate_config
    from clawrl.demo import DemoSettings
    from clawrl.demo.runner import run_split
    from clawrl.envs.evaluate import evaluate_personalization
    from clawrl.envs.scenario import load_scenario
    from clawrl.memory.prompt import memory_block
    from clawrl.runtime import build_runtime
    from clawrl.stats import paired_diff_ci

    spec = load_scenario(args.scenario)
    split = run_split(DemoSettings(validation=True, eval_problems=args.problems), spec, args.seed)
    problems = split.held_out
    directives = {c.name: directive_for(c) for c in spec.checks}
    conditions: dict[str, str | None] = {"none": None}
    conditions.update({name: memory_block([text]) for name, text in directives.items()})
    conditions["all"] = memory_block(list(directives.values()))
    # the same wishes stated plainly (the rubric's own descriptions), one block
    conditions["all, stated"] = memory_block(
        [f"Your answer: {c.description}." for c in spec.checks]
    )
    print(f"{spec.name}: {len(problems)} validation problems (seed {args.seed}), "
          f"{len(conditions)} conditions, model {args.model}", flush=True)  # fmt: skip
    for name, text in directives.items():
        print(f"  {name}: {text}")

    cfg = validate_config({"model": {"spec": args.model}})
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="clawrl-obedience-") as tmp:
        runtime = build_runtime(cfg, store=f"{tmp}/store.db")
        try:
            with runtime.serve() as server:
                for cond, system in conditions.items():
                    t0 = time.perf_counter()
                    r = evaluate_personalization(server.base_url, spec, problems,
                                                 system_prompt=system, seed=args.seed,
                                                 max_tokens=spec.answer.max_tokens)  # fmt: skip
                    failed = [i for i in r.items if i.error]
                    if failed:
                        raise SystemExit(f"{cond}: {len(failed)} calls failed: {failed[0].error}")
                    results[cond] = {
                        "system": system,
                        "checks": [i.checks for i in r.items],
                        "scores": [i.score for i in r.items],
                        "answers": [i.response for i in r.items],
                    }
                    print(f"{cond}: mean score {statistics.fmean(results[cond]['scores']):.3f} "
                          f"({time.perf_counter() - t0:.0f} s)", flush=True)  # fmt: skip
        finally:
            runtime.close()

    none, every = results["none"]["checks"], results["all"]["checks"]
    stated = results["all, stated"]["checks"]
    print(f"\n{spec.name}, {len(problems)} validation problems, greedy, {args.model}: pass rate "
          "per check with no system message, with its own directive, with all directives, with "
          "all stated plainly")  # fmt: skip
    print(f"{'check':<20} {'none':>5} {'own':>5} {'all':>5} {'stated':>6}   "
          f"{'own - none [95% CI]':<24} {'all - none [95% CI]':<24}")  # fmt: skip
    rows = {}
    for c in spec.checks:
        a = [float(x[c.name]) for x in none]
        own = [float(x[c.name]) for x in results[c.name]["checks"]]
        al = [float(x[c.name]) for x in every]
        st = [float(x[c.name]) for x in stated]
        d_own, d_all = paired_diff_ci(a, own), paired_diff_ci(a, al)
        r = rows[c.name] = {"none": statistics.fmean(a), "own": statistics.fmean(own),
                            "all": statistics.fmean(al), "stated": statistics.fmean(st),
                            "own_minus_none": d_own, "all_minus_none": d_all}  # fmt: skip
        print(f"{c.name:<20} {r['none']:>5.2f} {r['own']:>5.2f} {r['all']:>5.2f} "
              f"{r['stated']:>6.2f}   {d_own[0]:+.2f} [{d_own[1]:+.2f}, {d_own[2]:+.2f}]"
              f"{'':<4} {d_all[0]:+.2f} [{d_all[1]:+.2f}, {d_all[2]:+.2f}]")  # fmt: skip
    means = {k: statistics.fmean(v["scores"]) for k, v in results.items()}
    print("mean rubric score: " + ", ".join(f"{k} {means[k]:.3f}"
                                            for k in ("none", "all", "all, stated")))  # fmt: skip
    with open(args.out, "w") as f:
        json.dump({"scenario": spec.name, "model": args.model, "seed": args.seed,
                   "problems": [p.id for p in problems], "directives": directives,
                   "rates": rows, "conditions": results}, f, indent=1)  # fmt: skip
    print(f"answers: {args.out}")


if __name__ == "__main__":
    main()
