"""Prefix-tree credit on a Claude Code-shaped rollout, through the real gateway app.

The rollout is made of recorded Claude Code traffic (``tests/fixtures/traffic/``): the title
side call of ``claude-title``, then the run of ``claude-subagents`` (a main conversation whose
first answer spawns two subagents, each a conversation with its own system prompt), whose first
call is sent three times: the first attempt fails (the engine errors, 500), the second completes
but the client sends the call again (its answer was lost), the third goes on. All of it goes to
the rollout's URL (``/s/{rollout_id}/v1/messages``) as in harness mode, and the samples harness
mode would train on (:func:`clawrl.harness.samples.rollout_samples`) must: share the retries'
common prefix, train each sampled token once, drop the dead retry leaves with a reason, and keep
the side call out of the loss.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from clawrl.engine.scripted import ScriptedEngine
from clawrl.gateway import create_app
from clawrl.harness.samples import rollout_samples
from clawrl.store import SessionSource, Store, TurnKind, TurnRecord, TurnStatus
from clawrl.testing.traffic import Recording, rule_reply
from clawrl.trajectory import load_tree, training_rows
from clawrl.trajectory.tree import RootReason

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "traffic"
TASK_MARK = "clawrl-rec-task"  # the task text's marker in the recordings (scripts/record_traffic)
ROLLOUT = "rollout-cc"


def _first_call_fails_once(rule_script: list[dict]) -> list[dict]:
    """The recordings' rule for a first call that answers 500 once, before ``rule_script``."""
    fail = {"if": {"last_user_contains": TASK_MARK, "tool_result": False},
            "reply": {"error": "engine"}, "times": 1}  # fmt: skip
    return [fail, *rule_script]


def _claude_code_rollout() -> tuple[list[dict], list[tuple[str, dict, dict, int]]]:
    """The rollout's engine rules and its requests ``(path, headers, body, status)`` in order."""
    title = Recording.load(FIXTURES / "claude-title.json.gz")
    run = Recording.load(FIXTURES / "claude-subagents.json.gz")
    title_rule = next(r for r in title.script if "prompt_contains" in r["if"])
    script = [title_rule, *_first_call_fails_once(run.script)]
    posts = [e for e in sorted(title.exchanges, key=lambda e: e.t) if e.method == "POST"]
    title_call = next(e for e in posts if "naming a coding session" in str(e.body))
    calls = sorted(run.exchanges, key=lambda e: e.t)
    first, rest = calls[0], calls[1:]
    sent = [
        dataclasses.replace(title_call, status=200),
        dataclasses.replace(first, status=500),  # the engine fails: Claude Code retries
        first,  # completes, but the client sends the call again
        first,  # the retry that goes on
        *rest,
    ]
    out = []
    for ex in sent:
        headers = {k: v for k, v in ex.headers.items() if k not in ("content-length", "host")}
        out.append((f"/s/{ROLLOUT}{ex.path}", headers, ex.body, ex.status))
    return script, out


@pytest.fixture
def rollout_store(tokenizer, tmp_path):
    """A store holding the rollout's session, recorded by the real gateway app."""
    script, requests = _claude_code_rollout()
    with Store(tmp_path / "s.db") as store:
        store.get_or_create_session(ROLLOUT, SessionSource.HARNESS, client="harness:claude-code")
        engine = ScriptedEngine(
            tokenizer, reply_fn=rule_reply(tokenizer, script), max_context=1_000_000
        )
        with TestClient(create_app(engine, tokenizer, store, model_name="tiny")) as client:
            for path, headers, body, status in requests:
                response = client.post(path, headers=headers, json=body)
                assert response.status_code == status, (path, response.text[:300])
        store.end_session(ROLLOUT)
        yield store


def _first_prompt_attempts(turns: list[TurnRecord]) -> list[TurnRecord]:
    main = [t for t in turns if t.kind == TurnKind.MAIN and not t.client.get("agent_id")]
    return [t for t in main if t.prompt_ids == main[0].prompt_ids]


