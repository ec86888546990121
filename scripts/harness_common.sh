# Shared by scripts/harness_*.sh (sourced, not run): helpers over 'clawrl harness' run dirs.

last_version() {  # last_version RUN: the highest policies/vN RUN published (0: none)
    local dirs
    dirs=$(find "$1/policies" -maxdepth 1 -name 'v[0-9]*' -printf '%f\n' 2>/dev/null || true)
    sort -V <<<"${dirs:-v0}" | tail -n 1 | tr -d v
}
