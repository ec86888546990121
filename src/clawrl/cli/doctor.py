"""``clawrl doctor``: what this machine has, and what clawrl can use."""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import shutil
import sys
from typing import Any

from clawrl.cli.common import (
    add_config_options,
    add_model_options,
    config_from_args,
    quiet_transformers,
    with_model_flags,
)


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "doctor",
        help="check Python, torch, the model cache, memory and optional backends; with --model, "
        "whether a model will work",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Print what clawrl finds on this machine. Exits 1 if something required "
        "is missing (torch, transformers or the embedded model package).\n\n"
        "With --model SPEC it also loads that model and checks what clawrl needs of it: a chat "
        "template, the stop ids (EOS and the template's end-of-turn token), a render -> parse "
        "round trip of a conversation with a tool call, the context length, one short "
        "generation, and which model judges it. Exits 1 if a check fails; each failed check "
        "says what to do.",
        epilog="examples:\n  clawrl doctor\n  clawrl doctor --model ./my-hf-model\n"
        "  clawrl doctor --model model.gguf --chat-template gemma3.jinja\n"
        "  clawrl doctor --model gemma3-270m",
    )
    add_model_options(p)
    add_config_options(p)
    p.set_defaults(func=run)


def _mem() -> str:
    try:
        with open("/proc/meminfo") as f:
            info = dict(line.split(":", 1) for line in f)
        avail = int(info["MemAvailable"].split()[0]) / 1024**2
        total = int(info["MemTotal"].split()[0]) / 1024**2
        return f"{avail:.1f} GiB free of {total:.1f} GiB"
    except (OSError, KeyError, ValueError):
        return "unknown"


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from clawrl.models import cache_dir, embedded_gguf_path
    from clawrl.models.loading import DEFAULT_MODEL

    console = Console()
    table = Table(title="clawrl doctor", show_header=True)
    table.add_column("check")
    table.add_column("status")
    table.add_column("detail", overflow="fold")
    ok = True

    def row(name: str, good: bool | None, detail: str) -> None:
        mark = {True: "[green]ok[/]", False: "[red]missing[/]", None: "[yellow]optional[/]"}
        table.add_row(name, mark[good], detail)

    row("python", sys.version_info >= (3, 11), f"{platform.python_version()} ({sys.executable})")
    try:
        import torch

        threads = torch.get_num_threads()
        cuda = torch.cuda.is_available()
        row("torch", True, f"{torch.__version__}; {threads} threads; cuda={cuda}")
    except ImportError:
        row("torch", False, "pip install torch==2.13.0 (CPU) or a CUDA build")
        ok = False
    for mod in ("transformers", "peft", "gguf", "fastapi", "uvicorn"):
        spec = importlib.util.find_spec(mod)
        if spec is None:
            row(mod, False, "not installed")
            ok = False
        else:
            from importlib.metadata import version

            row(mod, True, version(mod))
    try:
        gguf = embedded_gguf_path(DEFAULT_MODEL)
        row("embedded model", True, f"{gguf} ({gguf.stat().st_size / 1e6:.0f} MB)")
    except Exception as e:  # report, do not crash: this is a diagnostic
        row("embedded model", False, str(e))
        ok = False
    cache = cache_dir() / "models" / DEFAULT_MODEL
    converted = (cache / "model.safetensors").is_file()
    row(
        "model cache",
        True if converted else None,
        f"{cache} ({'converted' if converted else 'converted on first load, ~20 s'})",
    )
    row("memory", True, _mem())
    free = shutil.disk_usage(cache_dir().parent if cache_dir().parent.exists() else "/").free
    row("disk", True, f"{free / 1e9:.0f} GB free near the cache")
    row("cpu cores", True, str(os.cpu_count()))
    row("vllm", *_vllm())
    row("sglang", None, "not supported as an engine (docs/vllm.md says what it would take)")
    for mod, what in (
        ("openai", "SDK"),
        ("anthropic", "SDK"),
        ("tensorboard", "metrics"),
    ):
        found = importlib.util.find_spec(mod) is not None
        row(mod, True if found else None, what + ("" if found else " (not installed)"))
    console.print(table)
    if args.model or args.chat_template:
        ok = _model_table(console, args) and ok
    return 0 if ok else 1


def _model_table(console: Any, args: argparse.Namespace) -> bool:
    """The ``--model`` checks (:mod:`clawrl.cli.doctor_model`) as a table; True if none failed."""
    from rich.table import Table

    from clawrl.cli.doctor_model import model_checks

    quiet_transformers()
    cfg = with_model_flags(config_from_args(args), args)
    with console.status(f"checking {cfg.model.spec} (a GGUF file converts on its first load)"):
        checks = model_checks(cfg)
    table = Table(title=f"model {cfg.model.spec}", show_header=True)
    table.add_column("check")
    table.add_column("status")
    table.add_column("detail", overflow="fold")
    mark = {True: "[green]ok[/]", False: "[red]fails[/]", None: "[yellow]warning[/]"}
    for c in checks:
        table.add_row(c.name, mark[c.ok], c.detail)
    console.print(table)
    return all(c.ok is not False for c in checks)


def _vllm() -> tuple[bool | None, str]:
    """Whether ``clawrl serve --engine vllm`` can launch a server here (a Python with vLLM)."""
    import subprocess

    from clawrl.engine.vllm import default_vllm_python

    python = default_vllm_python()
    if python is None:
        return None, ("engine backend: not installed (scripts/install_vllm.sh puts vLLM's CPU "
                      "build in .vllm/; or give running servers with --vllm-url)")  # fmt: skip
    try:
        out = subprocess.run(
            [python, "-c", "import vllm; print(vllm.__version__)"],
            capture_output=True, text=True, timeout=120, check=True,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError) as e:
        return False, f"{python} cannot import vllm: {e}"
    return True, f"engine backend: vLLM {out.stdout.strip()} ({python})"
