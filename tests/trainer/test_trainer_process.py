"""TrainerProcess (``clawrl train``) on one rank in this process: judged turns from the store ->
steps -> published versions, and what a crash at each point of a step leaves for the restart.

The tiny model; turns and judgments are written into the store directly (no engine, no judge).
The multi-process runs, with real ``kill -9``, are in ``test_processes_kill9.py`` and
``tests/e2e/test_three_processes.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from clawrl.chat import ChatMessage, render_prompt
from clawrl.config import TrainerConfig
from clawrl.errors import ConfigError, TrainerError
from clawrl.models import tiny_policy
from clawrl.store import JudgmentRecord, PolicyVersionRecord, Store, TurnRecord, WeightsKind
from clawrl.store.leases import TRAINER_LEASE
from clawrl.trainer.distributed import init_distributed, shutdown_distributed
from clawrl.trainer.fsdp import ShardedTrainer
from clawrl.trainer.metrics import MetricsWriter, read_metrics
from clawrl.trainer.process import TrainerLease, TrainerProcess, holder_is_dead_here, step_line

pytestmark = pytest.mark.filterwarnings(
    "ignore:Seems like `optimizer.step\\(\\)` has been overridden"
)


@pytest.fixture()
def env():
    e = init_distributed("cpu")  # a group of one (no torchrun)
    yield e
    shutdown_distributed()


@pytest.fixture()
def store(tmp_path):
    s = Store(tmp_path / "s.db")
    yield s
    s.close()


def _record(store: Store, tok, n: int, *, score, hint=None, version: int = 0) -> list[str]:
    ids = []
    for i in range(n):
        s = store.new_session()
        msgs = [ChatMessage(role="user", content=f"problem {i}: what is {i} + {i}?")]
        prompt = render_prompt(tok, msgs)
        completion = tok.encode(f"It is {2 * i}.<|im_end|>")
        t = TurnRecord(
            s.id, prompt.token_ids, completion, [-1.5] * len(completion),
            request_messages=[m.model_dump() for m in msgs],
            sampling_params={"temperature": 1.0}, policy_version=version, finish_reason="stop",
        )  # fmt: skip
        store.record_turn(t)
        store.record_judgment(JudgmentRecord(t.id, s.id, score, "test", hint=hint))
        ids.append(t.id)
    return ids


def _process(env, store, out: Path, lines: list[str], method="combine", batch=2, full=False):
    policy = tiny_policy(seed=4, max_context=512)
    config = TrainerConfig(method=method, lr=1e-3, batch_size=batch, output_dir=str(out),
                           full_finetune=full)  # fmt: skip
    trainer = ShardedTrainer(policy.model, config, env, computes_teacher=True)
    return TrainerProcess(
        trainer, env, config, store=store, tokenizer=policy.tokenizer, max_context=512,
        metrics=MetricsWriter(out, tensorboard=False), out=lines.append,
    )  # fmt: skip


def _killed(proc: TrainerProcess) -> None:
    """What a kill leaves of the lease, for a restart in this same process: the renewal stops
    and the lease lapses (a restart in another process on this host takes it over at once:
    tests/trainer/test_processes.py)."""
    assert proc.lease is not None
    proc.lease._stop.set()
    proc.store.acquire_lease(TRAINER_LEASE, proc.lease.holder, 1e-6)  # type: ignore[union-attr]
    time.sleep(0.01)


def test_steps_publish_versions_and_write_each_turn_once(env, store, tmp_path):
    tok = tiny_policy(seed=4).tokenizer
    good = _record(store, tok, 2, score=1)
    hinted = _record(store, tok, 2, score=-1, hint="Answer in one short sentence.")
    zero = _record(store, tok, 1, score=0)
    lines: list[str] = []
    proc = _process(env, store, tmp_path / "out", lines)
    assert proc.resume() == 0
    order = proc.next_order()
    assert order is not None and not isinstance(order, str)
    assert store.get_sample(zero[0]).reason == "zero_score"  # drops are written at once
    assert order.turn_ids == good  # oldest judgment first, batch_size of them
    assert order.teacher_prompts == [None, None]
    m = proc.step(order)
    assert m["policy/version"] == 1.0 and m["step"] == 1.0
    order = proc.next_order()
    assert order is not None and not isinstance(order, str) and order.turn_ids == hinted
    prompt = order.teacher_prompts[0]
    assert prompt is not None and len(prompt) > len(order.samples[0].prompt_ids)
    assert "[Hint: Answer in one short sentence.]" in tok.decode(prompt)
    m = proc.step(order)
    assert m["hint/rate"] == 1.0 and m["policy/version"] == 2.0
    assert proc.next_order() is None  # nothing left to train

    latest = store.latest_policy_version()
    assert latest is not None and latest.version == 2 and latest.weights_kind == WeightsKind.LORA
    assert (Path(str(latest.weights)) / "adapter_config.json").is_file()
    for t in good:
        assert store.get_sample(t).step == 1 and store.get_sample(t).policy_version == 1
    for t in hinted:
        assert store.get_sample(t).step == 2
    assert [r["step"] for r in read_metrics(tmp_path / "out" / "metrics.jsonl")] == [1, 2]
    assert [x.split(" ", 1)[1].split(":")[0] for x in lines if ": " in x] == ["step 1", "step 2"]
    assert sum("published policy v" in x for x in lines) == 2
    proc.step_limit = 2
    assert proc.next_order() == "stop"
    proc.metrics.close()  # type: ignore[union-attr]


def test_a_crash_after_the_checkpoint_resumes_rows_and_publish(env, store, tmp_path):
    tok = tiny_policy(seed=4).tokenizer
    ids = _record(store, tok, 2, score=1)
    lines: list[str] = []
    proc = _process(env, store, tmp_path / "out", lines, method="rl")
    proc.resume()
    order = proc.next_order()
    assert order is not None and not isinstance(order, str)

    def killed(records):
        raise RuntimeError("killed after the checkpoint, before the samples rows")

    real = store.record_samples
    store.record_samples = killed  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        proc.step(order)
    store.record_samples = real  # type: ignore[method-assign]
    assert all(store.get_sample(t) is None for t in ids)
    assert store.latest_policy_version() is None
    _killed(proc)

    shutdown_distributed()  # the restart: a new process group, a fresh model
    env2 = init_distributed("cpu")
    fresh = _process(env2, store, tmp_path / "out", lines, method="rl")
    assert fresh.resume() == 1 and fresh.trainer.step == 1
    assert all(store.get_sample(t).step == 1 for t in ids)  # rows written, nothing retrained
    latest = store.latest_policy_version()
    assert latest is not None and latest.version == 1  # and the version published
    assert fresh.next_order() is None


def test_a_crash_before_the_checkpoint_redoes_the_step_from_the_same_turns(env, store, tmp_path):
    tok = tiny_policy(seed=4).tokenizer
    ids = _record(store, tok, 2, score=1)
    lines: list[str] = []
    proc = _process(env, store, tmp_path / "out", lines, method="rl")
    proc.resume()
    order = proc.next_order()
    assert order is not None and not isinstance(order, str)

    def killed(meta):
        raise RuntimeError("killed before the checkpoint was committed")

    proc.trainer.save_checkpoint = killed  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        proc.step(order)
    assert all(store.get_sample(t) is None for t in ids)
    _killed(proc)

    shutdown_distributed()
    env2 = init_distributed("cpu")
    fresh = _process(env2, store, tmp_path / "out", lines, method="rl")
    assert fresh.resume() == 0  # the step never happened
    order = fresh.next_order()
    assert order is not None and not isinstance(order, str) and order.turn_ids == ids
    fresh.step(order)
    assert all(store.get_sample(t).step == 1 for t in ids)
    assert store.latest_policy_version().version == 1  # type: ignore[union-attr]


def test_a_fresh_output_dir_on_a_store_with_versions_is_refused(env, store, tmp_path):
    store.publish_policy_version(PolicyVersionRecord(3, WeightsKind.LORA, "/elsewhere/v3", 3))
    proc = _process(env, store, tmp_path / "out", [])
    with pytest.raises(ConfigError, match="has no checkpoint"):
        proc.resume()


def test_the_step_line_says_what_a_step_did():
    line = step_line(
        {"step": 3, "samples/trained": 4, "tokens/count": 120, "loss": 0.25, "reward/mean": 0.5,
         "hint/rate": 0.25, "grad/norm": 1.5, "time/step_total": 2.0}, 2, 1,
    )  # fmt: skip
    assert "step 3: 4 samples 120 tokens" in line and "2.00 s on 2 ranks" in line


def test_a_full_fine_tuning_version_is_a_safetensors_file_a_gateway_reads(env, store, tmp_path):
    from clawrl.gateway.versions import read_weights

    tok = tiny_policy(seed=4).tokenizer
    _record(store, tok, 2, score=1)
    proc = _process(env, store, tmp_path / "out", [], method="rl", full=True)
    proc.resume()
    order = proc.next_order()
    assert order is not None and not isinstance(order, str)
    proc.step(order)
    latest = store.latest_policy_version()
    assert latest is not None and latest.weights_kind == WeightsKind.FULL
    weights = read_weights(latest)
    trained = proc.trainer.full_weights()
    base = tiny_policy(seed=4).model.state_dict()
    assert set(weights) == set(base)
    moved = [k for k in base if not torch.equal(weights[k], base[k])]
    assert moved and all(torch.equal(weights[k], trained[k]) for k in trained)


def test_a_second_trainer_waits_for_the_lease_and_a_trainer_that_lost_it_stops(store):
    first = TrainerLease(store, ttl_s=30)
    first.take()
    lines: list[str] = []
    second = TrainerLease(store, ttl_s=30, out=lines.append, poll_s=0.05)
    waiter = threading.Thread(target=second.take)
    waiter.start()
    time.sleep(0.5)
    assert waiter.is_alive() and len(lines) == 1 and first.holder in lines[0]
    first.check()  # still first's
    first.release()
    waiter.join(10)
    assert not waiter.is_alive()
    assert store.get_lease(TRAINER_LEASE).holder == second.holder  # type: ignore[union-attr]
    store.acquire_lease(TRAINER_LEASE, "elsewhere:1:x", 30, force=True)  # an operator forced it
    with pytest.raises(TrainerError, match="lost the store's trainer lease to elsewhere"):
        second.check()
    second.release()
    assert store.get_lease(TRAINER_LEASE).holder == "elsewhere:1:x"  # type: ignore[union-attr]


def test_a_lease_of_a_dead_process_on_this_host_is_seen_dead():
    import socket

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    host = socket.gethostname()
    assert holder_is_dead_here(f"{host}:{gone.pid}:abc")
    assert not holder_is_dead_here(f"{host}:{os.getppid()}:abc")  # alive
    assert not holder_is_dead_here(f"other-host:{gone.pid}:abc")  # cannot tell: wait it out
