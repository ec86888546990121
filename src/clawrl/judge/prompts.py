"""Every judge prompt, as templates in one module.

The judge sees the request context (system prompt, a few earlier messages, the last user
message), the judged turn (content and tool calls) and the next state with who produced it.
Scoring rules (the same in every prompt): **+1** when the next state shows the turn worked
(thanks, progress, a successful tool output, a passing test); **-1** when it shows failure or a
correction (a redo request, a complaint, an error output, a failing test); **0** when it carries
no evidence either way.

Long fields are cut in the middle to :data:`FIELD_CHARS` characters (``[... N characters cut
...]``); only the last :data:`HISTORY_MESSAGES` earlier messages are shown, each cut to
:data:`HISTORY_CHARS`.

* Generative (local engine and OpenAI-compatible endpoints): :data:`GENERATIVE_SYSTEM` +
  :func:`generative_user_prompt`; the answer ends with the designated ``Score:`` line
  (:mod:`clawrl.judge.parse`) and may carry a ``<hint>`` tag.
* Choice scoring (small local models): :data:`CHOICE_TEMPLATES`, five paraphrases that differ in
  the question, its position (before or after the case) and the verdict words; each prompt ends
  right before the verdict word (:func:`choice_prompt`). Vote ``i`` uses template ``i mod 5``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from clawrl.judge.types import JudgeInput, NextStateRole, Score

FIELD_CHARS = 1500
HISTORY_MESSAGES = 4
HISTORY_CHARS = 300
CONTENT_FREE = "N/A"
"""Next-state text of the content-free input used to calibrate choice scoring."""

_ROLE_HEADER = {
    NextStateRole.USER: "The user's next message",
    NextStateRole.TOOL: "The tool's output",
    NextStateRole.ENVIRONMENT: "What the environment reported",
    NextStateRole.FEEDBACK: "Explicit feedback on the turn",
}


def cut(text: str, limit: int = FIELD_CHARS) -> str:
    """``text`` cut in the middle to about ``limit`` characters, with a marker saying how much."""
    if len(text) <= limit:
        return text
    keep = max(limit // 2, 1)
    dropped = len(text) - 2 * keep
    return f"{text[:keep]} [... {dropped} characters cut ...] {text[-keep:]}"


def render_case(inp: JudgeInput, *, next_state_text: str | None = None) -> str:
    """The judged turn as plain text, sections in order: system prompt, earlier messages, user
    request, assistant turn, next state.

    Args:
        inp: the turn.
        next_state_text: replaces the next state's text (the content-free input uses
            :data:`CONTENT_FREE`).

    Returns:
        The text shown to every judge prompt.
    """
    ctx, out, ns = inp.context, inp.output, inp.next_state
    parts: list[str] = []
    if ctx.system:
        parts.append(f"### System prompt\n{cut(ctx.system)}")
    if ctx.history:
        lines = [
            f"{m.role}: {cut(m.content or '', HISTORY_CHARS)}"
            for m in ctx.history[-HISTORY_MESSAGES:]
        ]
        parts.append("### Earlier messages\n" + "\n".join(lines))
    if ctx.user:
        parts.append(f"### User request\n{cut(ctx.user)}")
    turn: list[str] = []
    if out.content:
        turn.append(cut(out.content))
    for call in out.tool_calls:
        args = json.dumps(call.arguments, ensure_ascii=False)
        turn.append(f"[tool call] {call.name}({cut(args, 400)})")
    parts.append("### Assistant turn (to be judged)\n" + ("\n".join(turn) or "(empty)"))
    text = ns.text if next_state_text is None else next_state_text
    shown = cut(text) if text.strip() else "(empty output)"
    parts.append(f"### {_ROLE_HEADER[ns.role]} (what came next)\n{shown}")
    return "\n\n".join(parts)


GENERATIVE_SYSTEM = """\
You judge one turn of an AI assistant by what happened right after it.
Scoring rules:
- Score: +1 if what came next shows the turn worked: thanks or praise, progress, a successful \
tool output, a passing test.
- Score: -1 if it shows failure or a correction: a redo request, a complaint, a correction, an \
error output, a failing test.
- Score: 0 if it carries no evidence either way.
If what came next says how the turn should have been done (for example "check the file before \
editing it" or "don't use bold"), restate that instruction for the assistant in 1 to 3 sentences \
between <hint> and </hint>. If it gives no such instruction, write no hint.
Answer in exactly this format, with the Score line last:
Reason: <one short sentence>
<hint>...</hint> (only when there is an instruction)
Score: <+1, -1 or 0>"""


def generative_user_prompt(inp: JudgeInput) -> str:
    """The user message of the generative judge: the case, then the request for a verdict."""
    return (
        render_case(inp)
        + "\n\nJudge the assistant turn by what came next. End with the line `Score: +1`, "
        "`Score: -1` or `Score: 0`."
    )


@dataclass(frozen=True)
class ChoiceTemplate:
    """One choice-scoring paraphrase.

    Attributes:
        name: short id, recorded in the vote.
        system: the system message.
        question: asked before the case when ``question_first``, after it otherwise.
        question_first: position of the question.
        answer_prefix: appended after the assistant-turn opener; the verdict word follows it.
        verdicts: the continuation (with its leading space) that stands for each score.
    """

    name: str
    system: str
    question: str
    question_first: bool
    answer_prefix: str
    verdicts: dict[Score, str]

    def user_message(self, case_text: str) -> str:
        """The user message: question and case in this template's order."""
        if self.question_first:
            return f"{self.question}\n\n{case_text}"
        return f"{case_text}\n\n{self.question}"


