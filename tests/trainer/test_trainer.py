"""Trainer on the tiny model: on-policy ratios, learning signal, publishing, checkpoints."""

from __future__ import annotations

import asyncio

import pytest
import torch

from clawrl.config import TrainerConfig
from clawrl.engine import SamplingParams, TransformersEngine
from clawrl.errors import TrainerError
from clawrl.models import tiny_policy
from clawrl.trainer import Trainer, TrainSample


@pytest.fixture()
def policy():
    return tiny_policy(seed=2, max_context=512)


def _samples(policy, n=4, temperature=1.0, reward=lambda i: 1.0 if i % 2 == 0 else -1.0):
    eng = TransformersEngine.from_policy(policy)
    tok = policy.tokenizer
    out = []
    try:
        for i in range(n):
            ids = tok.apply_chat_template(
                [{"role": "user", "content": f"question {i}"}],
                add_generation_prompt=True,
                return_dict=False,
            )
            c = asyncio.run(
                eng.generate(
                    ids,
                    SamplingParams(max_tokens=6, temperature=temperature, seed=i, ignore_eos=True),
                )
            )
            out.append(
                TrainSample(
                    ids,
                    c.token_ids,
                    c.logprobs,
                    temperature=temperature,
                    reward=reward(i),
                    turn_id=f"t{i}",
                )
            )
    finally:
        eng.close()
    return out


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_on_policy_first_step_has_no_mismatch(policy, tmp_path, temperature):
    samples = _samples(policy, temperature=temperature)
    tr = Trainer(policy.model, TrainerConfig(method="rl", micro_batch_size=2), tmp_path)
    m = tr.train_step(samples)
    assert abs(m["kl/mismatch"]) < 1e-4  # trainer log-probs == engine sampling log-probs
    assert m["samples/trained"] == 4 and tr.step == 1
    assert m["grad/norm"] > 0


def test_micro_batching_gives_the_same_gradient(policy, tmp_path):
    samples = _samples(policy, n=4)
    grads = []
    for mb in (1, 4):
        tr = Trainer(
            policy.model,
            TrainerConfig(method="rl", micro_batch_size=mb, lr=0.0, grad_clip=0.0),
            tmp_path / str(mb),
        )
        tr.optimizer.step = lambda: None  # keep the gradient for inspection
        tr.optimizer.zero_grad = lambda set_to_none=True: None
        tr.train_step(samples)
        grads.append(torch.cat([p.grad.flatten() for p in tr.params]))
    assert torch.allclose(grads[0], grads[1], atol=1e-6, rtol=1e-4)


def test_positive_reward_raises_logprob_of_sampled_tokens(policy, tmp_path):
    samples = _samples(policy, n=2, reward=lambda i: 1.0)
    tr = Trainer(
        policy.model,
        TrainerConfig(method={"kind": "rl", "loss": {"kl": {"beta": 0.0}}}, lr=5e-3),
        tmp_path,
    )
    before = tr.train_step(samples)
    for _ in range(3):
        after = tr.train_step(samples)
    # the ratio pi_theta / pi_sampling rose above 1 for the rewarded tokens
    assert after["kl/mismatch"] != before["kl/mismatch"]
    from clawrl.trainer import collate, token_logprobs

    b = collate(samples)
    with torch.no_grad():
        lp, _ = token_logprobs(tr.model, b)
    assert float((lp - b.sampling_logprobs)[b.loss_mask].mean()) > 0


def test_publish_swaps_engine_version(policy, tmp_path):
    samples = _samples(policy, n=2)
    tr = Trainer(policy.model, TrainerConfig(method="rl", lr=1e-2), tmp_path)
    tr.train_step(samples)
    eng = TransformersEngine.from_policy(policy)
    try:
        p = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
        c0 = asyncio.run(eng.generate(samples[0].prompt_ids, p))
        weights = tr.save_weights(1)
        assert eng.load_policy(1, weights).result(timeout=60) == 1
        assert (tmp_path / "policies" / "v1" / "adapter_config.json").is_file()
        c1 = asyncio.run(eng.generate(samples[0].prompt_ids, p))
        assert c0.policy_version == 0 and c1.policy_version == 1
        assert c1.logprobs != c0.logprobs
        # the engine's log-probs equal the trainer's (same weights after the swap)
        from clawrl.trainer import collate, token_logprobs

        s = TrainSample(samples[0].prompt_ids, c1.token_ids, c1.logprobs, temperature=1.0)
        b = collate([s])
        with torch.no_grad():
            lp, _ = token_logprobs(tr.model.eval(), b)
        assert torch.allclose(lp[b.loss_mask], torch.tensor(c1.logprobs), atol=1e-4)
    finally:
        eng.close()


def test_checkpoint_resume_is_exact(policy, tmp_path):
    samples = _samples(policy, n=2)
    a = Trainer(policy.model, TrainerConfig(method="rl", lr=1e-3), tmp_path)
    a.train_step(samples)
    a.policy_version = 1
    a.save_checkpoint()
    m_a = a.train_step(samples)
    b = Trainer(policy.model, TrainerConfig(method="rl", lr=1e-3), tmp_path)
    meta = b.load_checkpoint()
    assert meta["step"] == 1 and b.policy_version == 1 and b.step == 1
    m_b = b.train_step(samples)
    assert m_a["loss"] == pytest.approx(m_b["loss"], abs=1e-6)
    pa = torch.cat([p.flatten() for p in a.params])
    pb = torch.cat([p.flatten() for p in b.params])
    assert torch.allclose(pa, pb, atol=1e-7)


