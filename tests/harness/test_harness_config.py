"""Harness mode's settings are a ``[harness]`` section of :class:`clawrl.config.Config`:
``clawrl harness train|eval`` take ``--config``, ``--set`` and ``--engine`` like every other
command, their flags override the file, and bad values are refused naming the setting."""

from __future__ import annotations

import json

import pytest

from clawrl.cli import main
from clawrl.config import HarnessConfig, load_config
from clawrl.errors import ConfigError
from clawrl.store import Store


def test_the_section_validates_and_names_the_bad_setting():
    cfg = load_config(None, ['harness.harnesses="reference, mini-swe-agent"', "harness.k=2"])
    assert cfg.harness.harnesses == ["reference", "mini-swe-agent"] and cfg.harness.k == 2
    assert cfg.harness.split_for("train") == "train"
    assert cfg.harness.split_for("eval") == "heldout"
    assert HarnessConfig(split="all").split_for("eval") == "all"
    with pytest.raises(ConfigError, match=r"harness\.match: .*is not a regular expression"):
        load_config(None, ['harness.match="("'])
    with pytest.raises(ConfigError, match=r"harness\.group_size"):
        load_config(None, ["harness.group_size=0"])
    with pytest.raises(ConfigError, match=r"harness\.isolation"):
        load_config(None, ['harness.isolation="docker"'])
    with pytest.raises(ConfigError, match=r"harness\.nope: .*\(the keys of harness: .*group_size"):
        load_config(None, ["harness.nope=1"])
    # a near miss names the key meant
    with pytest.raises(ConfigError, match=r"did you mean harness\.harnesses\?"):
        load_config(None, ['harness.harness="reference"'])
    with pytest.raises(ConfigError, match=r"did you mean harness\.time_limit_s\?"):
        load_config(None, ["harness.time_limit=60"])
    with pytest.raises(ConfigError, match=r"did you mean trainer\.lr\?"):
        load_config(None, ["trainer.lrr=1"])
    # the rollouts' sampling seed: the trainer's unless set, none when turned off
    assert load_config(None, ["trainer.seed=3"]).harness.sampling_seed(3) == 3
    assert HarnessConfig(seed=5).sampling_seed(3) == 5
    assert HarnessConfig(seed=5, seeded=False).sampling_seed(3) is None


def _eval_rows(capsys) -> list[dict]:
    out = capsys.readouterr().out
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.timeout(300)
def test_eval_takes_its_settings_from_config_and_set_and_flags_override(tmp_path, capsys):
    config = tmp_path / "harness.toml"
    config.write_text(
        '[model]\nspec = "tiny"\n\n'
        '[harness]\nlimit = 3\nk = 3\nisolation = "fallback"\nmax_steps = 1\n'
        "time_limit_s = 30\nparallel = 2\n"
    )
    base = ["harness", "eval", "--config", str(config), "--json"]
    assert main([*base, "--set", "harness.k=1", "--limit", "2", "--out", str(tmp_path / "a")]) == 0
    [row] = _eval_rows(capsys)
    # --set overrides the file's k, the --limit flag its limit; the rest is the file's
    assert len(row["counts"]) == 2 and all(n == 1 for n, _ in row["counts"].values())
    assert row["version"] == 0 and row["harness"] == "reference" and row["sampling_seed"] == 0
    with Store(tmp_path / "a" / "store.db", read_only=True) as store:
        assert store.latest_policy_version() is None  # eval trains and publishes nothing

    # the file's settings alone: k 3 over 3 tasks
    assert main([*base, "--set", "harness.limit=1", "--out", str(tmp_path / "b")]) == 0
    [row] = _eval_rows(capsys)
    assert len(row["counts"]) == 1 and all(n == 3 for n, _ in row["counts"].values())


def test_eval_and_train_refuse_bad_settings_naming_them(tmp_path, capsys):
    out = ["--out", str(tmp_path / "x")]
    assert main(["harness", "eval", "--model", "tiny", "--set", "harness.k=0", *out]) == 1
    assert "harness.k" in capsys.readouterr().err
    assert main(["harness", "train", "--model", "tiny", "--set", 'harness.match="("', *out]) == 1
    assert "harness.match" in capsys.readouterr().err
    missing = str(tmp_path / "no-such-suite")
    assert main(["harness", "eval", "--model", "tiny", "--tasks", missing, *out]) == 1
    assert "no such directory" in capsys.readouterr().err
    assert main(["harness", "train", "--model", "tiny", "--group-size", "1", *out]) == 1
    assert "a group of one never trains" in capsys.readouterr().err
    # the engine flags reach engine.* (the tests' random model has no directory to launch vLLM on)
    assert main(["harness", "eval", "--model", "tiny", "--engine", "vllm", *out]) != 0
    assert "launching vLLM needs a model directory" in capsys.readouterr().err
    assert not (tmp_path / "x" / "run.json").exists()


def test_train_reads_its_steps_from_the_section(tmp_path, capsys):
    """``harness.steps = 0`` without a warm start trains nothing: refused before anything is
    written, as ``--steps 0`` is."""
    config = tmp_path / "h.toml"
    config.write_text("[harness]\nsteps = 0\n")
    args = ["harness", "train", "--model", "tiny", "--config", str(config)]
    assert main([*args, "--out", str(tmp_path / "r")]) == 1
    assert "--steps 0: nothing to train" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


@pytest.mark.timeout(900)
def test_eval_through_a_real_vllm_server(vllm_server, tmp_path, capsys):
    """``harness eval --engine vllm --vllm-url URL``: the rollouts are sampled by the vLLM
    server (the turns carry its log-probs) and recorded in the eval's store."""
    args = ["harness", "eval", "--engine", "vllm", "--vllm-url", vllm_server.url,
            "--limit", "1", "--k", "1", "--isolation", "fallback", "--max-steps", "2",
            "--time-limit", "120", "--json", "--out", str(tmp_path / "e")]  # fmt: skip
    assert main(args) == 0
    [row] = _eval_rows(capsys)
    assert len(row["counts"]) == 1 and row["version"] == 0
    with Store(tmp_path / "e" / "store.db", read_only=True) as store:
        turns = [t for sid in store.session_ids() for t in store.session_turns(sid)]
    assert turns and all(t.policy_version == 0 and t.sampling_logprobs for t in turns)


def test_the_example_config_names_every_harness_key_at_its_default():
    from pathlib import Path

    from clawrl.config import Config

    path = Path(__file__).parents[2] / "examples" / "harness.toml"
    text = path.read_text()
    missing = [k for k in HarnessConfig.model_fields if f"{k} =" not in text]
    assert missing == [], f"examples/harness.toml does not show {missing}"
    cfg, default = load_config(path, []), Config()
    assert cfg.harness == default.harness and cfg.model == default.model
    assert cfg.trainer == default.trainer and cfg.metrics == default.metrics
