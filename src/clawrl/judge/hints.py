"""Hint selection among votes, and the heuristic directive extractor of choice mode.

**Selection rule** (:func:`select_hint`; better than OpenClaw-RL's "longest hint", which rewards
rambling). Candidates are the valid hints (:func:`clawrl.judge.parse.check_hint`: within
:data:`~clawrl.judge.parse.MIN_HINT_WORDS`..\\ :data:`~clawrl.judge.parse.MAX_HINT_WORDS` words)
of votes that gave a score; an abstaining vote's hint is ignored.

1. *Quorum*: a hint is returned only if at least ``ceil(quorum * valid_votes)`` valid votes
   carry one (default ``quorum = 0.5``: 1 of 1, 1 of 2, 2 of 3, 3 of 5) — a directive that most
   votes did not see is more likely invented than read from the next state.
2. *Consensus*: each candidate's support is its mean ROUGE-1 F1 against every other candidate
   (:func:`overlap_f1`: unigram multiset overlap on lowercased word tokens, stopwords removed).
   The candidate with the highest support wins: it is the one the other votes agree with most.
3. *Ties* (always the case with two candidates): fewer content tokens, then the lower vote index.
4. ``supporting_votes``: the chosen vote plus every candidate with F1 >= :data:`SUPPORT_THRESHOLD`
   against it.

**Directive heuristic** (:func:`extract_directive`, used by choice mode and for explicit
feedback comments). A 135M model cannot write a useful hint, so choice mode does not ask it to.
Instead it copies, verbatim, at most two sentences of the next state that read as an instruction
to the assistant — and only from a user message or a feedback comment (tool outputs, test logs
and verifier lines are evidence, not instructions). A sentence counts when it contains an
instruction marker (``don't``, ``never``, ``always``, ``instead``, ``should``, ``make sure``,
``next time``, ``need to``, ``remember to`` ...), or when it starts with an imperative verb *and*
the message signals a correction (``no``, ``wrong``, ``not what``, ``you forgot``, ``too long``
...). Bare redo requests ("try again", "redo it", "give me another one") are not directives. It is a keyword heuristic: it misses
directives phrased as questions or descriptions ("it's tabs here, not spaces") and it cannot
rephrase; its precision and recall are measured by ``clawrl judge eval``.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

from clawrl.judge.parse import check_hint
from clawrl.judge.types import Hint, HintSelection, HintStatus, NextStateRole, Vote

SUPPORT_THRESHOLD = 0.3
"""ROUGE-1 F1 at or above which another vote's hint counts as supporting the chosen one."""

DEFAULT_QUORUM = 0.5

_WORD = re.compile(r"[a-z0-9_]+(?:['’][a-z]+)?")
_STOPWORD_TEXT = (
    "a an the and or but of to in on at for with by from as is are was were be been being it "
    "its this that these those you your i me my we our they them he she his her their there "
    "here so if then than do does did done not no yes can could would should will just also "
    "very too into about when what which who how"
)
STOPWORDS = frozenset(_STOPWORD_TEXT.split())


def content_tokens(text: str) -> list[str]:
    """Lowercased word tokens of ``text`` without :data:`STOPWORDS` (order kept)."""
    return [w for w in _WORD.findall(text.lower()) if w not in STOPWORDS]


def overlap_f1(a: Sequence[str], b: Sequence[str]) -> float:
    """ROUGE-1 F1 of two token lists: harmonic mean of unigram precision and recall.

    Returns 0.0 when either list is empty or nothing overlaps; 1.0 for equal multisets.
    """
    if not a or not b:
        return 0.0
    overlap = sum((Counter(a) & Counter(b)).values())
    if overlap == 0:
        return 0.0
    p, r = overlap / len(a), overlap / len(b)
    return 2 * p * r / (p + r)


