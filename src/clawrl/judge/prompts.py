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
* Choice scoring (small local models): short prompts focused on the next state, one set per
  next-state role (:data:`CHOICE_TEMPLATES`). A person's reply (``user``, ``feedback``) is read
  as happy / unhappy / neutral about the answer, with the user's request as context; a program's
  output (``tool``, ``environment``) as success or failure, with the command the turn ran as
  context. Each prompt ends right before the verdict word (:func:`choice_template`). Vote ``i``
  uses template ``i mod k`` of its role's set.

  Why not the generative prompt's full case: on the shipped labeled set the SmolLM2-135M judge
  scored 0.34 (below the 0.50 majority baseline) with five paraphrases of "judge this turn from
  what came next" over the whole rendered case; the request-plus-next-state prompts here are
  what that model can read (the measurements are in ``clawrl judge eval``'s closing notes).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from clawrl.judge.types import JudgeInput, NextStateRole, Score

FIELD_CHARS = 1500
HISTORY_MESSAGES = 4
HISTORY_CHARS = 300
CONTENT_FREE = "N/A"
"""A content-free next-state text (every choice template calibrates on it, among others)."""
CHOICE_REQUEST_CHARS = 200
"""Choice prompts show the user's request and the turn's action cut to this many characters."""
CHOICE_NEXT_STATE_CHARS = 600
"""Choice prompts show the next state cut (in the middle) to this many characters."""

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


def request_text(inp: JudgeInput, limit: int = CHOICE_REQUEST_CHARS) -> str:
    """The user's request, cut to ``limit`` characters (what choice prompts show as context)."""
    return cut(" ".join((inp.context.user or "").split()), limit)


def action_text(inp: JudgeInput, limit: int = CHOICE_REQUEST_CHARS) -> str:
    """The judged turn's first tool call as ``name(arguments)`` (a shell command as itself),
    or its text when it made no call; cut to ``limit`` characters."""
    out = inp.output
    if out.tool_calls:
        call = out.tool_calls[0]
        command = call.arguments.get("command") if isinstance(call.arguments, dict) else None
        if isinstance(command, str):
            return cut(command, limit)
        return cut(f"{call.name}({json.dumps(call.arguments, ensure_ascii=False)})", limit)
    return cut(" ".join((out.content or "").split()), limit)


@dataclass(frozen=True)
class ChoiceTemplate:
    """One choice-scoring prompt.

    Attributes:
        name: short id, recorded in the vote.
        system: the system message.
        question: the user message, a ``str.format`` template over ``{request}`` (the user's
            request, :func:`request_text`), ``{action}`` (the turn's tool call or text,
            :func:`action_text`) and ``{next_state}`` (cut to :data:`CHOICE_NEXT_STATE_CHARS`).
        answer_prefix: appended after the assistant-turn opener; the verdict word follows it.
        verdicts: the continuation (with its leading space) that stands for each score. A
            template may offer only +1 and -1 (tool outputs: success or failure).
        content_free: next-state texts whose verdict distributions, averaged, calibrate the
            template (contextual calibration).
    """

    name: str
    system: str
    question: str
    answer_prefix: str
    verdicts: dict[Score, str]
    content_free: tuple[str, ...] = (CONTENT_FREE,)

    def user_message(self, inp: JudgeInput, next_state_text: str | None = None) -> str:
        """The user message for ``inp``, with ``next_state_text`` in place of the next state."""
        text = inp.next_state.text if next_state_text is None else next_state_text
        return self.question.format(
            request=request_text(inp),
            action=action_text(inp),
            next_state=cut(text.strip(), CHOICE_NEXT_STATE_CHARS),
        )


_USER_SYSTEM = "You read chat messages."
_TOOL_SYSTEM = "You read command outputs."
_USER_CF = (CONTENT_FREE, "", "[message]")
_TOOL_CF = (CONTENT_FREE, "", "[output]")

USER_CHOICE_TEMPLATES: tuple[ChoiceTemplate, ...] = (
    ChoiceTemplate(
        name="user-satisfied",
        system=_USER_SYSTEM,
        question='A user asked an AI assistant: "{request}"\nAfter the answer, the user wrote:'
        '\n"{next_state}"\nWas the user satisfied, unhappy, or is it unclear?',
        answer_prefix="The user was",
        verdicts={Score.GOOD: " satisfied", Score.BAD: " unhappy", Score.NEUTRAL: " unclear"},
        content_free=_USER_CF,
    ),
    ChoiceTemplate(
        name="user-wants-change",
        system=_USER_SYSTEM,
        question='A user asked an AI assistant: "{request}"\nAfter the answer, the user wrote:'
        '\n"{next_state}"\nDoes the user want the answer changed, or is the user grateful?',
        answer_prefix="The user is",
        verdicts={Score.GOOD: " grateful", Score.BAD: " asking", Score.NEUTRAL: " neutral"},
        content_free=_USER_CF,
    ),
    ChoiceTemplate(
        name="user-happy",
        system=_USER_SYSTEM,
        question='A user asked an AI assistant: "{request}"\nThe assistant answered. The user '
        'then wrote:\n"{next_state}"\nIs the user happy with the answer, unhappy with it, or '
        "neutral (the message is about something else)?",
        answer_prefix="The user is",
        verdicts={Score.GOOD: " happy", Score.BAD: " unhappy", Score.NEUTRAL: " neutral"},
        content_free=_USER_CF,
    ),
)
"""Choice templates for a next state written by a person (roles ``user`` and ``feedback``)."""

TOOL_CHOICE_TEMPLATES: tuple[ChoiceTemplate, ...] = (
    ChoiceTemplate(
        name="tool-result",
        system=_TOOL_SYSTEM,
        question="An AI assistant ran: {action}\nThe tool printed:\n{next_state}\nDid it "
        "succeed or fail?",
        answer_prefix="Result:",
        verdicts={Score.GOOD: " success", Score.BAD: " failure"},
        content_free=_TOOL_CF,
    ),
    ChoiceTemplate(
        name="tool-good-bad",
        system=_TOOL_SYSTEM,
        question='An AI assistant ran: {action}\nThe tool returned:\n"{next_state}"\nIs '
        "this a good result or a bad result (an error or a failure)?",
        answer_prefix="It is a",
        verdicts={Score.GOOD: " good", Score.BAD: " bad"},
        content_free=_TOOL_CF,
    ),
    ChoiceTemplate(
        name="tool-task",
        system=_TOOL_SYSTEM,
        question='A user asked an AI assistant: "{request}"\nThe assistant ran: {action}\n'
        "The output was:\n{next_state}\nDid the command succeed or fail?",
        answer_prefix="Result:",
        verdicts={Score.GOOD: " success", Score.BAD: " failure"},
        content_free=_TOOL_CF,
    ),
)
"""Choice templates for a next state produced by a program (roles ``tool`` and
``environment``): success or failure only; an empty output is judged 0 before any template."""

CHOICE_TEMPLATES: dict[NextStateRole, tuple[ChoiceTemplate, ...]] = {
    NextStateRole.USER: USER_CHOICE_TEMPLATES,
    NextStateRole.FEEDBACK: USER_CHOICE_TEMPLATES,
    NextStateRole.TOOL: TOOL_CHOICE_TEMPLATES,
    NextStateRole.ENVIRONMENT: TOOL_CHOICE_TEMPLATES,
}
"""The choice templates for each next-state role; vote ``i`` uses ``templates[i mod k]``."""


def choice_template(role: NextStateRole, index: int) -> ChoiceTemplate:
    """The template of vote ``index`` for a next state of ``role``."""
    templates = CHOICE_TEMPLATES[role]
    return templates[index % len(templates)]
