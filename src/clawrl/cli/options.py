"""Training and judge flags shared by ``clawrl serve``, ``clawrl demo`` and ``clawrl harness``.

Every flag is a shorthand for a setting of :class:`clawrl.config.Config` (``--set`` reaches the
rest, e.g. ``--set 'trainer.method.loss.ratio={kind="tis", cap=2.0}'``); the flags that were given
are applied over ``--config`` / ``--set``, and the result is validated once.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from clawrl.config import SHORTHANDS, Config, load_raw, merge_method, validate_config
from clawrl.errors import ConfigError

_TRAINER_FLAGS = {
    "batch_size": "batch_size", "micro_batch_size": "micro_batch_size",
    "lora_rank": "lora_rank", "lora_alpha": "lora_alpha", "full_finetune": "full_finetune",
    "lr": "lr", "weight_decay": "weight_decay", "grad_clip": "grad_clip",
    "warmup_steps": "warmup_steps", "max_staleness": "max_staleness", "output_dir": "output_dir",
}  # fmt: skip
"""flag dest -> ``trainer`` field."""

_METHOD_FLAGS: dict[str, tuple[str, ...] | dict[str, tuple[str, ...]]] = {
    "kl_beta": ("loss", "kl", "beta"),
    "eps_low": ("loss", "eps_low"),
    "eps_high": ("loss", "eps_high"),
    "dual_clip": ("loss", "dual_clip"),
    "mask_truncated": ("loss", "mask_truncated"),
    "teacher": ("teacher",),
    "train_on_zero": ("train_on_zero",),
    "w_rl": ("advantage", "w_rl"),
    "w_opd": ("advantage", "w_opd"),
    "opd_clip": {"opd": ("advantage", "clip"), "combine": ("advantage", "opd_clip")},
}
"""flag dest -> path inside ``trainer.method`` (or, per method kind, a path each)."""

_KIND_FLAGS = {"ratio": ("loss", "ratio"), "aggregation": ("loss", "aggregation")}
"""flag dest -> path of a union inside ``trainer.method`` set to ``{kind = VALUE}``."""


def add_engine_options(p: argparse.ArgumentParser) -> None:
    """``--engine`` and the vLLM backend's flags (settings ``engine.*``)."""
    g = p.add_argument_group("engine (policy serving)")
    g.add_argument("--engine", choices=["transformers", "vllm"],
                   help="in-process transformers (default), or vLLM servers")  # fmt: skip
    g.add_argument("--vllm-url", action="append", metavar="URL",
                   help="a running vLLM server started with --logprobs-mode processed_logprobs "
                   "and --enable-lora (repeatable: replicas, balanced); without it clawrl "
                   "launches one")  # fmt: skip
    g.add_argument("--vllm-arg", action="append", metavar="ARG",
                   help="a flag for the vLLM server clawrl launches, e.g. "
                   "--vllm-arg=--tensor-parallel-size --vllm-arg=2 (repeatable)")  # fmt: skip
    g.add_argument("--vllm-python", metavar="PATH",
                   help="Python with vLLM for the launched server (default .vllm/bin/python, "
                   "made by scripts/install_vllm.sh)")  # fmt: skip


def add_method_option(
    g: argparse._ArgumentGroup, choices: Sequence[str], default_help: str
) -> None:
    """``--method`` with the given shorthands (:data:`clawrl.config.SHORTHANDS`)."""
    g.add_argument("--method", choices=list(choices), help=default_help)


def add_trainer_options(g: argparse._ArgumentGroup, *, batch_size: bool = True) -> None:
    """Batching, LoRA, optimiser and loss flags (defaults: ``clawrl.config``); harness mode
    trains each step on what its rollouts produced, so it takes no ``--batch-size``."""
    if batch_size:
        g.add_argument("--batch-size", type=int, help="samples per training step (16)")
    g.add_argument("--micro-batch-size", type=int, help="samples per forward pass (1)")
    g.add_argument("--lora-rank", type=int, help="LoRA rank, all linear layers (16)")
    g.add_argument("--lora-alpha", type=int, help="LoRA alpha (32)")
    g.add_argument("--full-finetune", action="store_true", default=None,
                   help="train all weights instead of a LoRA adapter")  # fmt: skip
    g.add_argument("--lr", type=float, help="AdamW learning rate (1e-4)")
    g.add_argument("--weight-decay", type=float, help="AdamW weight decay (0)")
    g.add_argument("--grad-clip", type=float, help="max gradient norm, 0 = off (1.0)")
    g.add_argument("--warmup-steps", type=int, help="linear LR warmup steps (0)")
    g.add_argument("--max-staleness", type=int, help="most versions a sample may lag (4)")
    g.add_argument("--kl-beta", type=float, help="k3 KL penalty to the base weights (0.02)")
    g.add_argument("--eps-low", type=float, help="PPO lower clip (0.2)")
    g.add_argument("--eps-high", type=float, help="PPO upper clip, clip-higher (0.28)")
    g.add_argument("--dual-clip", type=float, help="dual clip c > 1 for A < 0 tokens (off)")
    g.add_argument("--ratio", choices=["sampling", "old", "tis", "mis"],
                   help="importance ratio against the engine's log-probs (sampling, default), "
                   "the trainer's (old), or old with a truncated (tis) / masked (mis) "
                   "trainer-engine mismatch weight")  # fmt: skip
    g.add_argument("--aggregation",
                   choices=["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"],
                   help="how token losses become one number (token_mean)")  # fmt: skip
    g.add_argument("--mask-truncated", action="store_true", default=None,
                   help="leave completions cut at max_tokens out of the loss")  # fmt: skip


