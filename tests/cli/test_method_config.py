"""The method spine: one typed ``trainer.method``, reachable from TOML, ``--set`` and flags."""

from __future__ import annotations

import argparse

import pytest

from clawrl.algorithms import (
    CombinedAdvantage,
    GRPOAdvantage,
    KLEstimator,
    MaskedIS,
    OldRatio,
    SequenceMeanTokenSumNorm,
    TruncatedIS,
)
from clawrl.cli.common import add_config_options
from clawrl.cli.options import add_online_options, config_with_flags
from clawrl.config import (
    BinaryRLMethod,
    CombinedMethod,
    GRPOMethod,
    OffMethod,
    OPDMethod,
    PRMOutcomeMethod,
    config_to_toml,
    load_config,
)
from clawrl.errors import ConfigError


@pytest.mark.parametrize(
    ("shorthand", "cls"),
    [("off", OffMethod), ("rl", BinaryRLMethod), ("opd", OPDMethod),
     ("combine", CombinedMethod), ("grpo", GRPOMethod), ("prm_outcome", PRMOutcomeMethod)],
)  # fmt: skip
def test_shorthands_keep_working(shorthand, cls):
    cfg = load_config(None, [f'trainer.method="{shorthand}"'])
    assert type(cfg.trainer.method) is cls and cfg.trainer.method.kind == shorthand


def test_default_is_off_and_trains_nothing():
    method = load_config().trainer.method
    assert isinstance(method, OffMethod) and not method.trains and method.needs.any_of == ()


def test_dr_grpo_is_grpo_without_the_std():
    for name in ("dr_grpo", "ppo"):
        method = load_config(None, [f'trainer.method="{name}"']).trainer.method
        assert method.advantage == GRPOAdvantage(normalize_std=False)


def test_every_loss_and_correction_option_from_toml(tmp_path):
    f = tmp_path / "m.toml"
    f.write_text(
        "[trainer.method]\n"
        'kind = "combine"\n'
        'teacher = "base"\n'
        "train_on_zero = true\n"
        "advantage = { w_rl = 0.5, w_opd = 2.0, opd_clip = 3.0 }\n"
        "loss = { eps_low = 0.1, eps_high = 0.3, dual_clip = 3.0, mask_truncated = true, "
        'ratio = { kind = "tis", cap = 1.5 }, kl = { beta = 0.05, estimator = "k2" }, '
        'aggregation = { kind = "seq_mean_token_sum_norm", max_tokens = 512 } }\n'
    )
    method = load_config(f).trainer.method
    assert isinstance(method, CombinedMethod)
    assert method.teacher == "base" and method.train_on_zero
    assert method.advantage == CombinedAdvantage(w_rl=0.5, w_opd=2.0, opd_clip=3.0)
    loss = method.loss
    assert (loss.eps_low, loss.eps_high, loss.dual_clip, loss.mask_truncated) == (
        0.1, 0.3, 3.0, True,
    )  # fmt: skip
    assert loss.ratio == TruncatedIS(cap=1.5)
    assert loss.kl.beta == 0.05 and loss.kl.estimator is KLEstimator.K2
    assert loss.aggregation == SequenceMeanTokenSumNorm(max_tokens=512)
    needs = method.needs
    assert needs.any_of == ("reward", "hint") and needs.teacher == "base"
    assert needs.zero_is_reward


def test_the_config_round_trips_through_toml(tmp_path):
    cfg = load_config(None, ['trainer.method={kind="rl", loss={ratio={kind="mis", low=0.4}}}'])
    f = tmp_path / "c.toml"
    f.write_text(config_to_toml(cfg))
    assert load_config(f) == cfg


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ('trainer.method="nope"', "unknown method 'nope'"),
        ('trainer.method={kind="rl", loss={ratio={kind="tis", capp=2.0}}}',
         "trainer.method.loss.ratio.capp"),
        ('trainer.method={kind="rl", loss={eps_low=3}}', "trainer.method.loss: .*eps_low"),
        ('trainer.method={kind="opd", teacher="x"}', "trainer.method.teacher"),
        ('trainer.method={kind="rl", teacher="base"}', "trainer.method.teacher"),
        ('trainer.method={kind="off", loss={}}', "trainer.method.loss"),
    ],
)  # fmt: skip
def test_a_malformed_method_names_the_field(override, needle):
    with pytest.raises(ConfigError, match=needle):
        load_config(None, [override])


def _serve_args(argv):
    p = argparse.ArgumentParser()
    add_online_options(p)
    add_config_options(p)
    return p.parse_args(argv)


