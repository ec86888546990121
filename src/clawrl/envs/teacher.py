"""The teacher: brings a student's worked solution and wants friendly, specific comments.

Each task is a problem plus a :class:`~clawrl.envs.solutions.WorkedSolution` — correct, or with
a known arithmetic slip (half of them by default). Rubric (:func:`teacher_rubric`):

=====================  ==================================================  ===================
check                  passes when the comment ...                         evidence
=====================  ==================================================  ===================
``praises_work``       says something the student did right (good, nice,   —
                       well done, correctly, ...; not negated)
``names_fix``          for a flawed solution: points at the slip (step     ``step k: W -> R``
                       *k*, or the wrong or right value) with a correction
                       cue (should, instead, mistake, check, not, ...).
                       Not applicable to a correct solution.
``friendly_tone``      has no harsh words (careless, lazy, sloppy, ...)    the word
``cites_numbers``      quotes a number from the student's work (or the     —
                       right value of the slipped step)
``within_word_limit``  has at most ``max_words`` words (100)               the count
=====================  ==================================================  ===================

Replies (:func:`teacher_reply`) are polite natural language from phrase banks (10+ phrasings
per check, several quoting the evidence or naming the step to fix), a varied lead-in and
connectives, "still" variants for repeated complaints, and 12 phrasings of thanks.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from enum import StrEnum

from clawrl.envs.numbers import numbers_in
from clawrl.envs.phrasing import choose, shuffled
from clawrl.envs.problems import Problem
from clawrl.envs.rubric import Check, Rubric, RubricResult, first_match, quote, word_count
from clawrl.envs.solutions import WorkedSolution, make_worked_solution
from clawrl.envs.student import assessment_of
from clawrl.envs.user import Assessment, Message, Scenario, Task, UserKind, UserReply

DEFAULT_MAX_WORDS = 100
"""Longest comment (words) the teacher accepts."""


class TeacherCheck(StrEnum):
    """The teacher's rubric checks."""

    PRAISE = "praises_work"
    NAMES_FIX = "names_fix"
    FRIENDLY = "friendly_tone"
    SPECIFIC = "cites_numbers"
    CONCISE = "within_word_limit"


_PRAISE = re.compile(
    r"\b(?:good|great|nice(?:ly)?|well done|did well|excellent|solid|neat(?:ly)?|careful(?:ly)?"
    r"|correctly|clear(?:ly)?|awesome|perfect(?:ly)?|spot on|impressive|strong|smart|proud"
    r"|(?:is|was|are|were|got (?:it|that|this)) (?:right|correct)|on the right track)\b",
    re.I,
)
_NEGATION = re.compile(
    r"\b(?:not|never|isn't|wasn't|aren't|don't|doesn't|hardly)\s+(?:\w+\s+)?$", re.I
)
"""A negation right before a praise word ("not good", "not very careful"), same clause only."""
_FIX_CUE = re.compile(
    r"\b(?:mistake|error|wrong|incorrect|should|instead|not|isn't|fix|check|recheck"
    r"|double[- ]check|slip|careful|look again|redo|recalculate|re-calculate|actually|oops"
    r"|typo|off)\b",
    re.I,
)
_HARSH = [
    re.compile(
        r"\b(?:stupid|dumb|lazy|careless(?:ly)?|sloppy|terrible|awful|horrible|pathetic"
        r"|useless|ridiculous|disappoint(?:ing|ed)|embarrassing|unacceptable|obviously"
        r"|lousy|nonsense|messy|poorly|clearly wrong|no excuse|should have known"
        r"|bad work|poor work)\b",
        re.I,
    )
]
_ORDINALS = ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth")
_STEP_REF = re.compile(r"\b(?:step|line)\s*#?\s*(\d+)\b", re.I)


def _praise(response: str, _: WorkedSolution) -> tuple[bool, str | None]:
    for m in _PRAISE.finditer(response):
        if not _NEGATION.search(response[max(0, m.start() - 30) : m.start()]):
            return True, None
    return False, None


