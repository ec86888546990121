"""clawrl export-model: a merged version loads in transformers and equals the trained policy."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from clawrl.cli.export_model import export_model
from clawrl.config import TrainerConfig
from clawrl.errors import ConfigError
from clawrl.trainer import Trainer, TrainSample


def test_export_merged_and_adapter(tmp_path, tiny):
    base = tmp_path / "base"
    tiny.model.save_pretrained(base)
    tiny.tokenizer.save_pretrained(base)
    ids = tiny.tokenizer.encode("hello there")
    sample = TrainSample(ids, [5, 6, 7], [-10.8, -10.8, -10.8], reward=1.0)
    tr = Trainer(tiny.model, TrainerConfig(method="rl", lr=5e-2), tmp_path / "run")
    tr.train_step([sample])
    tr.save_weights(1)
    out = export_model(tmp_path / "run", 1, tmp_path / "v1", model=str(base), adapter_only=False)
    merged = AutoModelForCausalLM.from_pretrained(out)
    x = torch.tensor([[*ids, 5, 6, 7]])
    with torch.no_grad():
        want = tr.model.eval()(input_ids=x).logits
        got = merged(input_ids=x).logits
        base_logits = tiny.model(input_ids=x).logits
    assert torch.allclose(got, want, atol=1e-4)
    assert not torch.allclose(got, base_logits, atol=1e-4)  # the update is in there
    a = export_model(tmp_path / "run", 1, tmp_path / "a1", model=str(base), adapter_only=True)
    assert (a / "adapter_config.json").is_file()
    with pytest.raises(ConfigError, match="no adapter for version 7"):
        export_model(tmp_path / "run", 7, tmp_path / "x", model=str(base), adapter_only=False)
    with pytest.raises(ConfigError, match="already exists"):
        export_model(tmp_path / "run", 1, tmp_path / "v1", model=str(base), adapter_only=False)
