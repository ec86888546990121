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
    server.supervise()  # as clawrl runs it (a test SIGKILLs it)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def _embedded_policy_once():
    from clawrl.models import load_policy

    return load_policy("smollm2-135m")


@pytest.fixture
def embedded_policy(_embedded_policy_once):
    """The real embedded SmolLM2-135M-Instruct (what the vLLM test server serves).

    A fresh copy of the weights per test: a Trainer injects its LoRA layers into the model it is
    given, so a shared model would carry one test's trained adapter into the next test's "base".
    """
    import copy
    import dataclasses

    policy = _embedded_policy_once
    return dataclasses.replace(policy, model=copy.deepcopy(policy.model))


@pytest.fixture(scope="session")
def pg_cluster():
    """A throwaway PostgreSQL cluster for the whole run (clawrl.testing.postgres): its URL.

    Fails when PostgreSQL is not installed (``make test`` installs Debian's package), unless
    ``CLAWRL_ALLOW_NO_POSTGRES=1`` skips the PostgreSQL tests explicitly.
    """
    from clawrl.testing.postgres import find_pg_bin, throwaway_cluster

    if find_pg_bin() is None:
        if os.environ.get("CLAWRL_ALLOW_NO_POSTGRES") == "1":
            pytest.skip("PostgreSQL is not installed (CLAWRL_ALLOW_NO_POSTGRES=1 skips this)")
        pytest.fail(
            "PostgreSQL is not installed: run `make test` as root (it installs Debian's "
            "postgresql package), `apt-get install postgresql`, or set "
            "CLAWRL_ALLOW_NO_POSTGRES=1 to skip the PostgreSQL tests"
        )
    with throwaway_cluster() as url:
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def store_target(request, tmp_path):
    """Factory ``store_target(name) -> target``: a fresh SQLite file, or a fresh PostgreSQL
    schema in the test cluster, per name; every test using it runs on both backends."""
    if request.param == "postgresql":
        from clawrl.testing.postgres import schema_url

        cluster = request.getfixturevalue("pg_cluster")
        made: dict[str, str] = {}

        def make_pg(name: str = "clawrl") -> str:
            if name not in made:
                made[name] = schema_url(cluster)
            return made[name]

        return make_pg

    def make_sqlite(name: str = "clawrl") -> str:
        return str(tmp_path / f"{name}.db")

    return make_sqlite