def _step_mentioned(response: str, step: int) -> bool:
    if any(int(m.group(1)) == step for m in _STEP_REF.finditer(response)):
        return True
    if step <= len(_ORDINALS):
        ordinal = _ORDINALS[step - 1]
        return (
            re.search(rf"\b{ordinal} (?:step|line|part|calculation)\b", response, re.I) is not None
        )
    return False


def _numbers_outside_refs(response: str) -> set[str]:
    return set(numbers_in(_STEP_REF.sub(" ", response)))


def _names_fix(response: str, work: WorkedSolution) -> tuple[bool | None, str | None]:
    flaw = work.flaw
    if flaw is None:
        return None, None
    evidence = f"step {flaw.step}: {flaw.wrong_value} -> {flaw.right_value}"
    values = _numbers_outside_refs(response)
    pointed = _step_mentioned(response, flaw.step) or bool(
        values & {flaw.wrong_value, flaw.right_value}
    )
    return (True, None) if pointed and _FIX_CUE.search(response) else (False, evidence)


def _friendly(response: str, _: WorkedSolution) -> tuple[bool, str | None]:
    found = first_match(_HARSH, response)
    return (False, quote(found)) if found else (True, None)


def _specific(response: str, work: WorkedSolution) -> tuple[bool, str | None]:
    wanted = set(work.numbers()) | ({work.flaw.right_value} if work.flaw else set())
    return bool(_numbers_outside_refs(response) & wanted), None


def teacher_rubric(max_words: int = DEFAULT_MAX_WORDS) -> Rubric[WorkedSolution]:
    """The teacher's rubric (see the module docstring).

    Args:
        max_words: the longest comment, in words, that counts as concise.
    """

    def concise(response: str, _: WorkedSolution) -> tuple[bool, str | None]:
        n = word_count(response)
        return n <= max_words, str(n)

    T = TeacherCheck
    return Rubric(
        "teacher",
        [
            Check(T.PRAISE.value, "says what the student did right", _praise),
            Check(T.NAMES_FIX.value, "points at the mistake and its fix (flawed work)", _names_fix),
            Check(T.FRIENDLY.value, "no harsh words", _friendly),
            Check(T.SPECIFIC.value, "refers to a number from the student's work", _specific),
            Check(T.CONCISE.value, f"at most {max_words} words", concise),
        ],
    )


INTROS = (
    "Could you help me grade this? It's from one of my 4th graders.",
    "I'm marking homework tonight. Can you write feedback for this student?",
    "Here's a student's solution. What comment should I give them?",
    "Can you look over this kid's work and write a comment I can hand back?",
    "I teach 5th grade math. Could you draft feedback on this answer?",
    "Please help me comment on this student's homework.",
    "One of my students turned this in. What would you write back?",
    "Could you grade this worked solution for me?",
    "I need a comment for this student's homework, can you help?",
    "Would you review this solution and suggest feedback for the student?",
    "Grading time! Can you give me a comment for this one?",
    "A student of mine solved this. How should I respond?",
)
"""The teacher's first line; the problem and the student's work follow."""

