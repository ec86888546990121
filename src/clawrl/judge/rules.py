"""Verdicts a program's output earns without a model: no evidence, or a non-zero exit status.

The trained head and the choice judge read a next state's text with a small model; two facts
about a *program's* output (roles ``tool`` and ``environment``) need no model and the model gets
them wrong often enough to matter:

* **Empty output** is judged 0: nothing was shown either way.
* **A non-zero exit status** that the output reports is judged -1: the command failed. Agent
  harnesses append the status to a command's output — the reference agent and clawrl's
  mini-swe-agent templates end it with ``(exit code N)``, mini-swe-agent's own templates wrap it
  in ``<returncode>N</returncode>``, others write ``[exit code N]``, ``exit status: N`` or
  ``exited with status N`` — and the last status the text reports is the command's. Measured on
  191 real reference-agent turns of the embedded model (``README.md``, "PRM + outcome"), the
  head gave +1 to 51 of 101 outputs such as ``sh: 1: sudo: not found`` ... ``(exit code 127)``
  when it read them as program output. An exit status of 0 proves nothing about the task (a
  command that wrote the wrong file exits 0), so it is left to the model.

A person's reply (roles ``user``, ``feedback``) never goes through these rules: a user who
quotes ``exit code 1`` is reporting, not running, a command.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from clawrl.judge.types import NextState, NextStateRole, Score

PROGRAM_ROLES = (NextStateRole.TOOL, NextStateRole.ENVIRONMENT)
"""Next-state roles whose text a program produced."""

_EXIT_STATUS = re.compile(
    r"<returncode>\s*(-?\d+)\s*</returncode>"
    r"|\bexit(?:ed)?[ _](?:code|status)\b[\"']?\s*[:=]?\s*(-?\d+)"
    r"|\bexited with (?:status|code)\s+(-?\d+)",
    re.IGNORECASE,
)


def exit_status(text: str) -> int | None:
    """The last exit status ``text`` reports (``(exit code 2)``, ``[exit code 139]``,
    ``exit status: 1``, ``"exit_code": 1``, ``<returncode>0</returncode>``, ``exited with status
    3``), or
    ``None`` when it reports none."""
    found = None
    for m in _EXIT_STATUS.finditer(text):
        found = next(g for g in m.groups() if g is not None)
    return int(found) if found is not None else None


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


def program_rule(next_state: NextState) -> RuleVerdict | None:
    """The verdict the rules above give ``next_state``, or ``None`` when the model must read it
    (a person's reply, or a program's output with text and no non-zero exit status)."""
    if next_state.role not in PROGRAM_ROLES:
        return None
    if not next_state.text.strip():
        return RuleVerdict(Score.NEUTRAL, "empty_output", "empty output: no evidence")
    status = exit_status(next_state.text)
    if status is not None and status != 0:
        return RuleVerdict(Score.BAD, "exit_status", f"the command failed: exit status {status}")
    return None
