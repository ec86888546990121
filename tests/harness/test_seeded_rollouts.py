"""Harness runs sample with seeds: one seed, the same rollouts; another seed, others."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from clawrl.cli import main


def _rollout_calls(out: Path) -> list[tuple[int, list[int], list[int], int]]:
    """(session seed, prompt ids, completion ids, call seed) of every call of a run."""
    db = sqlite3.connect(out / "store.db")
    rows = []
    for meta, prompt, completion, params in db.execute(
        "SELECT s.metadata, t.prompt_ids, t.completion_ids, t.sampling_params "
        "FROM turns t JOIN sessions s ON s.id = t.session_id"
    ):
        rows.append((json.loads(meta)["sampling_seed"], prompt, completion,
                     json.loads(params)["seed"]))  # fmt: skip
    db.close()
    return sorted(rows, key=lambda r: (r[0], r[1]))


@pytest.mark.timeout(600)
def test_one_seed_samples_the_same_rollouts(tmp_path, capsys):
    args = ["harness", "train", "--model", "tiny", "--steps", "1", "--group-size", "2",
            "--tasks-per-step", "2", "--isolation", "fallback", "--max-steps", "2"]  # fmt: skip
    runs = {}
    for name, seed in (("a", "0"), ("b", "0"), ("c", "1")):
        assert main([*args, "--seed", seed, "--out", str(tmp_path / name)]) == 0
        runs[name] = _rollout_calls(tmp_path / name)
    a, b, c = runs["a"], runs["b"], runs["c"]
    assert len(a) >= 4 and len({r[0] for r in a}) == 4  # 2 tasks x 2 members, 4 seeds
    assert all(r[3] is not None for r in a)  # every call sampled with a seed
    assert a == b  # same seeds, prompts and sampled ids
    assert {r[0] for r in a}.isdisjoint({r[0] for r in c})
    assert [r[2] for r in a] != [r[2] for r in c]
