"""The task format and the built-in suite: valid, split, shipped as generated, solvable."""

from __future__ import annotations

import filecmp
import os

import pytest

from clawrl.errors import ConfigError
from clawrl.harness.sandbox import Sandbox, choose_isolation
from clawrl.harness.suite import write_suite
from clawrl.harness.tasks import BUILTIN_TASKS, load_task, load_tasks
from clawrl.harness.verify import run_verifier


def test_builtin_suite_is_large_and_split():
    tasks = load_tasks("builtin")
    assert len(tasks) >= 40
    heldout = load_tasks("builtin", split="heldout")
    train = load_tasks("builtin", split="train")
    assert len(heldout) >= 10 and len(train) >= 30
    assert not {t.id for t in heldout} & {t.id for t in train}


def test_shipped_suite_equals_the_generator(tmp_path):
    ids = write_suite(tmp_path)
    assert sorted(ids) == sorted(p.name for p in BUILTIN_TASKS.iterdir() if p.is_dir())
    for task_id in ids:
        made = {p.relative_to(tmp_path / task_id): p for p in (tmp_path / task_id).rglob("*")
                if p.is_file()}  # fmt: skip
        shipped = {p.relative_to(BUILTIN_TASKS / task_id): p
                   for p in (BUILTIN_TASKS / task_id).rglob("*") if p.is_file()}  # fmt: skip
        assert made.keys() == shipped.keys(), task_id  # every file, files/ included
        for rel, path in made.items():
            assert filecmp.cmp(path, shipped[rel], shallow=False), f"{task_id}/{rel}"
        assert os.access(BUILTIN_TASKS / task_id / "verify", os.X_OK)


# One correct command per task kind (the reference agent's kind of answer).
COMMANDS = {
    "create-file-1": "echo apple > note.txt",
    "write-number-2": "echo 100 > answer.txt",
    "count-lines-3": "wc -l < data.txt > count.txt",
    "make-dir-1": "mkdir logs data",
    "copy-file-2": "cp main.txt main.bak",
    "rename-file-0": "mv old.txt new.txt",
    "delete-file-3": "rm cache.dat error.log",
    "replace-word-2": "sed -i 's/world/friend/' greeting.txt",
    # variants 8-13 (held out, added later)
    "create-file-9": "echo cloud > sky.txt",
    "write-number-13": "echo 8080 > port.txt",
    "count-lines-13": "wc -l < data.txt > count.txt",
    "make-dir-8": "mkdir lib bin",
    "copy-file-13": "cp plan.txt plan.bak",
    "rename-file-11": "mv m.txt n.txt",
    "delete-file-10": "rm foo.tmp bar.tmp",
    "replace-word-12": "sed -i 's/world/everyone/' greeting.txt",
}


@pytest.mark.parametrize("task_id", sorted(COMMANDS))
def test_each_kind_is_solvable_and_unsolved_scores_below_one(task_id):
    task = load_task(BUILTIN_TASKS / task_id)
    with Sandbox.create(choose_isolation(), files=task.files) as box:
        assert run_verifier(task, box).reward < 1.0
        r = box.run(["sh", "-c", COMMANDS[task_id]], gateway=False)
        assert r.returncode == 0, r.stderr
        assert run_verifier(task, box).reward == 1.0


@pytest.mark.parametrize(
    ("task_id", "command", "reward"),
    [("delete-file-0", "rm junk.txt", 0.5), ("delete-file-0", "rm *", 0.0),
     ("make-dir-0", "mkdir build", 0.5), ("count-lines-0", "wc -l data.txt > count.txt", 1.0),
     ("copy-file-0", "mv source.txt copy.txt", 0.5)],
)  # fmt: skip
def test_partial_and_wrong_answers_score_below_one(task_id, command, reward):
    task = load_task(BUILTIN_TASKS / task_id)
    with Sandbox.create(choose_isolation(), files=task.files) as box:
        box.run(["sh", "-c", command], gateway=False)
        assert run_verifier(task, box).reward == reward


def test_every_family_has_held_out_and_train_variants():
    from clawrl.harness.passk import task_family

    tasks = load_tasks("builtin")
    for family in {task_family(t.id) for t in tasks}:
        splits = [t.split for t in tasks if task_family(t.id) == family]
        assert splits.count("heldout") == 8 and splits.count("train") == 6, family
        train = sorted(int(t.id.rsplit("-", 1)[1]) for t in tasks
                       if task_family(t.id) == family and t.split == "train")  # fmt: skip
        assert train == [2, 3, 4, 5, 6, 7], family  # the first runs' training tasks, unchanged


def test_invalid_tasks_are_config_errors(tmp_path):
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "task.toml").write_text('instruction = "x"\n')
    with pytest.raises(ConfigError, match="verify"):
        load_task(tmp_path / "t")
    (tmp_path / "t" / "task.toml").write_text('split = "train"\n')
    with pytest.raises(ConfigError, match="instruction"):
        load_task(tmp_path / "t")
