"""A 2-rank FSDP2 step equals the 1-process step: same loss, gradient norm and updated weights.

``fsdp_worker.py`` runs :class:`clawrl.trainer.fsdp.ShardedTrainer` under torchrun on 2 CPU
ranks (gloo) on the tiny model in float64, two steps per case on one batch: Binary RL, OPD,
GRPO and combined, LoRA and full fine-tuning, with and without gradient clipping and a KL
penalty, an odd batch over 2 ranks (one rank makes a pass that weighs nothing). Here the
one-process :class:`clawrl.trainer.Trainer` takes the same steps and every number is compared.

Tolerance: relative 1e-9 (losses, gradient norms) and 1e-9 + 1e-12 absolute (weights). The two
differ only in summation order (the reduce-scatter adds the ranks' gradients; micro-batches are
padded differently), about 1e-15 relative in float64; a wrong normaliser, a gradient averaged
instead of summed over ranks, or advantages computed per rank would differ by far more (x2 or
more on every weight).

A DCP checkpoint written by 2 ranks is loaded by 1 process and the next step equals the
1-process trainer's second step (resuming with another rank count).

Every worker leaves its process group through :func:`clawrl.trainer.distributed.process_group`
and fails if a gloo thread outlives it: such threads ran into interpreter teardown, where rank 1
could die of SIGABRT ("terminate called without an active exception"), now and then, under load.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from clawrl.trainer import Trainer

HERE = Path(__file__).resolve().parent
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node"]
pytestmark = pytest.mark.filterwarnings(
    "ignore:Seems like `optimizer.step\\(\\)` has been overridden"
)


def _worker():
    spec = importlib.util.spec_from_file_location("fsdp_worker", HERE / "fsdp_worker.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


W = _worker()


def _run(cmd: list[str], timeout: int = 600) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("fsdp") / "steps.pt"
    _run([*TORCHRUN, "2", str(HERE / "fsdp_worker.py"), "steps", str(out)])
    return torch.load(out, weights_only=False)


def _reference(name: str, tmp_path: Path, steps: int = 2) -> tuple[Trainer, list[dict]]:
    trainer = Trainer(W.policy().model, W.config(name, tmp_path / name), computes_teacher=True)
    batch = W.samples(name)
    return trainer, [trainer.train_step(batch) | {"weights": _weights(trainer)}
                     for _ in range(steps)]  # fmt: skip


def _weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}


def _same_weights(sharded: dict, reference: dict) -> None:
    assert set(reference) <= set(sharded), sorted(set(reference) - set(sharded))[:5]
    moved = 0
    for name, ref in reference.items():
        got = sharded[name]
        assert got.shape == ref.shape and got.dtype == torch.float64, name
        assert torch.allclose(got, ref, rtol=1e-9, atol=1e-12), (
            name, float((got - ref).abs().max()),
        )  # fmt: skip
        moved += 1
    assert moved == len(reference)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", list(W.CASES))
def test_two_rank_step_equals_one_process_step(two_ranks, tmp_path, name):
    assert two_ranks["world_size"] == 2
    _, reference = _reference(name, tmp_path)
    initial = _weights(Trainer(W.policy().model, W.config(name, tmp_path / "init")))
    for step, (got, ref) in enumerate(zip(two_ranks[name], reference, strict=True)):
        assert got["loss"] == pytest.approx(ref["loss"], rel=1e-9, abs=1e-12), step
        assert got["grad_norm"] == pytest.approx(ref["grad/norm"], rel=1e-9), step
        assert got["grad_norm"] > 0 and got["tokens"] == ref["tokens/count"]
        _same_weights(got["weights"], ref["weights"])
    # the steps did move the weights (a trainer that ignored its gradient would pass above
    # only if the reference did too)
    changed = sum(
        not torch.equal(reference[-1]["weights"][n], initial[n]) for n in initial
    )  # fmt: skip
    assert changed > 0


def test_teacher_logprobs_on_two_ranks_equal_one_process(two_ranks, tmp_path):
    """The trainer's own OPD teacher (current policy, and base weights with the adapter off)."""
    trainer, _ = _reference("rl-lora", tmp_path)  # two steps, as the worker took
    reqs = W.teacher_requests()
    for which, got in two_ranks["teacher"].items():
        ref = trainer.teacher_logprobs(reqs, base=which == "base")
        assert [len(x) for x in got] == [len(r.completion_ids) for r in reqs]
        for g, r in zip(got, ref, strict=True):
            assert g == pytest.approx(r, rel=1e-9, abs=1e-12), which
    policy_lp, base_lp = (two_ranks["teacher"][k] for k in ("policy", "base"))
    assert policy_lp != base_lp  # the steps moved the adapter, so the two teachers differ


@pytest.mark.timeout(900)
def test_a_two_rank_checkpoint_resumes_on_one_rank(tmp_path):
    ckpt, out = tmp_path / "ckpt", tmp_path / "resumed.pt"
    _run([*TORCHRUN, "2", str(HERE / "fsdp_worker.py"), "checkpoint", str(ckpt)])
    # one process, no torchrun: a group of one
    _run([sys.executable, str(HERE / "fsdp_worker.py"), "resume", str(ckpt), str(out)])
    resumed = torch.load(out, weights_only=False)
    assert resumed["world_size"] == 1
    for name in ("rl-lora", "rl-full"):
        got = resumed[name]
        assert got["meta"]["world_size"] == 2 and got["meta"]["format"] == "dcp"
        assert got["meta"]["turn_ids"] == ["t0", "t1", "t2", "t3"] and got["step"] == 1
        _, reference = _reference(name, tmp_path)
        second = reference[1]
        assert got["after"]["loss"] == pytest.approx(second["loss"], rel=1e-9, abs=1e-12)
        assert got["after"]["grad_norm"] == pytest.approx(second["grad/norm"], rel=1e-9)
        _same_weights(got["after"]["weights"], second["weights"])
    assert resumed["mismatch"] is not None and "does not match the model" in resumed["mismatch"]


@pytest.mark.timeout(600)
def test_leaving_the_process_group_stops_gloo_even_with_the_trainer_alive(tmp_path):
    """Leaving normally destroys the group's gloo backend at once (its threads joined), though
    FSDP2 modules and DTensor's caches still refer to the group; leaving by an exception
    destroys the group and lets the exception through."""
    out = tmp_path / "shutdown.json"
    _run([sys.executable, str(HERE / "fsdp_worker.py"), "shutdown", str(out)])
    report = json.loads(out.read_text())
    assert isinstance(report["loss"], float)  # the step ran
    assert not report["initialized_after_exit"]
    if Path("/proc/self/task").is_dir():  # Linux: threads are visible by name
        assert "pt_gloo_runloop" in report["gloo_threads_inside"]
        assert report["gloo_threads_after_exit"] == []
    assert report["raised"] == "the step failed"
    assert not report["initialized_after_raise"]
