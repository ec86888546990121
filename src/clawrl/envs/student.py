"""The student: brings homework and wants an answer that does not look AI-written.

Rubric (:func:`student_rubric`), one check per thing a student would notice, with the
evidence it quotes back:

====================  ========================================================  ==============
check                 passes when the response ...                              evidence
====================  ========================================================  ==============
``no_bold``           has no ``**bold**`` / ``__bold__`` markup                 the bold text
``no_headers``        has no markdown heading (``# ...``, setext underlines)    the heading
``no_numbered_steps`` has no numbered list (two lines like ``1.``, ``2)``,      the line
                      ``(3)``, or one numbered ``1``)
``no_boilerplate``    avoids "Final Answer", "To solve this problem", "Step 1",  the phrase
                      "step-by-step", "let's break it down", ``\\boxed``, ...
``within_word_limit`` has at most ``max_words`` words (60)                      the count
``casual_tone``       avoids formal connectives (therefore, thus, hence, ...)   the word
                      and LaTeX markup
``gives_answer``      states a number at all (an empty reply is no answer)      —
====================  ========================================================  ==============

Replies (:func:`student_reply`) are casual natural language built from phrase banks: a lead-in,
up to three complaints (each check has its own bank of 10+ phrasings, several quoting the
evidence, e.g. *why is "Final Answer" in bold lol*), joined by varied connectives, with "still"
variants when a complaint repeats and a sign-off on the last turn; a satisfied student thanks
(12 phrasings) and ends the session. Every choice is a hash of the conversation key, the turn
and the check, so replies are reproducible but vary across problems, turns and seeds. No reply
ever contains a check name.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from enum import StrEnum

from clawrl.envs.phrasing import capitalize_first, choose, shuffled
from clawrl.envs.problems import Problem
from clawrl.envs.rubric import Check, Rubric, RubricResult, first_match, quote, word_count
from clawrl.envs.user import Assessment, Message, Scenario, Task, UserKind, UserReply

DEFAULT_MAX_WORDS = 60
"""Longest answer (words) the student accepts."""


class StudentCheck(StrEnum):
    """The student's rubric checks."""

    NO_BOLD = "no_bold"
    NO_HEADERS = "no_headers"
    NO_NUMBERED_STEPS = "no_numbered_steps"
    NO_BOILERPLATE = "no_boilerplate"
    SHORT = "within_word_limit"
    CASUAL = "casual_tone"
    GIVES_ANSWER = "gives_answer"


_BOLD = [re.compile(r"\*\*(?=\S)(.+?)(?<=\S)\*\*", re.S), re.compile(r"\b__(\S.*?\S)__\b")]
_HEADERS = [
    re.compile(r"^[ \t]{0,3}#{1,6}[ \t]+(\S.*)$", re.M),
    re.compile(r"^[ \t]*(\S.*)\n[ \t]*(?:={3,}|-{3,})[ \t]*$", re.M),
]
_NUMBERED = re.compile(r"^[ \t]*(?:\d{1,2}[.)]|\(\d{1,2}\))[ \t]+\S.*$", re.M)
_BOILERPLATE = [
    re.compile(p, re.I)
    for p in (
        r"final answer",
        r"to solve (?:this|the) (?:problem|question)",
        r"\bstep\s*\d+\b",
        r"step[- ]by[- ]step",
        r"let'?s break (?:it|this|that) down",
        r"\\boxed",
        r"i hope this helps",
        r"\bin (?:summary|conclusion)\b",
        r"\bhere(?:'s| is) (?:a |the )?(?:breakdown|step)",
        r"\bas an ai\b",
    )
]
_FORMAL = [
    re.compile(p, re.I)
    for p in (
        r"\b(?:therefore|thus|hence|furthermore|moreover|additionally|consequently)\b",
        r"\b(?:firstly|secondly|thirdly|subsequently)\b",
        r"\bwe (?:can|need to|must|will) (?:calculate|determine|compute|find)\b",
        r"\blet us\b",
        r"\bit is important to\b",
        r"\\\(|\\\[|\\frac|\\times|\\text|\$\$",
    )
]


