"""clawrl settings: pydantic models, TOML files, ``--set section.key=value`` overrides.

Importable without torch. Every field has a docstring (its ``description``) and bounds.

Precedence, lowest first: field defaults < ``--config FILE`` (TOML) < ``--set`` overrides.

Example TOML::

    [model]
    spec = "smollm2-135m"

    [engine]
    max_batch = 16

    [server]
    port = 8000
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from clawrl.errors import ConfigError


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelConfig(_Section):
    """Which policy to load."""

    spec: str = Field(
        "smollm2-135m",
        min_length=1,
        description="Embedded model name (smollm2-135m), a local Hugging Face dir, or a hub id.",
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="Weight dtype; float32 on CPU."
    )
    device: str = Field("cpu", min_length=1, description="Torch device, e.g. cpu or cuda:0.")


class EngineConfig(_Section):
    """The token-level engine."""

    backend: Literal["transformers"] = Field(
        "transformers", description="Generation backend (in-process transformers)."
    )
    max_batch: int = Field(32, ge=1, le=1024, description="Most sequences decoded together.")
    max_context: int | None = Field(
        None, ge=16, description="Context window in tokens; default: the model's own."
    )


class SamplingConfig(_Section):
    """Default sampling parameters (requests may override them)."""

    max_tokens: int = Field(256, ge=1, le=1_000_000, description="New tokens per completion.")
    temperature: float = Field(0.7, ge=0.0, le=10.0, description="0 means greedy decoding.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    top_k: int = Field(0, ge=0, description="Keep the k most likely tokens; 0 disables.")


class ServerConfig(_Section):
    """The HTTP gateway."""

    host: str = Field("127.0.0.1", min_length=1, description="Bind address; loopback by default.")
    port: int = Field(8000, ge=0, le=65535, description="TCP port; 0 picks a free one.")
    api_key: str | None = Field(
        None, description="Required bearer key; needed to bind a non-loopback address."
    )
    store: str = Field("clawrl.db", min_length=1, description="SQLite trajectory store path.")


class Config(BaseModel):
    """All clawrl settings, one section per component."""

    model_config = ConfigDict(extra="forbid")

    model: ModelConfig = Field(default_factory=ModelConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)


def _parse_value(raw: str) -> Any:
    """Parse an override value as TOML/JSON scalar when possible, else keep the string."""
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        pass
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def apply_override(data: dict[str, Any], override: str) -> None:
    """Apply one ``section.key=value`` override to a raw config dict in place.

    Raises:
        ConfigError: the override is not of the form ``a.b=value``.
    """
    if "=" not in override:
        raise ConfigError(f"override {override!r} must look like section.key=value")
    key, raw = override.split("=", 1)
    parts = [p for p in key.strip().split(".") if p]
    if len(parts) < 2:
        raise ConfigError(f"override key {key!r} must name a section and a key (e.g. server.port)")
    node = data
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {override!r}: {p!r} is not a section")
    node[parts[-1]] = _parse_value(raw.strip())


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Load settings from an optional TOML file plus ``--set`` overrides.

    Raises:
        ConfigError: the file is missing or not TOML, or a value breaks a field's bounds
            (the message names the field, e.g. ``server.port``).
    """
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        try:
            data = tomllib.loads(p.read_text())
        except FileNotFoundError as e:
            raise ConfigError(f"config file not found: {p}") from e
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{p} is not valid TOML: {e}") from e
    for o in overrides or []:
        apply_override(data, o)
    try:
        return Config.model_validate(data)
    except ValidationError as e:
        lines = [f"  {'.'.join(str(x) for x in err['loc'])}: {err['msg']}" for err in e.errors()]
        raise ConfigError("invalid configuration:\n" + "\n".join(lines)) from e


def config_to_toml(config: Config) -> str:
    """Render a config as TOML (for reports and ``clawrl config show``)."""
    out: list[str] = []
    for section, model in config:
        out.append(f"[{section}]")
        for key, value in model.model_dump().items():
            if value is None:
                out.append(f"# {key} = (unset)")
            else:
                out.append(f"{key} = {json.dumps(value)}")
        out.append("")
    return "\n".join(out)
