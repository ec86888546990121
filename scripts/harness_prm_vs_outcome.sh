#!/usr/bin/env bash
# Outcome-only GRPO vs integrated PRM + outcome through a harness, from the same start.
#
#   scripts/harness_prm_vs_outcome.sh [OUT] [-- extra 'clawrl harness train' flags]
#
# Both runs start from the same base model, tasks (train split), seed and settings; only
# --method differs (grpo: the verifier's outcome alone; prm_outcome: the judge also scores every
# turn's next state, R = step score + outcome normalised per (group, step)). Each run's last
# published version is then evaluated on the held-out split, next to the base model (version 0).
# Settings by environment: STEPS (5), K (4, held-out samples per task), HARNESS (reference),
# GROUP_SIZE (4), TASKS_PER_STEP (4), JUDGE (head), JUDGE_VOTES (3), MODEL (smollm2-135m).
# Results: OUT/{base,outcome,prm}.eval.json (one JSON row per harness), OUT/{outcome,prm}/
# (store.db with rollouts and judgments, metrics.jsonl with prm/* keys, policies/vN).
set -euo pipefail

OUT=${1:-runs/prm-vs-outcome}
[[ $# -gt 0 ]] && shift
[[ ${1:-} == "--" ]] && shift
CLAWRL=${CLAWRL:-clawrl}
STEPS=${STEPS:-5}
K=${K:-4}
HARNESS=${HARNESS:-reference}
MODEL=${MODEL:-smollm2-135m}
common=(--tasks builtin --harness "$HARNESS" --model "$MODEL")
train=("${common[@]}" --split train --steps "$STEPS" --group-size "${GROUP_SIZE:-4}"
       --tasks-per-step "${TASKS_PER_STEP:-4}")
mkdir -p "$OUT"

last_version() {  # the highest policies/vN a run published (0: none)
    local dirs
    dirs=$(find "$1/policies" -maxdepth 1 -name 'v[0-9]*' -printf '%f\n' 2>/dev/null || true)
    sort -V <<<"${dirs:-v0}" | tail -n 1 | tr -d v
}

evaluate() {  # evaluate NAME [RUN]: held-out Pass@1 / Pass@k of RUN's last version (or base)
    local name=$1 run=${2:-} version=0 args=()
    if [[ -n $run ]]; then
        version=$(last_version "$run")
        [[ $version -gt 0 ]] && args=(--run "$run" --version "$version")
    fi
    "$CLAWRL" harness eval "${common[@]}" --split heldout --k "$K" --json \
        --out "$OUT/$name-eval" "${args[@]}" | tee "$OUT/$name.eval.json"
}

evaluate base
"$CLAWRL" harness train "${train[@]}" --method grpo --out "$OUT/outcome" "$@"
"$CLAWRL" harness train "${train[@]}" --method prm_outcome --judge "${JUDGE:-head}" \
    --judge-votes "${JUDGE_VOTES:-3}" --out "$OUT/prm" "$@"
evaluate outcome "$OUT/outcome"
evaluate prm "$OUT/prm"
echo "held-out evaluations: $OUT/base.eval.json $OUT/outcome.eval.json $OUT/prm.eval.json"
