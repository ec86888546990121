"""Run under torchrun by ``test_fsdp_equivalence.py``: FSDP2 steps of :class:`ShardedTrainer`
on the tiny model in float64, written to a file for the test to compare with the one-process
:class:`Trainer`.

    torchrun --nproc-per-node 2 tests/trainer/fsdp_worker.py steps OUT.pt
    torchrun --nproc-per-node 2 tests/trainer/fsdp_worker.py checkpoint DIR   # 1 step, DCP save
    python tests/trainer/fsdp_worker.py resume DIR OUT.pt                   # 1 rank: load, step
    python tests/trainer/fsdp_worker.py shutdown OUT.json          # 1 rank: leaving the group

Every mode holds the process group in :func:`clawrl.trainer.distributed.process_group` and, once
out of it, fails if a gloo thread is still running (:func:`check_no_gloo_threads`).
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import torch

warnings.filterwarnings("ignore")

CASES: dict[str, dict[str, Any]] = {
    # name -> TrainerConfig fields; every case takes two steps on the same batch
    "rl-lora": {"method": {"kind": "rl"}},
    "opd-lora": {"method": {"kind": "opd"}},
    "grpo-lora": {"method": {"kind": "grpo"}},
    "combine-lora-mb2-odd": {"method": {"kind": "combine"}, "micro_batch_size": 2},
    "rl-full": {"method": {"kind": "rl"}, "full_finetune": True},
    "grpo-full-noclip": {
        "method": {"kind": "grpo", "loss": {"kl": {"beta": 0.0}}},
        "full_finetune": True,
        "grad_clip": 0.0,
    },
    "opd-full-kl": {
        "method": {"kind": "opd", "loss": {"kl": {"beta": 0.1}}},
        "full_finetune": True,
    },
}
BASE = {"lr": 1e-2, "lora_rank": 4, "lora_alpha": 8, "micro_batch_size": 1, "seed": 5}


def config(name: str, output_dir: Path) -> Any:
    from clawrl.config import TrainerConfig

    return TrainerConfig(**{**BASE, **CASES[name], "output_dir": str(output_dir)})


def policy() -> Any:
    """The tiny model in float64 (float32 noise of differently padded batches would hide a
    real difference of that size)."""
    from clawrl.models import tiny_policy

    p = tiny_policy(seed=3, max_context=256)
    p.model.double()
    return p


def samples(name: str) -> list[Any]:
    """Four turns of different lengths and temperatures (one truncated), five for the ``odd``
    case (2 + 3 rows over 2 ranks: one rank makes a pass that weighs nothing), with what each
    method needs (rewards, teacher log-probs, one GRPO group)."""
    from clawrl.trainer import TrainSample

    kind = CASES[name]["method"]["kind"]
    gen = torch.Generator().manual_seed(0)
    shapes = [(5, 3), (9, 6), (4, 2), (12, 5)] + ([(7, 4)] if "odd" in name else [])
    out = []
    for i, (p, c) in enumerate(shapes):
        prompt = torch.randint(5, 900, (p,), generator=gen).tolist()
        completion = torch.randint(5, 900, (c,), generator=gen).tolist()
        sampling = (-10.6 - 0.4 * torch.rand(c, generator=gen)).tolist()
        teacher = (-10.2 - 0.8 * torch.rand(c, generator=gen)).tolist()
        reward: float | None = [1.0, -1.0, 0.0, 1.0, -1.0][i]
        if kind == "grpo":
            reward = [1.0, 0.0, 1.0, 0.0, 1.0][i]
        hint = teacher if kind == "opd" or (kind == "combine" and i % 2 == 0) else None
        if kind == "opd":
            reward = None
        out.append(
            TrainSample(
                prompt, completion, sampling, temperature=[1.0, 0.7, 1.0, 1.3, 0.0][i],
                reward=reward, teacher_logprobs=hint, truncated=i == 3, turn_id=f"t{i}",
            )
        )  # fmt: skip
    return out


def teacher_requests() -> list[Any]:
    """Hint-enhanced prompts with sampled ids (5: odd over 2 ranks), for teacher log-probs."""
    from clawrl.trainer import TrainSample

    gen = torch.Generator().manual_seed(1)
    out = []
    for i, (p, c) in enumerate([(6, 3), (11, 4), (3, 2), (8, 5), (5, 1)]):
        prompt = torch.randint(5, 900, (p,), generator=gen).tolist()
        completion = torch.randint(5, 900, (c,), generator=gen).tolist()
        out.append(TrainSample(prompt, completion, [0.0] * c, temperature=[1.0, 0.7, 0.0][i % 3]))
    return out


def _result(trainer: Any, metrics: dict[str, float]) -> dict[str, Any]:
    return {
        "loss": metrics["loss"],
        "grad_norm": metrics["grad/norm"],
        "tokens": metrics["tokens/count"],
        "weights": trainer.full_weights(),
    }


def gloo_threads() -> list[str]:
    """The names of this process's gloo threads (``pt_gloo_runloop``, ``gloo_tcp_loop``): ``[]``
    once the process group's backend is destroyed (Linux; ``[]`` elsewhere)."""
    tasks = Path("/proc/self/task")
    if not tasks.is_dir():
        return []
    names = []
    for task in tasks.iterdir():
        try:
            names.append((task / "comm").read_text().strip())
        except OSError:  # the thread ended meanwhile
            continue
    return sorted(n for n in names if "gloo" in n)


