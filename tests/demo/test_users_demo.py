"""``clawrl demo --users 2`` on the tiny model with a scripted judge: both arms run end to end
through one gateway with a key per user; the per-user arm trains one adapter per user on that
user's turns only, the shared arm one policy on both; each user is evaluated with their own
key, problems and rubric, and the report has both arms with intervals."""

from __future__ import annotations

import json

import pytest

from clawrl.config import load_config
from clawrl.demo import DemoSettings
from clawrl.demo.users import run_users, user_keys, users_table, write_users_report
from clawrl.envs import load_scenario
from clawrl.models import tiny_policy
from clawrl.runtime import JudgeBundle
from clawrl.store import Store

from .test_fixed_schedule import judge_by_length


@pytest.mark.timeout(900)
def test_both_arms_train_and_evaluate_each_user_through_one_gateway(tmp_path):
    specs = [load_scenario("student"), load_scenario("parent")]
    settings = DemoSettings(
        scenario="student", methods=("combine",), seeds=(1,), steps=2, eval_steps=(0, 2),
        batch_size=2, eval_problems=4, max_tokens=8, concurrency=4, max_turns=2,
        temperature=1.0, out_dir=str(tmp_path),
    )  # fmt: skip
    cfg = load_config(None, ["trainer.lr=1e-2"])
    judge = JudgeBundle(judge_by_length, description="scripted x1")
    runs = [run_users(arm, settings, cfg, specs, seed=1, judge=judge,
                      policy=tiny_policy(seed=0, max_context=1024))
            for arm in ("per-user", "shared")]  # fmt: skip
    per_user, shared = runs
    assert per_user.steps_done == shared.steps_done == 4 and not per_user.note
    for run in runs:
        assert [r.method for r in run.users] == [f"{run.arm}:student", f"{run.arm}:parent"]
        for r in run.users:
            assert sorted(r.evaluations) == [0, 2] and len(r.evaluations[2].scores) == 4
            assert r.sessions > 0 and r.failed_sessions == 0
    assert [r.steps_done for r in per_user.users] == [2, 2]  # each user's own adapter
    assert [r.evaluations[2].version for r in per_user.users] == [2, 2]
    with Store(tmp_path / "runs" / "users-per-user-seed1" / "store.db") as store:
        assert {u.user_id for u in store.users()} == {"student", "parent"}  # from the keys
        assert store.latest_policy_version() is None  # nothing trained into a shared policy
        for user in ("student", "parent"):
            trained = [t for s in store.list_sessions(user=user)
                       for t in store.session_turns(s.session.id)
                       if (x := store.get_sample(t.id)) is not None and x.status == "trained"]  # fmt: skip
            assert trained and {t.user_id for t in trained} == {user}
    with Store(tmp_path / "runs" / "users-shared-seed1" / "store.db") as store:
        assert store.latest_policy_version().version == 4 and store.latest_user_adapters() == {}
    report = write_users_report(runs, settings, 60.0)
    text = report.read_text()
    assert "| student | per-user |" in text and "| parent | shared |" in text
    assert "Per-user minus shared at 2 steps" in text
    assert json.loads((tmp_path / "results.json").read_text())[0]["arm"] == "per-user"
    assert "gain at 2" in users_table(runs, [0, 2])
    assert len(set(user_keys(specs))) == 2
