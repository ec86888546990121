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
from clawrl.judge.types import NextStateRole

GBN = {Score.GOOD: " good", Score.BAD: " bad", Score.NEUTRAL: " neutral"}


def _template(content_free=("N/A",), verdicts=None, name="t"):
    return ChoiceTemplate(
        name=name,
        system="s",
        question='Asked "{request}"; did "{action}" work? Next: <<{next_state}>>',
        answer_prefix="Answer:",
        verdicts=verdicts or GBN,
        content_free=content_free,
    )


class StubScoreEngine:
    """``score_batch`` returning fixed per-token log-probs: ``table[(next_state, token_id)]``,
    where ``next_state`` is the text between ``<<`` and ``>>`` in the prompt (``_template``)."""

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
            text = self.tokenizer.decode(prompt)
            shown = text.split("<<", 1)[1].split(">>", 1)[0]
            out.append([self.table[(shown, t)] for t in target])
        return out

    async def score_next_batch(self, prompts, candidates, *, temperature=1.0):
        """The next-token form (one row per prompt, one value per candidate); counted as the
        ``len(prompts) * len(candidates)`` (prompt, verdict) pairs it stands for."""
        got = await self.score_batch([(p, [c]) for p in prompts for c in candidates])
        self.calls[-1:] = [len(prompts) * len(candidates)]
        k = len(candidates)
        return [[row[0] for row in got[i * k : (i + 1) * k]] for i in range(len(prompts))]


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
        ("hmm", good): -1.0, ("hmm", bad): -2.0, ("hmm", neutral): -0.5,
        ("N/A", good): -0.8, ("N/A", bad): -3.0, ("N/A", neutral): -0.4,
    }  # fmt: skip
    engine = StubScoreEngine(tokenizer, table)
    template = _template()
    inp = mk_input("hmm")
    calibrated = ChoiceBackend(engine, tokenizer, templates=[template])
    votes = asyncio.run(calibrated.votes(inp, [0, 1]))
    # 2 votes x {real, content-free} prompts x 3 verdicts in ONE batch; the two votes share the
    # one template, so their identical prompts are scored once: 2 prompts x 3 verdicts
    assert engine.calls == [6]
    assert [v.score for v in votes] == [Score.BAD, Score.BAD]
    raw = json.loads(votes[0].raw)
    assert raw["template"] == template.name
    assert raw["calibrated"]["-1"] - raw["calibrated"]["0"] == pytest.approx(1.1, abs=1e-3)
    plain = ChoiceBackend(engine, tokenizer, templates=[template], calibrate=False)
    (v,) = asyncio.run(plain.votes(inp, [0]))
    assert engine.calls[-1] == 3 and v.score == Score.NEUTRAL
    assert v.hint is None


def test_multi_token_verdicts_are_summed(tokenizer, mk_input):
    template = _template(verdicts={Score.GOOD: " +1", Score.BAD: " -1", Score.NEUTRAL: " 0"})
    ids = {s: tokenizer.encode(w, add_special_tokens=False) for s, w in template.verdicts.items()}
    assert all(len(v) == 2 for v in ids.values())
    # per-token log-probs; "1" is shared by +1 and -1
    lp = {ids[Score.GOOD][0]: -3.0, ids[Score.BAD][0]: -1.0, ids[Score.NEUTRAL][0]: -0.1,
          ids[Score.GOOD][1]: -0.1, ids[Score.NEUTRAL][1]: -2.5}  # fmt: skip
    table = {(shown, t): v for shown in ("Thanks, that worked!", "N/A") for t, v in lp.items()}
    engine = StubScoreEngine(tokenizer, table)
    backend = ChoiceBackend(engine, tokenizer, templates=[template], calibrate=False)
    (v,) = asyncio.run(backend.votes(mk_input(), [0]))
    raw = json.loads(v.raw)
    # sums: +1 = -3.1, -1 = -1.1, 0 = -2.6 (a mean would give 0 = -1.3 and still pick -1)
    assert raw["logprob"] == {"1": -3.1, "-1": -1.1, "0": -2.6}
    assert v.score == Score.BAD


def test_averaged_content_free_calibration_hand_computed(tokenizer, mk_input):
    good, bad, neutral = (_tid(tokenizer, w) for w in (" good", " bad", " neutral"))
    lp = {
        "meh": (-1.0, -1.0, -1.0),  # the real input is uninformative ...
        "N/A": (-0.5, -2.0, -2.0),  # ... but both content-free inputs favour "good"
        "": (-1.5, -2.0, -0.5),
    }
    table = {
        (k, t): v for k, vs in lp.items() for t, v in zip((good, bad, neutral), vs, strict=True)
    }
    backend = ChoiceBackend(
        StubScoreEngine(tokenizer, table), tokenizer, templates=[_template(("N/A", ""))]
    )
    (v,) = asyncio.run(backend.votes(mk_input("meh"), [0]))
    raw = json.loads(v.raw)
    na = normalise(dict(zip((Score.GOOD, Score.BAD, Score.NEUTRAL), lp["N/A"], strict=True)))
    empty = normalise(dict(zip((Score.GOOD, Score.BAD, Score.NEUTRAL), lp[""], strict=True)))
    for s in Score:
        assert raw["content_free"][str(int(s))] == pytest.approx((na[s] + empty[s]) / 2, abs=1e-4)
    # uniform real minus the averaged prior: bad has the lowest prior, so it wins
    assert v.score == Score.BAD