def _system(turn: TurnRecord) -> str:
    """The text of a turn's system message(s), as the client sent them."""
    return str([m.get("content") for m in turn.request_messages if m.get("role") == "system"])


def test_samples_of_a_claude_code_rollout_credit_each_sampled_token_once(rollout_store):
    store = rollout_store
    assert store.session_ids() == [ROLLOUT]  # every call, subagents and title included
    turns = store.session_turns(ROLLOUT)
    tree = load_tree(store, ROLLOUT)
    samples, untrained = rollout_samples(store, ROLLOUT, 1.0, 7, {"harness": "claude-code"})
    by_turn = {s.turn_id: s for s in samples}

    # the retries of the first call: siblings (one prefix, one segment), failed, dead, alive
    failed, lost, alive = _first_prompt_attempts(turns)
    assert failed.status == TurnStatus.ERROR and not failed.completion_ids
    assert lost.status == alive.status == TurnStatus.OK
    assert lost.completion_ids == alive.completion_ids  # the same answer, sampled twice
    nodes = [tree.node(t.id) for t in (failed, lost, alive)]
    assert [n.parent_id for n in nodes] == [None, None, None]
    assert [n.root_reason for n in nodes] == [RootReason.FIRST, RootReason.RETRY, RootReason.RETRY]
    assert len({n.segment for n in nodes}) == 1
    assert not tree.node(lost.id).children and tree.node(alive.id).children
    assert tree.node(failed.id).untrainable_reason == "error"
    assert tree.node(lost.id).untrainable_reason == "abandoned_retry"
    assert lost.trainable  # recorded trainable: the tree decides, once it saw the retry

    # the conversation goes on from the retry that went on: its prefix is context, not loss
    (child,) = tree.node(alive.id).children
    assert by_turn[child].prompt_ids[: len(alive.seq_ids)] == alive.seq_ids

    # two subagents: branches of their own (own system prompt), spawned by the live answer
    subagent_roots = [tree.node(r) for r in tree.roots if tree.node(r).turn.client.get("agent_id")]
    assert len(subagent_roots) == 2
    assert {n.root_reason for n in subagent_roots} == {RootReason.SUBAGENT}
    assert len({n.segment for n in subagent_roots} | {nodes[0].segment}) == 3
    assert {n.spawned_by for n in subagent_roots} == {alive.id}
    for root in subagent_roots:  # another system prompt: no common prefix to share
        assert _system(root.turn) != _system(alive) and _system(root.turn)
        assert root.turn.prompt_ids[: len(alive.seq_ids)] != alive.seq_ids

    # the title: a side call, recorded, never a sample, never a token with loss
    (title,) = [t for t in turns if t.kind == TurnKind.SIDE]
    assert title.side_kind == "title" and title.id not in by_turn

    # exactly the live main-kind answers are trained, each once, on its own sampled tokens
    expected = {t.id for t in turns if t.kind == TurnKind.MAIN and t.status == TurnStatus.OK}
    expected -= {lost.id}
    assert len(samples) == len(by_turn) == len(expected) == 7  # 3 main + 2 x 2 subagent calls
    assert set(by_turn) == expected
    for sample in samples:
        turn = store.get_turn(sample.turn_id)
        assert sample.prompt_ids == turn.prompt_ids
        assert sample.completion_ids == turn.completion_ids
        assert sample.sampling_logprobs == turn.sampling_logprobs
        assert (sample.reward, sample.group_id, sample.episode_id) == (1.0, 7, ROLLOUT)
    assert untrained == Counter({"error": 1, "abandoned_retry": 1, "side_call": 1})

    # the same on the token level: every sampled token of a trained turn has loss 1 in exactly
    # one training row; the dead leaves' and the title's tokens never have loss 1
    trained_tokens: Counter[str] = Counter()
    for row in training_rows(tree):
        for mask, index in zip(row.loss_mask, row.token_turn, strict=True):
            if mask:
                trained_tokens[row.turn_ids[index]] += 1
    assert trained_tokens == Counter(
        {turn_id: len(by_turn[turn_id].completion_ids) for turn_id in expected}
    )
