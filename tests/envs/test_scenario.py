"""Scenario files: the built-ins load, a new file works end to end, a malformed one names its field."""

from __future__ import annotations

import asyncio

import pytest

from clawrl.envs import RuleUser, generate_problems, load_scenario, make_user
from clawrl.envs.scenario import BUILTIN, builtin_path
from clawrl.errors import ConfigError

CHEF = """
name = "chef"
description = "a home cook who wants recipes short and in metric units"

[problems]
source = "generated"
held_out = 5

[task]
openings = ["quick one: {question}", "{question} thanks in advance"]

[answer]
max_tokens = 128

[replies]
thanks = ["lovely, thanks", "perfect"]
sign_offs = ["never mind"]

[[checks]]
name = "metric"
kind = "pattern_absent"
patterns = ["\\\\b(?:cups?|ounces?|oz|pounds?|lbs?)\\\\b"]
description = "metric units only"
complaints = ["no {evidence} please, grams", "metric units please, not {evidence}"]

[[checks]]
name = "short"
kind = "max_words"
limit = 12
description = "at most 12 words"
complaints = ["{evidence} words is too long, under {limit} please"]
"""


@pytest.mark.parametrize("name", BUILTIN)
def test_builtin_scenarios_load(name):
    spec = load_scenario(name)
    assert spec.name == name and spec.path == str(builtin_path(name))
    assert len(spec.checks) >= 5 and all(len(c.complaints) >= 10 for c in spec.checks)
    assert spec.answer.max_tokens == 256  # the server's default budget, not a tuned one


def test_a_new_scenario_file_works(tmp_path):
    f = tmp_path / "chef.toml"
    f.write_text(CHEF)
    spec = load_scenario(f)
    user = make_user(f)
    assert isinstance(user, RuleUser) and user.check_names == ("metric", "short")
    task = user.start(generate_problems(1, seed=0)[0])
    assert task.opening.startswith("quick one:") or task.opening.endswith("thanks in advance")
    reply = asyncio.run(user.respond(task, [], "Use 2 cups of flour and 3 oz of butter, then bake "
                                     "it for a long while", turn=0, final=False))  # fmt: skip
    assert not reply.done and set(reply.assessment.failed) == {"metric", "short"}
    assert "cups" in reply.text or "words" in reply.text
    good = asyncio.run(user.respond(task, [], "200 g flour, bake 20 min", turn=1, final=False))
    assert good.done and good.text in spec.replies.thanks


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (lambda t: t.replace('kind = "max_words"\nlimit = 12', 'kind = "max_words"'),
         r"checks\[1\] \(short\)\.limit: Field required"),
        (lambda t: t.replace('kind = "max_words"', 'kind = "max_wordz"'),
         r"checks\[1\] \(short\)\.kind: .*max_wordz"),
        # found by a helper writing a scenario from the docs alone
        (lambda t: t.replace("max_tokens = 128", 'max_tokens = "128"'), r"answer\.max_tokens"),
        (lambda t: t.replace("limit = 12", 'limit = "12"'), r"checks\[1\] \(short\)\.limit"),
        (lambda t: t.replace("metric units please, not {evidence}", "over {limit}"),
         r"checks\[0\] \(metric\)\.complaints: .*\['limit'\].*never fills"),
        (lambda t: t.replace('source = "generated"', 'source = "nope.jsonl"'),
         r"problems\.source: no such file"),
        (lambda t: t.replace('limit = 12', 'limit = 0'), r"checks\[1\] \(short\)\.limit"),
        (lambda t: t.replace('name = "short"', 'name = "metric"'), "unique"),
        (lambda t: t.replace("{evidence} words", "{count} words"), r"unknown slot.*count"),
        (lambda t: t.replace('"quick one: {question}"', '"quick one"'), r"task\.openings.*question"),
        (lambda t: t.replace("[replies]", "[replies]\ncolour = 1"), r"replies\.colour"),
        (lambda t: t.replace('held_out = 5', 'held_out = "five"'), r"problems\.held_out"),
        (lambda t: t.replace("(?:cups?", "((?:cups?"), r"checks\[0\] \(metric\)\.patterns"),
        (lambda t: t.replace('kind = "pattern_absent"\n', ""), r"checks\[0\] \(metric\)\.kind"),
    ],
)  # fmt: skip
def test_a_malformed_scenario_names_the_field(tmp_path, edit, needle):
    f = tmp_path / "bad.toml"
    f.write_text(edit(CHEF))
    with pytest.raises(ConfigError, match=needle) as err:
        load_scenario(f)
    assert str(f) in str(err.value)


def test_a_problems_file_must_leave_problems_to_train_on(tmp_path):
    rows = [f'{{"question": "What is {i} + 1?", "answer": "#### {i + 1}"}}' for i in range(4)]
    (tmp_path / "p.jsonl").write_text("\n".join(rows) + "\n")
    f = tmp_path / "s.toml"
    f.write_text(CHEF.replace('source = "generated"', 'source = "p.jsonl"'))
    with pytest.raises(ConfigError, match=r"problems\.held_out: 5 held out, but p\.jsonl has 4"):
        load_scenario(f)
    f.write_text(CHEF.replace('source = "generated"', 'source = "p.jsonl"').replace(
        "held_out = 5", "held_out = 2"))  # fmt: skip
    assert load_scenario(f).dataset() == str(tmp_path / "p.jsonl")


def test_missing_and_not_toml(tmp_path):
    with pytest.raises(ConfigError, match="no scenario"):
        load_scenario(tmp_path / "nope.toml")
    (tmp_path / "x.toml").write_text("name = [")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_scenario(tmp_path / "x.toml")


def test_the_parent_example_is_a_user_whose_wishes_differ_from_the_students():
    """The built-in ``parent`` scenario (the memory measurement's second user) loads, and an
    answer the parent fully accepts fails the student's rubric and the reverse."""
    import asyncio

    from clawrl.envs import load_scenario, make_user, problem_split

    parent_spec, student_spec = load_scenario("parent"), load_scenario("student")
    parent, student = (
        make_user(parent_spec, "rule", seed=0),
        make_user(student_spec, "rule", seed=0),
    )
    problem = problem_split(parent_spec.dataset(), held_out=4, seed=0).held_out[0]
    steps = (
        "1. Each day: 13 x 2 = 26 dollars.\n2. Over 4 days: 26 x 4 = 104 dollars.\n"
        "3. Left: 104 - 10 = 94.\nAnswer: 94"
    )
    casual = "94 bucks. he makes 26 a day, so 104, minus the 10 he spends."
    assert parent.evaluate(parent.start(problem), steps).failed == ()
    assert student.evaluate(student.start(problem), casual).failed == ()
    assert parent.evaluate(parent.start(problem), casual).failed
    assert student.evaluate(student.start(problem), steps).failed
    reply = asyncio.run(parent.respond(parent.start(problem), [], "**Great!** 94", turn=0,
                                       final=False))  # fmt: skip
    assert not reply.done and "exclamation" in reply.text.lower()
