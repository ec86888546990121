"""The GSM8K-format loader (a file written here, and the real copy when present)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clawrl.envs import DatasetError, load_gsm8k, make_worked_solution, problem_split
from clawrl.envs.data import parse_gsm8k_answer

# the shared data sets sit beside the repository (``../shared/data``), wherever it is cloned
REAL = Path(__file__).resolve().parents[3] / "shared" / "data" / "gsm8k"

RECORDS = [
    {
        "question": "Natalia sold clips to 48 of her friends in April, and then she sold half as "
        "many clips in May. How many clips did Natalia sell altogether in April and May?",
        "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
        "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72",
    },
    {
        "question": "A shop sells 1,000 pens a day for $1.50 each. How much money is that?",
        "answer": "1000*1.5 = <<1000*1.5=1500>>1500\n#### 1,500",
        "extra": "ignored",
    },
]


def _write(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "mini.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_loads_questions_answers_and_solution_lines(tmp_path):
    path = _write(tmp_path, [json.dumps(RECORDS[0]), "", json.dumps(RECORDS[1])])
    a, b = load_gsm8k(path)
    assert a.id == "gsm8k-mini-1" and b.id == "gsm8k-mini-3"
    assert a.answer == "72" and b.answer == "1500"
    assert a.solution == (
        "Natalia sold 48/2 = <<48/2=24>>24 clips in May.",
        "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.",
    )
    assert a.source == "mini.jsonl" and a.template is None
    assert load_gsm8k(path, limit=1) == [a]
    w = make_worked_solution(a, flaw_rate=1.0)
    assert w.flaw is not None and w.answer != "72"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "not JSON"),
        ("[1, 2]", "not a JSON object"),
        ('{"question": "q"}', "needs string fields"),
        ('{"question": "q", "answer": "no marker"}', "no '#### N' line"),
        ('{"question": "q", "answer": "x\\n#### many"}', "is not a number"),
    ],
)
def test_bad_lines_name_the_file_and_line(tmp_path, line, message):
    path = _write(tmp_path, [json.dumps(RECORDS[0]), line])
    with pytest.raises(DatasetError, match=message) as info:
        load_gsm8k(path)
    assert info.value.line == 2 and str(info.value).startswith(f"{path}:2: ")


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(DatasetError, match="cannot read"):
        load_gsm8k(tmp_path / "absent.jsonl")
    with pytest.raises(DatasetError, match="no problems"):
        load_gsm8k(_write(tmp_path, [""]))


def test_parse_answer_variants():
    assert parse_gsm8k_answer("a\nb\n#### -3.50") == (("a", "b"), "-3.5")
    assert parse_gsm8k_answer("#### 10 apples")[1] == "10"


def test_problem_split_from_a_file_and_from_the_generator(tmp_path):
    lines = [
        json.dumps({"question": f"What is {i} plus {i}?", "answer": f"#### {2 * i}"})
        for i in range(30)
    ]
    path = _write(tmp_path, lines)
    s = problem_split(path, held_out=10, seed=1)
    assert len(s.held_out) == 10 and len(s.train) == 20
    assert s == problem_split(path, held_out=10, seed=1)
    g = problem_split(held_out=50, seed=0, pool=200)
    assert len(g.held_out) == 50 and len(g.train) == 150
    assert all(p.source == "generated" for p in g.train)


@pytest.mark.skipif(not (REAL / "test.jsonl").exists(), reason="no GSM8K copy at " + str(REAL))
def test_real_gsm8k_files_load_and_take_slips():
    test = load_gsm8k(REAL / "test.jsonl")
    assert len(test) == 1319
    assert test[0].answer == "18" and test[0].question.startswith("Janet")
    works = [make_worked_solution(p, flaw_rate=1.0) for p in test[:300]]
    flawed = [w for w in works if w.flaw is not None]
    assert len(flawed) > 240
    assert all(w.answer != w.problem.answer for w in flawed)
    assert len(load_gsm8k(REAL / "train.jsonl", limit=200)) == 200
    s = problem_split(REAL / "test.jsonl", held_out=50)
    assert len(s.held_out) == 50 and len(s.train) == 1319 - 50
    assert not {p.question for p in s.held_out} & {p.question for p in s.train}
