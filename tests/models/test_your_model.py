"""A user's own model: GGUF files, chat-template overrides, stop ids, the judge's model, and the
commands that take ``--model`` (issue: any Hugging Face causal LM or GGUF file works)."""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

import pytest

from clawrl.config import Config
from clawrl.errors import EvaluationError, ModelLoadError
from clawrl.models import (
    load_policy,
    read_chat_template,
    stop_ids,
    template_end_of_turn_ids,
)

TRL_TEMPLATES = Path(__import__("trl").__file__).parent / "chat_templates"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, tiny):
    """The tiny model saved as a model directory, with its chat template removed (a base
    model's directory)."""
    d = tmp_path_factory.mktemp("base-model")
    tok = copy.deepcopy(tiny.tokenizer)
    tok.chat_template = None
    tiny.model.save_pretrained(d)
    tok.save_pretrained(d)
    for name in ("chat_template.jinja", "chat_template.json"):
        (d / name).unlink(missing_ok=True)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    return d


def test_a_directory_without_a_template_loads_and_takes_one(tiny_dir):
    plain = load_policy(str(tiny_dir))
    assert not plain.tokenizer.chat_template
    gemma = TRL_TEMPLATES / "gemma3.jinja"
    p = load_policy(str(tiny_dir), chat_template=str(gemma))
    assert p.tokenizer.chat_template == gemma.read_text()
    text = p.tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False,
                                           add_generation_prompt=True)  # fmt: skip
    assert text.endswith("<start_of_turn>model\n")


def test_chat_template_sources(tmp_path):
    inline = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    assert read_chat_template(inline) == inline
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": inline}))
    assert read_chat_template(str(tmp_path / "tokenizer_config.json")) == inline
    (tmp_path / "named.json").write_text(
        json.dumps({"chat_template": [{"name": "default", "template": inline}]})
    )
    assert read_chat_template(str(tmp_path / "named.json")) == inline
    with pytest.raises(ModelLoadError, match="no such file"):
        read_chat_template(str(tmp_path / "missing.jinja"))
    (tmp_path / "empty.json").write_text("{}")
    with pytest.raises(ModelLoadError, match="holds no chat_template"):
        read_chat_template(str(tmp_path / "empty.json"))


def test_stop_ids_include_the_templates_end_of_turn(tiny):
    tok = copy.deepcopy(tiny.tokenizer)
    # ChatML: <|im_end|> is SmolLM2's EOS too
    assert template_end_of_turn_ids(tok) == [tok.convert_tokens_to_ids("<|im_end|>")]
    # a template whose end of turn is another control token of this vocabulary
    tok.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|endoftext|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    eot = tok.convert_tokens_to_ids("<|endoftext|>")
    assert eot != tok.eos_token_id
    assert template_end_of_turn_ids(tok) == [eot, tok.eos_token_id]  # the end of turn, then EOS
    assert stop_ids(tok) == {tok.eos_token_id, eot}
    assert eot in stop_ids(tok, extra=["<|endoftext|>", 5])
    assert 5 in stop_ids(tok, extra=[5])
    with pytest.raises(ModelLoadError, match="not one token"):
        stop_ids(tok, extra=["hello world"])
    with pytest.raises(ModelLoadError, match="outside the vocabulary"):
        stop_ids(tok, extra=[10**9])


