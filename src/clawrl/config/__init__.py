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

import difflib
import json
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from clawrl.config.harness import HarnessConfig
from clawrl.config.judge import JUDGE_BACKEND_KINDS, JudgeConfig
from clawrl.config.method import (
    METHOD_KINDS,
    SHORTHANDS,
    BinaryRLMethod,
    CombinedMethod,
    GRPOMethod,
    HintPlacement,
    MethodConfig,
    OffMethod,
    OPDMethod,
    PrecomputedMethod,
    PRMOutcomeMethod,
    SampleNeeds,
    TrainedMethod,
    expand_method,
    merge_method,
)
from clawrl.errors import ConfigError

__all__ = [
    "METHOD_KINDS",
    "SHORTHANDS",
    "BinaryRLMethod",
    "CombinedMethod",
    "Config",
    "EngineConfig",
    "GRPOMethod",
    "HarnessConfig",
    "HintPlacement",
    "MemoryConfig",
    "MethodConfig",
    "MetricsConfig",
    "ModelConfig",
    "OPDMethod",
    "OffMethod",
    "PRMOutcomeMethod",
    "PrecomputedMethod",
    "SampleNeeds",
    "SamplingConfig",
    "ServerConfig",
    "TrainedMethod",
    "TrainerConfig",
    "apply_override",
    "config_to_toml",
    "error_lines",
    "expand_method",
    "load_config",
    "load_raw",
    "merge_method",
    "validate_config",
]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelConfig(_Section):
    """Which policy to load."""

    spec: str = Field(
        "smollm2-135m",
        min_length=1,
        description="Embedded model name (smollm2-135m; gemma3-270m, a base model), a local "
        "Hugging Face dir, a .gguf file, or a hub id.",
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="Weight dtype; float32 on CPU."
    )
    device: str = Field("cpu", min_length=1, description="Torch device, e.g. cpu or cuda:0.")
    chat_template: str | None = Field(
        None,
        min_length=1,
        description="A chat template replacing the tokenizer's: a .jinja file, a "
        "tokenizer_config.json holding one, or the template text; None: the model's own (a "
        "base model without one needs this).",
    )
    stop_ids: list[int | str] = Field(
        default_factory=list,
        description="More token ids (or single-token strings) that end a completion, beside "
        "EOS, the generation config's and the chat template's end-of-turn tokens.",
    )


class EngineConfig(_Section):
    """The token-level engine."""

    backend: Literal["transformers", "vllm"] = Field(
        "transformers",
        description="Generation backend: the in-process transformers engine, or vLLM servers "
        "(clawrl.engine.vllm: the servers in vllm_urls, or one clawrl launches).",
    )
    max_batch: int = Field(
        32, ge=1, le=1024, description="Most sequences decoded together (in-process engine)."
    )
    max_adapters: int = Field(
        8,
        ge=1,
        le=4096,
        description="Most per-user adapters held in memory (server.per_user_adapters); the least "
        "recently used beyond it are written to the engine's spill folder and read back on "
        "their user's next request (a vLLM server clawrl launches gets --max-loras and "
        "--max-cpu-loras max_adapters + 2: vLLM does the same). Also the most users whose "
        "trainer state stays in memory.",
    )
    max_context: int | None = Field(
        None, ge=16, description="Context window in tokens; default: the model's own."
    )
    vllm_urls: list[str] = Field(
        default_factory=list,
        description="Running vLLM servers (replicas) to serve through; empty: clawrl launches "
        "one (backend vllm).",
    )
    vllm_python: str | None = Field(
        None,
        description="Python with vLLM installed, for the server clawrl launches (default: "
        "$CLAWRL_VLLM_PYTHON, else .vllm/bin/python from scripts/install_vllm.sh).",
    )
    vllm_args: list[str] = Field(
        default_factory=list,
        description="More flags for the vLLM server clawrl launches (e.g. --tensor-parallel-size).",
    )
    vllm_startup_timeout_s: float = Field(
        900.0, gt=0, description="Seconds to wait for a launched vLLM server to become healthy."
    )
    vllm_api_key: str | None = Field(
        None, description="Bearer key of vLLM servers started with --api-key."
    )
    scoring_defer_s: float = Field(
        10.0,
        ge=0,
        description="vLLM: seconds an OPD teacher-scoring request may give way to generation on "
        "its replica (it waits while users' requests run, and is cancelled and re-sent when one "
        "starts); after that it runs regardless. 0: scoring never gives way.",
    )
    scoring_slots: int = Field(
        2, ge=1, le=1024, description="vLLM: teacher-scoring requests in flight per replica."
    )


