# Shared by scripts/harness_*.sh (sourced, not run): helpers over 'clawrl harness' run dirs.

last_version() {  # last_version RUN: the highest policies/vN RUN published (0: none)
    local dirs  # vN only: a killed run can leave a vN.tmp being written
    dirs=$(find "$1/policies" -maxdepth 1 -type d -printf '%f\n' 2>/dev/null \
        | grep -E '^v[0-9]+$' || true)
    sort -V <<<"${dirs:-v0}" | tail -n 1 | tr -d v
}

fresh_dir() {  # fresh_dir DIR: stop unless DIR is new (a rerun would mix in an old run's policies)
    if [[ -e $1 ]]; then
        echo "$1 exists: a rerun into it would evaluate an earlier run's policies; remove it or" \
            "pick another OUT" >&2
        exit 1
    fi
}
