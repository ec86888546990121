"""Scenarios as data: a TOML file says who the simulated user is and what they want.

A scenario file holds the problems' source, the task (homework questions, or a student's worked
solution to grade), the answer budget, a rubric built from the check kinds of
:mod:`clawrl.envs.checks` — each check with the phrasings the user complains with — and the
user's thanks, lead-ins and sign-offs. ``clawrl demo --scenario FILE`` and ``clawrl eval
personalization --scenario FILE`` take any such file; the built-in ``student`` and ``teacher``
are such files (``clawrl/scenarios/*.toml``)::

    name = "student"
    description = "a student who wants homework answers that do not look AI-written"

    [problems]
    source = "generated"          # or a GSM8K-format JSONL file (relative to this file)
    held_out = 50

    [task]
    kind = "homework"             # or "grading" (openings get {work}; flaw_rate applies)
    openings = ["can u solve this for me: {question}", "..."]

    [answer]
    max_tokens = 256              # the policy's answer budget (the server default)
    temperature = 1.0             # sampling of training sessions (evaluation is greedy)
    max_turns = 4                 # judged answers per session at most

    [replies]
    style = "casual"              # casual: random capitals, a final period added;
                                  # polite: sentences; a complaint without final
                                  # punctuation gets a full stop, one starting a
                                  # sentence a capital, after a connective lowercase
    max_complaints = 3            # checks named per reply at most
    thanks = ["perfect, thanks!!", "..."]
    sign_offs = ["never mind then", "..."]
    leads = ["hmm", "ok but", ""]
    still = ["still", "again,"]
    connectives = [". also ", ". and "]

    [[checks]]
    name = "no_bold"
    kind = "no_bold"              # the check kind; its settings (limit, patterns, ...) follow
    description = "no bold markup"
    complaints = ['why is "{evidence}" in bold lol', "..."]

Slots: ``{question}`` (openings), ``{work}`` (grading openings), and in complaints
``{evidence}`` (what the check found), ``{limit}`` (a kind's limit), ``{step}``, ``{wrong}``,
``{right}`` (the slip of graded work: ``names_fix`` only). A complaint may use only the slots
its kind fills (no ``{evidence}`` on a kind whose evidence is ``—``, no ``{limit}`` on a kind
without a limit). Check names are lowercase identifiers (``no_bold``). Grading scenarios set
``[task] flaw_rate`` (the share of worked solutions with a slip, 0.5).

A problems file is GSM8K-format JSONL: one ``{"question": ..., "answer": "... #### 42"}`` per
line (:func:`clawrl.envs.data.load_gsm8k`); it must exist and hold more than ``held_out``
problems. A malformed file is refused with a :class:`~clawrl.errors.ConfigError` that names the
file and the field.

Scoring an answer without a model::

    spec = load_scenario("my.toml")
    result = spec.rubric().evaluate("3 cups.", None)   # context: the task's (None: homework)
    result.score, result.failed, result.checks         # mean pass rate, failed names, per check
"""

from __future__ import annotations

import string
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from clawrl.envs.checks import CHECK_KINDS, CheckKind, build_check
from clawrl.envs.rubric import Check, Rubric
from clawrl.errors import ConfigError

BUILTIN = ("student", "teacher", "parent")
"""The scenarios shipped with clawrl."""


def builtin_path(name: str) -> Path:
    """The TOML file of a built-in scenario."""
    return Path(str(resources.files("clawrl") / "scenarios" / f"{name}.toml"))


def _slots(text: str) -> set[str]:
    return {f for _, f, _, _ in string.Formatter().parse(text) if f}


def _check_slots(values: list[str], allowed: set[str], what: str) -> list[str]:
    for v in values:
        try:
            bad = _slots(v) - allowed
        except ValueError as e:
            raise ValueError(f"{what} {v!r} is not a valid template: {e}") from e
        if bad:
            raise ValueError(
                f"{what} {v!r} uses unknown slot(s) {sorted(bad)}; allowed: {sorted(allowed)}"
            )
    return values


class _Section(BaseModel):
    # strict: TOML has real ints and strings, so "96" for a number is a mistake, not a value
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class ProblemsSpec(_Section):
    """Where the problems come from and how many are held out for evaluation."""

    source: str = Field("generated", min_length=1, description="generated, or a JSONL file")
    held_out: int = Field(50, ge=1, le=10_000, description="held-out problems (evaluation)")


