"""Grade-school word problems with known numeric answers: the type, a seeded generator, a split.

Every problem carries its worked solution in GSM8K's format (one line per step, calculations
annotated ``<<expr=result>>``), so the teacher scenario can show a student's work and plant a
known arithmetic slip in it (:mod:`clawrl.envs.solutions`), whether the problem came from the
generator or from a GSM8K file.

The generator has :data:`TEMPLATES` (shopping, sharing, speed and time, ages, wages, baking,
fencing, discounts). Problem ``i`` of seed ``s`` is drawn from ``random.Random(f"{s}:{i}")``,
so a problem does not depend on how many others are generated, and runs are reproducible
across processes and machines.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from clawrl.envs.numbers import canonical, safe_eval


@dataclass(frozen=True)
class Problem:
    """A word problem with a known numeric answer.

    Attributes:
        id: unique within its source (``gen-0-17``, ``gsm8k-test-42``).
        question: the problem text.
        answer: the canonical answer string (:func:`clawrl.envs.numbers.canonical`).
        solution: worked-solution lines in GSM8K format (``<<expr=result>>`` annotations), without
            the ``#### N`` line; may be empty.
        source: ``generated`` or the dataset file's name.
        template: the generator template's name (``None`` for dataset problems).
    """

    id: str
    question: str
    answer: str
    solution: tuple[str, ...] = ()
    source: str = "generated"
    template: str | None = None

    @property
    def answer_value(self) -> float:
        """The answer as a float."""
        return float(self.answer)


@dataclass(frozen=True)
class ProblemSplit:
    """A deterministic train / held-out split (disjoint by question text).

    Attributes:
        train: problems the simulated users bring during training.
        held_out: problems only evaluation uses.
    """

    train: list[Problem] = field(default_factory=list)
    held_out: list[Problem] = field(default_factory=list)


class _Steps:
    """Builds annotated solution lines whose results are computed, never typed by hand."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.value = 0.0

    def calc(self, before: str, expr: str, after: str = "") -> str:
        self.value = safe_eval(expr)
        v = canonical(self.value)
        shown = expr.replace("*", " x ")
        self.lines.append(f"{before}{shown} = <<{expr}={v}>>{v}{after}")
        return v


_NAMES = (
    "Maya", "Liam", "Sofia", "Noah", "Ava", "Ethan", "Zara", "Omar", "Lena", "Kai",
    "Priya", "Diego", "Hana", "Felix", "Amara", "Jonah", "Ines", "Mateo", "Ruby", "Theo",
)  # fmt: skip
_ITEMS = (
    ("notebooks", "pens"), ("apples", "bananas"), ("stickers", "markers"),
    ("cupcakes", "cookies"), ("comic books", "posters"), ("socks", "hats"),
)  # fmt: skip
_SHARED = ("marbles", "pencils", "crayons", "trading cards", "beads", "candies")
_VEHICLES = (("train", "km"), ("car", "km"), ("cyclist", "km"), ("bus", "miles"))
_RELATIVES = ("brother", "sister", "cousin")
_JOBS = ("walking dogs", "tutoring", "washing cars", "babysitting", "mowing lawns")
_BAKES = (("cookies", "eggs"), ("pancakes", "cups of milk"), ("muffins", "cups of flour"))
_SHOP_ITEMS = ("jacket", "bike", "video game", "backpack", "lamp", "pair of shoes")

Template = Callable[[random.Random], tuple[str, list[str], str]]


