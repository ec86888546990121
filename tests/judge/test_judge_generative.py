"""Generative backend: seeded votes submitted together to the engine, each parsed on its own."""

from __future__ import annotations

import asyncio

from clawrl.engine import Completion, FinishReason
from clawrl.errors import EngineError
from clawrl.judge import AbstainReason, Judge, Score
from clawrl.judge.backends import GenerativeBackend


class StubGenEngine:
    """``generate`` answering ``texts[seed]`` after a short sleep; records concurrency."""

    def __init__(self, tokenizer, texts):
        self.tokenizer = tokenizer
        self.texts = texts
        self.params = []
        self.in_flight = 0
        self.max_in_flight = 0

    async def generate(self, prompt_ids, params):
        self.params.append(params)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        await asyncio.sleep(0.05)
        self.in_flight -= 1
        text = self.texts[params.seed]
        if isinstance(text, Exception):
            raise text
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return Completion(ids, [0.0] * len(ids), FinishReason.STOP, 0, len(prompt_ids))


def test_votes_are_concurrent_with_distinct_seeds(tokenizer, mk_input):
    texts = {
        10: "Reason: thanks.\nScore: +1",
        11: "Reason: hmm, first +1, then\nScore: -1",
        12: "Reason: thanks.\n<hint></hint>\nScore: +1",
    }
    engine = StubGenEngine(tokenizer, texts)
    backend = GenerativeBackend(engine, tokenizer, model="stub", base_seed=10, temperature=0.9)
    j = asyncio.run(Judge(backend, votes=3).judge(mk_input()))
    assert engine.max_in_flight == 3  # all votes were in the engine at once
    assert sorted(p.seed for p in engine.params) == [10, 11, 12]
    assert {p.temperature for p in engine.params} == {0.9}
    assert j.score == Score.GOOD
    assert [v.score for v in j.votes] == [Score.GOOD, Score.BAD, Score.GOOD]
    assert j.hint is None


def test_prompt_shows_context_turn_and_next_state(tokenizer, mk_input):
    backend = GenerativeBackend(object(), tokenizer)
    text = tokenizer.decode(backend.prompt_ids(mk_input("No, use tabs.")))
    for part in ("You are helpful.", "What is 2+2?", "No, use tabs.", "Score: +1"):
        assert part in text
    assert text.index("What is 2+2?") < text.index("No, use tabs.")
    assert text.endswith("<|im_start|>assistant\n")


def test_engine_error_is_an_abstention(tokenizer, mk_input):
    texts = {0: "Score: -1", 1: EngineError("boom"), 2: "Score: -1"}
    backend = GenerativeBackend(StubGenEngine(tokenizer, texts), tokenizer)
    j = asyncio.run(Judge(backend, votes=3).judge(mk_input()))
    assert j.score == Score.BAD
    assert j.votes[1].abstain_reason == AbstainReason.BACKEND_ERROR
    assert "boom" in (j.votes[1].detail or "")