class TaskSpec(_Section):
    """What the user brings."""

    kind: Literal["homework", "grading"] = "homework"
    openings: list[str] = Field(min_length=1, description="first messages; {question}")
    flaw_rate: float = Field(
        0.5, ge=0.0, le=1.0, description="grading: worked solutions with a slip"
    )

    @field_validator("openings")
    @classmethod
    def _openings(cls, v: list[str]) -> list[str]:
        _check_slots(v, {"question", "work"}, "opening")
        for text in v:
            if "question" not in _slots(text):
                raise ValueError(f"opening {text!r} must contain the {{question}} slot")
        return v


class AnswerSpec(_Section):
    """The policy's answers."""

    max_tokens: int = Field(256, ge=1, le=32_768, description="tokens per answer")
    temperature: float = Field(1.0, ge=0.0, le=2.0, description="training sessions' sampling")
    max_turns: int = Field(4, ge=1, le=32, description="answers per session at most")


class RepliesSpec(_Section):
    """How the user talks besides the complaints."""

    style: Literal["casual", "polite"] = "casual"
    thanks: list[str] = Field(min_length=1)
    sign_offs: list[str] = Field(min_length=1)
    leads: list[str] = Field(default_factory=lambda: [""])
    still: list[str] = Field(default_factory=lambda: ["still"])
    connectives: list[str] = Field(default_factory=lambda: [". also "])
    max_complaints: int = Field(3, ge=1, le=20)

    @field_validator("thanks", "sign_offs", "leads", "still", "connectives")
    @classmethod
    def _plain(cls, v: list[str]) -> list[str]:
        return _check_slots(v, set(), "reply")


_COMPLAINT_SLOTS = {"evidence", "limit", "step", "wrong", "right"}
_NO_EVIDENCE = {"pattern_present", "states_number", "praises_work", "cites_work"}
"""Kinds whose checks report no evidence (``—`` in :mod:`clawrl.envs.checks`)."""


class CheckSpec(_Section):
    """One check of the rubric: its name, what it wants, how the user complains about it, and
    the check kind with its settings."""

    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    description: str = Field(min_length=1)
    rule: CheckKind  # before complaints: their validator reads it
    complaints: list[str] = Field(min_length=1)

    @field_validator("complaints")
    @classmethod
    def _complaints(cls, v: list[str], info: ValidationInfo) -> list[str]:
        _check_slots(v, _COMPLAINT_SLOTS, "complaint")
        rule = info.data.get("rule")
        if rule is None:
            return v
        allowed = {"evidence"} if rule.kind not in _NO_EVIDENCE else set()
        if (getattr(rule, "limit", None) or getattr(rule, "words", None)) is not None:
            allowed.add("limit")
        if rule.kind == "names_fix":
            allowed |= {"step", "wrong", "right"}
        for text in v:
            empty = _slots(text) - allowed
            if empty:
                raise ValueError(
                    f"complaint {text!r} uses slot(s) {sorted(empty)} that a {rule.kind!r} "
                    f"check never fills (it would be sent empty); this kind fills: "
                    f"{sorted(allowed) or 'none'}"
                )
        return v

    @property
    def limit(self) -> int | None:
        """The kind's ``limit`` (or ``words``), quoted by complaints as ``{limit}``."""
        return getattr(self.rule, "limit", None) or getattr(self.rule, "words", None)

    def check(self) -> Check[Any]:
        """The rubric check."""
        return build_check(self.name, self.description, self.rule)


class ScenarioSpec(_Section):
    """A whole scenario file (see the module docstring)."""

    name: str = Field(min_length=1)
    description: str = ""
    problems: ProblemsSpec = Field(default_factory=ProblemsSpec)
    task: TaskSpec
    answer: AnswerSpec = Field(default_factory=AnswerSpec)
    replies: RepliesSpec
    checks: list[CheckSpec] = Field(min_length=1)
    path: str | None = Field(None, description="the file it was read from (set by the loader)")

    @field_validator("checks")
    @classmethod
    def _unique(cls, v: list[CheckSpec]) -> list[CheckSpec]:
        names = [c.name for c in v]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"check names must be unique, repeated: {dup}")
        return v

    def rubric(self) -> Rubric[Any]:
        """The rubric of the checks, in file order."""
        return Rubric(self.name, [c.check() for c in self.checks])

    def check(self, name: str) -> CheckSpec:
        """The check called ``name``.

        Raises:
            KeyError: no such check.
        """
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(name)

    def dataset(self) -> str | None:
        """The problems' JSONL file (resolved against the scenario file), or ``None`` for the
        generator."""
        if self.problems.source == "generated":
            return None
        p = Path(self.problems.source)
        if not p.is_absolute() and self.path is not None:
            p = Path(self.path).parent / p
        return str(p)


