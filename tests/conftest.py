"""Shared fixtures: the tiny policy (real tokenizer, random weights) is built once per session."""

from __future__ import annotations

import os
import warnings

import pytest

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore", category=FutureWarning)


@pytest.fixture(scope="session")
def tiny():
    """A tiny random Llama with the real SmolLM2 tokenizer (see clawrl.models.tiny_policy)."""
    from clawrl.models import tiny_policy

    return tiny_policy(seed=0)


@pytest.fixture(scope="session")
def tokenizer(tiny):
    return tiny.tokenizer


NO_VLLM_ENV = "CLAWRL_ALLOW_NO_VLLM"
"""Set to 1 to skip the tests that need a real vLLM server when vLLM is not installed."""


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory):
    """A real vLLM server (CPU build, ``scripts/install_vllm.sh``) serving the embedded model,
    started once per test session by clawrl's own launcher and stopped at the end.

    Without vLLM the tests that use it fail, unless ``CLAWRL_ALLOW_NO_VLLM=1`` skips them.
    """
    from clawrl.engine.vllm import VLLMServer, default_vllm_python
    from clawrl.models import load_policy

    python = default_vllm_python()
    if python is None:
        if os.environ.get(NO_VLLM_ENV) == "1":
            pytest.skip(f"vLLM is not installed ({NO_VLLM_ENV}=1)")
        pytest.fail(
            "vLLM is not installed: `make test` installs it (scripts/install_vllm.sh into "
            f".vllm/); set {NO_VLLM_ENV}=1 to skip the tests that need it"
        )
    policy = load_policy("smollm2-135m")
    server = VLLMServer(
        policy.path, python=python, run_dir=tmp_path_factory.mktemp("vllm"),
        # float32 like the trainer, so served and trained log-probs agree to ~1e-4
        extra_args=["--dtype", "float32", "--max-model-len", "2048"],
    )  # fmt: skip
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def embedded_policy():
    """The real embedded SmolLM2-135M-Instruct (what the vLLM test server serves)."""
    from clawrl.models import load_policy

    return load_policy("smollm2-135m")