COMPLAINTS: dict[TeacherCheck, tuple[str, ...]] = {
    TeacherCheck.PRAISE: (
        "Could you start with something they did well? They need encouragement.",
        "Please mention what they got right too, not just the problems.",
        "Kids respond better when we note what's good first. What did they do well here?",
        "It's missing any praise, and they worked hard on this.",
        "Can you add a line about what they did nicely?",
        "I'd like the comment to acknowledge the parts they handled correctly.",
        "Add a bit of encouragement, please: something they did right.",
        "There's nothing positive in there. Can you point out a strength?",
        "Please recognise the good parts of their work as well.",
        "Let's open with what they did well before anything else.",
    ),
    TeacherCheck.NAMES_FIX: (
        "You didn't point out the mistake. Step {step} is off; can you say so?",
        "There's an error in step {step}. The comment should tell them where to look.",
        "Can you tell them exactly which step to fix? It's step {step}.",
        "They wrote {wrong} in step {step}, which isn't right. Please mention that.",
        "The comment should name the slip: in step {step} it should be {right}, not {wrong}.",
        "I need the comment to say what to fix, specifically the calculation in step {step}.",
        "You missed that step {step} has a wrong number. Please flag it gently.",
        "Please point them to step {step}; that's where it goes wrong.",
        "It doesn't say what they need to correct. Look at step {step} again.",
        "Their answer is off because of step {step}. Can the comment say that?",
    ),
    TeacherCheck.FRIENDLY: (
        "That's a bit harsh for a 10-year-old. Can you soften it?",
        'Please avoid words like "{phrase}"; they will just discourage them.',
        'Can you make the tone kinder? "{phrase}" feels too blunt.',
        "I don't want to hurt their feelings, please rephrase it more gently.",
        "The tone is too negative for a kid.",
        "Let's keep it warm. I wouldn't say \"{phrase}\" to a student.",
        "Could you be gentler? They're still learning.",
        "That sounds like a scolding. A friendlier tone, please.",
        'Please drop "{phrase}", it comes across as unkind.',
        "Can we make it more encouraging in tone?",
    ),
    TeacherCheck.SPECIFIC: (
        "It's too generic. Can you refer to their actual numbers?",
        "Could you mention the specific numbers from their work?",
        "This could be about any problem. Please point to what they actually wrote.",
        "I'd like the comment to quote something concrete from their steps.",
        "Be more specific, please: which calculation are you talking about?",
        "Please tie the comment to their numbers so they know what you mean.",
        "Too vague. Mention a number from their solution.",
        "Can you reference a specific value they wrote?",
        "Make it concrete and name the numbers they used.",
        "It needs specifics from their work, not general advice.",
    ),
    TeacherCheck.CONCISE: (
        "That's too long to write in the margin. Can you trim it?",
        "It's {words} words; I need something much shorter.",
        "Please keep it to a few sentences.",
        "Shorter, please; they won't read all that.",
        "Can you cut it down to under {limit} words?",
        "Too wordy for a homework comment.",
        "Could you make it brief? A short note is enough.",
        "Trim it down, please; half the length would be better.",
        "I only have room for a couple of lines.",
        "Please condense it.",
    ),
}
"""What the teacher says about each failed check. Slots: ``{phrase}`` (evidence), ``{words}``,
``{limit}``, and for the fix: ``{step}``, ``{wrong}``, ``{right}``."""

LEADS = (
    "Thanks, but not quite.",
    "Hmm.",
    "Close.",
    "Almost there.",
    "Good start, but a few things.",
    "",
    "OK, a couple of things.",
    "Not quite what I need.",
    "Nearly.",
    "Let's adjust this.",
)
STILL = (
    "This is still missing:",
    "Same issue as before.",
    "I still don't see it.",
    "Still not there.",
    "Again,",
    "That hasn't changed.",
    "As I said,",
    "It's still the same problem.",
    "Not fixed yet.",
    "One more time:",
)
CONNECTIVES = (" Also, ", " And ", " One more thing: ", " Plus, ", " ", " Finally, ")
THANKS = (
    "Perfect, I'll copy that onto their sheet. Thank you!",
    "That's just right, thanks.",
    "Great, that's exactly the kind of comment I wanted.",
    "Lovely, thank you!",
    "That works well, thanks so much.",
    "Excellent, thanks for the help.",
    "Nice, that's kind and clear. Thank you.",
    "This is great, thanks!",
    "Just what I needed, thank you.",
    "Wonderful, I'll use that.",
    "Thanks! That's a good comment for them.",
    "That's perfect, they'll appreciate it.",
)
SIGN_OFFS = (
    "I'll finish it myself, thanks anyway.",
    "Never mind, I'll write it myself.",
    "OK, I'll take it from here.",
    "I'll adjust it on my own.",
    "Let's leave it there; I'll edit it myself.",
    "I'll rework it myself later.",
    "Fine, I'll handle the rest.",
    "I'll write my own, thank you.",
    "No worries, I'll do it myself.",
    "Let's stop here, I'll fix it up myself.",
)
MAX_COMPLAINTS = 3


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:] if text[:1].isupper() and not text[:2].isupper() else text


