"""Verdicts a program's output earns without a model: no evidence, or a non-zero exit status.

The trained head and the choice judge read a next state's text with a small model; two facts
about a *program's* output (roles ``tool`` and ``environment``) need no model and the model gets
them wrong often enough to matter:

* **Empty output** (no text at all) is judged 0: nothing was shown either way. A harness's
  frame around a silent command (``Output:\n(exit code 0)``) is text: it goes to the model,
  and the head judges it +1, as the labeled sets label a silent success.
* **A non-zero exit status** that the output reports is judged -1: the command failed. Agent
  harnesses add the status to a command's output — the reference agent and clawrl's
  mini-swe-agent templates end it with ``(exit code N)``, mini-swe-agent's own templates wrap it
  in ``<returncode>N</returncode>``, other tools open it with a header line such as ``Exit code:
  N`` (:func:`read_exit_status`). A command whose non-zero status is an answer rather than a
  failure (``grep`` that found nothing, ``diff`` that found a difference, ``test -f``) is
  judged -1 too when it printed something; status 1 with nothing else printed is left to the
  model. On the 191 judged turns of the embedded model's reference-agent rollouts on the
  training tasks (``README.md``, "PRM + outcome vs outcome only"), the head gave +1 to 47 of
  the 101 failing commands' outputs (``sh: 1: sudo: not found`` ... ``(exit code 127)``) read
  as a person's reply, and to 51 read as program output. An exit status of 0 proves nothing
  about the task (a command that wrote the wrong file exits 0), so it is left to the model.

Limits of the reading (:func:`read_exit_status`): a program's own first or last line that
looks like a report (``cat`` of a log ending ``exit status 1``) is read as the command's
status, and a ``<returncode>`` tag anywhere wins; a JSON result is read only on one line, with
the status key within its first 2,000 characters, and always counts as printed; statuses in
other words (``[The command completed with exit code 1.]``, ``Error: Exit code 1``, the
reference agent's ``(command timed out after 20s)``) are not read and go to the model.

A person's reply (roles ``user``, ``feedback``) never goes through these rules: a user who
quotes ``exit code 1`` is reporting, not running, a command.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from clawrl.judge.types import NextStateRole, NextStateText, Score

PROGRAM_ROLES = (NextStateRole.TOOL, NextStateRole.ENVIRONMENT)
"""Next-state roles whose text a program produced."""

_FLAGS = re.IGNORECASE | re.ASCII  # ASCII: \d is [0-9], not any script's digits

_RETURNCODE_TAG = re.compile(r"<returncode>[ \t]*(-?\d{1,6})[ \t]*</returncode>", _FLAGS)
"""mini-swe-agent's own observation templates: the status in a tag, anywhere in the text."""

_STATUS_LINE = (
    # (exit code 2)  [exit code 139]  [exit code 0, no output]  exit status: 1  Exit code 1
    re.compile(
        r"[(\[]?[ \t]*(?:exit[ _](?:code|status)|return[ _]?code)[ \t]*(?:[:=][ \t]*)?"
        r"(-?\d{1,6})(?:,[^)\]]{0,40})?[ \t]*[)\]]?\.?",
        _FLAGS,
    ),
    # [process exited with status 3]  Process exited with code 0  Command finished with exit code 0.
    re.compile(
        r"[(\[]?[\w ]{0,40}?\b(?:exited with (?:status|code)|with exit (?:code|status))"
        r"[ \t]+(-?\d{1,6})[ \t]*[)\]]?\.?",
        _FLAGS,
    ),
    # a one-line JSON result: {"exit_code": 1, ...}  {"exitCode": 1}  {"returncode": 2}
    re.compile(
        r"\{.{0,2000}?\"(?:exit_?code|exitCode|exit_status|returncode)\"[ \t]*:[ \t]*(-?\d{1,6})"
        r"\b.{0,2000}\}",
        _FLAGS,
    ),
)
"""A line that *is* an exit status report (matched as the whole line)."""

_FRAME_LINE = re.compile(r"(?:output|observation|result)[ \t]*:?|</?output>|</?returncode>", _FLAGS)
"""Lines a harness frames an output with; they are not the program's output."""

_OUTPUT_TAG = re.compile(r"</?output>", _FLAGS)


@dataclass(frozen=True)
class ExitReport:
    """An exit status a program's output reports.

    Attributes:
        status: the status (0: success).
        printed: whether the program printed anything besides the report and its frame
            (``Output:``, ``<output>`` tags).
    """

    status: int
    printed: bool


def read_exit_status(text: str) -> ExitReport | None:
    """The exit status ``text`` reports, or ``None`` when it reports none.

    Read from mini-swe-agent's ``<returncode>N</returncode>`` tag anywhere, else from the last
    non-empty line (a trailer: ``(exit code 2)``, ``[exit code 139]``, ``exit status: 1``,
    ``[process exited with status 3]``, ``Command finished with exit code 0.``), else from the
    first (a header: ``Exit code: 1``); a one-line JSON result (``{"exit_code": 1, ...}``) is
    both. Only a line that is nothing but the report counts, so an output that mentions an exit
    status (a test log, a usage text, prose) does not. Linear in the text's length.
    """
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    tag = _RETURNCODE_TAG.search(text)
    if tag is not None:
        rest = _OUTPUT_TAG.sub("", _RETURNCODE_TAG.sub("", text)).splitlines()
        printed = any(ln.strip() and not _FRAME_LINE.fullmatch(ln.strip()) for ln in rest)
        return ExitReport(int(tag.group(1)), printed)
    for at in (len(lines) - 1, 0) if lines else ():
        for pattern in _STATUS_LINE:
            m = pattern.fullmatch(lines[at])
            if m is not None:
                others = lines[:at] + lines[at + 1 :]
                printed = pattern is _STATUS_LINE[2] or any(
                    not _FRAME_LINE.fullmatch(ln) for ln in others
                )
                return ExitReport(int(m.group(1)), printed)
    return None


def exit_status(text: str) -> int | None:
    """The exit status ``text`` reports (:func:`read_exit_status`), or ``None``."""
    report = read_exit_status(text)
    return report.status if report is not None else None


@dataclass(frozen=True)
class RuleVerdict:
    """A verdict reached without a model.

    Attributes:
        score: the verdict.
        rule: ``"empty_output"`` or ``"exit_status"``.
        detail: one line for the vote's ``detail``.
    """

    score: Score
    rule: str
    detail: str


def program_rule(next_state: NextStateText) -> RuleVerdict | None:
    """The verdict the rules above give ``next_state``, or ``None`` when the model must read it:
    a person's reply; a program's output with text and no non-zero exit status; or status 1
    with nothing else printed (``grep`` that matched nothing, a ``test`` that was false: an
    answer as often as a failure)."""
    if next_state.role not in PROGRAM_ROLES:
        return None
    if not next_state.text.strip():
        return RuleVerdict(Score.NEUTRAL, "empty_output", "empty output: no evidence")
    report = read_exit_status(next_state.text)
    if report is None or report.status == 0 or (report.status == 1 and not report.printed):
        return None
    return RuleVerdict(Score.BAD, "exit_status", f"the command failed: exit status {report.status}")