def check_no_gloo_threads() -> None:
    """Fail when the process group left gloo threads behind: they would run into interpreter
    teardown, where a rank can die of SIGABRT ("terminate called without an active
    exception")."""
    left = gloo_threads()
    if left:
        raise SystemExit(f"rank {os.environ.get('RANK', 0)}: gloo threads still running after "
                         f"leaving the process group: {left}")  # fmt: skip


def run_steps(out: Path) -> None:
    from clawrl.trainer.distributed import process_group
    from clawrl.trainer.fsdp import ShardedTrainer

    with process_group("cpu") as env:
        results: dict[str, Any] = {"world_size": env.world_size}
        for name in CASES:
            trainer = ShardedTrainer(policy().model, config(name, out.parent / name), env,
                                     computes_teacher=True)  # fmt: skip
            batch = samples(name)
            results[name] = [_result(trainer, trainer.train_step(batch)) for _ in range(2)]
            if name == "rl-lora":  # the teacher after the two steps: policy and base weights
                reqs = teacher_requests()
                results["teacher"] = {
                    "policy": trainer.teacher_logprobs(reqs),
                    "base": trainer.teacher_logprobs(reqs, base=True),
                }
        if env.is_main:
            torch.save(results, out)
    check_no_gloo_threads()


def run_checkpoint(directory: Path) -> None:
    """One step of ``rl-lora`` and ``rl-full``, then a DCP checkpoint each."""
    from clawrl.trainer.distributed import process_group
    from clawrl.trainer.fsdp import ShardedTrainer

    with process_group("cpu") as env:
        for name in ("rl-lora", "rl-full"):
            trainer = ShardedTrainer(policy().model, config(name, directory / name), env)
            trainer.train_step(samples(name))
            trainer.policy_version = 1
            trainer.save_checkpoint({"turn_ids": ["t0", "t1", "t2", "t3"]})
    check_no_gloo_threads()


def run_resume(directory: Path, out: Path) -> None:
    """Load the checkpoints ``run_checkpoint`` wrote (with another rank count) and step again."""
    from clawrl.errors import TrainerError
    from clawrl.trainer.distributed import process_group
    from clawrl.trainer.fsdp import ShardedTrainer

    with process_group("cpu") as env:
        results: dict[str, Any] = {"world_size": env.world_size}
        for name in ("rl-lora", "rl-full"):
            trainer = ShardedTrainer(policy().model, config(name, directory / name), env)
            meta = trainer.load_checkpoint()
            assert meta is not None
            results[name] = {"meta": meta, "step": trainer.step}  # the step loaded
            results[name]["after"] = _result(trainer, trainer.train_step(samples(name)))
        # a checkpoint of another adapter shape is refused by name, never loaded in part
        other = config("rl-lora", directory / "rl-lora").model_copy(update={"lora_rank": 8})
        try:
            ShardedTrainer(policy().model, other, env).load_checkpoint()
            results["mismatch"] = None
        except TrainerError as e:
            results["mismatch"] = str(e)
        if env.is_main:
            torch.save(results, out)
    check_no_gloo_threads()


def run_shutdown(out: Path) -> None:
    """Leave the process group (one rank, no torchrun) after a step, normally with the trainer
    still alive, then (a new group in the same process) by an exception; writes what was left."""
    import torch.distributed as dist

    from clawrl.trainer.distributed import process_group
    from clawrl.trainer.fsdp import ShardedTrainer

    report: dict[str, Any] = {}
    with process_group("cpu") as env:
        trainer = ShardedTrainer(policy().model, config("rl-lora", out.parent / "a"), env)
        report["loss"] = trainer.train_step(samples("rl-lora"))["loss"]
        report["gloo_threads_inside"] = gloo_threads()
    report["initialized_after_exit"] = dist.is_initialized()
    report["gloo_threads_after_exit"] = gloo_threads()
    try:
        with process_group("cpu") as env:
            trainer = ShardedTrainer(policy().model, config("rl-full", out.parent / "b"), env)
            trainer.train_step(samples("rl-full"))
            raise RuntimeError("the step failed")
    except RuntimeError as e:
        report["raised"] = str(e)
    report["initialized_after_raise"] = dist.is_initialized()
    out.write_text(json.dumps(report))


if __name__ == "__main__":
    mode, *paths = sys.argv[1:]
    if mode == "steps":
        run_steps(Path(paths[0]))
    elif mode == "checkpoint":
        run_checkpoint(Path(paths[0]))
    elif mode == "resume":
        run_resume(Path(paths[0]), Path(paths[1]))
    elif mode == "shutdown":
        run_shutdown(Path(paths[0]))
    else:
        raise SystemExit(f"unknown mode {mode!r}")
