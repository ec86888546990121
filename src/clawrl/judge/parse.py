"""Reading one judge output: the designated final score field and the hint tag.

**Score format (the designated final field).** A vote's score is read from the *last line that
starts with* ``Score:`` (case-insensitive; leading markdown such as ``**``, ``#``, ``>``, ``-``
and surrounding ``*``/backticks are ignored, so ``**Score:** -1`` reads like ``Score: -1``). Its
value must be exactly one of ``+1``, ``1``, ``-1`` (also with a unicode minus) or ``0``, optionally
followed by a period. Nothing else counts:

* prose before that line never counts, whatever scores it mentions (``"first I thought +1 ...
  Score: -1"`` reads -1; ``"... final: -1"`` without a ``Score:`` line is an abstention);
* a ``Score:`` that does not start a line (``"I'd say Score: +1"``) is prose;
* if the last ``Score:`` line holds anything but one value (``Score: +1 or -1``, ``Score: 2``,
  ``Score: N/A``), the vote abstains (``invalid_score``): earlier ``Score:`` lines are *not*
  consulted, because the model's last word replaced them;
* text after the last ``Score:`` line is ignored.

A vote without a valid field abstains with a reason (:class:`AbstainReason`): ``empty``,
``refusal`` (no valid field and the text declines: it opens with an apology, says "as an AI",
or "I can't / won't / am unable to" help, judge, evaluate, rate ...),
``no_score_field`` or ``invalid_score``. A vote with a valid field counts even if it also says
it is unsure: the field is the contract.

**Hint format.** The hint is the text between the *last* ``<hint>`` and the first ``</hint>``
after it (case-insensitive), whitespace collapsed. It is no hint (:class:`HintStatus`) when:
there is no tag (``absent``); the tag never closes (``unterminated``); it is empty or says there
is none — ``none``, ``n/a``, ``no hint``, ``-`` ... (``none``); it has fewer than
:data:`MIN_HINT_WORDS` words or :data:`MIN_HINT_CHARS` characters (``too_short``); or more than
:data:`MAX_HINT_WORDS` words or :data:`MAX_HINT_CHARS` characters (``too_long``; the prompt asks
for 1-3 sentences and a longer text is not trimmed into one).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from clawrl.judge.types import AbstainReason, HintStatus, Score

MIN_HINT_WORDS = 3
MIN_HINT_CHARS = 12
MAX_HINT_WORDS = 80
MAX_HINT_CHARS = 480

_LINE_PREFIX = re.compile(r"^[\s>#*`_\-]*")
_SCORE_LINE = re.compile(r"^score\s*[:：]", re.IGNORECASE)
_SCORE_VALUE = re.compile(r"^(?P<value>\+?1|[-−–]1|[+-]?0)\.?$")
_JUDGING = r"(?:help|assist|judge|evaluate|assess|rate|score|grade|comply|do\s+that|provide)"
_REFUSAL = re.compile(
    r"^\W*(?:i['’]m\s+sorry|i\s+apologi[sz]e|sorry,)"  # an apology that opens the output
    r"|\bas\s+an\s+ai\b"
    r"|\bi\s*(?:can(?:no|['’]?)t|am\s+(?:unable|not\s+able)|['’]m\s+(?:unable|not\s+able)|"
    rf"won['’]?t|will\s+not|refuse)\s+(?:to\s+)?{_JUDGING}\b"
    rf"|\bunable\s+to\s+{_JUDGING}\b",
    re.IGNORECASE,
)
_HINT_OPEN = re.compile(r"<hint>", re.IGNORECASE)
_HINT_CLOSE = re.compile(r"</hint>", re.IGNORECASE)
_NO_HINT = re.compile(
    r"^(?:none|n/?a|no|no hint|no directive|nothing|null|empty|-+|\.+)[.!]?$", re.IGNORECASE
)


@dataclass(frozen=True)
class ParsedScore:
    """The score field of one output.

    Attributes:
        score: the value, or ``None`` for an abstention.
        reason: set exactly when ``score is None``.
        detail: what was found instead (e.g. the invalid value), for the record.
    """

    score: Score | None
    reason: AbstainReason | None = None
    detail: str | None = None


@dataclass(frozen=True)
class ParsedHint:
    """The hint tag of one output: ``text`` is set exactly when ``status`` is ``ok``."""

    text: str | None
    status: HintStatus


def _strip_decoration(line: str) -> str:
    return _LINE_PREFIX.sub("", line).strip()


def parse_score(text: str) -> ParsedScore:
    """Read the designated final ``Score:`` field of a judge output (see the module doc).

    Args:
        text: the raw output of one vote.

    Returns:
        The score, or an abstention with its reason.
    """
    if not text.strip():
        return ParsedScore(None, AbstainReason.EMPTY, "empty output")
    last: str | None = None
    for line in text.splitlines():
        body = _strip_decoration(line)
        if _SCORE_LINE.match(body):
            last = body
    refused = _REFUSAL.search(text) is not None
    if last is None:
        if refused:
            return ParsedScore(None, AbstainReason.REFUSAL, "declined, no Score: line")
        return ParsedScore(None, AbstainReason.NO_SCORE_FIELD, "no line starts with Score:")
    value = _SCORE_LINE.sub("", last).strip().strip("*`_ ").strip()
    m = _SCORE_VALUE.match(value)
    if m is None:
        reason = AbstainReason.REFUSAL if refused else AbstainReason.INVALID_SCORE
        return ParsedScore(None, reason, f"last Score: line holds {value[:60]!r}")
    v = m.group("value").replace("−", "-").replace("–", "-")
    return ParsedScore(Score(int(v)))


def parse_hint(text: str) -> ParsedHint:
    """Read the hint tag of a judge output (see the module doc for the rules).

    Args:
        text: the raw output of one vote.

    Returns:
        The hint text with status ``ok``, or ``None`` with the reason there is none.
    """
    opens = list(_HINT_OPEN.finditer(text))
    if not opens:
        return ParsedHint(None, HintStatus.ABSENT)
    start = opens[-1].end()
    close = _HINT_CLOSE.search(text, start)
    if close is None:
        return ParsedHint(None, HintStatus.UNTERMINATED)
    return check_hint(text[start : close.start()])


def check_hint(raw: str) -> ParsedHint:
    """Validate a candidate hint text by the length and "none" rules of the module doc.

    Args:
        raw: the text between the tags (or a heuristic/feedback candidate).

    Returns:
        The normalised text (whitespace collapsed) with status ``ok``, or the reason it is none.
    """
    body = " ".join(raw.split())
    if not body or _NO_HINT.match(body):
        return ParsedHint(None, HintStatus.NONE)
    words = len(body.split())
    if words < MIN_HINT_WORDS or len(body) < MIN_HINT_CHARS:
        return ParsedHint(None, HintStatus.TOO_SHORT)
    if words > MAX_HINT_WORDS or len(body) > MAX_HINT_CHARS:
        return ParsedHint(None, HintStatus.TOO_LONG)
    return ParsedHint(body, HintStatus.OK)