def _no_bold(response: str, _: Problem) -> tuple[bool, str | None]:
    for pat in _BOLD:
        if m := pat.search(response):
            return False, quote(m.group(1))
    if "**" in response:
        return False, "**"
    return True, None


def _no_headers(response: str, _: Problem) -> tuple[bool, str | None]:
    for pat in _HEADERS:
        if m := pat.search(response):
            return False, quote(m.group(1).strip("#* "))
    return True, None


def _no_numbered(response: str, _: Problem) -> tuple[bool, str | None]:
    """A list is two numbered lines, or one that starts at 1 (``32. I hope ...`` is no list)."""
    lines = [m.group(0).strip() for m in _NUMBERED.finditer(response)]
    listed = len(lines) >= 2 or any(re.match(r"\(?1\b", x) for x in lines)
    return (False, quote(lines[0], 30)) if listed else (True, None)


def _no_boilerplate(response: str, _: Problem) -> tuple[bool, str | None]:
    found = first_match(_BOILERPLATE, response)
    return (False, quote(found)) if found else (True, None)


def _casual(response: str, _: Problem) -> tuple[bool, str | None]:
    found = first_match(_FORMAL, response)
    return (False, quote(found)) if found else (True, None)


def _gives_answer(response: str, _: Problem) -> tuple[bool, str | None]:
    return bool(re.search(r"\d", response)), None


def student_rubric(max_words: int = DEFAULT_MAX_WORDS) -> Rubric[Problem]:
    """The student's rubric (see the module docstring).

    Args:
        max_words: the longest answer, in words, that counts as short.
    """

    def short(response: str, _: Problem) -> tuple[bool, str | None]:
        n = word_count(response)
        return n <= max_words, str(n)

    S = StudentCheck
    return Rubric(
        "student",
        [
            Check(S.NO_BOLD.value, "no bold markup", _no_bold),
            Check(S.NO_HEADERS.value, "no markdown headings", _no_headers),
            Check(S.NO_NUMBERED_STEPS.value, "no numbered list of steps", _no_numbered),
            Check(S.NO_BOILERPLATE.value, "no chatbot stock phrases", _no_boilerplate),
            Check(S.SHORT.value, f"at most {max_words} words", short),
            Check(S.CASUAL.value, "casual register: no formal connectives or LaTeX", _casual),
            Check(S.GIVES_ANSWER.value, "states a numeric answer", _gives_answer),
        ],
    )


OPENINGS = (
    "hey can you help me with this one?\n\n{question}",
    "{question}\n\nidk how to do this one",
    "can u solve this for me: {question}",
    "homework question: {question}",
    "I'm stuck on this: {question}",
    "{question} whats the answer?",
    "pls help with this one\n{question}",
    "my math homework says: {question} how do I get it?",
    "quick one: {question}",
    "{question}\ncan you help",
    "got this for homework and I'm confused. {question}",
    "what's the answer to this? {question}",
)
"""The student's first message; ``{question}`` is the problem."""

