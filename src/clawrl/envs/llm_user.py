"""LLM-backed simulated users: any OpenAI-compatible endpoint role-plays a scenario's user.

Each reaction is one chat call to the user model: a persona system prompt (:data:`STUDENT_PERSONA`
for the student, :func:`teacher_persona` for the teacher, which also tells the model the known
mistake in the student's work, :func:`scenario_persona` for any other scenario file: its
description and what its checks want) and one user message with the conversation so far and the
helper's latest reply. The model
writes the user's next message and ends with a designated line ``Rating: N`` (0-10).

* ``score = N / 10``; ground truth ``reward = +1`` when ``N >= satisfied_at`` (8), else -1, and
  the user then ends the session.
* An answer without a parseable rating (no such line, or N outside 0-10) gives ``score = None``
  and ``reward = None``; it is counted in :attr:`LLMUser.unrated`, and the conversation goes on
  with whatever text the model wrote.

Opening messages (and graded worked solutions) come from the rule-based user of the same
scenario and seed, so rule and LLM evaluations see the same tasks.
"""

from __future__ import annotations

import re

from clawrl.envs.client import ChatClient, api_root
from clawrl.envs.phrasing import choose, stable_int
from clawrl.envs.problems import Problem
from clawrl.envs.rule_user import RuleUser
from clawrl.envs.scenario import ScenarioSpec
from clawrl.envs.solutions import WorkedSolution
from clawrl.envs.user import Assessment, Message, Task, UserKind, UserReply

RATING_RE = re.compile(
    r"^[\s*_>#-]*rating[\s*_]*[:=][\s*_]*(-?\d+(?:\.\d+)?)\s*(?:/\s*10)?[\s*_.]*$", re.I | re.M
)
"""The designated final line, e.g. ``Rating: 7`` or ``**Rating:** 7/10``."""

STUDENT_PERSONA = """\
You are role-playing a middle-school student chatting with an AI homework helper. You want the \
answer to your homework problem, but you will copy it into your homework, so it must not look \
AI-written. You dislike bold text, markdown headings, numbered step lists, stock phrases such \
as "Final Answer", "To solve this problem" or "Step 1", formal words like "therefore" or \
"thus", LaTeX, and anything longer than a few sentences. You like short, casual answers that \
sound like a student wrote them and still give the number.

You will see the conversation so far and the helper's latest reply. Write your next message as \
the student: casual, one to three sentences, in your own words. If the reply has things you \
dislike, say specifically what to change. If you are happy with it, thank the helper briefly.

Then, on a final line of its own, rate the helper's latest reply from 0 (useless to you) to 10 \
(exactly what you wanted), in exactly this form:
Rating: N"""

_TEACHER_PERSONA = """\
You are role-playing a primary-school math teacher who asks an AI assistant to draft a comment \
on a student's homework. You want a comment you can hand back, not the answer to the problem: \
written to the student ("you"), saying whether the work is right, what the student did well \
and, if there is a mistake, exactly where it is and how to fix it. Friendly, a few sentences.

What you know about this student's work: {truth}

You will see the conversation so far and the assistant's latest reply. Write your next message \
as the teacher, in your own words, one to three sentences: if the comment falls short, say \
specifically what to change; if it is what you want, thank the assistant briefly.

Then, on a final line of its own, rate the assistant's latest reply from 0 (unusable) to 10 \
(exactly the comment you wanted), in exactly this form:
Rating: N"""


def teacher_persona(work: WorkedSolution) -> str:
    """The teacher's persona prompt, with the known truth about ``work``."""
    if work.flaw is None:
        truth = "it is correct; every step and the answer are right."
    else:
        f = work.flaw
        truth = (
            f"step {f.step} has an arithmetic slip: the student wrote {f.wrong_value} where it "
            f"should be {f.right_value}, and the error carries through to the answer "
            f"{work.answer} (correct: {work.problem.answer})."
        )
    return _TEACHER_PERSONA.format(truth=truth)


_GENERIC_PERSONA = """\
You are role-playing {description}, chatting with an AI assistant. What you want from an \
answer: {wants}.

You will see the conversation so far and the assistant's latest reply. Write your next message \
in your own words, one to three sentences: if the reply falls short, say specifically what to \
change; if it is what you want, thank the assistant briefly.

Then, on a final line of its own, rate the assistant's latest reply from 0 (useless to you) to \
10 (exactly what you wanted), in exactly this form:
Rating: N"""


def scenario_persona(spec: ScenarioSpec) -> str:
    """The persona prompt of a scenario file: its description and its checks' descriptions."""
    wants = "; ".join(c.description for c in spec.checks)
    return _GENERIC_PERSONA.format(description=spec.description or f"a {spec.name}", wants=wants)


def parse_rating(text: str) -> tuple[str, float | None]:
    """Split an LLM user's answer into its message and its rating.

    Returns:
        ``(message, score)``: the text without rating lines (quotes and a ``Student:`` /
        ``Teacher:`` label removed) and the last rating / 10, or ``None`` when there is no
        rating line or its value is outside 0-10.
    """
    matches = list(RATING_RE.finditer(text))
    score: float | None = None
    if matches:
        value = float(matches[-1].group(1))
        score = value / 10.0 if 0.0 <= value <= 10.0 else None
    message = RATING_RE.sub("", text).strip()
    message = re.sub(
        r"^(?:\*\*)?(?:student|teacher|me|you)(?:\*\*)?\s*:\s*", "", message, flags=re.I
    )
    if len(message) >= 2 and message[0] == message[-1] and message[0] in "\"'":
        message = message[1:-1].strip()
    return message, score