_KIND_ADAPTER: TypeAdapter[Any] = TypeAdapter(CheckKind)


@dataclass(frozen=True)
class _Located:
    path: str
    message: str


def _errors(e: ValidationError, prefix: str = "") -> list[_Located]:
    out = []
    for err in e.errors():
        loc = [str(x) for x in err["loc"] if not str(x).startswith(("function-", "tagged-union"))]
        if len(loc) >= 2 and loc[0] in CHECK_KINDS:  # the union member pydantic names
            loc = loc[1:]
        if not loc and err["type"].startswith("union_tag"):
            loc = ["kind"]
        where = prefix + ".".join(loc) if loc else prefix.rstrip(".") or "(file)"
        out.append(_Located(where, err["msg"]))
    return out


def _dataset_problems(spec: ScenarioSpec) -> list[_Located]:
    """A problems file that is missing, or has too few problems for ``held_out``."""
    path = spec.dataset()
    if path is None:
        return []
    p = Path(path)
    if not p.is_file():
        return [_Located("problems.source", f"no such file: {p} (a GSM8K-format JSONL file)")]
    with p.open(encoding="utf-8") as f:
        count = sum(1 for line in f if line.strip())
    if spec.problems.held_out >= count:
        return [_Located("problems.held_out", f"{spec.problems.held_out} held out, but {p.name} "
                         f"has {count} problems: hold out fewer, so some are left to train on")]  # fmt: skip
    return []


def parse_scenario(data: dict[str, Any], *, source: str = "<scenario>") -> ScenarioSpec:
    """Validate a scenario table (a parsed TOML file).

    Raises:
        ConfigError: a field is missing, unknown or out of bounds; the message names
            ``source`` and each field (``checks[2] (short).limit: ...``).
    """
    problems: list[_Located] = []
    raw_checks = data.get("checks")
    checks: list[Any] = []
    if isinstance(raw_checks, list):
        for i, raw in enumerate(raw_checks):
            where = f"checks[{i}]"
            if not isinstance(raw, dict):
                problems.append(_Located(where, "must be a table ([[checks]])"))
                continue
            raw = dict(raw)
            where += f" ({raw.get('name', '?')})"
            head = {k: raw.pop(k) for k in ("name", "description", "complaints") if k in raw}
            if "kind" not in raw:
                problems.append(
                    _Located(f"{where}.kind", f"missing; one of: {', '.join(CHECK_KINDS)}")
                )
                continue
            try:
                rule = _KIND_ADAPTER.validate_python(raw)
            except ValidationError as e:
                problems.extend(_errors(e, f"{where}."))
                continue
            try:
                checks.append(CheckSpec.model_validate({**head, "rule": rule}))
            except ValidationError as e:
                problems.extend(_errors(e, f"{where}."))
    body = {**data, "checks": checks if isinstance(raw_checks, list) else raw_checks}
    if not problems:
        try:
            spec = ScenarioSpec.model_validate({**body, "path": body.get("path") or None})
        except ValidationError as e:
            problems.extend(_errors(e))
        else:
            problems.extend(_dataset_problems(spec))
            if not problems:
                return spec
    lines = "\n".join(f"  {p.path}: {p.message}" for p in problems)
    raise ConfigError(f"invalid scenario {source}:\n{lines}")


def load_scenario(name_or_path: str | Path) -> ScenarioSpec:
    """A built-in scenario by name (``student``, ``teacher``, ``parent``) or a scenario file.

    Raises:
        ConfigError: the file is missing, not TOML, or not a valid scenario (the message names
            the field).
    """
    text = str(name_or_path)
    path = builtin_path(text) if text in BUILTIN else Path(text)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        known = ", ".join(BUILTIN)
        raise ConfigError(f"no scenario {text!r}: not a file, nor one of {known}") from e
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"scenario {path} is not valid TOML: {e}") from e
    data["path"] = str(path)
    return parse_scenario(data, source=str(path))