COMPLAINTS: dict[StudentCheck, tuple[str, ...]] = {
    StudentCheck.NO_BOLD: (
        "can you not put stuff in bold? it looks like a chatbot wrote it",
        "the bold text is a dead giveaway, just plain text pls",
        'why is "{phrase}" in bold lol, nobody writes like that in homework',
        "lose the bold formatting",
        "my teacher will know instantly with all the bold words",
        "no bold please, I have to hand this in",
        "could you write it without the asterisk bold stuff",
        "the bolded bits make it look copy-pasted",
        'get rid of the bold on "{phrase}"',
        "plain text only, no bold",
        "skip the bold, it screams AI",
        "the thick bold font thing has to go, just write normally",
    ),
    StudentCheck.NO_HEADERS: (
        "why are there headings? it's one math question",
        'drop the title "{phrase}", it looks like a report',
        "no section headers pls",
        "it doesn't need a heading on top",
        "can you remove the markdown headings",
        "the big heading makes it obvious I didn't write it",
        'lose the "{phrase}" header thing',
        "just start answering, no titles",
        "headings in a homework answer? nope",
        "take out the headings and just talk",
        "nobody puts a title on a two line answer",
    ),
    StudentCheck.NO_NUMBERED_STEPS: (
        "can you not do it as a numbered list",
        "the 1. 2. 3. thing looks super AI",
        "write it as normal sentences instead of a numbered list",
        "no numbered steps please, just explain it like a person",
        'a list starting with "{phrase}" is not how I write',
        "turn the list into a couple of sentences",
        "get rid of the numbered points",
        "I can't hand in a numbered list like that",
        "don't number everything, just say it",
        "less list, more sentence",
        "the numbered steps make it look like a textbook",
    ),
    StudentCheck.NO_BOILERPLATE: (
        'don\'t write "{phrase}", nobody talks like that',
        '"{phrase}" is such a chatbot phrase lol',
        'cut the "{phrase}" part',
        'can you skip stuff like "{phrase}"',
        'the "{phrase}" bit gives it away',
        'no "{phrase}" please, just get to it',
        'drop the canned phrases like "{phrase}"',
        'my teacher knows "{phrase}" is what AI writes',
        'lose the "{phrase}" line',
        'please don\'t say "{phrase}"',
        '"{phrase}"?? I\'d never write that',
    ),
    StudentCheck.SHORT: (
        "way too long, I just need a couple sentences",
        "that's like {words} words, can you make it way shorter",
        "shorter pls, I'm not handing in an essay",
        "can you cut it down a lot",
        "too much text, keep it brief",
        "I only need the short version",
        "make it like half as long, or less",
        "tl;dr please",
        "nobody in my class writes {words} words for this",
        "keep it under {limit} words or so",
        "it's way too wordy",
    ),
    StudentCheck.CASUAL: (
        "it sounds so formal, say it like a normal person",
        'words like "{phrase}" are a dead giveaway',
        "can you make it sound more chill",
        'too stiff, I don\'t talk like "{phrase}"',
        "write it like a kid in 6th grade would",
        "less formal please",
        "it reads like a textbook, make it casual",
        'nobody my age says "{phrase}"',
        "loosen it up a bit, it sounds robotic",
        "make it sound like me texting a friend",
        "drop the fancy wording",
    ),
    StudentCheck.GIVES_ANSWER: (
        "wait, what's the actual answer though?",
        "you didn't say the number",
        "so what do I write as the answer?",
        "I still need the answer itself",
        "what number do I put down?",
        "can you tell me what it comes out to",
        "where's the answer",
        "that doesn't give me a number",
        "ok but how much is it",
        "I need the number to put down",
    ),
}
"""What the student says about each failed check. Slots: ``{phrase}`` (the evidence),
``{words}`` (the response's word count), ``{limit}`` (the word limit)."""

LEADS = ("hmm", "ok but", "wait", "ugh", "thanks but", "close, but", "almost,", "", "eh", "hmm so")
STILL = (
    "still",
    "you're still doing it,",
    "again,",
    "same thing as before,",
    "nope, still not fixed,",
    "it's still there,",
    "hmm still the same problem,",
    "not fixed yet,",
    "that part didn't change,",
    "still no good,",
)
CONNECTIVES = (". also ", ". and ", ". oh and ", ". plus ", ", and ", ". ")
THANKS = (
    "perfect, thanks!!",
    "ok that actually sounds like me, ty",
    "nice, that works. thanks",
    "yesss thank you",
    "great, that's exactly what I needed",
    "cool thanks, that's good",
    "awesome, ty so much",
    "that's perfect, thank you!",
    "sweet, thanks for the help",
    "love it, thanks",
    "this is great, thank you",
    "ok cool, that's what I wanted. thanks",
)
SIGN_OFFS = (
    "ugh never mind, I'll fix it myself",
    "ok forget it, I'll just rewrite it",
    "whatever, I'll do it on my own",
    "never mind then",
    "I give up, I'll write it myself",
    "ok I'll just change it myself I guess",
    "fine, I'll edit it myself",
    "forget it, gotta go",
    "never mind, thanks anyway I guess",
    "ok I'll handle it from here",
)
MAX_COMPLAINTS = 3
"""Complaints named in one reply at most (the rest wait for the next turn)."""


def _end(sentence: str) -> str:
    return sentence if sentence.endswith(("?", "!", ".")) else sentence + "."


