#!/usr/bin/env bash
# Outcome-only GRPO vs integrated PRM + outcome through a harness, from the same start.
#
#   scripts/harness_prm_vs_outcome.sh [OUT] [-- extra 'clawrl harness train' flags]
#
# Both runs start from the same base model, tasks (train split), seed and settings; only
# --method differs (grpo: the verifier's outcome alone; prm_outcome: the judge also scores every
# turn's next state, R = step score + outcome normalised per (group, step)). Each run's last
# published version is then evaluated on the held-out split together with the base model
# (--version 0,N: Pass@1 with 95 % intervals over tasks and the paired gain over the base), and
# the two runs are compared (clawrl harness compare: PRM + outcome minus outcome only, paired).
# Settings by environment: STEPS (5), K (4, held-out samples per task), HARNESS (reference),
# GROUP_SIZE (4), TASKS_PER_STEP (4), JUDGE (head), JUDGE_VOTES (3), MODEL (smollm2-135m).
# Results: OUT/{outcome,prm}.eval.json (rows of versions 0 and N), OUT/{outcome,prm}/
# (store.db with rollouts and judgments, metrics.jsonl with prm/* keys, policies/vN).
set -euo pipefail

OUT=runs/prm-vs-outcome
if [[ $# -gt 0 && $1 != -* ]]; then
    OUT=$1
    shift
fi
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

# shellcheck source=scripts/harness_common.sh
source "$(dirname "$0")/harness_common.sh"

evaluate() {  # evaluate NAME RUN: held-out Pass@1 of the base model and of RUN's last version
    local name=$1 run=$2 version
    version=$(last_version "$run")
    local versions=0
    [[ $version -gt 0 ]] && versions="0,$version"
    "$CLAWRL" harness eval "${common[@]}" --split heldout --k "$K" --json \
        --out "$OUT/$name-eval" --run "$run" --version "$versions" >"$OUT/$name.eval.json"
}

fresh_dir "$OUT/outcome"
fresh_dir "$OUT/prm"
"$CLAWRL" harness train "${train[@]}" --method grpo --out "$OUT/outcome" "$@"
"$CLAWRL" harness train "${train[@]}" --method prm_outcome --judge "${JUDGE:-head}" \
    --judge-votes "${JUDGE_VOTES:-3}" --out "$OUT/prm" "$@"
evaluate outcome "$OUT/outcome"
evaluate prm "$OUT/prm"
for name in outcome prm; do
    last=$(last_version "$OUT/$name")
    if [[ $last -gt 0 ]]; then
        "$CLAWRL" harness compare --version-a 0 --version-b "$last" "$OUT/$name.eval.json" \
            "$OUT/$name.eval.json" | sed "s/^/$name, v$last vs base: /"
    else
        echo "$name: no version was published (every step skipped): nothing to compare" >&2
    fi
done
"$CLAWRL" harness compare --version-a "$(last_version "$OUT/outcome")" \
    --version-b "$(last_version "$OUT/prm")" "$OUT/outcome.eval.json" "$OUT/prm.eval.json" \
    | sed 's/^/PRM + outcome (B) vs outcome only (A): /'