def add_online_options(p: argparse.ArgumentParser) -> None:
    """Flags of ``serve --method rl|opd|combine`` (defaults come from the ``trainer`` and
    ``judge`` config sections)."""
    g = p.add_argument_group(
        "online training (OpenClaw-RL)",
        "With --method rl|opd|combine the server also judges every turn from its next state "
        "(the user's reply, a tool's output, explicit feedback) and trains the policy every "
        "--batch-size samples, swapping each new version in between requests. With "
        "--external-trainer the judge and the trainer run as their own processes (clawrl judge "
        "worker, clawrl train) and this server serves each version they publish. Any other "
        "setting: --set trainer.method.KEY=VALUE (see clawrl.config.method).",
    )
    add_online_method_options(
        g, "off (default): serve and record only; rl: Binary RL; opd: hindsight OPD; combine: both"
    )
    g.add_argument("--external-trainer", action="store_true", default=None,
                   help="the judge and the trainer run as their own processes on this store "
                   "(clawrl judge worker, clawrl train): only serve, record, and load each "
                   "version they publish")  # fmt: skip
    add_judge_options(p)


def add_online_method_options(g: argparse._ArgumentGroup, method_help: str) -> None:
    """``--method rl|opd|combine``, the trainer's flags, ``--output-dir`` and the OPD/combine
    flags: what ``clawrl serve`` and ``clawrl train`` share."""
    add_method_option(g, ["off", "rl", "opd", "combine"], method_help)
    add_trainer_options(g)
    g.add_argument("--output-dir", help="versions, checkpoints, metrics (runs/online); a "
                   "restart with the same dir and --store resumes")  # fmt: skip
    g.add_argument("--teacher", choices=["policy", "base"],
                   help="OPD teacher: current policy (default) or frozen base weights")  # fmt: skip
    g.add_argument("--w-rl", type=float, help="combine: weight of the judge reward (1.0)")
    g.add_argument("--w-opd", type=float, help="combine: weight of the OPD advantage (1.0)")
    g.add_argument("--opd-clip", type=float, help="clip of the OPD advantage (off)")
    g.add_argument("--train-on-zero", action="store_true", default=None,
                   help="rl/combine: train on score-0 turns too")  # fmt: skip


def add_judge_options(p: argparse.ArgumentParser) -> None:
    """The PRM judge's flags."""
    g = p.add_argument_group("judge")
    g.add_argument("--judge", choices=["head", "choice", "generative", "openai"],
                   help="PRM judge backend (head: the trained probes on the embedded model, "
                   "default; choice: calibrated verdict scoring; generative / openai: a model "
                   "that writes its verdict and hint)")  # fmt: skip
    g.add_argument("--judge-votes", type=int, help="votes per judgment, m (5)")
    g.add_argument("--judge-url", help="OpenAI-compatible judge endpoint (with --judge openai)")
    g.add_argument("--judge-model", help="judge model name at --judge-url, or a local spec")
    g.add_argument("--judge-api-key-env", help="env var holding the judge endpoint's key")


def _put(node: dict[str, Any], path: Sequence[str], value: Any) -> None:
    for key in path[:-1]:
        child = node.get(key)
        if not isinstance(child, dict):
            child = node[key] = {}
        node = child
    node[path[-1]] = value


def config_with_flags(args: argparse.Namespace, *, default_method: str | None = None) -> Config:
    """``--config`` and ``--set``, then the training and judge flags that were given, validated
    once (so a flag and a ``--set`` of the same method table combine).

    Args:
        args: the parsed command line (``config``, ``overrides`` and any flags of this module).
        default_method: the method shorthand when neither ``--method`` nor the settings name a
            kind (harness mode: ``grpo``).

    Raises:
        ConfigError: a malformed file or value, a flag that does not apply to the method (e.g.
            ``--teacher`` with ``--method rl``), or ``--method`` naming another kind than the
            settings; the message names the setting.
    """
    data = load_raw(getattr(args, "config", None), getattr(args, "overrides", None))
    apply_flags(data, args, default_method=default_method)
    return validate_config(data)


