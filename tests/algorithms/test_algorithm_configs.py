"""Config validation, and that the config unions parse as pydantic discriminated unions."""

from __future__ import annotations

import ast
import pathlib

import pydantic
import pytest

import clawrl.algorithms as algorithms
from clawrl.algorithms import (
    AdvantageConfig,
    CombinedAdvantage,
    GRPOAdvantage,
    KLEstimator,
    KLPenalty,
    MaskedIS,
    OPDAdvantage,
    PPOClipLoss,
    SamplingRatio,
    SequenceMeanTokenSumNorm,
    TokenMean,
    TruncatedIS,
)


def test_defaults_match_the_issue() -> None:
    config = PPOClipLoss()
    assert (config.eps_low, config.eps_high, config.dual_clip) == (0.2, 0.28, None)
    assert config.kl == KLPenalty(beta=0.02, estimator=KLEstimator.K3)
    assert config.aggregation == TokenMean()
    assert config.ratio == SamplingRatio()
    assert (CombinedAdvantage().w_rl, CombinedAdvantage().w_opd) == (1.0, 1.0)


@pytest.mark.parametrize(
    "make",
    [
        lambda: PPOClipLoss(eps_low=1.0),
        lambda: PPOClipLoss(eps_high=-0.1),
        lambda: PPOClipLoss(dual_clip=1.0),
        lambda: KLPenalty(beta=-1.0),
        lambda: KLPenalty(estimator="k4"),  # type: ignore[arg-type]
        lambda: SequenceMeanTokenSumNorm(max_tokens=0),
        lambda: MaskedIS(low=2.0, high=1.0),
        lambda: TruncatedIS(cap=0.0),
        lambda: OPDAdvantage(clip=-1.0),
        lambda: GRPOAdvantage(kind="opd"),  # type: ignore[arg-type]
    ],
)
def test_out_of_bounds_values_are_rejected(make: object) -> None:
    with pytest.raises(ValueError):
        make()  # type: ignore[operator]


def test_pydantic_parses_the_unions_by_kind() -> None:
    loss = pydantic.TypeAdapter(PPOClipLoss).validate_python(
        {
            "eps_high": 0.3,
            "dual_clip": 3.0,
            "ratio": {"kind": "tis", "cap": 1.5},
            "kl": {"beta": 0.0, "estimator": "k1"},
            "aggregation": {"kind": "seq_mean_token_sum_norm", "max_tokens": 128},
        }
    )
    assert loss.ratio == TruncatedIS(cap=1.5)
    assert loss.kl == KLPenalty(beta=0.0, estimator=KLEstimator.K1)
    assert loss.aggregation == SequenceMeanTokenSumNorm(max_tokens=128)
    advantage = pydantic.TypeAdapter(AdvantageConfig).validate_python(
        {"kind": "grpo", "normalize_std": False}
    )
    assert advantage == GRPOAdvantage(normalize_std=False)
    with pytest.raises(pydantic.ValidationError):
        pydantic.TypeAdapter(PPOClipLoss).validate_python({"eps_low": 1.5})


def test_algorithms_imports_only_torch_and_the_standard_library() -> None:
    package = pathlib.Path(algorithms.__file__).parent
    allowed = {"torch", "clawrl", "__future__"}
    for path in package.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if name.startswith("clawrl."):
                    assert name.startswith("clawrl.algorithms"), (path.name, name)
                assert top in allowed or top in _stdlib(), (path.name, name)


def _stdlib() -> frozenset[str]:
    import sys

    return frozenset(sys.stdlib_module_names)
