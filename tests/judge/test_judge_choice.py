"""Choice scoring: calibration math on a stub engine with known log-probs, and the tiny model."""

from __future__ import annotations

import asyncio
import json
import math

import pytest

from clawrl.errors import EngineError
from clawrl.judge import AbstainReason, Judge, Score
from clawrl.judge.backends import ChoiceBackend, calibrated_verdict, normalise
from clawrl.judge.prompts import CHOICE_TEMPLATES, ChoiceTemplate


class StubScoreEngine:
    """``score_batch`` returning fixed per-token log-probs: ``table[(content_free, token_id)]``.

    A prompt is content-free when its decoded text shows ``N/A`` as the next state.
    """

    def __init__(self, tokenizer, table, fail=False):
        self.tokenizer = tokenizer
        self.table = table
        self.fail = fail
        self.calls: list[int] = []

    async def score_batch(self, items, *, temperature=1.0):
        self.calls.append(len(items))
        if self.fail:
            raise EngineError("model failed")
        out = []
        for prompt, target in items:
            cf = "(what came next)\nN/A" in self.tokenizer.decode(prompt)
            out.append([self.table[(cf, t)] for t in target])
        return out


def _tid(tok, word):
    (t,) = tok.encode(word, add_special_tokens=False)
    return t


def test_normalise_and_calibration_hand_computed():
    real = {Score.GOOD: -1.0, Score.BAD: -2.0, Score.NEUTRAL: -0.5}
    cf = {Score.GOOD: -0.8, Score.BAD: -3.0, Score.NEUTRAL: -0.4}
    lse = math.log(math.exp(-1.0) + math.exp(-2.0) + math.exp(-0.5))
    assert normalise(real)[Score.GOOD] == pytest.approx(-1.0 - lse)
    # without calibration the prior wins: neutral has the highest log-prob
    assert calibrated_verdict(real, None)[0] == Score.NEUTRAL
    # calibrated: l(s|x) - l(s|cf) = (x_s - cf_s) + const = good -0.2, bad +1.0, neutral -0.1
    score, cal = calibrated_verdict(real, cf)
    assert score == Score.BAD
    assert cal[Score.BAD] - cal[Score.NEUTRAL] == pytest.approx(1.1)
    assert cal[Score.NEUTRAL] - cal[Score.GOOD] == pytest.approx(0.1)
    # the margin rule: best - runner-up = 1.1 nats
    assert calibrated_verdict(real, cf, min_margin=1.2)[0] is None
    assert calibrated_verdict(real, cf, min_margin=1.0)[0] == Score.BAD
    # an exact tie goes to 0; the content-free input itself is an exact three-way tie
    assert calibrated_verdict(cf, cf)[0] == Score.NEUTRAL


def test_choice_backend_calibrates_on_the_stub_engine(tokenizer, mk_input):
    good, bad, neutral = (_tid(tokenizer, w) for w in (" good", " bad", " neutral"))
    table = {
        (False, good): -1.0, (False, bad): -2.0, (False, neutral): -0.5,
        (True, good): -0.8, (True, bad): -3.0, (True, neutral): -0.4,
    }  # fmt: skip
    engine = StubScoreEngine(tokenizer, table)
    template = CHOICE_TEMPLATES[0]
    assert template.verdicts[Score.GOOD] == " good"
    inp = mk_input("hmm")
    calibrated = ChoiceBackend(engine, tokenizer, templates=[template])
    votes = asyncio.run(calibrated.votes(inp, [0, 1]))
    assert engine.calls == [12]  # 2 votes x 3 verdicts x {real, content-free}: ONE batch
    assert [v.score for v in votes] == [Score.BAD, Score.BAD]
    raw = json.loads(votes[0].raw)
    assert raw["template"] == template.name
    assert raw["calibrated"]["-1"] - raw["calibrated"]["0"] == pytest.approx(1.1, abs=1e-3)
    plain = ChoiceBackend(engine, tokenizer, templates=[template], calibrate=False)
    (v,) = asyncio.run(plain.votes(inp, [0]))
    assert engine.calls[-1] == 3 and v.score == Score.NEUTRAL
    assert v.hint is None