def _shopping(r: random.Random) -> tuple[str, list[str], str]:
    name = r.choice(_NAMES)
    a, b = r.choice(_ITEMS)
    na, pa, nb, pb = r.randint(2, 6), r.randint(2, 9), r.randint(2, 5), r.randint(1, 6)
    paid = ((na * pa + nb * pb) // 10 + 1 + r.randint(0, 3)) * 10
    q = (
        f"{name} buys {na} {a} for ${pa} each and {nb} {b} for ${pb} each. "
        f"{name} pays with ${paid}. How much change does {name} get, in dollars?"
    )
    s = _Steps()
    x = s.calc(f"The {a} cost ", f"{na}*{pa}", " dollars.")
    y = s.calc(f"The {b} cost ", f"{nb}*{pb}", " dollars.")
    t = s.calc("Together that is ", f"{x}+{y}", " dollars.")
    ans = s.calc("The change is ", f"{paid}-{t}", " dollars.")
    return q, s.lines, ans


def _sharing(r: random.Random) -> tuple[str, list[str], str]:
    name = r.choice(_NAMES)
    thing = r.choice(_SHARED)
    friends, each = r.randint(2, 6), r.randint(3, 12)
    per_pack = r.choice((4, 5, 6, 8, 10, 12))
    kept = r.randint(1, 9)
    total = friends * each + kept
    packs = -(-total // per_pack)
    extra = packs * per_pack - total
    kept += extra
    q = (
        f"{name} has {packs} packs of {thing} with {per_pack} in each pack. {name} keeps "
        f"{kept} and shares the rest equally among {friends} friends. How many {thing} does "
        f"each friend get?"
    )
    s = _Steps()
    t = s.calc(f"{name} has ", f"{packs}*{per_pack}", f" {thing}.")
    rest = s.calc("After keeping some, ", f"{t}-{kept}", " are shared.")
    ans = s.calc("Each friend gets ", f"{rest}/{friends}", f" {thing}.")
    return q, s.lines, ans


def _speed(r: random.Random) -> tuple[str, list[str], str]:
    vehicle, unit = r.choice(_VEHICLES)
    v1, h1 = r.randint(3, 12) * 5, r.randint(2, 5)
    v2, h2 = r.randint(3, 12) * 5, r.randint(1, 4)
    q = (
        f"A {vehicle} travels at {v1} {unit} per hour for {h1} hours, then at {v2} {unit} per "
        f"hour for {h2} hours. How many {unit} does it travel in total?"
    )
    s = _Steps()
    d1 = s.calc("First part: ", f"{v1}*{h1}", f" {unit}.")
    d2 = s.calc("Second part: ", f"{v2}*{h2}", f" {unit}.")
    ans = s.calc("In total: ", f"{d1}+{d2}", f" {unit}.")
    return q, s.lines, ans


def _ages(r: random.Random) -> tuple[str, list[str], str]:
    name = r.choice(_NAMES)
    rel = r.choice(_RELATIVES)
    young, times, later = r.randint(2, 9), r.randint(2, 4), r.randint(2, 10)
    q = (
        f"{name} is {times} times as old as {name}'s {rel}, who is {young} years old. How old "
        f"will {name} and the {rel} be altogether in {later} years?"
    )
    s = _Steps()
    now = s.calc(f"{name} is ", f"{young}*{times}", " years old now.")
    a = s.calc(f"In {later} years {name} will be ", f"{now}+{later}", ".")
    b = s.calc(f"The {rel} will be ", f"{young}+{later}", ".")
    ans = s.calc("Altogether: ", f"{a}+{b}", " years.")
    return q, s.lines, ans


def _wages(r: random.Random) -> tuple[str, list[str], str]:
    name = r.choice(_NAMES)
    job = r.choice(_JOBS)
    rate, hours, days = r.randint(8, 20), r.randint(2, 6), r.randint(3, 6)
    spent = r.randint(2, rate * hours * days // 10) * 5
    q = (
        f"{name} earns ${rate} an hour {job}. {name} works {hours} hours a day for {days} days "
        f"and then spends ${spent}. How many dollars does {name} have left?"
    )
    s = _Steps()
    per_day = s.calc("Each day: ", f"{rate}*{hours}", " dollars.")
    total = s.calc(f"Over {days} days: ", f"{per_day}*{days}", " dollars.")
    ans = s.calc("Left after spending: ", f"{total}-{spent}", " dollars.")
    return q, s.lines, ans


def _baking(r: random.Random) -> tuple[str, list[str], str]:
    name = r.choice(_NAMES)
    bake, ing = r.choice(_BAKES)
    per, batches, dozens = r.randint(2, 4), r.randint(2, 5), r.randint(2, 4)
    while dozens * 12 <= per * batches:
        dozens += 1
    q = (
        f"A batch of {bake} needs {per} {ing}. {name} makes {batches} batches and started "
        f"with {dozens} dozen {ing}. How many {ing} are left?"
    )
    s = _Steps()
    used = s.calc(f"{name} uses ", f"{per}*{batches}", f" {ing}.")
    had = s.calc(f"{dozens} dozen is ", f"{dozens}*12", f" {ing}.")
    ans = s.calc("Left over: ", f"{had}-{used}", f" {ing}.")
    return q, s.lines, ans


def _fencing(r: random.Random) -> tuple[str, list[str], str]:
    length, width, price = r.randint(5, 30), r.randint(3, 20), r.randint(2, 9)
    q = (
        f"A rectangular garden is {length} meters long and {width} meters wide. Fencing costs "
        f"${price} per meter. How many dollars does it cost to fence the whole garden?"
    )
    s = _Steps()
    half = s.calc("One length plus one width is ", f"{length}+{width}", " meters.")
    per = s.calc("The perimeter is ", f"{half}*2", " meters.")
    ans = s.calc("The fence costs ", f"{per}*{price}", " dollars.")
    return q, s.lines, ans


def _discount(r: random.Random) -> tuple[str, list[str], str]:
    name = r.choice(_NAMES)
    item = r.choice(_SHOP_ITEMS)
    price = r.randint(2, 15) * 20  # a multiple of 20, so every discount is whole dollars
    pct = r.choice((10, 20, 25, 30, 40, 50))
    coupon = r.randint(1, 3) * 5
    q = (
        f"A {item} costs ${price}. It is on sale for {pct}% off, and {name} also has a ${coupon} "
        f"coupon. How many dollars does {name} pay?"
    )
    s = _Steps()
    off = s.calc("The discount is ", f"{price}*{pct}/100", " dollars.")
    sale = s.calc("The sale price is ", f"{price}-{off}", " dollars.")
    ans = s.calc("With the coupon: ", f"{sale}-{coupon}", " dollars.")
    return q, s.lines, ans


TEMPLATES: dict[str, Template] = {
    "shopping": _shopping,
    "sharing": _sharing,
    "speed": _speed,
    "ages": _ages,
    "wages": _wages,
    "baking": _baking,
    "fencing": _fencing,
    "discount": _discount,
}
"""Generator templates by name; each returns (question, annotated solution lines, answer)."""


def generate_problem(seed: int, index: int, *, template: str | None = None) -> Problem:
    """Problem number ``index`` of the seeded generator.

    Args:
        seed: the generator seed.
        index: the problem number (>= 0); problems of one seed are independent of each other.
        template: force one of :data:`TEMPLATES` (default: drawn from the seed and index).

    Raises:
        KeyError: an unknown template name.
    """
    r = random.Random(f"{seed}:{index}")
    name = template or r.choice(sorted(TEMPLATES))
    question, lines, answer = TEMPLATES[name](r)
    return Problem(
        id=f"gen-{seed}-{index}",
        question=question,
        answer=answer,
        solution=tuple(lines),
        source="generated",
        template=name,
    )


def generate_problems(n: int, *, seed: int = 0) -> list[Problem]:
    """``n`` distinct generated problems (duplicate questions are skipped).

    Args:
        n: how many (>= 0).
        seed: the generator seed.

    Raises:
        ValueError: ``n`` is negative.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    out: list[Problem] = []
    seen: set[str] = set()
    index = 0
    while len(out) < n:
        p = generate_problem(seed, index)
        index += 1
        if p.question not in seen:
            seen.add(p.question)
            out.append(p)
    return out


def question_key(question: str) -> str:
    """A question normalised for comparison: lower case, whitespace collapsed."""
    return " ".join(question.lower().split())


def _rank(key: str, seed: int) -> str:
    return hashlib.sha256(f"{seed}:{key}".encode()).hexdigest()


def split_problems(
    problems: Sequence[Problem], *, held_out: int, seed: int = 0, train: int | None = None
) -> ProblemSplit:
    """Split problems into train and held-out sets, deterministically and disjointly.

    Questions are ranked by ``sha256(seed, normalised question)``; the first ``held_out``
    distinct questions (with every copy of them) are held out, the rest train. Because the rank
    depends only on the question, the split of a problem does not depend on the others' order.

    Args:
        problems: the pool.
        held_out: distinct questions to hold out (>= 0).
        seed: the split seed.
        train: keep at most this many training problems (default: all the rest).

    Returns:
        The split; each side keeps the pool's order.

    Raises:
        ValueError: ``held_out`` is negative or not smaller than the number of distinct questions.
    """
    keys = {question_key(p.question) for p in problems}
    if held_out < 0 or (held_out >= len(keys) and held_out > 0):
        raise ValueError(
            f"cannot hold out {held_out} of {len(keys)} distinct questions (need fewer)"
        )
    ranked = sorted(keys, key=lambda k: _rank(k, seed))
    held = set(ranked[:held_out])
    held_list = [p for p in problems if question_key(p.question) in held]
    train_list = [p for p in problems if question_key(p.question) not in held]
    if train is not None:
        train_list = train_list[:train]
    return ProblemSplit(train=train_list, held_out=held_list)