def test_policy_stop_ids_reach_the_engine(tiny_dir):
    from clawrl.engine import TransformersEngine

    p = load_policy(str(tiny_dir), chat_template=str(TRL_TEMPLATES / "qwen2_5.jinja"),
                    stop_ids=["<|endoftext|>"])  # fmt: skip
    engine = TransformersEngine.from_policy(p)
    try:
        want = {p.tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")}
        assert want <= engine.eos_token_ids
    finally:
        engine.close()


def test_model_spec_errors_say_what_to_pass(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        load_policy(str(tmp_path / "weights.bin"))
    (tmp_path / "m.gguf").write_bytes(b"not gguf")
    with pytest.raises(ModelLoadError, match=r"pass --model .*m\.gguf"):
        load_policy(str(tmp_path))
    with pytest.raises(ModelLoadError, match=r"cannot read .* as a GGUF model"):
        load_policy(str(tmp_path / "m.gguf"))


@pytest.mark.slow
def test_a_gguf_file_loads_like_the_embedded_model(tmp_path, monkeypatch):
    """A user's GGUF file (here the embedded model's own file) converts once into the cache and
    gives the same weights as the embedded spec."""
    import torch

    from clawrl.models import embedded_gguf_path

    gguf = tmp_path / "my-model.gguf"
    gguf.symlink_to(embedded_gguf_path("smollm2-135m"))
    monkeypatch.setenv("CLAWRL_CACHE", str(tmp_path / "cache"))
    mine = load_policy(str(gguf))
    assert mine.path is not None and mine.path.parent == tmp_path / "cache" / "models"
    again = load_policy(str(gguf))  # read from the cache
    assert again.path == mine.path
    ref = load_policy("smollm2-135m")
    a, b = mine.model.state_dict(), ref.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert mine.stop_ids == ref.stop_ids


def test_the_default_judge_reads_its_own_model_for_any_policy(tmp_path):
    from clawrl.config import validate_config
    from clawrl.runtime import judge_model_spec

    other = validate_config({"model": {"spec": str(tmp_path)}})
    assert judge_model_spec(other) == "smollm2-135m"  # the shipped head's model
    explicit = validate_config({"model": {"spec": "x/y"}, "judge": {"model": "a/b"}})
    assert judge_model_spec(explicit) == "a/b"
    choice = validate_config({"model": {"spec": "x/y"}, "judge": {"backend": {"kind": "choice"}}})
    assert judge_model_spec(choice) == "x/y"  # a generative judge reads the policy's base


def test_model_flags_reach_the_config():
    from clawrl.cli.common import with_model_flags

    args = argparse.Namespace(model="gemma3-270m", chat_template="t.jinja")
    cfg = with_model_flags(Config(), args)
    assert (cfg.model.spec, cfg.model.chat_template) == ("gemma3-270m", "t.jinja")
    assert with_model_flags(Config(), argparse.Namespace()).model == Config().model


def test_quick_keeps_the_flags_given():
    from clawrl.cli.demo import run_shape

    def ns(**kw):
        base = {"quick": False, "steps": None, "batch_size": None, "eval_problems": None}
        return argparse.Namespace(**{**base, **kw})

    assert run_shape(ns()) == (16, 4, None, (0, 8, 16))
    assert run_shape(ns(quick=True)) == (4, 2, 20, (0, 2, 4))
    assert run_shape(ns(quick=True, eval_problems=6, steps=2)) == (2, 2, 6, (0, 1, 2))


def test_failed_answers_are_never_scored():
    from clawrl.demo.runner import _evaluation
    from clawrl.envs.evaluate import EvalItem, EvalResult

    ok = EvalItem("p1", "s1", "42 is it", 0.5)
    failed = EvalItem("p2", "s2", "", None, error="500: engine step failed")
    with pytest.raises(EvaluationError, match=r"1 of 2 held-out answers .*engine step failed"):
        _evaluation(EvalResult("student", "rule", [ok, failed]), 4, 2, 0)
    assert _evaluation(EvalResult("student", "rule", [ok]), 4, 2, 0).score == 0.5


def test_doctor_checks_a_model_dir(capsys, tiny_dir):
    from clawrl.cli import main

    assert main(["doctor", "--model", str(tiny_dir)]) == 1
    out = capsys.readouterr().out
    assert "no chat template" in out and "--chat-template" in out
    for name in ("qwen2_5", "llama3_2"):  # Hermes <tool_call>, Llama 3 JSON
        template = str(TRL_TEMPLATES / f"{name}.jinja")
        assert main(["doctor", "--model", str(tiny_dir), "--chat-template", template]) == 0
        out = " ".join(capsys.readouterr().out.replace("│", " ").split())
        for check in ("load", "chat template", "stop ids", "tools", "context", "generation",
                      "judge"):  # fmt: skip
            assert check in out
        assert "parses back as written" in out, out