def test_multi_token_verdicts_are_summed(tokenizer, mk_input):
    template = ChoiceTemplate(
        name="signed",
        system="s",
        question="q",
        question_first=False,
        answer_prefix="Score:",
        verdicts={Score.GOOD: " +1", Score.BAD: " -1", Score.NEUTRAL: " 0"},
    )
    ids = {s: tokenizer.encode(w, add_special_tokens=False) for s, w in template.verdicts.items()}
    assert all(len(v) == 2 for v in ids.values())
    # per-token log-probs; "1" is shared by +1 and -1
    lp = {ids[Score.GOOD][0]: -3.0, ids[Score.BAD][0]: -1.0, ids[Score.NEUTRAL][0]: -0.1,
          ids[Score.GOOD][1]: -0.1, ids[Score.NEUTRAL][1]: -2.5}  # fmt: skip
    table = {(cf, t): v for cf in (False, True) for t, v in lp.items()}
    engine = StubScoreEngine(tokenizer, table)
    backend = ChoiceBackend(engine, tokenizer, templates=[template], calibrate=False)
    (v,) = asyncio.run(backend.votes(mk_input(), [0]))
    raw = json.loads(v.raw)
    # sums: +1 = -3.1, -1 = -1.1, 0 = -2.6 (a mean would give 0 = -1.3 and still pick -1)
    assert raw["logprob"] == {"1": -3.1, "-1": -1.1, "0": -2.6}
    assert v.score == Score.BAD


def test_vote_i_uses_template_i_mod_k(tokenizer):
    backend = ChoiceBackend(object(), tokenizer)
    names = [backend.template(i).name for i in range(7)]
    assert names[:5] == [t.name for t in CHOICE_TEMPLATES]
    assert names[5:] == names[:2]
    assert len(set(names[:5])) == 5


def test_prompt_ends_right_before_the_verdict(tokenizer, mk_input):
    backend = ChoiceBackend(object(), tokenizer)
    for i, t in enumerate(CHOICE_TEMPLATES):
        text = tokenizer.decode(backend.prompt_ids(mk_input("thanks!"), t, content_free=False))
        assert text.endswith("<|im_start|>assistant\n" + t.answer_prefix), i
        assert "thanks!" in text
        cf = tokenizer.decode(backend.prompt_ids(mk_input("thanks!"), t, content_free=True))
        assert "thanks!" not in cf and "(what came next)\nN/A" in cf
        for w in t.verdicts.values():  # one token each for the SmolLM2 tokenizer
            assert len(tokenizer.encode(w, add_special_tokens=False)) == 1


def test_engine_failure_is_an_abstention(tokenizer, mk_input):
    backend = ChoiceBackend(StubScoreEngine(tokenizer, {}, fail=True), tokenizer)
    j = asyncio.run(Judge(backend, votes=3).judge(mk_input()))
    assert j.score is None
    assert {v.abstain_reason for v in j.votes} == {AbstainReason.BACKEND_ERROR}


def test_choice_on_the_tiny_model(tiny, mk_input):
    from clawrl.engine import TransformersEngine

    engine = TransformersEngine.from_policy(tiny, max_batch=4)
    try:
        backend = ChoiceBackend(engine, tiny.tokenizer, model="tiny")
        j = asyncio.run(Judge(backend, votes=3).judge(mk_input("No, use tabs instead of spaces.")))
    finally:
        engine.close()
    assert j.score is not None and len(j.valid_votes) == 3
    for v in j.votes:
        raw = json.loads(v.raw)
        assert set(raw["calibrated"]) == {"1", "-1", "0"}
        assert all(x <= 0 for x in raw["logprob"].values())
    assert j.hint is not None and j.hint.text == "Use tabs instead of spaces."


def test_judge_timeout_does_not_cancel_the_engines_scoring_future(tokenizer, mk_input):
    """The engine resolves its own concurrent future later; a timeout must not cancel it
    (TransformersEngine raises InvalidStateError on a cancelled score future)."""
    import concurrent.futures
    import threading
    import time

    pending: list[concurrent.futures.Future] = []

    class SlowEngine:
        async def score_batch(self, items, *, temperature=1.0):
            fut: concurrent.futures.Future = concurrent.futures.Future()
            pending.append(fut)
            return await asyncio.wrap_future(fut)

    backend = ChoiceBackend(SlowEngine(), tokenizer)

    async def go():
        start = time.perf_counter()
        j = await Judge(backend, votes=3, timeout_s=0.2).judge(mk_input())
        assert time.perf_counter() - start < 1.0
        await asyncio.sleep(0.05)
        assert len(pending) == 1 and not pending[0].cancelled()
        # the engine thread resolves it later; aclose waits for that
        threading.Timer(0.1, pending[0].set_result, args=([],)).start()
        await backend.aclose(wait_s=5)
        assert not backend._in_flight
        return j

    j = asyncio.run(go())
    assert j.score is None and {v.abstain_reason for v in j.votes} == {AbstainReason.TIMEOUT}
    assert pending[0].result() == []
