#!/usr/bin/env bash
# One harness training recipe over several seeds: does its held-out gain survive a reseed?
#
#   scripts/harness_seeds.sh [OUT] [-- extra 'clawrl harness train' flags, e.g. --lr 1e-3]
#
# Trains SEEDS runs (trainer.seed = 0..SEEDS-1: the LoRA init, shuffles and rollout sampling),
# evaluates the base model once and each run's last published version on the held-out split (k
# rollouts per task), then compares: per run the paired gain over the base with intervals over
# families and over tasks within families, and the mean gain over runs with a Student-t interval
# over runs (clawrl harness compare with one B file per run).
# Settings by environment: SEEDS (3), STEPS (16), K (4), HARNESS (reference), GROUP_SIZE (4),
# TASKS_PER_STEP (4), MODEL (smollm2-135m).
# Results: OUT/base.eval.json, OUT/seedS/ (store.db, metrics.jsonl, policies/vN),
# OUT/seedS.eval.json, OUT/compare.txt (OUT/notes.txt: seeds that published no version; their
# policy is the base, evaluated again). Time on 2 CPU cores with the defaults: about 20 min per
# run alone, 5-10 min per evaluation.
set -euo pipefail

OUT=runs/seeds
if [[ $# -gt 0 && $1 != -* ]]; then
    OUT=$1
    shift
fi
[[ ${1:-} == "--" ]] && shift
CLAWRL=${CLAWRL:-clawrl}
SEEDS=${SEEDS:-3}
K=${K:-4}
common=(--tasks builtin --harness "${HARNESS:-reference}" --model "${MODEL:-smollm2-135m}")
# shellcheck source=scripts/harness_common.sh
source "$(dirname "$0")/harness_common.sh"
mkdir -p "$OUT"

for dir in base-eval $(seq -f 'seed%g' 0 $((SEEDS - 1))); do
    fresh_dir "$OUT/$dir"
done
"$CLAWRL" harness eval "${common[@]}" --split heldout --k "$K" --json --out "$OUT/base-eval" \
    >"$OUT/base.eval.json"
evals=()
for ((s = 0; s < SEEDS; s++)); do
    run="$OUT/seed$s"
    "$CLAWRL" harness train "${common[@]}" --split train --steps "${STEPS:-16}" \
        --group-size "${GROUP_SIZE:-4}" --tasks-per-step "${TASKS_PER_STEP:-4}" \
        --set "trainer.seed=$s" --out "$run" "$@"
    version=$(last_version "$run")
    versions=(--run "$run" --version "$version")
    if [[ $version -eq 0 ]]; then  # its policy is the base: a result of the recipe all the same
        echo "seed $s: no version was published (every step skipped): its policy is the base," \
            "evaluated again" | tee -a "$OUT/notes.txt" >&2
        versions=()
    fi
    "$CLAWRL" harness eval "${common[@]}" --split heldout --k "$K" --json --out "$run-eval" \
        "${versions[@]}" >"$run.eval.json"
    evals+=("$run.eval.json")
done
"$CLAWRL" harness compare --version-a 0 "$OUT/base.eval.json" "${evals[@]}" | tee "$OUT/compare.txt"