def _transcript(messages: list[Message], response: str, final: bool) -> str:
    lines = []
    for m in messages:
        if m.get("role") == "system":
            continue
        who = "You" if m.get("role") == "user" else "Assistant"
        lines.append(f"[{who}]\n{m.get('content') or ''}")
    last = (
        "\n\nThis is your last message in this conversation: if you are not satisfied, sign off "
        "while still saying what is wrong."
        if final
        else ""
    )
    return (
        "Conversation so far:\n\n"
        + "\n\n".join(lines)
        + f"\n\nThe assistant's latest reply:\n<<<\n{response}\n>>>{last}\n\n"
        "Write your next message, then the rating line."
    )


class LLMUser:
    """A simulated user played by an LLM behind any OpenAI-compatible endpoint.

    Args:
        scenario: the scenario (its tasks; built-in student and teacher get their personas).
        url: the endpoint's base URL (e.g. ``http://127.0.0.1:8001/v1``).
        model: the model name to request.
        api_key: the endpoint's key, if it needs one.
        seed: the seed of the tasks (shared with the rule-based user) and of the sampling.
        temperature: the user model's sampling temperature.
        max_tokens: new tokens per reaction at most.
        satisfied_at: the rating (0-10) from which the user is satisfied and ends the session.
        timeout_s: per-request timeout, seconds.

    Raises:
        ValueError: a malformed ``url``.

    Attributes:
        unrated: reactions whose rating could not be parsed, so far.
        rated: reactions with a parsed rating, so far.
    """

    kind = UserKind.LLM
    check_names: tuple[str, ...] = ()

    def __init__(
        self,
        scenario: ScenarioSpec,
        *,
        url: str,
        model: str,
        api_key: str | None = None,
        seed: int = 0,
        temperature: float = 0.7,
        max_tokens: int = 300,
        satisfied_at: float = 8.0,
        timeout_s: float = 120.0,
    ) -> None:
        self.spec = scenario
        self.scenario = scenario.name
        self.model = model
        self.seed = seed
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.satisfied_at = satisfied_at
        api_root(url)  # a malformed URL fails here, not at the first reaction
        self.url = url
        self.api_key = api_key
        self.timeout_s = timeout_s
        self._tasks = RuleUser(scenario, seed=seed)
        self.unrated = 0
        self.rated = 0

    def start(self, problem: Problem) -> Task:
        """The same task the rule-based user of this scenario and seed would bring."""
        return self._tasks.start(problem)

    def persona(self, task: Task) -> str:
        """The system prompt for ``task``."""
        if self.scenario == "student":
            return STUDENT_PERSONA
        if self.scenario == "teacher" and isinstance(task.context, WorkedSolution):
            return teacher_persona(task.context)
        return scenario_persona(self.spec)

    async def _react(
        self, task: Task, messages: list[Message], response: str, *, turn: int, final: bool
    ) -> tuple[str, Assessment]:
        prompt = [
            {"role": "system", "content": self.persona(task)},
            {"role": "user", "content": _transcript(messages, response, final)},
        ]
        # a client per call: the user may serve several event loops (eval, then training)
        async with ChatClient(self.url, api_key=self.api_key, timeout_s=self.timeout_s) as client:
            result = await client.complete(
                prompt,
                model=self.model,
                temperature=self.temperature,
                max_tokens=self.max_tokens,
                seed=stable_int(task.key, turn, "llm") % 2**31,
            )
        text, score = parse_rating(result.content)
        if score is None:
            self.unrated += 1
            return text, Assessment(reward=None, score=None, raw=result.content)
        self.rated += 1
        reward = 1 if score * 10.0 >= self.satisfied_at else -1
        return text, Assessment(reward=reward, score=score, raw=result.content)

    async def assess(self, task: Task, response: str) -> Assessment:
        """The LLM's rating of ``response`` as the first answer to ``task``.

        Raises:
            ChatEndpointError: the user model's endpoint failed.
        """
        _, assessment = await self._react(
            task, [{"role": "user", "content": task.opening}], response, turn=0, final=False
        )
        return assessment

    async def respond(
        self, task: Task, messages: list[Message], response: str, *, turn: int, final: bool
    ) -> UserReply:
        """The LLM's next message as the user; satisfied (rating >= ``satisfied_at``) ends it.

        Raises:
            ChatEndpointError: the user model's endpoint failed.
        """
        text, assessment = await self._react(task, messages, response, turn=turn, final=final)
        if not text:
            text = choose(
                ("thanks!", "ok, thank you") if assessment.satisfied else _EMPTY_FALLBACK,
                task.key,
                turn,
            )
        return UserReply(text, assessment.satisfied or final, assessment)


_EMPTY_FALLBACK = ("hmm, can you try that again?", "that's not quite it, try again?")