def teacher_reply(
    result: RubricResult,
    work: WorkedSolution,
    *,
    key: str,
    turn: int,
    previous_failed: Sequence[str] = (),
    final: bool = False,
    max_words: int = DEFAULT_MAX_WORDS,
) -> str:
    """The teacher's natural-language reaction to a comment.

    Args:
        result: the rubric result of the comment.
        work: the student's worked solution (its flaw fills ``{step}``, ``{wrong}``, ``{right}``).
        key: the conversation key (seeds every choice).
        turn: the 0-based turn.
        previous_failed: checks that failed on the previous comment ("still" variants).
        final: the last turn: an unsatisfied teacher signs off.
        max_words: the word limit quoted by length complaints.
    """
    if result.satisfied:
        return choose(THANKS, key, turn, "thanks")
    failed = shuffled(list(result.failed), key, turn, "order")[:MAX_COMPLAINTS]
    flaw = work.flaw
    parts: list[str] = []
    for i, name in enumerate(failed):
        evidence = result.result(name).evidence or ""
        text = choose(COMPLAINTS[TeacherCheck(name)], key, turn, name).format(
            phrase=evidence,
            words=evidence,
            limit=max_words,
            step=flaw.step if flaw else "",
            wrong=flaw.wrong_value if flaw else "",
            right=flaw.right_value if flaw else "",
        )
        if i == 0:
            lead = choose(STILL if name in previous_failed else LEADS, key, turn, "lead")
            text = f"{lead} {text}" if lead else text
        else:
            conn = choose(CONNECTIVES, key, turn, i, "and")
            text = conn + (_lower_first(text) if conn.strip() else text)
        parts.append(text)
    reply = "".join(parts)
    if final:
        reply = f"{reply} {choose(SIGN_OFFS, key, turn, 'bye')}"
    return reply


class RuleTeacher:
    """The rule-based teacher (the default simulated user of the teacher scenario).

    Args:
        seed: seeds the worked solutions, their flaws and the phrasings.
        flaw_rate: the fraction of worked solutions with a planted slip, in [0, 1].
        max_words: the longest comment that counts as concise.
    """

    scenario = Scenario.TEACHER
    kind = UserKind.RULE

    def __init__(
        self, *, seed: int = 0, flaw_rate: float = 0.5, max_words: int = DEFAULT_MAX_WORDS
    ) -> None:
        self.seed = seed
        self.flaw_rate = flaw_rate
        self.max_words = max_words
        self.rubric = teacher_rubric(max_words)
        self.check_names = self.rubric.check_names

    def start(self, problem: Problem) -> Task:
        """The grading request: the problem and a (possibly flawed) worked solution."""
        key = f"teacher:{self.seed}:{problem.id}"
        work = make_worked_solution(problem, seed=self.seed, flaw_rate=self.flaw_rate)
        opening = (
            f"{choose(INTROS, key, 'open')}\n\nProblem: {problem.question}\n\n"
            f"Student's work:\n{work.render()}"
        )
        return Task(problem, Scenario.TEACHER, opening, work, key)

    def evaluate(self, task: Task, response: str) -> RubricResult:
        """The rubric result of ``response`` (synchronous)."""
        return self.rubric.evaluate(response, task.context)

    async def assess(self, task: Task, response: str) -> Assessment:
        """Ground truth: +1 when every applicable check passes, score = fraction met."""
        return assessment_of(self.evaluate(task, response))

    async def respond(
        self, task: Task, messages: list[Message], response: str, *, turn: int, final: bool
    ) -> UserReply:
        """Thanks and end the session when satisfied, else say what to change."""
        result = self.evaluate(task, response)
        prior = [m for m in messages if m.get("role") == "assistant"]
        previous = self.evaluate(task, str(prior[-1].get("content") or "")).failed if prior else ()
        text = teacher_reply(
            result,
            task.context,
            key=task.key,
            turn=turn,
            previous_failed=previous,
            final=final,
            max_words=self.max_words,
        )
        return UserReply(text, result.satisfied or final, assessment_of(result))
