"""``clawrl generate``: answer one prompt with a policy, optionally showing every token."""

from __future__ import annotations

import argparse
import asyncio
import sys

from clawrl.cli.common import (
    add_config_options,
    add_model_options,
    config_from_args,
    quiet_transformers,
    with_model_flags,
)


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "generate",
        help="generate an answer to one prompt (chat template applied)",
        description="Render PROMPT as a user message with the policy's chat template, sample "
        "an answer token by token and stream it to the terminal. With --show-tokens, also "
        "print each sampled token id, its text and its sampling log-prob (nats).",
        epilog='example: clawrl generate --max-tokens 64 --temperature 0 "What is 2+2?"',
    )
    p.add_argument("prompt", help="the user message")
    add_model_options(p)
    p.add_argument("--system", help="system prompt (default: the template's own)")
    p.add_argument("--max-tokens", type=int, default=128, help="new tokens at most (128)")
    p.add_argument("--temperature", type=float, default=None, help="0 = greedy (default 0.7)")
    p.add_argument("--top-p", type=float, default=None, help="nucleus mass (1.0)")
    p.add_argument("--top-k", type=int, default=None, help="top-k filter, 0 = off (0)")
    p.add_argument("--seed", type=int, default=None, help="sampling seed")
    p.add_argument("--show-tokens", action="store_true", help="print id, piece, log-prob")
    add_config_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    quiet_transformers()
    from rich.console import Console
    from rich.table import Table

    from clawrl.chat import ChatMessage, render_prompt
    from clawrl.engine import SamplingParams, TransformersEngine
    from clawrl.runtime import load_model

    cfg = with_model_flags(config_from_args(args), args)
    spec = cfg.model.spec
    err = Console(stderr=True)
    with err.status(f"loading {spec} (the first load of a GGUF converts it, 20-80 s)"):
        policy = load_model(cfg)
    messages = []
    if args.system:
        messages.append(ChatMessage(role="system", content=args.system))
    messages.append(ChatMessage(role="user", content=args.prompt))
    prompt = render_prompt(policy.tokenizer, messages)
    s = cfg.sampling
    params = SamplingParams(
        max_tokens=args.max_tokens,
        temperature=s.temperature if args.temperature is None else args.temperature,
        top_p=s.top_p if args.top_p is None else args.top_p,
        top_k=s.top_k if args.top_k is None else args.top_k,
        seed=args.seed,
    )
    engine = TransformersEngine.from_policy(policy, max_batch=cfg.engine.max_batch)
    tok = policy.tokenizer
    events = []

    async def stream() -> None:
        ids: list[int] = []
        shown: str = ""
        async for ev in engine.generate_stream(prompt.token_ids, params):
            events.append(ev)
            if ev.token_id in engine.eos_token_ids:
                continue
            ids.append(ev.token_id)
            text = str(tok.decode(ids, skip_special_tokens=True))
            sys.stdout.write(text[len(shown) :])
            sys.stdout.flush()
            shown = text
        sys.stdout.write("\n")

    try:
        asyncio.run(stream())
    finally:
        engine.close()
    if args.show_tokens:
        table = Table(
            title=f"{len(events)} sampled tokens (policy version {engine.policy_version})"
        )
        table.add_column("#", justify="right")
        table.add_column("id", justify="right")
        table.add_column("piece")
        table.add_column("logprob", justify="right")
        for i, ev in enumerate(events):
            piece = tok.decode([ev.token_id], skip_special_tokens=False)
            table.add_row(str(i), str(ev.token_id), repr(piece), f"{ev.logprob:.4f}")
        Console().print(table)
        finish = events[-1].finish_reason if events else None
        Console().print(f"finish_reason={finish}  prompt_tokens={len(prompt.token_ids)}")
    return 0
