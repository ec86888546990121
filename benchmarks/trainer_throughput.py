"""Trainer throughput: trained tokens/s and s/step of clawrl's trainer (one process, and FSDP2 over
1 and 2 torchrun ranks) beside TRL's ``GRPOTrainer`` doing a step on the same batch, model and
LoRA settings — in one run.

    .venv/bin/python benchmarks/trainer_throughput.py [--model smollm2-135m] [--batch 8]
        [--prompt 128] [--completion 64] [--steps 3] [--ranks 1,2] [--device cpu|cuda]

The batch: ``--batch`` samples of one GRPO group (random token ids, prompts of ``--prompt``
tokens, completions of ``--completion``, random rewards), LoRA rank 16 / alpha 32 on every linear
layer, AdamW at lr 1e-5, no KL term, no gradient clipping, micro-batch 1 (clawrl's default) for
clawrl; TRL's step is its loss over the whole batch at once (``per_device_train_batch_size`` =
the batch): its ``compute_loss`` (forward, log-probs, GRPO loss), ``accelerator.backward`` and
the optimizer step — the part of ``GRPOTrainer.training_step`` after generation, since clawrl's
trainer never generates (the gateway's engine did). Each configuration runs in its own
subprocess (FSDP2 under torchrun) after one warm-up step, each process (rank) with ``--threads``
CPU threads (``OMP_NUM_THREADS``, 1 by default: N ranks use N cores, and idle OpenMP threads
spinning on a busy machine do not count as work). "Trained tokens" are completion tokens (the
ones the loss covers); prompt tokens are processed too but not counted. Beside wall-clock s/step it prints
the CPU seconds per step summed over the ranks (``time.process_time``), which other jobs on a
shared machine do not inflate: on CPU, ranks that split the work should add up to about the one
process's CPU time, and the wall-clock gain of N ranks needs N free cores.

Without TRL installed (it is in the ``dev`` extras) its row says so.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

LORA = {"lora_rank": 16, "lora_alpha": 32}
LR = 1e-5


def _batch(vocab: int, n: int, prompt: int, completion: int) -> list[dict[str, Any]]:
    rng = random.Random(0)
    return [
        {
            "prompt_ids": [rng.randrange(3, vocab) for _ in range(prompt)],
            "completion_ids": [rng.randrange(3, vocab) for _ in range(completion)],
            "sampling_logprobs": [-rng.uniform(0.1, 3.0) for _ in range(completion)],
            "reward": float(rng.choice([-1.0, 1.0])),
        }
        for _ in range(n)
    ]


def _load(args: argparse.Namespace) -> Any:
    from clawrl.cli.common import quiet_transformers
    from clawrl.models import load_policy, tiny_policy

    quiet_transformers()
    if args.model == "tiny":
        return tiny_policy(seed=0)
    return load_policy(args.model, device="cpu")


def _clawrl_child(args: argparse.Namespace) -> dict[str, Any]:
    """One clawrl configuration (``fsdp``: this process is a torchrun rank, or a group of one)."""
    import torch

    from clawrl.config import TrainerConfig
    from clawrl.trainer import Trainer, TrainSample

    policy = _load(args)
    config = TrainerConfig(
        method={"kind": "grpo", "loss": {"kl": {"beta": 0.0}}}, lr=LR, micro_batch_size=1,
        grad_clip=0.0, output_dir=tempfile.mkdtemp(prefix="clawrl-bench-"), **LORA,
    )  # fmt: skip
    env = None
    if args.child == "fsdp":
        from clawrl.trainer.distributed import init_distributed
        from clawrl.trainer.fsdp import ShardedTrainer

        env = init_distributed(args.device)
        trainer: Trainer = ShardedTrainer(policy.model, config, env)
    else:
        policy.model.to(args.device)
        trainer = Trainer(policy.model, config)
    batch = [
        TrainSample(b["prompt_ids"], b["completion_ids"], b["sampling_logprobs"],
                    reward=b["reward"], group_id=0, episode_id=f"e{i}", policy_version=0)
        for i, b in enumerate(_batch(len(policy.tokenizer), args.batch, args.prompt,
                                     args.completion))
    ]  # fmt: skip
    times, cpu = [], []
    for i in range(args.steps + 1):
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        t0, c0 = time.perf_counter(), time.process_time()
        trainer.train_step(batch)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        if i > 0:  # the first step warms up
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    cpu_s = sum(cpu) / len(cpu)
    if env is not None:
        from clawrl.trainer.distributed import gather_objects, shutdown_distributed

        cpu_s = sum(gather_objects(cpu_s, env))  # every rank's CPU time
        shutdown_distributed()
    return {"s_per_step": sum(times) / len(times), "cpu_s_per_step": cpu_s,
            "tokens": args.batch * args.completion}  # fmt: skip


def _trl_child(args: argparse.Namespace) -> dict[str, Any]:
    """TRL's GRPOTrainer: loss, backward and optimizer step on the same batch (module docstring)."""
    import warnings

    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    warnings.filterwarnings("ignore")
    policy = _load(args)
    out = tempfile.mkdtemp(prefix="trl-bench-")
    cfg = GRPOConfig(
        output_dir=out, per_device_train_batch_size=args.batch, num_generations=args.batch,
        max_completion_length=args.completion, use_cpu=args.device == "cpu", report_to=[],
        beta=0.0, learning_rate=LR, max_grad_norm=0.0, save_strategy="no", bf16=False,
        fp16=False, logging_steps=10_000,
    )  # fmt: skip
    trainer = GRPOTrainer(
        model=policy.model, args=cfg, processing_class=policy.tokenizer,
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        train_dataset=Dataset.from_dict({"prompt": ["hi"] * args.batch}),
        peft_config=LoraConfig(r=LORA["lora_rank"], lora_alpha=LORA["lora_alpha"],
                               target_modules="all-linear", task_type="CAUSAL_LM"),
    )  # fmt: skip
    trainer.create_optimizer_and_scheduler(num_training_steps=args.steps + 1)
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer.train, not called here
    batch = _batch(len(policy.tokenizer), args.batch, args.prompt, args.completion)
    dev = trainer.accelerator.device
    rewards = torch.tensor([b["reward"] for b in batch])
    inputs = {
        "prompt_ids": torch.tensor([b["prompt_ids"] for b in batch], device=dev),
        "prompt_mask": torch.ones(args.batch, args.prompt, dtype=torch.long, device=dev),
        "completion_ids": torch.tensor([b["completion_ids"] for b in batch], device=dev),
        "completion_mask": torch.ones(args.batch, args.completion, dtype=torch.long, device=dev),
        "advantages": ((rewards - rewards.mean()) / (rewards.std() + 1e-4)).to(dev),
        "old_per_token_logps": torch.tensor([b["sampling_logprobs"] for b in batch], device=dev),
        "num_items_in_batch": torch.tensor(float(args.batch * args.completion), device=dev),
    }
    model = trainer.model
    model.train()
    times, cpu = [], []
    for i in range(args.steps + 1):
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0, c0 = time.perf_counter(), time.process_time()
        loss = trainer.compute_loss(model, inputs)
        trainer.accelerator.backward(loss)
        trainer.optimizer.step()
        trainer.lr_scheduler.step()
        trainer.optimizer.zero_grad()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        if i > 0:
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    return {"s_per_step": sum(times) / len(times), "cpu_s_per_step": sum(cpu) / len(cpu),
            "tokens": args.batch * args.completion}  # fmt: skip


