"""Fixtures for clawrl.chat tests: the real SmolLM2 tokenizer, loaded once per module."""

from __future__ import annotations

import pytest

from clawrl.models import load_tokenizer


@pytest.fixture(scope="module")
def smol_tokenizer():
    """The real SmolLM2-135M-Instruct tokenizer (plain ChatML template, no tool support)."""
    return load_tokenizer()
