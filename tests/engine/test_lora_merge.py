"""LoRA versions served from merged weights equal PEFT's unmerged forward, version after version."""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch
from peft import PeftModel

from clawrl.engine import SamplingParams, TransformersEngine
from clawrl.engine.lora import MergedLora, UnsupportedAdapter, lora_deltas
from clawrl.models import tiny_policy

from .conftest import trained_adapter


@pytest.fixture()
def policy():
    return tiny_policy(seed=5, max_context=256)


def _adapter(base, path, seed: int, **lora) -> torch.nn.Module:
    """A LoRA adapter with non-zero A and B on a copy of ``base``, saved to ``path``."""
    return trained_adapter(base, path, seed, rank=4, scale=0.1, weights="lora_", **lora)


def _ids(policy) -> list[int]:
    return policy.tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 3 + 4?"}], add_generation_prompt=True,
        return_dict=False,
    )  # fmt: skip


def _logprobs(model, ids, target) -> torch.Tensor:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids + target])).logits[0].float()
    lp = torch.log_softmax(logits, -1)[len(ids) - 1 : -1]
    return lp.gather(-1, torch.tensor(target)[:, None]).squeeze(-1)


def test_deltas_are_pefts_own(policy, tmp_path):
    peft_model = _adapter(policy.model, tmp_path / "a", seed=1)
    deltas = lora_deltas(tmp_path / "a")
    layers = {n: m for n, m in peft_model.named_modules() if hasattr(m, "get_delta_weight")}
    assert deltas and len(deltas) == len(layers)
    for name, layer in layers.items():
        want = layer.get_delta_weight("default")
        assert torch.allclose(deltas[name.removeprefix("base_model.model.")], want, atol=1e-7)


def test_served_versions_equal_peft_and_score_base(policy, tmp_path):
    base = copy.deepcopy(policy.model).eval()  # the engine writes merged weights into its model
    engine = TransformersEngine.from_policy(policy)
    ids = _ids(policy)
    greedy = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    try:
        for version in (1, 2, 3):  # each merged onto the exact base, not onto the last version
            peft_model = _adapter(base, tmp_path / f"v{version}", seed=version)
            assert engine.load_policy(version, tmp_path / f"v{version}").result(timeout=30)
            c = asyncio.run(engine.generate(ids, greedy))
            assert c.policy_version == version
            want = _logprobs(peft_model, ids, c.token_ids)
            assert torch.allclose(torch.tensor(c.logprobs), want, atol=1e-4)
            assert not isinstance(engine.model, PeftModel)  # merged, no PEFT wrapper
        served_base = asyncio.run(engine.score(ids, c.token_ids, base=True))
        assert torch.allclose(torch.tensor(served_base), _logprobs(base, ids, c.token_ids),
                              atol=1e-4)  # fmt: skip
    finally:
        engine.close()


def test_an_unsupported_adapter_is_served_through_peft(policy, tmp_path):
    base = copy.deepcopy(policy.model).eval()
    engine = TransformersEngine.from_policy(policy)
    ids = _ids(policy)
    try:
        _adapter(base, tmp_path / "v1", seed=1)
        engine.load_policy(1, tmp_path / "v1").result(timeout=30)
        dora = _adapter(base, tmp_path / "v2", seed=2, use_dora=True)
        with pytest.raises(UnsupportedAdapter, match="use_dora"):
            lora_deltas(tmp_path / "v2")
        engine.load_policy(2, tmp_path / "v2").result(timeout=30)
        c = asyncio.run(engine.generate(ids, SamplingParams(max_tokens=6, temperature=0)))
        assert isinstance(engine.model, PeftModel) and c.policy_version == 2
        want = _logprobs(dora, ids, c.token_ids)
        assert torch.allclose(torch.tensor(c.logprobs), want, atol=1e-4)
    finally:
        engine.close()


def test_layers_a_version_leaves_out_return_to_base(policy, tmp_path):
    model = copy.deepcopy(policy.model)
    merger = MergedLora(model)
    name = "model.layers.0.self_attn.q_proj"
    base = model.get_parameter(f"{name}.weight").detach().clone()
    delta = torch.ones_like(base)
    merger.apply({name: delta})
    assert torch.equal(model.get_parameter(f"{name}.weight"), base + delta)
    merger.apply({})
    assert torch.equal(model.get_parameter(f"{name}.weight"), base)
    with pytest.raises(UnsupportedAdapter, match="not a linear layer"):
        merger.apply({"model.norm": delta})
    with pytest.raises(UnsupportedAdapter, match="vs weight"):
        merger.apply({name: torch.ones(3, 3)})
