"""Guard metrics: what a personalization rubric does not score, but training can break.

A rubric rewards style (no bold, casual, short). A policy can raise it by writing worse
answers: looping on one sentence, or dropping the arithmetic. These two checks are reported
next to the score (``clawrl eval personalization``, ``clawrl demo``) and never enter it:

* :func:`repeated_sentence` — a sentence or line of at least ``min_words`` words that occurs
  ``times`` or more times (a decoding loop);
* :func:`final_number_correct` — the last number of the answer equals the problem's known
  answer (student scenario; GSM8K scoring, as in Cobbe et al. 2021, where the final number is
  the answer).
"""

from __future__ import annotations

import re
from collections import Counter

from clawrl.envs.numbers import canonical, numbers_in
from clawrl.envs.problems import Problem

_UNIT = re.compile(r"(?<=[.!?])\s+|\n+")


def repeated_sentence(text: str, *, times: int = 3, min_words: int = 4) -> str | None:
    """The first sentence or line that occurs at least ``times`` times, else ``None``.

    Sentences are compared lowercased with whitespace collapsed; ones shorter than
    ``min_words`` words ("Yes.", "So:") do not count.
    """
    units = [" ".join(u.lower().split()) for u in _UNIT.split(text)]
    counts = Counter(u for u in units if len(u.split()) >= min_words)
    for unit in units:
        if counts.get(unit, 0) >= times:
            return unit
    return None


def final_number_correct(response: str, problem: Problem) -> bool:
    """Whether the last number in ``response`` equals ``problem.answer`` (canonical forms:
    ``"12.50" == "12.5"``, ``"1,000" == "1000"``); a response without a number is wrong."""
    found = numbers_in(response)
    return bool(found) and found[-1] == canonical(problem.answer)
