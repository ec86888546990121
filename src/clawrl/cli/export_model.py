"""``clawrl export-model``: a trained policy version as a Hugging Face model directory."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from clawrl.cli.common import quiet_transformers
from clawrl.errors import ConfigError


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "export-model",
        help="write a trained policy version as a Hugging Face model (merged) or adapter",
        description="Load policy version V from an online run's --output-dir (its LoRA adapter "
        "under policies/vV) and write it to --out: by default the base model with the adapter "
        "merged in, plus the tokenizer, which transformers (and so vLLM) load as is; with "
        "--adapter-only, the PEFT adapter directory.",
        epilog="example: clawrl export-model --output-dir runs/online --version 16 --out ./v16",
    )
    p.add_argument("--version", type=int, required=True, help="policy version to export")
    p.add_argument("--output-dir", default="runs/online", help="the run's --output-dir")
    p.add_argument("--model", default="smollm2-135m", help="the base model spec of the run")
    p.add_argument("--chat-template", metavar="FILE",
                   help="the chat template the run served with (saved into the export, so the "
                   "exported directory serves with it)")  # fmt: skip
    p.add_argument("--out", required=True, help="directory to write (must not exist)")
    p.add_argument("--adapter-only", action="store_true", help="copy the adapter, no merge")
    p.set_defaults(func=run)


def export_model(
    output_dir: str | Path,
    version: int,
    out: str | Path,
    *,
    model: str,
    adapter_only: bool,
    chat_template: str | None = None,
) -> Path:
    """Write version ``version`` of a run to ``out``; returns ``out``.

    Raises:
        ConfigError: the version's adapter does not exist, or ``out`` exists.
    """
    adapter = Path(output_dir) / "policies" / f"v{version}"
    out = Path(out)
    if not (adapter / "adapter_config.json").is_file():
        have = sorted(p.name for p in (Path(output_dir) / "policies").glob("v*"))
        raise ConfigError(f"no adapter for version {version} at {adapter}; found: {have or 'none'}")
    if out.exists():
        raise ConfigError(f"{out} already exists; choose a new --out")
    if adapter_only:
        shutil.copytree(adapter, out)
        return out
    from peft import PeftModel

    from clawrl.models import load_policy

    policy = load_policy(model, chat_template=chat_template)
    merged = PeftModel.from_pretrained(policy.model, str(adapter)).merge_and_unload()
    merged.save_pretrained(out, safe_serialization=True)
    policy.tokenizer.save_pretrained(out)
    return out


def run(args: argparse.Namespace) -> int:
    quiet_transformers()
    out = export_model(args.output_dir, args.version, args.out, model=args.model,
                       adapter_only=args.adapter_only, chat_template=args.chat_template)  # fmt: skip
    print(f"wrote policy version {args.version} to {out}")
    return 0
