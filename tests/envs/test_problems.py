"""The word-problem generator, the split and the worked solutions with planted slips."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from clawrl.envs.numbers import canonical, numbers_in, safe_eval
from clawrl.envs.problems import (
    TEMPLATES,
    Problem,
    generate_problem,
    generate_problems,
    split_problems,
)
from clawrl.envs.solutions import ANNOTATION_RE, display, make_worked_solution


def _n(question: str) -> list[float]:
    return [float(x) for x in numbers_in(question)]


# Independent solvers: the answer recomputed from the numbers in the question text alone.
SOLVERS = {
    "shopping": lambda na, pa, nb, pb, paid: paid - (na * pa + nb * pb),
    "sharing": lambda packs, per, kept, friends: (packs * per - kept) / friends,
    "speed": lambda v1, h1, v2, h2: v1 * h1 + v2 * h2,
    "ages": lambda times, young, later: times * young + young + 2 * later,
    "wages": lambda rate, hours, days, spent: rate * hours * days - spent,
    "baking": lambda per, batches, dozens: dozens * 12 - per * batches,
    "fencing": lambda length, width, price: 2 * (length + width) * price,
    "discount": lambda price, pct, coupon: price - price * pct / 100 - coupon,
}


@pytest.mark.parametrize("template", sorted(TEMPLATES))
def test_each_template_answer_matches_an_independent_solver(template):
    assert set(SOLVERS) == set(TEMPLATES)
    for index in range(40):
        p = generate_problem(7, index, template=template)
        expected = SOLVERS[template](*_n(p.question))
        assert p.answer == canonical(expected), (p.question, p.answer)
        assert float(p.answer) > 0 and float(p.answer) == int(float(p.answer)), p.question


def test_solution_lines_recheck_and_end_in_the_answer():
    for p in generate_problems(200, seed=3):
        for line in p.solution:
            (m,) = ANNOTATION_RE.finditer(line)
            assert canonical(safe_eval(m.group(1))) == m.group(2)
            assert display(line).count(m.group(2)) >= 1
        assert ANNOTATION_RE.search(p.solution[-1]).group(2) == p.answer


def test_generator_is_deterministic_by_seed_and_independent_of_count():
    a = generate_problems(30, seed=5)
    assert a == generate_problems(30, seed=5)
    assert a[:10] == generate_problems(10, seed=5)
    b = generate_problems(30, seed=6)
    assert [p.question for p in a] != [p.question for p in b]
    assert len({p.question for p in a}) == 30 and len({p.id for p in a}) == 30


def test_generator_covers_every_template():
    counts = Counter(p.template for p in generate_problems(400, seed=0))
    assert set(counts) == set(TEMPLATES)
    assert min(counts.values()) >= 20


def test_split_is_disjoint_deterministic_and_order_free():
    pool = generate_problems(300, seed=1)
    s = split_problems(pool, held_out=50, seed=2)
    assert len(s.held_out) == 50 and len(s.train) == 250
    assert not {p.question for p in s.held_out} & {p.question for p in s.train}
    assert split_problems(pool, held_out=50, seed=2) == s
    shuffled = split_problems(list(reversed(pool)), held_out=50, seed=2)
    assert {p.id for p in shuffled.held_out} == {p.id for p in s.held_out}
    other = split_problems(pool, held_out=50, seed=3)
    assert {p.id for p in other.held_out} != {p.id for p in s.held_out}
    assert len(split_problems(pool, held_out=50, seed=2, train=10).train) == 10


def test_split_keeps_duplicate_questions_on_one_side():
    pool = generate_problems(20, seed=0)
    dup = Problem("copy", "  " + pool[0].question.upper() + " ", pool[0].answer)
    s = split_problems([*pool, dup], held_out=5, seed=0)
    sides = {p.id: ("held" if p in s.held_out else "train") for p in [*s.train, *s.held_out]}
    assert sides["copy"] == sides[pool[0].id]
    with pytest.raises(ValueError, match="cannot hold out"):
        split_problems(pool, held_out=20)


def test_flawed_solution_carries_the_slip_forward():
    flawed = 0
    for p in generate_problems(150, seed=4):
        w = make_worked_solution(p, seed=1, flaw_rate=1.0)
        if w.flaw is None:
            continue
        flawed += 1
        k = w.flaw.step - 1
        assert w.flaw.wrong_value != w.flaw.right_value
        # the slip step shows the wrong result where the right one was
        assert numbers_in(display(p.solution[k]).split(" = ")[-1])[0] == w.flaw.right_value
        assert numbers_in(w.steps[k].split(" = ")[-1])[0] == w.flaw.wrong_value
        assert w.steps[k].split(" = ")[0] == display(p.solution[k]).split(" = ")[0]
        # the steps before it are untouched, the answer is wrong
        assert w.steps[:k] == tuple(display(x) for x in p.solution[:k])
        assert w.answer != p.answer
        # every later step's arithmetic is right given what the student wrote before
        for step in w.steps[k + 1 :]:
            lhs, rhs = step.split(" = ")
            expr = re.findall(r"[\d.]+(?: x |[-+*/])[\d.]+(?:(?: x |[-+*/])[\d.]+)*", lhs)[-1]
            assert canonical(safe_eval(expr.replace(" x ", "*"))) == numbers_in(rhs)[0]
        assert w.render().splitlines()[k].startswith(f"Step {k + 1}: ")
    assert flawed >= 140  # nearly every generated problem admits an unambiguous slip


def test_flaw_rate_and_determinism():
    pool = generate_problems(200, seed=0)
    works = [make_worked_solution(p, seed=9) for p in pool]
    assert works == [make_worked_solution(p, seed=9) for p in pool]
    rate = sum(w.flaw is not None for w in works) / len(works)
    assert 0.35 < rate < 0.65
    assert all(make_worked_solution(p, flaw_rate=0.0).correct for p in pool[:20])
    correct = make_worked_solution(pool[0], flaw_rate=0.0)
    assert correct.answer == pool[0].answer and correct.render().endswith(
        f"Answer: {pool[0].answer}"
    )
    with pytest.raises(ValueError):
        make_worked_solution(pool[0], flaw_rate=1.5)


def test_numbers_helpers():
    assert numbers_in("paid $1,200 for 3.50 kg, 10-4 = 6") == ["1200", "3.5", "10", "4", "6"]
    assert canonical(2.0) == "2" and canonical("-0.250") == "-0.25"
    assert safe_eval("(3+4)*2/7") == 2.0
    for bad in ("__import__('os')", "2**99", "1/0", "a+1"):
        with pytest.raises(ValueError):
            safe_eval(bad)