def select_hint(votes: Sequence[Vote], *, quorum: float = DEFAULT_QUORUM) -> Hint | None:
    """Choose the judgment's hint from its votes by the rule of the module doc.

    Args:
        votes: all votes of one judgment (abstentions are ignored).
        quorum: fraction of valid votes that must carry a hint, in [0, 1].

    Returns:
        The chosen :class:`Hint`, or ``None`` (no candidate, or below the quorum).
    """
    valid = [v for v in votes if v.score is not None]
    cands = [v for v in valid if v.hint is not None and v.hint_status == HintStatus.OK]
    if not cands or len(cands) < max(1, math.ceil(quorum * len(valid) - 1e-9)):
        return None
    if len(cands) == 1:
        return Hint(
            text=cands[0].hint or "",
            supporting_votes=[cands[0].index],
            selection=HintSelection.SINGLE,
        )
    toks = {v.index: content_tokens(v.hint or "") for v in cands}
    support = {
        v.index: sum(overlap_f1(toks[v.index], toks[o.index]) for o in cands if o is not v)
        / (len(cands) - 1)
        for v in cands
    }
    best = min(cands, key=lambda v: (-support[v.index], len(toks[v.index]), v.index))
    backers = sorted(
        o.index
        for o in cands
        if o is best or overlap_f1(toks[best.index], toks[o.index]) >= SUPPORT_THRESHOLD
    )
    return Hint(
        text=best.hint or "",
        supporting_votes=backers,
        selection=HintSelection.CONSENSUS,
        support=round(support[best.index], 6),
    )


_SENTENCE_SPLIT = re.compile(r"(?<=[.!?])\s+|\n+")
_MARKER = re.compile(
    r"\b(?:don['’]?t|do not|never|always|instead|rather than|should(?:n['’]?t| not)?|"
    r"make sure|remember to|needs? to|must|next time|from now on|in (?:the )?future|"
    r"going forward|avoid|you forgot to|please (?:use|don['’]?t|do not|keep|add|check|write|"
    r"make|stop|avoid|remove|answer|reply|respond|include|run|read))\b",
    re.IGNORECASE,
)
_CORRECTION_CUE = re.compile(
    r"^(?:no|nope|wrong)\b|\b(?:wrong|incorrect|not what|that['’]?s not|you forgot|you didn['’]?t|"
    r"you missed|missing|broke|broken|too (?:long|short|verbose|wordy|formal|casual|vague|"
    r"complicated|complex|much|many|few))\b",
    re.IGNORECASE,
)
_IMPERATIVE = re.compile(
    r"^(?:please\s+)?(?:use|check|add|remove|make|keep|write|read|run|put|call|avoid|stop|"
    r"include|show|give|answer|reply|respond|switch|change|replace|rename|format|explain|list|"
    r"look|open|edit|delete|install|import|test|verify|mention|cite|follow|skip|drop|prefer|"
    r"start|return|print|save|sort|shorten|summarize|summarise|translate|convert|wrap|move|set|"
    r"update|pass|ask|leave|limit|capitalize|lowercase|quote|respect|handle)\b",
    re.IGNORECASE,
)
_LEAD = re.compile(
    r"^(?:(?:no|nope|wrong|ugh|hmm|ok|okay|well|actually|also|and|but|so)\b[\s,.!:;-]*)+",
    re.IGNORECASE,
)
_BARE_REDO = re.compile(
    r"^(?:please\s+)?(?:(?:try|redo|do|fix|run|write|check)\s*(?:it|that|this|again|it again|"
    r"that again|once more|over)?|(?:give me\s+)?(?:another|a different)(?: one| answer)?)"
    r"\s*(?:again|please)?[.!]*$",
    re.IGNORECASE,
)


def extract_directive(text: str, role: NextStateRole, *, max_sentences: int = 2) -> Hint | None:
    """Copy the directive sentences of a user message or feedback comment (module doc).

    Args:
        text: the next state's text.
        role: who wrote it; only ``user`` and ``feedback`` can carry a directive here.
        max_sentences: most sentences kept, in their original order.

    Returns:
        A :class:`Hint` with selection ``heuristic``, or ``None`` when no sentence qualifies or
        the result fails the hint length rules.
    """
    if role not in (NextStateRole.USER, NextStateRole.FEEDBACK):
        return None
    correction = _CORRECTION_CUE.search(text.strip()) is not None
    picked: list[str] = []
    for raw in _SENTENCE_SPLIT.split(text.strip()):
        sentence = raw.strip()
        core = _LEAD.sub("", sentence).strip()
        if not core or _BARE_REDO.match(core):
            continue
        if _MARKER.search(core) or (correction and _IMPERATIVE.match(core)):
            picked.append(core[0].upper() + core[1:])
        if len(picked) >= max_sentences:
            break
    if not picked:
        return None
    parsed = check_hint(" ".join(picked))
    if parsed.text is None:
        return None
    return Hint(text=parsed.text, selection=HintSelection.HEURISTIC)
