"""How a new directive changes a user's memory: add it, merge it into a near-duplicate, or let it
replace an entry it contradicts.

A directive is a short instruction to the assistant, in the user's words: a judge's hindsight
hint ("Lead with the number, then one sentence.") or the directive sentence of a feedback
comment (:func:`clawrl.judge.hints.extract_directive`). The rules are lexical, so they can be
checked by reading them:

* **Near-duplicate**: the two texts' content words (lowercased, stopwords removed,
  :func:`clawrl.judge.hints.content_tokens`) overlap with ROUGE-1 F1 >= :data:`DUPLICATE_F1`
  (the measure the judge's hint selection uses). The entry is kept, its ``support`` grows and
  its text becomes the newer wording (the user's latest way of saying it).
* **Contradiction**: the two texts point in opposite directions on the same thing: one holds a
  word of an :data:`OPPOSITES` pair and the other its opposite, about the whole answer (length,
  register: :data:`GLOBAL_PAIRS`) or about the same topic (content-word F1 >= :data:`TOPIC_F1`
  once the words that carry a direction are left out); or one asks for something not to be
  done ("don't ...", "never ...", "stop ...", "avoid ...", "no headings", "less intro",
  "without ...") and the other does not, on the same topic (a higher bar,
  :data:`NEGATION_TOPIC_F1`). The newer directive replaces the older entry ("longer answers
  please" after "keep it short"). Read clause by clause (:func:`_analyse`): a complaint names
  the direction it wants, not the word it uses ("too long" asks for shorter; "avoid long
  explanations" too; "it's a bit long", "that's very formal" as well), and a complaint's "not
  fixed", "still no good" or "no offense" is not a
  negated directive: a user saying the same wish again, annoyed, does not contradict it.
* Otherwise the directive is a new entry; past the cap, the entry updated least recently is
  evicted.

Nothing here touches the store: :func:`decide` returns what to do, and
:class:`clawrl.memory.keeper.MemoryKeeper` does it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from clawrl.judge.hints import content_tokens, overlap_f1

DUPLICATE_F1 = 0.6
"""Content-word ROUGE-1 F1 at or above which two directives are one entry."""

TOPIC_F1 = 0.3
"""Content-word F1 (direction words left out) at or above which two directives are about the
same thing, so opposite direction words contradict."""

NEGATION_TOPIC_F1 = 0.5
"""Topic F1 at or above which a directive negated on one side only contradicts the other
("don't show the steps" against "show every step"; not "don't use bold" against "use bullet
points", F1 0.4)."""

_PAIRS = (
    (
        "short shorter shortest brief briefer concise terse",
        "long longer longest detailed verbose elaborate expand",
    ),
    ("first start begin lead", "last end finish after"),
    ("omit skip drop remove forget", "include add show"),
    ("simple simpler plain", "complex technical formal"),
    ("casual informal", "formal"),
    ("less fewer", "more"),
)
OPPOSITES: tuple[tuple[frozenset[str], frozenset[str]], ...] = tuple(
    (frozenset(a.split()), frozenset(b.split())) for a, b in _PAIRS
)
"""Pairs of word sets that point in opposite directions."""

GLOBAL_PAIRS = frozenset({0, 4})
"""Pairs (by index in :data:`OPPOSITES`) about the whole answer (its length, its register):
opposite directions contradict whatever else the two directives name ("Longer answers please."
against "Keep it short."). The others need the same topic ("Put the number last." against
"Lead with the number.", not "Remove the emojis." against "Keep it short.")."""

_CLAUSE = re.compile(r"[.!?;:,\n]+\s*|\s+(?:and|but|or|plus)\s+", re.I)
_CLAUSE_LEAD = re.compile(
    r"^(?:(?:still|wait|again|also|ok|okay|so|and|but|then|thanks|hmm+|well|yeah|yes|"
    r"please|pls|just|(?:like |as )?i said)\s+)+",
    re.I,
)
_NEGATED_CLAUSE = re.compile(
    r"^(?:(?:don't|do not|never|stop|avoid|quit)\b|without\s|no more\s+(?!than\b)[a-z\"']|"
    r"no\s+(?!(?:good|luck|way|problems?|worries|idea|clue|matter|one|changes?|better|"
    r"different|difference|improvement|thanks|offen[cs]e|no|doubt|rush|the|that|this|it|i|you|"
    r"more)\b)[a-z\"']|less\s+[a-z\"'])",
    re.I,
)
"""A clause that asks for something *not* to be done ("don't use bold", "no headings",
"never say 'we'", "without the asterisks"); "not fixed", "still no good", "no more than 60
words" and "no offense" say nothing of the kind."""
_MULTIPLIER = frozenset(["half", "twice", "times", "quarter", "third", "double"])
_DEGREE = frozenset(["more", "less", "fewer"])
_NOT_AMOUNT = frozenset(["thing", "time", "question", "request", "point", "tip"])
_POSITIVE = frozenset(
    [
        "short",
        "brief",
        "concise",
        "terse",
        "long",
        "detailed",
        "verbose",
        "elaborate",
        "simple",
        "plain",
        "complex",
        "technical",
        "formal",
        "casual",
        "informal",
    ]
)
"""Direction words in their plain form: in a description ("it's a bit long") they name what is
wrong; a comparative ("it's better longer") names the wish."""
_QUALIFIED = re.compile(r"\b(?:not|enough|better|fine|ok|okay|good|right|perfect|great)\b", re.I)
_DESCRIBES = re.compile(
    r"^(?:it'?s|it is|that'?s|that is|this is|this'?s|thats|its|the answer is|your answer is)\b",
    re.I,
)
"""A clause that describes the answer ("it's long", "that's a lot of detail"): a direction word
in its first words is the complaint, not the wish."""
_DIRECTION = frozenset(w for pair in OPPOSITES for side in pair for w in side)


@dataclass(frozen=True)
class Decision:
    """What a new directive does to the memory.

    Attributes:
        action: ``add`` a new entry; ``merge`` into ``target`` (a near-duplicate); ``replace``
            ``target`` (a contradicted entry) with a new entry.
        target: the index, in the entries given to :func:`decide`, of the entry merged into or
            replaced (``None`` for ``add``).
        why: one line for the log and the entry's history.
    """

    action: Literal["add", "merge", "replace"]
    target: int | None = None
    why: str = ""


def _analyse(text: str) -> tuple[set[int], bool]:
    """What ``text`` asks for, clause by clause: the side (0 / 1) of each :data:`OPPOSITES`
    pair it takes, as ``2 * pair + side``, and whether a clause asks for something not to be
    done (:data:`_NEGATED_CLAUSE`).

    A complaint asks for the other side ("too long": shorter); so does a negated clause with a
    direction word ("avoid long explanations", "not so long", "don't skip the steps"), whose
    negation is then spent on the direction. A multiple names no side ("half as long").
    """
    text = text.replace("\u2019", "'")
    sides: set[int] = set()
    negated = False
    for clause in _CLAUSE.split(text):
        core = _CLAUSE_LEAD.sub("", clause.strip().strip("\"'\u201c\u201d")).strip()
        neg = bool(_NEGATED_CLAUSE.match(core))
        flip_all = neg or bool(re.match(r"not\b", core, re.I))
        # "it's a bit long": a description of what is wrong, unless it says what is fine
        described = bool(_DESCRIBES.match(core)) and not _QUALIFIED.search(core)
        words = re.findall(r"[a-z']+", core.lower())
        found = False
        flip_next = False
        for k, w in enumerate(words):
            before = words[k - 1] if k else ""
            if before == "as" and k >= 2 and words[k - 2] in _MULTIPLIER:
                continue
            after = words[k + 1] if k + 1 < len(words) else ""
            if w in _DEGREE and (before == "one" or after in _NOT_AMOUNT):
                continue  # "one more thing"
            if w in _DEGREE and after in _DIRECTION:
                flip_next = w != "more"  # "more concise": concise; "less verbose": shorter
                continue
            flip, flip_next = flip_next, False
            for i, pair in enumerate(OPPOSITES):
                for side, ws in enumerate(pair):
                    if w in ws:
                        found = True
                        complaint = (
                            before == "too"
                            or (described and k <= 4 and w in _POSITIVE)
                            or (w == "more" and after == "than")  # "more than I need"
                        )
                        flipped = complaint or flip_all or flip  # "not so long": still shorter
                        sides.add(2 * i + (1 - side if flipped else side))
        negated = negated or (neg and not found)
    return sides, negated


def _words(text: str) -> list[str]:
    """Content words, plural ``s`` cut ("steps" and "step" are one word)."""
    return [w[:-1] if len(w) > 3 and w.endswith("s") and not w.endswith("ss") else w
            for w in content_tokens(text)]  # fmt: skip


def contradicts(new: str, old: str) -> bool:
    """Whether directive ``new`` points the opposite way from ``old`` on the same topic (module
    doc): opposite direction words of a :data:`GLOBAL_PAIRS` pair, or of another pair with topic
    F1 >= :data:`TOPIC_F1`, or a negation on one side only with topic F1 >=
    :data:`NEGATION_TOPIC_F1`."""
    nw, ow = _words(new), _words(old)
    rest_n = [w for w in nw if w not in _DIRECTION]
    rest_o = [w for w in ow if w not in _DIRECTION]
    topic = overlap_f1(rest_n, rest_o)
    (dn, neg_n), (do, neg_o) = _analyse(new), _analyse(old)
    # a pair is opposed when each directive takes one side of it only ("shorter, or longer if
    # you must" takes both: no direction)
    opposed = [d // 2 for d in dn if (d ^ 1) in do and (d ^ 1) not in dn and d not in do]
    if any(p in GLOBAL_PAIRS for p in opposed) or (opposed and topic >= TOPIC_F1):
        return True
    return neg_n != neg_o and topic >= NEGATION_TOPIC_F1


def decide(entries: Sequence[str], new: str) -> Decision:
    """What ``new`` does to the memory whose active entries' texts are ``entries`` (in any
    order): the first contradicted entry is replaced; else the most similar near-duplicate
    takes it; else it is added.
    """
    nw = _words(new)
    for i, text in enumerate(entries):
        if contradicts(new, text):
            return Decision("replace", i, f"contradicts {text!r}")
    best, best_f1 = None, 0.0
    for i, text in enumerate(entries):
        f1 = overlap_f1(nw, _words(text))
        if f1 > best_f1:
            best, best_f1 = i, f1
    if best is not None and best_f1 >= DUPLICATE_F1:
        return Decision("merge", best, f"same as {entries[best]!r} (F1 {best_f1:.2f})")
    return Decision("add", None, "new")