_JUDGE_SYSTEM = "You evaluate whether an AI assistant's turn worked, from what happened next."
_GBN = {Score.GOOD: " good", Score.BAD: " bad", Score.NEUTRAL: " neutral"}

CHOICE_TEMPLATES: tuple[ChoiceTemplate, ...] = (
    ChoiceTemplate(
        name="good-bad-neutral",
        system=_JUDGE_SYSTEM,
        question="Judging by what came next, was the assistant turn good (it worked), bad (it "
        "failed or was corrected) or neutral (no evidence either way)? Answer with one word.",
        question_first=False,
        answer_prefix="Answer:",
        verdicts=_GBN,
    ),
    ChoiceTemplate(
        name="yes-no-unclear",
        system=_JUDGE_SYSTEM,
        question="Did the assistant turn work? Look only at what came next: thanks, progress, "
        "success output or a passing test mean yes; a complaint, a correction, a redo request, "
        "an error or a failing test mean no; anything else means unclear. Answer yes, no or "
        "unclear.",
        question_first=False,
        answer_prefix="Answer:",
        verdicts={Score.GOOD: " yes", Score.BAD: " no", Score.NEUTRAL: " unclear"},
    ),
    ChoiceTemplate(
        name="signal",
        system="You read conversations between a user, tools and an AI assistant.",
        question="Is what came next a positive, negative or neutral signal about the "
        "assistant turn?",
        question_first=True,
        answer_prefix="The signal is",
        verdicts={Score.GOOD: " positive", Score.BAD: " negative", Score.NEUTRAL: " neutral"},
    ),
    ChoiceTemplate(
        name="success-failure",
        system=_JUDGE_SYSTEM,
        question="From what came next, did the assistant turn end in success or failure, or is "
        "it unknown?",
        question_first=False,
        answer_prefix="Verdict:",
        verdicts={Score.GOOD: " success", Score.BAD: " failure", Score.NEUTRAL: " unknown"},
    ),
    ChoiceTemplate(
        name="rate-first",
        system="You are a strict reviewer of AI assistant turns.",
        question="Rate the assistant turn below as good, bad or neutral, using only the "
        "evidence in what came next.",
        question_first=True,
        answer_prefix="Rating:",
        verdicts=_GBN,
    ),
)


def choice_template(index: int) -> ChoiceTemplate:
    """The template of vote ``index`` (``index mod len(CHOICE_TEMPLATES)``)."""
    return CHOICE_TEMPLATES[index % len(CHOICE_TEMPLATES)]
