"""The rule-based simulated user of any scenario file (:mod:`clawrl.envs.scenario`).

It brings a task (a homework question, or a student's worked solution to grade), scores every
answer with the scenario's rubric (ground truth: +1 exactly when every applicable check passes,
score = fraction met), and answers in natural language built from the file's phrase banks: thanks
when satisfied (the session ends), else up to ``max_complaints`` complaints about the failed
checks, quoting their evidence, each after a lead-in (or a "still" variant when the same check
failed on the previous answer), joined by connectives, with a sign-off on the last turn. Every
choice is a hash of the conversation key, the turn and the check, so replies are reproducible
but vary across problems, turns and seeds. No reply ever contains a check name.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from clawrl.envs.phrasing import capitalize_first, choose, shuffled
from clawrl.envs.problems import Problem
from clawrl.envs.rubric import RubricResult
from clawrl.envs.scenario import ScenarioSpec
from clawrl.envs.solutions import WorkedSolution, make_worked_solution
from clawrl.envs.user import Assessment, Message, Task, UserKind, UserReply


def _end(sentence: str) -> str:
    return sentence if sentence.endswith(("?", "!", ".")) else sentence + "."


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:] if text[:1].isupper() and not text[:2].isupper() else text


def assessment_of(result: RubricResult) -> Assessment:
    """The ground truth a rubric result implies: reward +1 iff satisfied, score = fraction."""
    return Assessment(
        reward=1 if result.satisfied else -1,
        score=result.score,
        checks=result.passed,
        failed=result.failed,
        evidence={c.name: c.evidence for c in result.checks if c.evidence is not None},
    )


class RuleUser:
    """The rule-based user a :class:`~clawrl.envs.scenario.ScenarioSpec` describes.

    Args:
        spec: the scenario.
        seed: seeds the phrasings and (grading) the worked solutions and their slips.
    """

    kind = UserKind.RULE

    def __init__(self, spec: ScenarioSpec, *, seed: int = 0) -> None:
        self.spec = spec
        self.scenario = spec.name
        self.seed = seed
        self.rubric = spec.rubric()
        self.check_names = self.rubric.check_names

    def start(self, problem: Problem) -> Task:
        """The opening message for ``problem`` (with the worked solution for a grading task)."""
        key = f"{self.spec.name}:{self.seed}:{problem.id}"
        template = choose(self.spec.task.openings, key, "open")
        work: WorkedSolution | None = None
        fields: dict[str, str] = {"question": problem.question}
        if self.spec.task.kind == "grading":
            work = make_worked_solution(problem, seed=self.seed, flaw_rate=self.spec.task.flaw_rate)
            fields["work"] = work.render()
        opening = template.format(**fields)
        if work is not None and "work" not in template:
            opening = f"{opening}\n\nStudent's work:\n{work.render()}"
        return Task(problem, self.spec.name, opening, work, key)

    def evaluate(self, task: Task, response: str) -> RubricResult:
        """The rubric result of ``response`` (synchronous)."""
        return self.rubric.evaluate(response, task.context)

    async def assess(self, task: Task, response: str) -> Assessment:
        """Ground truth: +1 when every applicable check passes, score = fraction met."""
        return assessment_of(self.evaluate(task, response))

    def reply(
        self,
        result: RubricResult,
        task: Task,
        *,
        turn: int,
        previous_failed: Sequence[str] = (),
        final: bool = False,
    ) -> str:
        """The user's natural-language reaction to an answer (see the module docstring)."""
        r, key = self.spec.replies, task.key
        if result.satisfied:
            return choose(r.thanks, key, turn, "thanks")
        failed = shuffled(list(result.failed), key, turn, "order")[: r.max_complaints]
        flaw = task.context.flaw if isinstance(task.context, WorkedSolution) else None
        parts: list[str] = []
        for i, name in enumerate(failed):
            check = self.spec.check(name)
            slots: dict[str, Any] = {
                "evidence": result.result(name).evidence or "",
                "limit": check.limit if check.limit is not None else "",
                "step": flaw.step if flaw else "",
                "wrong": flaw.wrong_value if flaw else "",
                "right": flaw.right_value if flaw else "",
            }
            text = choose(check.complaints, key, turn, name).format(**slots)
            polite = r.style == "polite"
            if polite and text[-1:].isalnum():  # a sentence of its own before the next part
                text += "."
            if i == 0:
                pool = r.still if name in previous_failed else r.leads
                lead = choose(pool, key, turn, "lead")
                text = f"{lead} {text}" if lead else capitalize_first(text) if polite else text
            else:
                conn = choose(r.connectives, key, turn, i, "and")
                if polite and conn.strip():
                    text = _lower_first(text)
                elif polite:  # a bare space starts a new sentence
                    text = capitalize_first(text)
                text = conn + text
            parts.append(text)
        reply = "".join(parts)
        if r.style == "casual":
            reply = _end(reply)
        if final:
            bye = choose(r.sign_offs, key, turn, "bye")
            reply = f"{reply} {_end(bye) if r.style == 'casual' else bye}"
        if r.style == "casual" and choose((True, False), key, "caps"):
            reply = capitalize_first(reply)
        return reply

    async def respond(
        self, task: Task, messages: list[Message], response: str, *, turn: int, final: bool
    ) -> UserReply:
        """Thanks and end the session when satisfied, else name what to change."""
        result = self.evaluate(task, response)
        prior = [m for m in messages if m.get("role") == "assistant"]
        previous = self.evaluate(task, str(prior[-1].get("content") or "")).failed if prior else ()
        text = self.reply(result, task, turn=turn, previous_failed=previous, final=final)
        return UserReply(text, result.satisfied or final, assessment_of(result))