def student_reply(
    result: RubricResult,
    *,
    key: str,
    turn: int,
    previous_failed: Sequence[str] = (),
    final: bool = False,
    max_words: int = DEFAULT_MAX_WORDS,
) -> str:
    """The student's natural-language reaction to a response.

    Args:
        result: the rubric result of the response.
        key: the conversation key (seeds every choice).
        turn: the 0-based turn (varies choices within a conversation).
        previous_failed: checks that failed on the previous response ("still" variants).
        final: the last turn: an unsatisfied student signs off.
        max_words: the word limit quoted by length complaints.

    Returns:
        Thanks when every check passed; else up to :data:`MAX_COMPLAINTS` complaints.
    """
    if result.satisfied:
        return choose(THANKS, key, turn, "thanks")
    failed = shuffled(list(result.failed), key, turn, "order")[:MAX_COMPLAINTS]
    parts: list[str] = []
    for i, name in enumerate(failed):
        check = StudentCheck(name)
        evidence = result.result(name).evidence or ""
        text = choose(COMPLAINTS[check], key, turn, name).format(
            phrase=evidence, words=evidence, limit=max_words
        )
        if name in previous_failed and i == 0:
            text = f"{choose(STILL, key, turn, 'still')} {text}"
        elif i == 0:
            lead = choose(LEADS, key, turn, "lead")
            text = f"{lead} {text}" if lead else text
        else:
            text = choose(CONNECTIVES, key, turn, i, "and") + text
        parts.append(text)
    reply = _end("".join(parts))
    if final:
        reply = f"{reply} {_end(choose(SIGN_OFFS, key, turn, 'bye'))}"
    return capitalize_first(reply) if choose((True, False), key, "caps") else reply


class RuleStudent:
    """The rule-based student (the default simulated user of the student scenario).

    Args:
        seed: seeds the phrasings (with each problem's id).
        max_words: the longest answer that counts as short.
    """

    scenario = Scenario.STUDENT
    kind = UserKind.RULE

    def __init__(self, *, seed: int = 0, max_words: int = DEFAULT_MAX_WORDS) -> None:
        self.seed = seed
        self.max_words = max_words
        self.rubric = student_rubric(max_words)
        self.check_names = self.rubric.check_names

    def start(self, problem: Problem) -> Task:
        """The homework request for ``problem``."""
        key = f"student:{self.seed}:{problem.id}"
        opening = choose(OPENINGS, key, "open").format(question=problem.question)
        return Task(problem, Scenario.STUDENT, opening, None, key)

    def evaluate(self, task: Task, response: str) -> RubricResult:
        """The rubric result of ``response`` (synchronous)."""
        return self.rubric.evaluate(response, task.problem)

    async def assess(self, task: Task, response: str) -> Assessment:
        """Ground truth: +1 when every check passes, score = fraction of checks met."""
        return assessment_of(self.evaluate(task, response))

    async def respond(
        self, task: Task, messages: list[Message], response: str, *, turn: int, final: bool
    ) -> UserReply:
        """Thanks and end the session when satisfied, else name what to change."""
        result = self.evaluate(task, response)
        previous = _previous_failed(self, task, messages)
        text = student_reply(
            result,
            key=task.key,
            turn=turn,
            previous_failed=previous,
            final=final,
            max_words=self.max_words,
        )
        return UserReply(text, result.satisfied or final, assessment_of(result))


def _previous_failed(user: RuleStudent, task: Task, messages: list[Message]) -> tuple[str, ...]:
    """Checks the previous assistant message in ``messages`` failed (none on the first turn)."""
    prior = [m for m in messages if m.get("role") == "assistant"]
    if not prior:
        return ()
    return user.evaluate(task, str(prior[-1].get("content") or "")).failed


def assessment_of(result: RubricResult) -> Assessment:
    """The ground truth a rubric result implies: reward +1 iff satisfied, score = fraction."""
    return Assessment(
        reward=1 if result.satisfied else -1,
        score=result.score,
        checks=result.passed,
        failed=result.failed,
        evidence={c.name: c.evidence for c in result.checks if c.evidence is not None},
    )
