"""``clawrl serve`` options of the online loop, and building the running service from them."""

from __future__ import annotations

import argparse
from typing import Any

from clawrl.config import Config


def add_online_options(p: argparse.ArgumentParser) -> None:
    """Flags of ``serve --method rl|opd|combine`` (defaults come from the ``trainer`` and
    ``judge`` config sections)."""
    g = p.add_argument_group(
        "online training (OpenClaw-RL)",
        "With --method rl|opd|combine the server also judges every turn from its next state "
        "(the user's reply, a tool's output, explicit feedback) and trains the policy every "
        "--batch-size samples, swapping each new version in between requests.",
    )
    g.add_argument("--method", choices=["off", "rl", "opd", "combine"],
                   help="off (default): serve and record only; rl: Binary RL; opd: hindsight "
                   "OPD; combine: both")  # fmt: skip
    g.add_argument("--batch-size", type=int, help="samples per training step (16)")
    g.add_argument("--lora-rank", type=int, help="LoRA rank, all linear layers (16)")
    g.add_argument("--lora-alpha", type=int, help="LoRA alpha (32)")
    g.add_argument("--full-finetune", action="store_true", default=None,
                   help="train all weights instead of a LoRA adapter")  # fmt: skip
    g.add_argument("--lr", type=float, help="AdamW learning rate (1e-4)")
    g.add_argument("--weight-decay", type=float, help="AdamW weight decay (0)")
    g.add_argument("--grad-clip", type=float, help="max gradient norm, 0 = off (1.0)")
    g.add_argument("--warmup-steps", type=int, help="linear LR warmup steps (0)")
    g.add_argument("--max-staleness", type=int, help="most versions a sample may lag (4)")
    g.add_argument("--teacher", choices=["policy", "base"],
                   help="OPD teacher: current policy (default) or frozen base weights")  # fmt: skip
    g.add_argument("--output-dir", help="versions, checkpoints, metrics (runs/online); a "
                   "restart with the same dir and --store resumes")  # fmt: skip
    g.add_argument("--judge", choices=["choice", "generative", "openai"],
                   help="PRM judge backend (choice: calibrated verdict scoring, default)")  # fmt: skip
    g.add_argument("--judge-votes", type=int, help="votes per judgment, m (3)")
    g.add_argument("--judge-url", help="OpenAI-compatible judge endpoint (with --judge openai)")
    g.add_argument("--judge-model", help="judge model name at --judge-url, or a local spec")
    g.add_argument("--judge-api-key-env", help="env var holding the judge endpoint's key")


_TRAINER_FLAGS = {
    "method": "method", "batch_size": "batch_size", "lora_rank": "lora_rank",
    "lora_alpha": "lora_alpha", "full_finetune": "full_finetune", "lr": "lr",
    "weight_decay": "weight_decay", "grad_clip": "grad_clip", "warmup_steps": "warmup_steps",
    "max_staleness": "max_staleness", "teacher": "teacher", "output_dir": "output_dir",
}  # fmt: skip


def apply_online_flags(cfg: Config, args: argparse.Namespace) -> Config:
    """Return ``cfg`` with the online flags that were given applied (validated)."""
    data = cfg.model_dump()
    for flag, key in _TRAINER_FLAGS.items():
        value = getattr(args, flag, None)
        if value is not None:
            data["trainer"][key] = value
    judge = data.setdefault("judge", {})
    if getattr(args, "judge", None):
        backend: dict[str, Any] = {"kind": args.judge}
        if args.judge == "openai":
            backend.update(url=args.judge_url or "", model=args.judge_model or "")
            if args.judge_api_key_env:
                backend["api_key_env"] = args.judge_api_key_env
        judge["backend"] = backend
    elif getattr(args, "judge_model", None):
        judge["model"] = args.judge_model
    if getattr(args, "judge_votes", None):
        judge["votes"] = args.judge_votes
    return Config.model_validate(data)


def build_judge(cfg: Config, policy: Any, max_batch: int) -> tuple[Any, Any]:
    """The judge and the engine it owns (None for an endpoint judge).

    Local backends run on their own engine over a separate copy of the judge model (the
    policy's base weights by default), so training never changes the judge.
    """
    from clawrl.engine import TransformersEngine
    from clawrl.judge import Judge
    from clawrl.judge.backends import build_backend
    from clawrl.judge.config import OpenAIJudgeConfig
    from clawrl.models import load_policy

    jc = cfg.judge
    engine = None
    tokenizer = None
    name = ""
    if not isinstance(jc.backend, OpenAIJudgeConfig):
        spec = jc.model or cfg.model.spec
        judge_policy = load_policy(spec, dtype=cfg.model.dtype, device=cfg.model.device)
        engine = TransformersEngine.from_policy(judge_policy, max_batch=max_batch)
        tokenizer, name = judge_policy.tokenizer, spec
    backend = build_backend(jc.backend, engine=engine, tokenizer=tokenizer, model=name)
    judge = Judge(backend, votes=jc.votes, timeout_s=jc.timeout_s, hint_quorum=jc.hint_quorum)
    return judge, engine


def build_service(cfg: Config, policy: Any, engine: Any, store: Any, judge: Any) -> Any:
    """The :class:`~clawrl.trainer.service.OnlineService` for ``cfg.trainer``."""
    from clawrl.trainer.online import OnlineSettings
    from clawrl.trainer.service import OnlineService
    from clawrl.trainer.trainer import TrainerSettings

    t = cfg.trainer
    online = OnlineSettings(
        method=t.method,  # type: ignore[arg-type]
        batch_size=t.batch_size,
        train_on_zero=t.train_on_zero,
        teacher=t.teacher,
        checkpoint_every=t.checkpoint_every,
    )
    settings = TrainerSettings(
        method=t.method,  # type: ignore[arg-type]
        lr=t.lr, weight_decay=t.weight_decay, grad_clip=t.grad_clip,
        warmup_steps=t.warmup_steps, full_finetune=t.full_finetune, lora_rank=t.lora_rank,
        lora_alpha=t.lora_alpha, micro_batch_size=t.micro_batch_size,
        max_staleness=t.max_staleness, kl_beta=t.kl_beta, eps_low=t.eps_low,
        eps_high=t.eps_high, w_rl=t.w_rl, w_opd=t.w_opd, seed=t.seed,
    )  # fmt: skip
    return OnlineService(store, engine, policy, judge.judge, online, settings, t.output_dir,
                         judge_timeout_s=cfg.judge.timeout_s)  # fmt: skip
