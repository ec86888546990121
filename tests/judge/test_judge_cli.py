"""``clawrl judge eval`` on the tiny model (saved as a local HF dir) and a stub endpoint."""

from __future__ import annotations

import json
import re
import socket

import pytest

from clawrl.cli import main
from clawrl.judge import load_cases


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, tiny):
    d = tmp_path_factory.mktemp("tiny-judge-model")
    tiny.model.save_pretrained(d)
    tiny.tokenizer.save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def few_cases(tmp_path_factory):
    cases = load_cases()
    picked = [next(c for c in cases if c.category == cat) for cat in
              ("praise", "correction", "tool_empty", "test_fail")]  # fmt: skip
    p = tmp_path_factory.mktemp("cases") / "few.jsonl"
    p.write_text("".join(c.model_dump_json() + "\n" for c in picked))
    return p


@pytest.mark.parametrize("backend", ["choice", "generative"])
def test_eval_on_tiny_model(capsys, tmp_path, tiny_dir, few_cases, backend):
    out = tmp_path / "results.jsonl"
    args = ["judge", "eval", "--cases", str(few_cases), "--backend", backend, "--votes", "1",
            "--model", str(tiny_dir), "--max-tokens", "8", "--output", str(out), "--json"]  # fmt: skip
    assert main(args) == 0
    text = capsys.readouterr().out
    for part in ("accuracy", "confusion matrix", "hint precision", "hint recall", "judgments/s"):
        assert part in text
    metrics = json.loads(text.strip().splitlines()[-1])
    assert metrics["eval/cases"] == 4 and metrics["judge/votes"] == 1
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["praise-01", "correction-01", "tool_empty-01",
                                       "test_fail-01"]  # fmt: skip
    assert all(len(r["judgment"]["votes"]) == 1 for r in rows)
    if backend == "choice":  # the choice backend always gives a verdict
        assert metrics["eval/coverage"] == 1.0
        # the heuristic finds the correction's directive whatever the model
        assert rows[1]["judgment"]["hint"]["selection"] == "heuristic"
    else:  # 8 random tokens never contain a Score: line
        assert metrics["eval/coverage"] == 0.0 and metrics["eval/accuracy"] == 0.0


def test_prefixes_table(capsys, tiny_dir, few_cases):
    args = ["judge", "eval", "--cases", str(few_cases), "--backend", "choice", "--votes", "3",
            "--prefixes", "1,2", "--model", str(tiny_dir)]  # fmt: skip
    assert main(args) == 0
    assert "from the first K votes" in capsys.readouterr().out
    assert main([*args[:-4], "--prefixes", "4", "--model", str(tiny_dir)]) == 1
    assert "--prefixes must lie in 1..3" in capsys.readouterr().err


def test_head_backend_train_then_eval(capsys, tmp_path, tiny_dir, few_cases):
    """`clawrl judge train` writes a head set for the given model; `eval --head` uses it; the
    shipped head (trained for SmolLM2-135M) is refused for another model."""
    head = tmp_path / "head.safetensors"
    train = ["judge", "train", "--out", str(head), "--model", str(tiny_dir), "--train", "60",
             "--val", "30", "--probes", "4"]  # fmt: skip
    assert main(train) == 0
    assert f"-> {head}" in capsys.readouterr().out
    args = ["judge", "eval", "--cases", str(few_cases), "--head", str(head), "--votes", "4",
            "--model", str(tiny_dir), "--json"]  # fmt: skip
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "sign errors" in text
    metrics = json.loads(text.strip().splitlines()[-1])
    assert metrics["eval/cases"] == 4 and metrics["judge/votes"] == 4
    assert "hints looked for by" in text and "bad-or-gate votes" in text
    # a dotted --set of the head's rule names no kind: it is the head judge's
    assert main([*args, "--set", "judge.backend.hints=gate"]) == 0
    assert "gate votes" in capsys.readouterr().out
    assert main(["judge", "eval", "--cases", str(few_cases), "--model", str(tiny_dir)]) == 1
    assert "clawrl judge train" in capsys.readouterr().err


def test_eval_takes_votes_and_quorum_from_the_config(capsys, tiny_dir, few_cases):
    """Without --votes the judge's settings come from --set / --config (they were replaced)."""
    args = ["judge", "eval", "--cases", str(few_cases), "--backend", "choice", "--model",
            str(tiny_dir), "--set", "judge.votes=2", "--set", "judge.hint_quorum=1.0",
            "--json"]  # fmt: skip
    assert main(args) == 0
    text = capsys.readouterr().out
    assert json.loads(text.strip().splitlines()[-1])["judge/votes"] == 2
    assert re.search(r"hint quorum\s*│\s*1\s", text)
    assert main([*args[:-1], "--votes", "1", "--json"]) == 0  # the flag wins
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["judge/votes"] == 1


def test_openai_backend_needs_url_and_model(capsys, few_cases):
    assert main(["judge", "eval", "--cases", str(few_cases), "--backend", "openai"]) == 1
    assert "--judge-url" in capsys.readouterr().err
    bad = ["judge", "eval", "--cases", str(few_cases), "--backend", "openai", "--judge-url",
           "http://127.0.0.1:1/v1", "--judge-model", "m", "--max-retries", "99"]  # fmt: skip
    assert main(bad) == 1
    assert "max_retries" in capsys.readouterr().err


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_openai_backend_against_unreachable_endpoint(capsys, few_cases):
    # nothing listens on a just-closed ephemeral port: every vote is a backend_error abstention
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    args = ["judge", "eval", "--cases", str(few_cases), "--backend", "openai", "--judge-url",
            url, "--judge-model", "m", "--votes", "2", "--json"]  # fmt: skip
    assert main(args) == 0
    metrics = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert metrics["eval/coverage"] == 0.0
    assert metrics["judge/abstain/backend_error"] == 8


def test_openai_backend_against_the_clawrl_gateway(capsys, tmp_path, tiny, few_cases):
    """The judge's OpenAI backend talks to clawrl's own gateway (real app, real store); the
    scripted policy answers by the next state it is shown, so the accuracy is known: 3 of 4."""
    from clawrl.engine.scripted import ScriptedEngine
    from clawrl.gateway import create_app
    from clawrl.gateway.server import LiveServer
    from clawrl.store import Store

    def reply(prompt_ids, params):
        text = tiny.tokenizer.decode(prompt_ids)
        if "Thanks, that's right!" in text:
            return "Reason: the user thanks the assistant.\nScore: +1"
        if "f-string" in text:
            return "Reason: a correction.\n<hint>Use an f-string instead of %.</hint>\nScore: -1"
        return "Reason: nothing to go on.\nScore: 0"  # right for tool_empty, wrong for test_fail

    engine = ScriptedEngine(tiny.tokenizer, reply_fn=reply, max_context=100_000)
    with Store(tmp_path / "s.db") as store:
        app = create_app(engine, tiny.tokenizer, store, model_name="judge")
        with LiveServer(app) as server:
            args = ["judge", "eval", "--cases", str(few_cases), "--backend", "openai",
                    "--judge-url", server.base_url, "--judge-model", "judge", "--votes", "3",
                    "--json"]  # fmt: skip
            assert main(args) == 0
        assert len(store.session_ids()) >= 1  # the judge's calls were recorded like any client's
    metrics = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert metrics["eval/coverage"] == 1.0
    assert metrics["eval/accuracy"] == 0.75
    assert metrics["eval/hint_precision"] == 1.0
