"""Guard metrics: loops and right final numbers, reported next to the rubric score."""

from __future__ import annotations

from clawrl.envs.guards import final_number_correct, repeated_sentence
from clawrl.envs.problems import Problem


def test_repeated_sentence_finds_a_decoding_loop():
    loop = "A batch needs 3 cups of milk.\nA batch needs 3 cups of milk.\n" * 2
    assert repeated_sentence(loop) == "a batch needs 3 cups of milk."
    assert repeated_sentence("So. So. So. It is 4.") is None  # short sentences do not count
    twice = "He has 4 apples left. He has 4 apples left. The answer is 4."
    assert repeated_sentence(twice) is None
    assert repeated_sentence(twice, times=2) == "he has 4 apples left."


def test_final_number_correct():
    p = Problem(id="p1", question="?", answer="12.5")
    assert final_number_correct("3 * 4 = 12, plus 0.5 makes 12.50", p)
    assert not final_number_correct("12.5 at first, then 13", p)
    assert not final_number_correct("no idea", p)
    assert final_number_correct("It costs $1,000.", Problem(id="p2", question="?", answer="1000"))
