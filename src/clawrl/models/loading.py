"""Model and tokenizer loading: embedded models, local directories, GGUF files, hub ids; chat
template and stop-id overrides (:mod:`clawrl.models.gguf` converts GGUF files)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clawrl.errors import ModelLoadError
from clawrl.models.gguf import (
    DEFAULT_MODEL,
    EMBEDDED_MODELS,
    EmbeddedModel,
    cache_dir,
    convert_gguf,
    embedded_gguf_path,
    template_path,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_MODEL",
    "EMBEDDED_MODELS",
    "EmbeddedModel",
    "Policy",
    "cache_dir",
    "embedded_gguf_path",
    "load_policy",
    "load_tokenizer",
    "tiny_policy",
]


@dataclass
class Policy:
    """A loaded policy: a causal LM and its tokenizer.

    Attributes:
        model: the ``transformers`` causal LM, in eval mode, on CPU unless moved.
        tokenizer: its tokenizer (the chat template lives here, overrides applied).
        name: the spec it was loaded from (``smollm2-135m``, a path or a hub id).
        path: the local directory holding the weights (the cache dir for embedded models and
            GGUF files).
        max_context: context window in tokens (``config.max_position_embeddings``).
        stop_ids: ids that end a completion (:func:`clawrl.models.stops.stop_ids`: EOS, the
            generation config's, the template's end-of-turn tokens and ``model.stop_ids``);
            empty: derive them when needed (:func:`clawrl.engine.inputs.policy_eos_ids`).
    """

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    name: str
    path: Path | None
    max_context: int
    stop_ids: frozenset[int] = field(default_factory=frozenset)


def _resolve(spec: str) -> tuple[str, Path | None]:
    """Map a spec to (what to pass to from_pretrained, local dir or None).

    Raises:
        ModelLoadError: the spec names nothing loadable; the message says what would be.
    """
    if spec in EMBEDDED_MODELS:
        path = convert_gguf(embedded_gguf_path(spec), spec)
        return str(path), path
    p = Path(spec).expanduser()
    if p.is_file():
        if p.suffix.lower() != ".gguf":
            raise ModelLoadError(
                f"{p} is a file but not a GGUF file (*.gguf): --model takes a Hugging Face "
                "model directory (config.json, weights, tokenizer files) or a .gguf file"
            )
        path = convert_gguf(p.resolve())
        return str(path), path
    if p.exists():
        if not (p / "config.json").is_file():
            ggufs = sorted(p.glob("*.gguf"))
            hint = f" (it holds {ggufs[0].name}: pass --model {ggufs[0]})" if ggufs else ""
            raise ModelLoadError(
                f"{p} exists but is not a Hugging Face model dir (no config.json){hint}"
            )
        return str(p), p
    if spec.count("/") == 1 and not spec.startswith((".", "/", "~")):
        return spec, None  # a hub id
    raise ModelLoadError(
        f"cannot resolve model {spec!r}: not an embedded model ({', '.join(EMBEDDED_MODELS)}), "
        "not a local directory or .gguf file, not a hub id (owner/name)"
    )


def read_chat_template(source: str) -> str:
    """A chat template from ``source``: a file path (a Jinja file, or a ``tokenizer_config.json``
    / ``chat_template.json`` holding one), or the template text itself (it contains ``{%`` or
    ``{{``).

    Raises:
        ModelLoadError: the file is missing or holds no template.
    """
    import json

    if "{%" in source or "{{" in source:
        return source
    path = Path(source).expanduser()
    if not path.is_file():
        raise ModelLoadError(
            f"chat template {source!r}: no such file (give a .jinja file, a "
            "tokenizer_config.json with a chat_template, or the template text)"
        )
    text = path.read_text()
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ModelLoadError(f"chat template file {path} is not valid JSON: {e}") from e
        template = data.get("chat_template") if isinstance(data, dict) else None
        if isinstance(template, list):  # named templates: take "default"
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        if not isinstance(template, str) or not template.strip():
            raise ModelLoadError(f"{path} holds no chat_template")
        return template
    if not text.strip():
        raise ModelLoadError(f"chat template file {path} is empty")
    return text


def _apply_template(tok: Any, spec: str, chat_template: str | None) -> None:
    """Put the override, or an embedded base model's shipped template, on ``tok``."""
    if chat_template is not None:
        tok.chat_template = read_chat_template(chat_template)
    elif spec in EMBEDDED_MODELS and not tok.chat_template:
        shipped = EMBEDDED_MODELS[spec].chat_template
        if shipped is not None:
            tok.chat_template = template_path(shipped).read_text()


def load_tokenizer(
    spec: str = DEFAULT_MODEL, *, chat_template: str | None = None
) -> PreTrainedTokenizerBase:
    """Load only the tokenizer of a model spec (converting a GGUF file if needed).

    Args:
        spec: as :func:`load_policy`.
        chat_template: as :func:`load_policy`.
    """
    from transformers import AutoTokenizer

    src, _ = _resolve(spec)
    try:
        tok = AutoTokenizer.from_pretrained(src)
    except OSError as e:
        raise ModelLoadError(f"cannot load tokenizer for {spec!r}: {e}") from e
    _apply_template(tok, spec, chat_template)
    return tok


def load_policy(
    spec: str = DEFAULT_MODEL,
    *,
    dtype: str = "float32",
    device: str = "cpu",
    chat_template: str | None = None,
    stop_ids: Sequence[int | str] = (),
) -> Policy:
    """Load a policy by spec.

    Args:
        spec: an embedded model (``smollm2-135m``, the default; ``gemma3-270m``, a base model),
            a Hugging Face model directory (``config.json`` + weights + tokenizer files), a GGUF
            file (dequantized once and cached, as the embedded models are), or a hub id
            ``owner/name`` (needs network access to the hub).
        dtype: ``float32`` (default; CPU), ``bfloat16`` or ``float16``.
        device: torch device string.
        chat_template: a template that replaces the tokenizer's (:func:`read_chat_template`:
            a file or the text); ``None``: the tokenizer's own (for an embedded base model
            without one, the template clawrl ships for it).
        stop_ids: more ids (or token strings) that end a completion, beside those derived from
            the tokenizer, generation config and template (:func:`clawrl.models.stops.stop_ids`).

    Returns:
        A :class:`Policy` with the model in eval mode.

    Raises:
        ModelLoadError: unknown spec, missing package, unreadable weights or template, a stop
            token the tokenizer does not know, or no hub access.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from clawrl.models.stops import stop_ids as derive_stop_ids

    src, path = _resolve(spec)
    torch_dtype = getattr(torch, dtype, None)
    if not isinstance(torch_dtype, torch.dtype):
        raise ModelLoadError(f"unknown dtype {dtype!r}")
    try:
        tok = AutoTokenizer.from_pretrained(src)
        model = AutoModelForCausalLM.from_pretrained(src, dtype=torch_dtype)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"cannot load model {spec!r} from {src}: {e}") from e
    _apply_template(tok, spec, chat_template)
    model.to(device)  # type: ignore[arg-type]
    model.eval()
    stops = derive_stop_ids(tok, model, extra=stop_ids)
    return Policy(model, tok, spec, path, _max_context(model.config), stops)


def _max_context(config: Any) -> int:
    return int(getattr(config, "max_position_embeddings", 2048) or 2048)


def tiny_policy(
    *,
    seed: int = 0,
    hidden_size: int = 64,
    num_layers: int = 2,
    max_context: int = 2048,
    arch: str = "llama",
) -> Policy:
    """A tiny randomly initialised causal LM with the real SmolLM2 tokenizer, for fast tests.

    The default (``arch="llama"``) matches SmolLM2's family (Llama, tied embeddings, vocab
    49152) at a few layers and hidden size ``hidden_size``. Other architectures test what the
    engine must handle beyond Llama; their sliding windows are :data:`TINY_SLIDING_WINDOW` tokens,
    so that any chat prompt is longer than the window:

    * ``mistral``, ``phi3``: every layer slides;
    * ``qwen2``, ``qwen3`` (``use_sliding_window``): layer 0 full, the others slide;
    * ``gemma2``, ``gemma3``: alternating sliding / full layers (``layer_types``).

    Weights are seeded, so two calls with the same arguments give equal models.

    Raises:
        ValueError: ``arch`` is not one of :data:`TINY_ARCHS`.
    """
    import torch
    import transformers

    if arch not in TINY_ARCHS:
        raise ValueError(f"unknown tiny architecture {arch!r}; known: {', '.join(TINY_ARCHS)}")
    tok = load_tokenizer(DEFAULT_MODEL)
    head_dim = hidden_size // 4
    window = TINY_SLIDING_WINDOW
    alternating = [
        "sliding_attention" if i % 2 == 0 else "full_attention" for i in range(num_layers)
    ]
    qwen = {"use_sliding_window": True, "sliding_window": window, "max_window_layers": 1}
    gemma = {
        "head_dim": head_dim,
        "query_pre_attn_scalar": head_dim,
        "sliding_window": window,
        "layer_types": alternating,
    }
    # arch -> (config class, model class, what differs from the Llama arguments)
    archs: dict[str, tuple[str, str, dict[str, Any]]] = {
        "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
        "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": window}),
        "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", qwen),
        "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": head_dim, **qwen}),
        "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", gemma),
        "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", gemma),
        "phi3": ("Phi3Config", "Phi3ForCausalLM", {"sliding_window": window}),
    }
    config_name, model_name, extra = archs[arch]
    config = getattr(transformers, config_name)(
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
        **extra,
    )
    gen = torch.random.fork_rng()
    with gen:
        torch.manual_seed(seed)
        model = getattr(transformers, model_name)(config)
    model.eval()
    name = f"tiny-{seed}" if arch == "llama" else f"tiny-{arch}-{seed}"
    return Policy(model, tok, name, None, max_context)


TINY_ARCHS = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3")
"""The architectures :func:`tiny_policy` builds."""
TINY_SLIDING_WINDOW = 6
"""The sliding window (tokens) of :func:`tiny_policy`'s sliding-window architectures."""