class SamplingConfig(_Section):
    """Default sampling parameters (requests may override them)."""

    max_tokens: int = Field(256, ge=1, le=1_000_000, description="New tokens per completion.")
    responses_max_tokens: int = Field(
        4096,
        ge=1,
        le=1_000_000,
        description="New tokens for a Responses call without max_output_tokens (Codex sends "
        "none; capped at what fits the context).",
    )
    max_tokens_beyond_context: Literal["refuse", "clamp"] = Field(
        "refuse",
        description="A request whose prompt plus the max_tokens it sets exceeds the context: "
        "'refuse' answers 400 context_length_exceeded before generating, like OpenAI's and "
        "Anthropic's APIs; 'clamp' generates what fits (for a harness that always asks for more "
        "than a small model's context). A budget the request leaves out is always capped at "
        "what fits.",
    )
    temperature: float = Field(0.7, ge=0.0, le=10.0, description="0 means greedy decoding.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    top_k: int = Field(0, ge=0, description="Keep the k most likely tokens; 0 disables.")


UserSourceName = Literal["header", "body", "key"]
_DEFAULT_USER_FROM: tuple[UserSourceName, ...] = ("header", "body")


class ServerConfig(_Section):
    """The HTTP gateway."""

    host: str = Field("127.0.0.1", min_length=1, description="Bind address; loopback by default.")
    port: int = Field(8000, ge=0, le=65535, description="TCP port; 0 picks a free one.")
    api_key: str | None = Field(
        None, description="Required bearer key; needed to bind a non-loopback address."
    )
    user_keys_file: str | None = Field(
        None,
        description="A file of users' API keys, one 'USER KEY' per line: a request with a "
        "user's key is that user's (header and body may not name another) and sees only that "
        "user's sessions, turns and feedback; what spans every user (dashboard overview, "
        "training, judge and memory pages, /metrics, the memory routes) needs api_key, the "
        "admin key.",
    )
    store: str = Field(
        "clawrl.db",
        min_length=1,
        description="Trajectory store: a SQLite file path, or a PostgreSQL database "
        "(postgresql://USER[:PASSWORD]@HOST[:PORT]/DB) that several replicas share.",
    )
    version_poll_s: float = Field(
        2.0,
        ge=0.0,
        le=3600.0,
        description="A replica that does not train checks the store for a newer published "
        "policy version this often (seconds) and serves it; 0: never.",
    )
    user_from: list[UserSourceName] = Field(
        default_factory=lambda: list(_DEFAULT_USER_FROM),
        max_length=3,
        description="Where the gateway finds whose request it is, first match wins (each turn "
        "records it; clawrl users list): 'header' (x-clawrl-user), 'body' (OpenAI's user or "
        "safety_identifier, Anthropic's metadata.user_id when a plain id), 'key' (the API "
        "key's fingerprint: each key is one user); [] records no user.",
    )
    per_user_adapters: bool = Field(
        False,
        description="Serve each user (server.user_from) with the newest version of their own "
        "LoRA adapter on top of the policy, as the store's user_adapters table names it "
        "(clawrl users adapter USER DIR records one); users without one get the policy alone "
        "(on vLLM a user's adapter is served on the base or full fine-tuned weights: not while "
        "the policy is a LoRA version). "
        "With a training method, each user's judged turns train their own adapter (a version "
        "per step; the shared policy is not trained, turns naming no user are not trained). "
        "Trained in the serving process only (not with server.external_trainer).",
    )
    external_trainer: bool = Field(
        False,
        description="The judge and the trainer run as their own processes (clawrl judge worker, "
        "clawrl train) on this store: with a training method, clawrl serve only serves and "
        "records, and serves each policy version the trainer publishes (polled every "
        "version_poll_s).",
    )

    @field_validator("user_from")
    @classmethod
    def _distinct_sources(cls, value: list[UserSourceName]) -> list[UserSourceName]:
        if len(set(value)) != len(value):
            raise ValueError(f"names a source twice: {value}; list each of header, body, key once")
        return value


class TrainerConfig(_Section):
    """Training: the method (advantage, loss, what a sample needs), batching, LoRA, optimiser,
    checkpoints. One object for the online loop (``clawrl serve --method ...``), the demo and
    harness mode."""

    method: MethodConfig = Field(
        default_factory=OffMethod,
        description="The training method (clawrl.config.method): a shorthand (off, rl, opd, "
        "combine, grpo, dr_grpo, prm_outcome, precomputed) or a table with kind, advantage, loss, ...",
    )
    batch_size: int = Field(16, ge=1, le=4096, description="Samples per optimizer step.")
    micro_batch_size: int = Field(
        1,
        ge=1,
        le=1024,
        description="Samples per forward/backward. Rows of a pass are padded to the longest and "
        "projected to the vocabulary from the earliest completion, so online turns with prompts "
        "of different lengths train faster and far lighter one at a time on a CPU (measured: "
        "3.3 vs 11 GB peak, 14 vs 24 s per 4-sample step); raise it on a GPU.",
    )
    lora_rank: int = Field(16, ge=1, le=1024, description="LoRA rank (all linear layers).")
    lora_alpha: int = Field(32, ge=1, le=4096, description="LoRA alpha.")
    lora_dropout: float = Field(0.0, ge=0.0, lt=1.0, description="LoRA dropout.")
    full_finetune: bool = Field(False, description="Train all weights instead of LoRA.")
    lr: float = Field(1e-4, ge=0.0, le=1.0, description="AdamW learning rate (0: no update).")
    weight_decay: float = Field(0.0, ge=0.0, le=1.0, description="AdamW weight decay.")
    grad_clip: float = Field(1.0, ge=0.0, description="Max global grad norm; 0 disables.")
    warmup_steps: int = Field(0, ge=0, description="Linear LR warmup, optimizer steps.")
    max_staleness: int = Field(4, ge=0, description="Most policy versions a sample may lag.")
    teacher_scoring: Literal["auto", "engine", "trainer"] = Field(
        "auto",
        description="Where the online learner scores the OPD teacher: 'engine' (the serving "
        "engine, when the turn is collected, with the served version), 'trainer' (the trainer's "
        "own forward pass at step time, with the weights about to be trained: no scoring on the "
        "serving engine, so users' requests never share it with teacher prefills), 'auto' "
        "(trainer on vLLM, engine otherwise).",
    )
    output_dir: str = Field(
        "runs/online", min_length=1, description="Versions, checkpoints and metrics."
    )
    checkpoint_every: int = Field(
        1,
        ge=1,
        description="Checkpoint every N steps: must be 1 (every step is checkpointed before its "
        "samples rows are written, so a crash trains nothing twice); other values are refused.",
    )
    keep_checkpoints: int = Field(
        0, ge=0, description="Keep only the newest N checkpoints (0: keep every one)."
    )
    poll_interval_s: float = Field(
        0.5, gt=0.0, le=60.0, description="Seconds between store polls of an idle learner."
    )
    seed: int = Field(0, ge=0, description="Trainer random seed.")

    @field_validator("method", mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        return expand_method(value)


class MetricsConfig(_Section):
    """Where each training step's metrics go, in every mode (``clawrl serve``, the demo,
    ``clawrl train``, ``clawrl harness train``): one JSON line per step in the output
    directory's ``metrics.jsonl`` always, and the sinks below."""

    tensorboard: bool = Field(
        True, description="TensorBoard event files under OUTPUT_DIR/tensorboard."
    )
    wandb: bool = Field(
        False,
        description="Weights & Biases: one run per training run, with this whole config as the "
        "run's config (pip install 'clawrl[wandb]'; log in with `wandb login`, or use "
        "wandb_mode offline).",
    )
    wandb_project: str = Field("clawrl", min_length=1, description="W&B project.")
    wandb_entity: str | None = Field(
        None, description="W&B entity (team or user); None: the logged-in user's default."
    )
    wandb_run_name: str | None = Field(
        None, min_length=1, description="W&B run name; None: the output directory's name."
    )
    wandb_mode: Literal["online", "offline"] = Field(
        "online",
        description="online: stream to the W&B server; offline: write the run under "
        "OUTPUT_DIR/wandb, to upload later with `wandb sync`.",
    )


class MemoryConfig(_Section):
    """Preference memory (:mod:`clawrl.memory`): directives taken from judges' hints and
    feedback comments, added to the system message of main calls."""

    enabled: bool = Field(
        False,
        description="Add the memory's entries to the system message of every main call "
        "(clawrl serve --memory). Off by default: on the student demo (one seed) the memory "
        "alone raised the held-out score from 0.35 to 0.59 in 16 steps' sessions, but with "
        "training (memory.distill) answers looped more often, and a memory of wrong hints "
        "would steer every answer.",
    )
    max_entries: int = Field(
        8, ge=1, le=64, description="Most active entries; past it the least recently "
        "updated is evicted."
    )  # fmt: skip
    sync_s: float = Field(
        1.0, ge=0.0, description="Least seconds between two reads of new hints and feedback "
        "comments from the store (feedback is taken at once)."
    )  # fmt: skip
    distill: bool = Field(
        False,
        description="Train turns that had memory without it (context distillation: the "
        "teacher is the policy with the memory block, plus the turn's hint when there is one; "
        "the student sees the client's messages alone). Needs a method with a teacher (opd or "
        "combine). Entries the weights alone follow are retired (retire_gap, retire_turns).",
    )
    retire_gap: float = Field(
        0.05,
        ge=0.0,
        description="Retire an entry once the mean teacher-student gap (log-prob with the "
        "memory minus without, nats per sampled token, current weights) over its last "
        "retire_turns distilled turns is at most this.",
    )
    retire_turns: int = Field(
        8, ge=1, description="Distilled turns an entry needs before it can be retired."
    )


class Config(BaseModel):
    """All clawrl settings, one section per component."""

    model_config = ConfigDict(extra="forbid")

    model: ModelConfig = Field(default_factory=ModelConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    judge: JudgeConfig = Field(default_factory=JudgeConfig)
    harness: HarnessConfig = Field(default_factory=HarnessConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    memory: MemoryConfig = Field(default_factory=MemoryConfig)

    @model_validator(mode="after")
    def _per_user_adapters_in_process(self) -> Config:
        if (
            self.server.per_user_adapters
            and self.server.external_trainer
            and self.trainer.method.trains
        ):
            raise ValueError(
                "server.per_user_adapters trains each user's adapter inside clawrl serve (its "
                "online learner); clawrl train trains the shared policy only: turn "
                "server.external_trainer off, or per_user_adapters off"
            )
        return self


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
    return validate_config(load_raw(path, overrides))


def validate_config(data: dict[str, Any]) -> Config:
    """Validate raw settings (as :func:`load_raw` gives them) into a :class:`Config`.

    Raises:
        ConfigError: a value breaks a field's bounds (the message names the field).
    """
    try:
        return Config.model_validate(data)
    except ValidationError as e:
        raise ConfigError("invalid configuration:\n" + "\n".join(error_lines(e))) from e


def load_raw(path: str | Path | None = None, overrides: list[str] | None = None) -> dict[str, Any]:
    """The raw settings of an optional TOML file with ``--set`` overrides applied, not validated
    (so that command-line flags can still be merged in before :func:`validate_config`).

    Raises:
        ConfigError: the file is missing or not TOML, or an override is malformed.
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
    return data


def error_lines(error: ValidationError) -> list[str]:
    """One ``  field.path: message`` line per problem, for a person to read.

    A value of a union without a pydantic discriminator (the ``clawrl.algorithms`` configs
    embedded in ``trainer.method``, e.g. ``loss.ratio``) is tried against every member, and
    pydantic reports every member's failure; only the members whose ``kind`` matched the value
    are kept (all of them if none matched), and the member's class name is left out of the path.
    """
    errors = error.errors()
    member_of: dict[int, tuple[tuple[Any, ...], str]] = {}
    for n, err in enumerate(errors):
        loc = tuple(err["loc"])
        for i, part in enumerate(loc):
            if isinstance(part, str) and part[:1].isupper():  # a union member's class name
                member_of[n] = (loc[:i], part)
                break
    wrong_kind = {
        member_of[n]
        for n, err in enumerate(errors)
        if n in member_of
        and err["type"] == "literal_error"
        and tuple(err["loc"])[len(member_of[n][0]) + 1 :] == ("kind",)
    }
    matched_unions = {
        prefix for prefix, name in member_of.values() if (prefix, name) not in wrong_kind
    }
    lines = []
    for n, err in enumerate(errors):
        loc = tuple(err["loc"])
        if n in member_of:
            prefix, name = member_of[n]
            if prefix in matched_unions and (prefix, name) in wrong_kind:
                continue
            loc = (*prefix, *loc[len(prefix) + 1 :])
        for union, tags in (("method", METHOD_KINDS), ("backend", JUDGE_BACKEND_KINDS)):
            if union in loc:  # drop the discriminator tag pydantic puts after it (method.rl.loss)
                i = loc.index(union) + 1
                if i < len(loc) and loc[i] in tags:
                    loc = loc[:i] + loc[i + 1 :]
        msg = str(err["msg"]).removeprefix("Value error, ") if not loc else err["msg"]
        line = f"  {'.'.join(str(x) for x in loc)}: {msg}" if loc else f"  {msg}"
        if err["type"] == "extra_forbidden":
            line += _known_keys_hint(loc)
        if line not in lines:
            lines.append(line)
    return lines


def _known_keys_hint(loc: tuple[Any, ...]) -> str:
    """For an unknown key at ``loc``: the closest known key of its section, or the section's
    keys (``""`` where the section is not a plain settings model, e.g. a method union)."""
    model: Any = Config
    for part in loc[:-1]:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        if field is None or not (isinstance(field.annotation, type)
                                 and issubclass(field.annotation, BaseModel)):  # fmt: skip
            return ""
        model = field.annotation
    names = sorted(model.model_fields)
    prefix = ".".join(str(x) for x in loc[:-1])
    close = difflib.get_close_matches(str(loc[-1]).replace("-", "_"), names, n=1, cutoff=0.6)
    if close:
        return f" (did you mean {prefix + '.' if prefix else ''}{close[0]}?)"
    return f" (the keys of {prefix or 'the file'}: {', '.join(names)})"


def _toml_value(value: Any) -> str:
    if isinstance(value, dict):
        items = sorted(value.items(), key=lambda kv: kv[0] != "kind")  # the union tag first
        inner = ", ".join(f"{k} = {_toml_value(v)}" for k, v in items if v is not None)
        return "{ " + inner + " }"
    return json.dumps(value)


def config_to_toml(config: Config) -> str:
    """Render a config as TOML (for reports and ``--config`` files); unset values as comments."""
    out: list[str] = []
    for section, model in config:
        out.append(f"[{section}]")
        for key, value in model.model_dump(mode="json").items():
            if value is None:
                out.append(f"# {key} = (unset)")
            else:
                out.append(f"{key} = {_toml_value(value)}")
        out.append("")
    return "\n".join(out)
