"""Judge settings: a discriminated union of backends, bounds, and the backend factory."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from clawrl.errors import JudgeError
from clawrl.judge import (
    BackendKind,
    ChoiceJudgeConfig,
    GenerativeJudgeConfig,
    HeadJudgeConfig,
    JudgeConfig,
    OpenAIJudgeConfig,
)
from clawrl.judge.backends import ChoiceBackend, GenerativeBackend, OpenAIBackend, build_backend


def test_defaults_and_union():
    cfg = JudgeConfig()
    assert isinstance(cfg.backend, HeadJudgeConfig) and cfg.votes == 5
    assert isinstance(JudgeConfig.model_validate({"backend": {"kind": "choice"}}).backend,
                      ChoiceJudgeConfig)  # fmt: skip
    cfg = JudgeConfig.model_validate(
        {"votes": 5, "backend": {"kind": "openai", "url": "http://h/v1", "model": "m"}}
    )
    assert isinstance(cfg.backend, OpenAIJudgeConfig) and cfg.backend.max_retries == 2
    gen = JudgeConfig.model_validate({"backend": {"kind": "generative", "temperature": 1.0}})
    assert isinstance(gen.backend, GenerativeJudgeConfig)


@pytest.mark.parametrize(
    "data",
    [
        {"votes": 0},
        {"timeout_s": 0},
        {"hint_quorum": 1.5},
        {"backend": {"kind": "generative", "temperature": 0}},
        {"backend": {"kind": "openai", "url": "http://h/v1"}},  # model missing
        {"backend": {"kind": "choice", "bogus": 1}},
        {"backend": {"kind": "vllm"}},
    ],
)
def test_bad_settings_are_rejected(data):
    with pytest.raises(ValidationError):
        JudgeConfig.model_validate(data)


def test_build_backend(tokenizer):
    engine = object()
    gen = build_backend(GenerativeJudgeConfig(seed=7), engine=engine, tokenizer=tokenizer)
    assert isinstance(gen, GenerativeBackend) and gen.base_seed == 7
    ch = build_backend(ChoiceJudgeConfig(calibrate=False), engine=engine, tokenizer=tokenizer)
    assert isinstance(ch, ChoiceBackend) and ch.calibrate is False
    oa = build_backend(OpenAIJudgeConfig(url="http://h/v1/", model="m"))
    assert isinstance(oa, OpenAIBackend) and oa.endpoint == "http://h/v1/chat/completions"
    assert {gen.kind, ch.kind, oa.kind} == {
        BackendKind.GENERATIVE,
        BackendKind.CHOICE,
        BackendKind.OPENAI,
    }
    with pytest.raises(JudgeError, match="local engine"):
        build_backend(ChoiceJudgeConfig())


def test_config_imports_without_torch():
    import subprocess
    import sys

    code = "import sys, clawrl.judge, clawrl.judge.backends; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
