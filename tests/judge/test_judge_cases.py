"""The shipped labeled set: loads, is large and varied enough, labels agree with categories."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from clawrl.errors import JudgeError
from clawrl.judge import CaseCategory, NextStateRole, Score, default_cases_path, load_cases

EXPECTED = {
    CaseCategory.PRAISE: Score.GOOD,
    CaseCategory.NEUTRAL: Score.NEUTRAL,
    CaseCategory.REDO: Score.BAD,
    CaseCategory.COMPLAINT: Score.BAD,
    CaseCategory.CORRECTION: Score.BAD,
    CaseCategory.TOOL_SUCCESS: Score.GOOD,
    CaseCategory.TOOL_ERROR: Score.BAD,
    CaseCategory.TOOL_EMPTY: Score.NEUTRAL,
    CaseCategory.TEST_PASS: Score.GOOD,
    CaseCategory.TEST_FAIL: Score.BAD,
}


@pytest.fixture(scope="module")
def cases():
    return load_cases()


def test_shipped_set_is_packaged_and_large(cases):
    assert default_cases_path().parent.name == "data"
    assert default_cases_path().name.endswith(".jsonl")  # matches the data/*.jsonl package glob
    assert len(cases) >= 80
    per = Counter(c.category for c in cases)
    assert set(per) == set(CaseCategory)
    assert min(per.values()) >= 5


def test_labels_agree_with_categories(cases):
    for c in cases:
        assert c.expected_score == EXPECTED[c.category], c.id
        assert c.id.startswith(c.category.value + "-"), c.id
    assert all(c.has_hint for c in cases if c.category == CaseCategory.CORRECTION)
    assert not any(
        c.has_hint for c in cases if c.category in (CaseCategory.REDO, CaseCategory.NEUTRAL)
    )
    assert sum(c.has_hint for c in cases) >= 10
    assert all(c.reference_hint for c in cases if c.has_hint)


def test_next_state_roles(cases):
    roles = {c.category: {c2.input.next_state.role for c2 in cases if c2.category == c.category}
             for c in cases}  # fmt: skip
    for cat in (CaseCategory.PRAISE, CaseCategory.NEUTRAL, CaseCategory.REDO,
                CaseCategory.COMPLAINT, CaseCategory.CORRECTION):  # fmt: skip
        assert roles[cat] == {NextStateRole.USER}
    assert roles[CaseCategory.TOOL_ERROR] == {NextStateRole.TOOL}
    assert all(c.input.next_state.text.strip() in ("", "[]", '{"results": []}',
                                                    "No results found.")
               for c in cases if c.category == CaseCategory.TOOL_EMPTY)  # fmt: skip
    assert NextStateRole.ENVIRONMENT in roles[CaseCategory.TEST_PASS]


def test_phrasing_is_varied(cases):
    for cat in CaseCategory:
        texts = [c.input.next_state.text for c in cases if c.category == cat]
        if cat != CaseCategory.TOOL_EMPTY:
            assert len(set(texts)) == len(texts), cat


def test_bad_file_names_the_line(tmp_path, cases):
    p = tmp_path / "cases.jsonl"
    good = cases[0].model_dump_json()
    p.write_text(good + "\n\n" + json.dumps({"id": "x"}) + "\n")
    with pytest.raises(JudgeError, match="line 3"):
        load_cases(p)
    p.write_text(good + "\n" + good + "\n")
    with pytest.raises(JudgeError, match="duplicate"):
        load_cases(p)
    with pytest.raises(JudgeError, match="cannot read"):
        load_cases(tmp_path / "missing.jsonl")


@pytest.mark.parametrize(
    ("which", "sha_file", "at_least"),
    [("first", "judge_blind_cases.sha256", 150), ("second", "judge_blind_b_cases.sha256", 240)],
)
def test_the_blind_sets_are_frozen(which, sha_file, at_least):
    """Each blind set is the one frozen before it was used: the first before the trained judge
    existed, the second before any judge was scored on it."""
    import hashlib

    from clawrl.judge import cases as judge_cases

    path, expected = {
        "first": (judge_cases.blind_cases_path(), judge_cases.BLIND_SHA256),
        "second": (judge_cases.blind_b_cases_path(), judge_cases.BLIND_B_SHA256),
    }[which]
    assert hashlib.sha256(path.read_bytes()).hexdigest() == expected
    recorded = (path.parent / sha_file).read_text().split()[0]
    assert recorded == expected
    cases = load_cases(path)
    assert len(cases) >= at_least and len({c.category for c in cases}) == 10