def test_checkpoint_of_another_shape_is_refused(policy, tmp_path):
    a = Trainer(policy.model, TrainerConfig(method="rl", lora_rank=4), tmp_path)
    a.save_checkpoint()
    b = Trainer(policy.model, TrainerConfig(method="rl", full_finetune=True), tmp_path)
    with pytest.raises(TrainerError, match="missing"):
        b.load_checkpoint()


def test_method_inputs_are_checked(policy, tmp_path):
    samples = _samples(policy, n=1)
    tr = Trainer(policy.model, TrainerConfig(method="opd"), tmp_path)
    with pytest.raises(TrainerError, match="teacher"):
        tr.train_step(samples)
    tr2 = Trainer(policy.model, TrainerConfig(method="rl", max_staleness=0), tmp_path)
    tr2.policy_version = 3
    with pytest.raises(TrainerError, match="stale"):
        tr2.train_step(samples)


def test_a_step_may_train_with_another_method_and_leaves_the_trainers_own(policy, tmp_path):
    """The harness warm start's supervised steps pass their method to the step; the trainer's
    method (what every later step trains with) is never swapped."""
    from clawrl.harness.warmstart import SFT_METHOD

    samples = _samples(policy, n=2)
    tr = Trainer(policy.model, TrainerConfig(method="opd"), tmp_path)
    own = tr.method
    m = tr.train_step(samples, method=SFT_METHOD)  # opd would refuse: no teacher log-probs
    assert tr.method is own and own.kind == "opd" and m["samples/trained"] == 2
    # the advantage is each sample's reward (precomputed), not the opd teacher's
    assert m["adv/min"] == -1.0 and m["adv/max"] == 1.0
    with pytest.raises(TrainerError, match="teacher"):
        tr.train_step(samples)
    # a full fine-tune without a KL penalty keeps no reference model: a step with one is refused
    no_kl = {"kind": "rl", "loss": {"kl": {"beta": 0.0}}}
    full = Trainer(policy.model, TrainerConfig(method=no_kl, full_finetune=True), tmp_path / "f")
    kl = TrainerConfig(method={"kind": "rl", "loss": {"kl": {"beta": 0.1}}}).method
    with pytest.raises(TrainerError, match="without a reference model"):
        full.train_step(samples, method=kl)  # type: ignore[arg-type]


def test_token_logprobs_match_the_full_vocabulary_projection(policy):
    """Projecting only from the first completion position gives the full computation's numbers."""
    from clawrl.trainer import collate, token_logprobs

    samples = [
        TrainSample([1, 2, 3, 4, 5, 6, 7, 8], [9, 10, 11], [-1.0] * 3, temperature=0.7),
        TrainSample([1, 2, 3], [12, 13, 14, 15, 16], [-1.0] * 5, temperature=1.0),
        TrainSample([4, 5, 6, 7, 8], [17], [-1.0], temperature=0.0),
    ]
    b = collate(samples)
    model = policy.model.eval()
    with torch.no_grad():
        lp, ent = token_logprobs(model, b)
        logits = model(input_ids=b.input_ids, attention_mask=b.attention_mask).logits[:, :-1]
    temp = torch.tensor([0.7, 1.0, 1.0])
    full = torch.log_softmax(logits.float() / temp[:, None, None], dim=-1)
    want = full.gather(-1, b.input_ids[:, 1:, None]).squeeze(-1)
    want_ent = -(full.exp() * full).sum(-1)
    assert lp.shape == ent.shape == b.loss_mask.shape
    assert torch.allclose(lp[b.loss_mask], want[b.loss_mask], atol=1e-5)
    assert torch.allclose(ent[b.loss_mask], want_ent[b.loss_mask], atol=1e-4)
    # the earliest trained position is 2 (row 1's prompt has 3 tokens): earlier ones are 0
    assert bool((lp[:, :2] == 0).all())


def test_chunked_projection_equals_the_whole_one_with_gradients(policy):
    """Trained positions projected in checkpointed chunks: same log-probs, entropies and
    gradients as projecting every position with the model's own head."""
    from clawrl.trainer import collate, token_logprobs
    from clawrl.trainer.batch import _decoder_and_head, _token_logprobs_whole

    model = policy.model.double().train()
    assert _decoder_and_head(model) is not None  # the chunked path is the one taken
    samples = [
        TrainSample([1, 2, 3, 4, 5, 6, 7, 8], [9, 10, 11], [-1.0] * 3, temperature=0.7),
        TrainSample([1, 2, 3], [12, 13, 14, 15, 16], [-1.0] * 5, temperature=1.0),
        TrainSample([4, 5, 6, 7, 8], [17], [-1.0], temperature=0.0),
    ]
    b = collate(samples)
    weights = torch.linspace(-1, 1, b.loss_mask.numel(), dtype=torch.float64).view_as(b.loss_mask)
    results = []
    for run in ("whole", 2, 1000):
        model.zero_grad()
        if run == "whole":
            temp = torch.tensor([0.7, 1.0, 1.0])
            lp, ent = _token_logprobs_whole(model, b, temp)
        else:
            lp, ent = token_logprobs(model, b, chunk_tokens=run)
        (lp * weights).sum().backward()
        grad = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        results.append((lp.detach(), ent, grad))
    model.float()
    for lp, ent, grad in results[1:]:
        assert torch.allclose(lp, results[0][0], atol=1e-10)
        assert torch.allclose(ent, results[0][1], atol=1e-9)
        assert torch.allclose(grad, results[0][2], atol=1e-10)
