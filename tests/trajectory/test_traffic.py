"""Recorded traffic from seven real harnesses, replayed through the gateway (issue 22).

Each fixture in ``tests/fixtures/traffic/`` is what one harness run sent (recorded by
``scripts/record_traffic.py`` against the gateway on a scripted engine, scrubbed of paths and
host names). The replay sends the same requests, in the order they started, to a fresh gateway
whose scripted engine answers by the same rules, and checks what clawrl made of them: the number
of sessions, the tree (retries as siblings, subagents as linked branches of their own), the
next states, and that no side-call token is ever trained.

Per harness, what the run really was (``REAL``): one session each. The table below also states
the tree's shape for the scenarios where it matters.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from starlette.testclient import TestClient

from clawrl.engine.scripted import ScriptedEngine
from clawrl.gateway import create_app
from clawrl.store import Store, TurnKind, TurnStatus
from clawrl.store.chains import MIN_SHARED_IDS
from clawrl.testing.traffic import Recording, replay, rule_reply
from clawrl.trajectory import load_tree, training_rows
from clawrl.trajectory.next_state import NextStateRole, next_state
from clawrl.trajectory.tree import RootReason

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "traffic"
RECORDINGS = sorted(FIXTURES.glob("*.json.gz"))

# key -> (real sessions, side kinds expected, attribution prefix of the main turns)
REAL: dict[str, tuple[int, set[str], str]] = {
    "aider-commit": (1, {"commit_message"}, "inferred"),
    "claude-compact": (1, {"compaction"}, "header:x-claude-code-session-id"),
    "claude-continue": (1, set(), "header:x-claude-code-session-id"),
    "claude-parallel": (1, set(), "header:x-claude-code-session-id"),
    "claude-retry": (1, set(), "header:x-claude-code-session-id"),
    "claude-subagents": (1, set(), "header:x-claude-code-session-id"),
    "claude-title": (1, {"title"}, "header:x-claude-code-session-id"),
    "codex-compact": (1, {"compaction"}, "header:session-id"),
    "codex-resume": (1, set(), "header:session-id"),
    "codex-retry": (1, set(), "header:session-id"),
    "mini-format-error": (1, set(), "inferred"),
    "openclaw-retry": (1, set(), "body:openclaw_runtime"),
    "openclaw-session": (1, set(), "body:openclaw_runtime"),
    "opencode-plain": (1, {"title"}, "header:x-session-id"),
    "qwen-continue": (1, {"memory"}, "inferred"),
}


def test_every_recording_is_listed():
    """A fixture added without its expectation here would be replayed unchecked."""
    assert RECORDINGS, f"no recordings in {FIXTURES}"
    assert {p.name.removesuffix(".json.gz") for p in RECORDINGS} == set(REAL)


class Replayed:
    def __init__(self, store: Store, rec: Recording, statuses: list[int]) -> None:
        self.store, self.rec, self.statuses = store, rec, statuses
        self.sessions = store.session_ids()
        self.turns = [t for s in self.sessions for t in store.session_turns(s)]

    def tree(self, session_id: str | None = None):
        return load_tree(self.store, session_id or self.sessions[0])


@pytest.fixture
def replayed(tokenizer, tmp_path):
    stores: list[Store] = []

    def run(key: str) -> Replayed:
        rec = Recording.load(FIXTURES / f"{key}.json.gz")
        store = Store(tmp_path / f"{key}.db")
        stores.append(store)
        engine = ScriptedEngine(
            tokenizer, reply_fn=rule_reply(tokenizer, rec.script), max_context=1_000_000
        )
        with TestClient(create_app(engine, tokenizer, store, model_name="tiny")) as client:
            result = replay(client, rec)
        assert result.statuses == result.recorded_statuses, (key, result)
        return Replayed(store, rec, result.statuses)

    yield run
    for store in stores:
        store.close()


@pytest.mark.parametrize("key", sorted(REAL))
def test_replay_forms_the_real_sessions(replayed, key):
    real, side_kinds, attribution = REAL[key]
    r = replayed(key)
    assert len(r.sessions) == real, [
        (t.session_id[:8], t.kind.value, t.client.get("attribution")) for t in r.turns
    ]
    main = [t for t in r.turns if t.kind == TurnKind.MAIN]
    assert main and all(t.client["attribution"].startswith(attribution) for t in main)
    assert {t.side_kind for t in r.turns if t.kind == TurnKind.SIDE} == side_kinds
    for sid in r.sessions:
        tree = r.tree(sid)
        # retries are siblings: main turns of one agent with identical prompts share a parent
        parents: dict[tuple[str, tuple[int, ...]], set[str | None]] = {}
        for n in tree.nodes.values():
            if n.turn.kind == TurnKind.MAIN:
                key_ = (n.turn.client.get("agent_id", ""), tuple(n.turn.prompt_ids))
                parents.setdefault(key_, set()).add(n.parent_id)
        assert all(len(p) == 1 for p in parents.values()), "a retry is not a sibling"
        # side calls are data, never loss, never a next state
        for n in tree.nodes.values():
            if n.turn.kind == TurnKind.SIDE:
                assert not n.turn.trainable and n.turn.untrainable_reason == "side_call"
                assert n.untrainable_reason == "side_call"
        for n in tree.nodes.values():
            state = next_state(tree, n.id)
            if state is not None and state.child_turn_id is not None:
                assert tree.node(state.child_turn_id).turn.kind == TurnKind.MAIN
        side_ids = {n.id for n in tree.nodes.values() if n.turn.kind == TurnKind.SIDE}
        for row in training_rows(tree):
            for index, turn_id in enumerate(row.turn_ids):
                if turn_id in side_ids:
                    owned = [
                        m for m, t in zip(row.loss_mask, row.token_turn, strict=True) if t == index
                    ]
                    assert not any(owned), f"side-call token with loss mask 1 in {key}"


# aider edits files as text (no tool calls); in codex-compact Codex compacts between the tool
# call and its result, so the result arrives in a compacted prompt: a new segment, by design
NO_TOOL_NEXT_STATE = {"aider-commit", "codex-compact"}


@pytest.mark.parametrize("key", sorted(set(REAL) - NO_TOOL_NEXT_STATE))
def test_the_tool_call_has_the_tool_output_as_next_state(replayed, key):
    r = replayed(key)
    calls = [
        t
        for t in r.turns
        if t.kind == TurnKind.MAIN and t.status == TurnStatus.OK and t.output["tool_calls"]
    ]
    followed = 0
    for call in calls:
        tree = r.tree(call.session_id)
        if tree.next_child(call.id) is None:
            continue  # the harness's last call (mini's submit command): nothing came after it
        state = next_state(tree, call.id)
        assert state is not None and state.role == NextStateRole.TOOL, (key, state)
        assert state.ids
        followed += 1
    assert followed >= 1, key


def test_claude_subagents_are_linked_distinct_branches(replayed):
    r = replayed("claude-subagents")
    tree = r.tree()
    spawner = next(
        n.turn
        for n in tree.nodes.values()
        if any(c["name"] == "Agent" for c in (n.turn.output or {}).get("tool_calls", []))
    )
    subagent_roots = [tree.node(i) for i in tree.roots if tree.node(i).turn.client.get("agent_id")]
    assert len(subagent_roots) == 2
    # identical first prompts, two agents: two branches, never retries of each other
    assert subagent_roots[0].turn.prompt_ids == subagent_roots[1].turn.prompt_ids
    assert {n.root_reason for n in subagent_roots} == {RootReason.SUBAGENT}
    assert len({n.segment for n in subagent_roots}) == 2
    for root in subagent_roots:
        assert root.spawned_by == spawner.id
        assert root.turn.client["spawn_link"] == "tool_call_prompt"
        # each agent's second call continues its own first call
        (child,) = root.children
        assert tree.node(child).turn.client["agent_id"] == root.turn.client["agent_id"]


def test_codex_answers_are_not_cut_at_the_default_budget(replayed):
    r = replayed("codex-resume")
    assert all(t.sampling_params["max_tokens"] > 256 for t in r.turns)


def test_claude_preflight_is_answered(replayed):
    r = replayed("claude-title")
    heads = [e for e in r.rec.exchanges if e.method == "HEAD"]
    assert heads and heads[0].path == "/api/hello"
    assert r.statuses[0] == 200
    (title,) = [t for t in r.turns if t.side_kind == "title"]
    formats = [
        e.body["output_config"]["format"]
        for e in r.rec.exchanges
        if isinstance(e.body, dict) and "format" in (e.body.get("output_config") or {})
    ]
    assert len(formats) == 1 and formats[0]["schema"]["required"] == ["title"]
    assert title.session_id == r.sessions[0]


@pytest.mark.parametrize("key", sorted(REAL))
def test_every_turn_rebuilds_id_for_id_from_its_stored_delta(tokenizer, tmp_path, key):
    """Prompts are stored as deltas of the turn they extend (issue 21): each turn read back (by
    a fresh store, nothing remembered) has exactly the ids the engine received, and every turn
    whose parent's ``prompt + completion`` starts its prompt was stored as that delta."""
    rec = Recording.load(FIXTURES / f"{key}.json.gz")
    received: set[tuple[int, ...]] = set()
    reply = rule_reply(tokenizer, rec.script)

    def recording_reply(prompt_ids, params):
        received.add(tuple(prompt_ids))
        return reply(prompt_ids, params)

    path = tmp_path / f"{key}.db"
    with Store(path) as store:
        engine = ScriptedEngine(tokenizer, reply_fn=recording_reply, max_context=1_000_000)
        with TestClient(create_app(engine, tokenizer, store, model_name="tiny")) as client:
            replay(client, rec)
    with Store(path) as store:
        turns = {t.id: t for sid in store.session_ids() for t in store.session_turns(sid)}
        with store._read() as conn:
            rows = {
                r["id"]: r
                for r in conn.execute(
                    "SELECT id, prefix_turn_id, prefix_len, length(prompt_ids) AS stored FROM turns"
                )
            }
    assert turns and set(turns) == set(rows)
    deltas = whole = stored = 0
    for turn in turns.values():
        if turn.completion_ids:  # it reached the engine
            assert tuple(turn.prompt_ids) in received, f"turn {turn.id} does not rebuild"
        row = rows[turn.id]
        parent = turns.get(turn.parent_turn_id or "")
        extends = parent is not None and parent.seq_ids and (
            turn.prompt_ids[: len(parent.seq_ids)] == parent.seq_ids
        )  # fmt: skip
        shared = 0
        if parent is not None:
            shared = next(
                (
                    i
                    for i, (a, b) in enumerate(zip(parent.seq_ids, turn.prompt_ids, strict=False))
                    if a != b
                ),
                min(len(parent.seq_ids), len(turn.prompt_ids)),
            )
        if extends or shared >= MIN_SHARED_IDS:
            assert parent is not None and row["prefix_turn_id"] == parent.id
            assert row["prefix_len"] == (len(parent.seq_ids) if extends else shared)
            deltas += 1
        else:
            assert row["prefix_len"] == 0
        assert row["stored"] == 4 * (len(turn.prompt_ids) - row["prefix_len"])
        whole += 4 * len(turn.prompt_ids)
        stored += row["stored"]
    if deltas:
        assert stored < whole, (key, deltas, stored, whole)
    if key in ("claude-continue", "openclaw-session", "qwen-continue"):  # multi-call sessions
        assert deltas >= 2, (key, deltas)
