"""The clawrl command: help, doctor, generate (tiny model saved as a local HF dir), config."""

from __future__ import annotations

import pytest

from clawrl.cli import main
from clawrl.config import load_config
from clawrl.errors import ConfigError


def test_help_lists_commands(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "generate" in out and "doctor" in out and "clawrl generate" in out


def test_no_command_prints_help(capsys):
    assert main([]) == 2
    assert "COMMAND" in capsys.readouterr().out


def test_doctor_runs(capsys):
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "torch" in out and "embedded model" in out


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, tiny):
    d = tmp_path_factory.mktemp("tiny-model")
    tiny.model.save_pretrained(d)
    tiny.tokenizer.save_pretrained(d)
    return d


def test_generate_show_tokens(capsys, tiny_dir):
    rc = main(
        [
            "generate",
            "--model",
            str(tiny_dir),
            "--max-tokens",
            "5",
            "--temperature",
            "0",
            "--show-tokens",
            "hello",
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "5 sampled tokens" in out and "logprob" in out
    assert "finish_reason=length" in out


def test_generate_bad_model_is_a_clear_error(capsys):
    assert main(["generate", "--model", "nope-model", "hi"]) == 1
    assert "cannot resolve model" in capsys.readouterr().err


def test_config_file_and_overrides(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text("[server]\nport = 9000\n[engine]\nmax_batch = 4\n")
    cfg = load_config(f, ["server.port=9100", "sampling.temperature=0"])
    assert cfg.server.port == 9100 and cfg.engine.max_batch == 4
    assert cfg.sampling.temperature == 0.0


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["server.port=70000"], "server.port"),
        (["engine.max_batch=0"], "engine.max_batch"),
        (["server.nope=1"], "server.nope"),
        (["port=1"], "must name a section"),
        (["server.port"], "section.key=value"),
        (["judge.backend.url=x"], "head judge's, which has no url; name the backend"),
        (['judge.backend={kind="openai", model="m"}'], "judge.backend.url: Field required"),
    ],
)
def test_bad_config_names_the_field(overrides, needle):
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        load_config(None, overrides)


def test_a_dotted_judge_backend_setting_is_the_default_backends():
    """``--set judge.backend.hints=gate`` alone names no kind: it is the head judge's setting
    (it failed on the union's discriminator), and another kind's table keeps its own kind."""
    cfg = load_config(None, ["judge.backend.hints=gate"])
    assert (cfg.judge.backend.kind, cfg.judge.backend.hints) == ("head", "gate")
    cfg = load_config(None, ['judge.backend={kind="openai", url="http://x/v1", model="m"}'])
    assert cfg.judge.backend.kind == "openai"


def test_bad_toml(tmp_path):
    f = tmp_path / "bad.toml"
    f.write_text("[server\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(f)
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.toml")


def test_config_importable_without_torch():
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['torch'] = None; "
        "import clawrl.config as c; print(c.load_config().server.host)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "127.0.0.1"