def test_cli_flags_reach_the_method():
    cfg = config_with_flags(
        _serve_args(["--method", "opd", "--kl-beta", "0", "--ratio", "old", "--eps-high", "0.4",
                     "--teacher", "base", "--batch-size", "8", "--aggregation",
                     "seq_mean_token_mean", "--opd-clip", "2"]),
    )  # fmt: skip
    method = cfg.trainer.method
    assert isinstance(method, OPDMethod) and method.teacher == "base"
    assert method.loss.kl.beta == 0.0 and method.loss.ratio == OldRatio()
    assert method.loss.eps_high == 0.4 and cfg.trainer.batch_size == 8
    assert method.loss.aggregation.kind == "seq_mean_token_mean"
    assert method.advantage.clip == 2.0
    combine = config_with_flags(_serve_args(["--method", "combine", "--opd-clip", "2"]))
    assert combine.trainer.method.advantage.opd_clip == 2.0


def test_method_flag_keeps_the_settings_of_the_same_kind():
    """--method rl with --set settings of an rl table keeps them (and a dotted --set works)."""
    set_table = (
        'trainer.method={kind="rl", train_on_zero=true, loss={ratio={kind="mis", high=3.0}}}'
    )
    cfg = config_with_flags(_serve_args(["--method", "rl", "--set", set_table, "--kl-beta", "0.1"]))
    method = cfg.trainer.method
    assert method.train_on_zero and method.loss.ratio == MaskedIS(high=3.0)
    assert method.loss.kl.beta == 0.1
    dotted = config_with_flags(
        _serve_args(["--method", "rl", "--set", "trainer.method.loss.kl.beta=0"])
    )
    assert isinstance(dotted.trainer.method, BinaryRLMethod)
    assert dotted.trainer.method.loss.kl.beta == 0.0


def test_harness_default_method_keeps_set_settings():
    args = _serve_args(["--set", "trainer.method.advantage.normalize_std=false",
                        "--set", "trainer.method.loss.kl.beta=0"])  # fmt: skip
    cfg = config_with_flags(args, default_method="grpo")
    method = cfg.trainer.method
    assert isinstance(method, GRPOMethod) and not method.advantage.normalize_std
    assert method.loss.kl.beta == 0.0


def test_harness_train_chooses_outcome_only_or_prm_plus_outcome():
    from clawrl.cli import build_parser

    parser = build_parser()
    outcome = config_with_flags(parser.parse_args(["harness", "train"]), default_method="grpo")
    assert isinstance(outcome.trainer.method, GRPOMethod)
    assert not outcome.trainer.method.needs.step_scores
    args = parser.parse_args(
        ["harness", "train", "--method", "prm_outcome", "--judge-votes", "3",
         "--set", "trainer.method.advantage.normalize_std=false"]
    )  # fmt: skip
    prm = config_with_flags(args, default_method="grpo")
    method = prm.trainer.method
    assert isinstance(method, PRMOutcomeMethod) and method.needs.step_scores
    assert method.needs.group and not method.advantage.normalize_std
    assert prm.judge.votes == 3


def test_method_flag_contradicting_the_settings_is_refused():
    with pytest.raises(ConfigError, match="contradicts"):
        config_with_flags(_serve_args(["--method", "rl", "--set", 'trainer.method="opd"']))


def test_a_method_table_without_kind_is_refused_clearly():
    with pytest.raises(ConfigError, match="needs a kind"):
        load_config(None, ["trainer.method.loss.kl.beta=0"])


def test_a_flag_that_does_not_apply_to_the_method_is_refused():
    with pytest.raises(ConfigError, match=r"trainer\.method\.teacher"):
        config_with_flags(_serve_args(["--method", "rl", "--teacher", "base"]))


def test_demo_takes_the_engine_flags():
    """``clawrl demo --engine vllm --vllm-url URL`` runs the demo's rollouts, evaluation and
    teacher scoring on that server (issue 38); a vLLM flag with the in-process engine is refused."""
    from clawrl.cli import build_parser
    from clawrl.cli.demo import demo_config
    from clawrl.errors import ConfigError

    parser = build_parser()
    args = parser.parse_args(["demo", "--quick", "--engine", "vllm", "--vllm-url", "http://h:1"])
    cfg = demo_config(args)
    assert cfg.engine.backend == "vllm" and cfg.engine.vllm_urls == ["http://h:1"]
    assert demo_config(parser.parse_args(["demo"])).engine.backend == "transformers"
    bad = parser.parse_args(["demo", "--engine", "transformers", "--vllm-url", "http://h:1"])
    with pytest.raises(ConfigError, match="--engine vllm"):
        demo_config(bad)


def test_judge_flag_keeps_the_same_backends_settings():
    """--judge head with --set judge.backend={kind="head", ...}: the settings stay (they were
    replaced by the backend's defaults); another backend's flag starts from its defaults."""
    import argparse

    from clawrl.cli.options import config_with_flags

    given = ['judge.backend={kind="head", hints="gate", min_confidence=0.8}']
    cfg = config_with_flags(argparse.Namespace(config=None, overrides=given, judge="head"))
    assert cfg.judge.backend.kind == "head"
    assert (cfg.judge.backend.hints, cfg.judge.backend.min_confidence) == ("gate", 0.8)
    cfg = config_with_flags(argparse.Namespace(config=None, overrides=given, judge="choice"))
    assert cfg.judge.backend.kind == "choice"