def _run_child(kind: str, ranks: int, args: argparse.Namespace) -> dict[str, Any] | str:
    """Run one configuration in a subprocess; its result, or why there is none."""
    out = Path(tempfile.mkdtemp(prefix="bench-")) / "result.json"
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_VERBOSITY": "error"}  # fmt: skip
    own = [__file__, "--child", kind, "--result", str(out), "--model", args.model,
           "--batch", str(args.batch), "--prompt", str(args.prompt), "--completion",
           str(args.completion), "--steps", str(args.steps), "--device", args.device]  # fmt: skip
    if kind == "fsdp":
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", str(ranks), *own]  # fmt: skip
    else:
        cmd = [sys.executable, *own]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    if proc.returncode != 0 or not out.is_file():
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-8:]
        return f"failed (exit {proc.returncode}): " + " | ".join(tail)
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m", help="model spec, or 'tiny' (smoke runs)")
    p.add_argument("--batch", type=int, default=8, help="samples per step (8)")
    p.add_argument("--prompt", type=int, default=128, help="prompt tokens per sample (128)")
    p.add_argument("--completion", type=int, default=64, help="completion tokens per sample (64)")
    p.add_argument("--steps", type=int, default=3, help="timed steps after a warm-up step (3)")
    p.add_argument("--ranks", default="1,2", help="FSDP2 rank counts to run (1,2)")
    p.add_argument("--device", default="cpu", help="cpu (gloo) or cuda (NCCL)")
    p.add_argument("--threads", type=int, default=1,
                   help="CPU threads per process / rank (1: N ranks use N cores)")  # fmt: skip
    p.add_argument("--child", choices=["single", "fsdp", "trl"], help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args()

    if args.child:
        run = _trl_child if args.child == "trl" else _clawrl_child
        result = run(args)
        if os.environ.get("RANK", "0") == "0":
            Path(args.result).write_text(json.dumps(result))
        return 0

    print(f"load average {' / '.join(f'{x:.1f}' for x in os.getloadavg())} at the start")
    print(f"trainer throughput: {args.model}, batch {args.batch} x ({args.prompt} prompt + "
          f"{args.completion} completion tokens), LoRA r{LORA['lora_rank']} on all linear "
          f"layers, {args.device}, {os.cpu_count()} CPU cores, {args.threads} thread(s) per "
          f"process, mean of {args.steps} steps after a warm-up", flush=True)  # fmt: skip
    rows: list[tuple[str, dict[str, Any] | str]] = [
        ("clawrl Trainer, 1 process (no FSDP)", _run_child("single", 1, args))
    ]
    for n in [int(x) for x in args.ranks.split(",") if x.strip()]:
        rows.append((f"clawrl ShardedTrainer, FSDP2 on {n} rank{'s' * (n > 1)}",
                     _run_child("fsdp", n, args)))  # fmt: skip
    if importlib.util.find_spec("trl") is None:
        rows.append(("TRL GRPOTrainer", "not installed (pip install 'trl>=1.16', in the dev "
                     "extras): no TRL row"))  # fmt: skip
    else:
        import trl

        rows.append((f"TRL {trl.__version__} GRPOTrainer", _run_child("trl", 1, args)))
    width = max(len(name) for name, _ in rows)
    print(f"{'':{width}}  {'s/step':>8}  {'trained tokens/s':>16}  {'CPU s/step':>10}")
    for name, r in rows:
        if isinstance(r, str):
            print(f"{name:{width}}  {r}")
        else:
            print(f"{name:{width}}  {r['s_per_step']:8.3f}  {r['tokens'] / r['s_per_step']:16.1f}"
                  f"  {r['cpu_s_per_step']:10.3f}")  # fmt: skip
    print(f"load average {' / '.join(f'{x:.1f}' for x in os.getloadavg())} (1/5/15 min) at the "
          f"end, on {os.cpu_count()} cores: s/step is wall-clock time, shared with whatever else "
          f"runs; CPU s/step (summed over ranks) is this run's own work")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
