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
