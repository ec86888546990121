"""Problem sources: GSM8K-format JSONL files and the built-in generator, and their split.

A GSM8K record is one JSON object per line with ``question`` and ``answer``; the answer is the
worked solution, one step per line with ``<<expr=result>>`` calculator annotations, ending in a
line ``#### N`` with the numeric answer (e.g. ``#### 1,000``). Other keys are ignored.

:func:`problem_split` is the one call the CLI and the demo use: a deterministic train /
held-out split of either source (:func:`clawrl.envs.problems.split_problems`).
"""

from __future__ import annotations

import json
from pathlib import Path

from clawrl.envs.errors import DatasetError
from clawrl.envs.numbers import canonical
from clawrl.envs.problems import Problem, ProblemSplit, generate_problems, split_problems

DEFAULT_POOL = 1000
"""Generated problems in the pool the built-in split draws from."""


def parse_gsm8k_answer(answer: str) -> tuple[tuple[str, ...], str]:
    """Split a GSM8K ``answer`` field into its solution lines and its canonical final answer.

    Raises:
        ValueError: no ``#### N`` line, or ``N`` is not a number.
    """
    head, sep, tail = answer.rpartition("####")
    if not sep:
        raise ValueError("answer has no '#### N' line")
    final = tail.strip().split()[0] if tail.strip() else ""
    try:
        value = canonical(final)
    except ValueError as e:
        raise ValueError(f"final answer {final!r} is not a number") from e
    lines = tuple(line.strip() for line in head.strip().splitlines() if line.strip())
    return lines, value


def load_gsm8k(path: str | Path, *, limit: int | None = None) -> list[Problem]:
    """Read a GSM8K-format JSONL file.

    Problem ids are ``gsm8k-{file stem}-{line number}`` (1-based, blank lines counted).

    Args:
        path: the ``.jsonl`` file.
        limit: read at most this many problems.

    Raises:
        DatasetError: the file is missing or unreadable, a line is not a JSON object with
            string ``question`` and ``answer``, or an answer has no numeric ``#### N`` line.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise DatasetError(f"cannot read the file ({e.strerror or e})", path=str(p)) from e
    out: list[Problem] = []
    for n, raw in enumerate(text.splitlines(), 1):
        if limit is not None and len(out) >= limit:
            break
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
        except json.JSONDecodeError as e:
            raise DatasetError(f"not JSON ({e.msg})", path=str(p), line=n) from e
        if not isinstance(record, dict):
            raise DatasetError("not a JSON object", path=str(p), line=n)
        question, answer = record.get("question"), record.get("answer")
        if not isinstance(question, str) or not isinstance(answer, str) or not question.strip():
            raise DatasetError("needs string fields 'question' and 'answer'", path=str(p), line=n)
        try:
            lines, value = parse_gsm8k_answer(answer)
        except ValueError as e:
            raise DatasetError(str(e), path=str(p), line=n) from e
        out.append(
            Problem(
                id=f"gsm8k-{p.stem}-{n}",
                question=question.strip(),
                answer=value,
                solution=lines,
                source=p.name,
            )
        )
    if not out:
        raise DatasetError("no problems in the file", path=str(p))
    return out


def problem_split(
    dataset: str | Path | None = None,
    *,
    held_out: int = 50,
    seed: int = 0,
    train: int | None = None,
    pool: int = DEFAULT_POOL,
) -> ProblemSplit:
    """Train and held-out problems from a GSM8K file or, by default, the built-in generator.

    The same arguments always give the same split, so training (the demo) and evaluation
    (``clawrl eval personalization``) agree on what is held out.

    Args:
        dataset: a GSM8K-format JSONL file; ``None`` for generated problems.
        held_out: distinct questions held out for evaluation.
        seed: the generator seed and the split seed.
        train: keep at most this many training problems.
        pool: how many problems to generate when ``dataset`` is ``None``.

    Raises:
        DatasetError: the file cannot be loaded.
        ValueError: ``held_out`` is not smaller than the number of distinct questions.
    """
    problems = load_gsm8k(dataset) if dataset is not None else generate_problems(pool, seed=seed)
    return split_problems(problems, held_out=held_out, seed=seed, train=train)
