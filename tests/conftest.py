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


@pytest.fixture(scope="session")
def pg_cluster():
    """A throwaway PostgreSQL cluster for the whole run (clawrl.store.pgtest): its URL.

    Fails when PostgreSQL is not installed (``make test`` installs Debian's package), unless
    ``CLAWRL_ALLOW_NO_POSTGRES=1`` skips the PostgreSQL tests explicitly.
    """
    from clawrl.store.pgtest import find_pg_bin, throwaway_cluster

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
        from clawrl.store.pgtest import schema_url

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