def test_empty_next_state_is_neutral_without_a_model_call(tokenizer, mk_input):
    engine = StubScoreEngine(tokenizer, {})
    backend = ChoiceBackend(engine, tokenizer)
    for role in ("tool", "user"):
        votes = asyncio.run(backend.votes(mk_input("  \n", role=role), [0, 1, 2]))
        assert [v.score for v in votes] == [Score.NEUTRAL] * 3
        assert json.loads(votes[0].raw) == {"rule": "empty next state"}
    assert engine.calls == []


def test_nonzero_exit_status_of_a_program_is_bad_without_a_model_call(tokenizer, mk_input):
    engine = StubScoreEngine(tokenizer, {})
    backend = ChoiceBackend(engine, tokenizer)
    for role in ("tool", "environment"):
        text = "cp: cannot stat 'out.txt': No such file or directory\n[exit code 1]"
        votes = asyncio.run(backend.votes(mk_input(text, role=role), [0, 1]))
        assert [v.score for v in votes] == [Score.BAD] * 2
        assert json.loads(votes[0].raw) == {"rule": "exit_status"}
    assert engine.calls == []


def test_templates_follow_the_next_state_role(tokenizer):
    backend = ChoiceBackend(object(), tokenizer)
    for role in NextStateRole:
        ts = CHOICE_TEMPLATES[role]
        names = [backend.template(i, role).name for i in range(len(ts) + 2)]
        assert names[: len(ts)] == [t.name for t in ts] and names[len(ts) :] == names[:2]
    person = {t.name for t in CHOICE_TEMPLATES[NextStateRole.USER]}
    program = {t.name for t in CHOICE_TEMPLATES[NextStateRole.TOOL]}
    assert not person & program
    assert {t.name for t in CHOICE_TEMPLATES[NextStateRole.FEEDBACK]} == person
    assert {t.name for t in CHOICE_TEMPLATES[NextStateRole.ENVIRONMENT]} == program
    # a program's output is judged success or failure only
    assert all(set(t.verdicts) == {Score.GOOD, Score.BAD} for t in CHOICE_TEMPLATES["tool"])
    with pytest.raises(ValueError, match="at least one template"):
        ChoiceBackend(object(), tokenizer, templates={NextStateRole.USER: [_template()]})


def test_prompt_ends_right_before_the_verdict(tokenizer, mk_input):
    backend = ChoiceBackend(object(), tokenizer)
    for role in NextStateRole:
        for t in CHOICE_TEMPLATES[role]:
            inp = mk_input("thanks {literally}!", role=str(role))
            text = tokenizer.decode(backend.prompt_ids(inp, t))
            assert text.endswith("<|im_start|>assistant\n" + t.answer_prefix), t.name
            assert "thanks {literally}!" in text
            # context: the user's request for a person's reply, the turn's action for a tool's
            assert ("What is 2+2?" in text) or ("4" in text.split("thanks")[0]), t.name
            for cf in t.content_free:
                other = tokenizer.decode(backend.prompt_ids(inp, t, content_free=cf))
                assert "thanks" not in other and other.endswith(t.answer_prefix)
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

    pending: list[concurrent.futures.Future] = []

    class SlowEngine:
        async def score_next_batch(self, prompts, candidates, *, temperature=1.0):
            fut: concurrent.futures.Future = concurrent.futures.Future()
            pending.append(fut)
            return await asyncio.wrap_future(fut)

    backend = ChoiceBackend(SlowEngine(), tokenizer)

    async def go():
        j = await Judge(backend, votes=3, timeout_s=0.2).judge(mk_input())  # engine never answers
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


def test_repeated_templates_are_scored_once_on_the_next_token_path(tokenizer, mk_input):
    """Votes beyond the role's k templates repeat a prompt: one forward per distinct prompt."""

    class NextTokenEngine:
        def __init__(self):
            self.prompts: list[int] = []

        async def score_next_batch(self, prompts, candidates):
            self.prompts.append(len(prompts))
            # a deterministic function of the prompt, different per candidate
            return [[-((sum(p) + 7 * j) % 13) / 3 for j in range(len(candidates))] for p in prompts]

    engine = NextTokenEngine()
    backend = ChoiceBackend(engine, tokenizer)
    k = len(CHOICE_TEMPLATES[NextStateRole.USER])
    votes = asyncio.run(backend.votes(mk_input("not what I asked for"), list(range(k + 2))))
    per_vote = 1 + len(CHOICE_TEMPLATES[NextStateRole.USER][0].content_free)
    assert sum(engine.prompts) == k * per_vote  # not (k + 2) * per_vote
    assert [v.raw for v in votes[k:]] == [v.raw for v in votes[:2]]


def test_calibration_needs_content_free_inputs(tokenizer):
    bare = _template(content_free=())
    with pytest.raises(ValueError, match="no content_free inputs"):
        ChoiceBackend(object(), tokenizer, templates=[bare])
    ChoiceBackend(object(), tokenizer, templates=[bare], calibrate=False)  # fine uncalibrated