def apply_engine_flags(data: dict[str, Any], args: argparse.Namespace) -> None:
    """Merge :func:`add_engine_options`' flags that were given into raw settings ``data``.

    Raises:
        ConfigError: a vLLM flag with ``--engine transformers``.
    """
    engine = data.setdefault("engine", {})
    if getattr(args, "engine", None):
        engine["backend"] = args.engine
    for flag, key in (("vllm_url", "vllm_urls"), ("vllm_arg", "vllm_args")):
        values = getattr(args, flag, None)
        if values:
            engine[key] = list(values)
    if getattr(args, "vllm_python", None):
        engine["vllm_python"] = args.vllm_python
    vllm_flags = [f"--{f.replace('_', '-')}" for f in ("vllm_url", "vllm_arg", "vllm_python")
                  if getattr(args, f, None)]  # fmt: skip
    if vllm_flags and engine.get("backend", "vllm") != "vllm":
        verb = "needs" if len(vllm_flags) == 1 else "need"
        raise ConfigError(f"{', '.join(vllm_flags)} {verb} the vLLM engine, but the engine is "
                          f"{engine['backend']!r} (--engine vllm, or drop them)")  # fmt: skip
    if (engine.get("vllm_urls") or engine.get("vllm_args")) and "backend" not in engine:
        engine["backend"] = "vllm"


def apply_flags(
    data: dict[str, Any], args: argparse.Namespace, *, default_method: str | None = None
) -> None:
    """Merge the flags that were given into raw settings ``data`` (in place, not validated).

    Raises:
        ConfigError: ``--method`` contradicts the settings' method kind, or is unknown.
    """
    if getattr(args, "memory", None):
        memory = data.setdefault("memory", {})
        if not isinstance(memory, dict):
            raise ConfigError("memory must be a table of settings")
        memory["enabled"] = True
    if getattr(args, "per_user_adapters", None):
        server = data.setdefault("server", {})
        if not isinstance(server, dict):
            raise ConfigError("server must be a table of settings")
        server["per_user_adapters"] = True
    if getattr(args, "distill", None):
        memory = data.setdefault("memory", {})
        if not isinstance(memory, dict):
            raise ConfigError("memory must be a table of settings")
        memory["distill"] = True
    trainer = data.setdefault("trainer", {})
    if not isinstance(trainer, dict):
        raise ConfigError("trainer must be a table of settings")
    shorthand = getattr(args, "method", None)
    current = trainer.get("method")
    kindless = current is None or (isinstance(current, dict) and "kind" not in current)
    if shorthand is None and default_method is not None and kindless:
        shorthand = default_method
    if shorthand is not None:
        try:
            trainer["method"] = merge_method(current, shorthand)
        except ValueError as e:
            raise ConfigError(str(e)) from e
    for flag, key in _TRAINER_FLAGS.items():
        value = getattr(args, flag, None)
        if value is not None:
            trainer[key] = value
    method = trainer.get("method")
    if isinstance(method, str) and method in SHORTHANDS:  # a shorthand from --config / --set
        method = trainer["method"] = merge_method(None, method)
    kind = method.get("kind") if isinstance(method, dict) else None
    for flag, where in _METHOD_FLAGS.items():
        value = getattr(args, flag, None)
        if value is None:
            continue
        path = (
            where.get(kind or "", next(iter(where.values()))) if isinstance(where, dict) else where
        )
        if not isinstance(method, dict):
            method = trainer["method"] = {}
        _put(method, path, value)
    for flag, path in _KIND_FLAGS.items():
        value = getattr(args, flag, None)
        if value is not None:
            if not isinstance(method, dict):
                method = trainer["method"] = {}
            _put(method, path, {"kind": value})
    if getattr(args, "external_trainer", None):
        server = data.setdefault("server", {})
        if isinstance(server, dict):
            server["external_trainer"] = True
    apply_engine_flags(data, args)
    judge = data.setdefault("judge", {})
    if getattr(args, "judge", None):
        backend: dict[str, Any] = {"kind": args.judge}
        given = judge.get("backend")
        if isinstance(given, dict) and given.get("kind", "head") == args.judge:
            # the same backend's settings from --config / --set stay (hints, min_confidence)
            backend = {**given, **backend}
        if args.judge == "openai":
            backend.update(url=args.judge_url or "", model=args.judge_model or "")
            if args.judge_api_key_env:
                backend["api_key_env"] = args.judge_api_key_env
        judge["backend"] = backend
    if getattr(args, "judge_model", None) and getattr(args, "judge", None) != "openai":
        judge["model"] = args.judge_model  # a local judge's weights
    if getattr(args, "judge_votes", None):
        judge["votes"] = args.judge_votes
