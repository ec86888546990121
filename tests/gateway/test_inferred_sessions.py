"""Sessions without ids (issue 22): fuzzy continuation, never merging unrelated clients.

The rules are :func:`clawrl.gateway.attribution.link_call`'s: an exact prefix, a retry (only of
a failed call or one the client marks a retry), a history that echoes recorded answers, a
prompt that repeats an earlier one with its answer dropped, and a side call joining its
client's latest session; plus OpenClaw's ``Runtime: ... sessionId=`` line.
"""

from __future__ import annotations

import threading

import httpx
import openai
import pytest

from clawrl.errors import EngineError
from clawrl.store import SessionSource
from clawrl.trajectory import load_tree

SYSTEM = {"role": "system", "content": "You are a coding agent. Use the tools you are given."}
TASK = {"role": "user", "content": "Fix the failing test in calc.py, please."}
LONG = (
    "I looked at calc.py: the add function subtracts its second argument instead of adding "
    "it, so the test that checks add(2, 3) == 5 fails. I changed the minus to a plus."
)


def _chat(served, messages, headers=None, api_key="test-key"):
    client = served.client(api_key=api_key)
    return client.chat.completions.create(
        model="tiny", messages=messages, extra_headers=headers or {}
    )


def _sessions(served):
    return served.store.session_ids()


def test_two_unrelated_clients_with_the_same_first_prompt_stay_apart(scripted_server):
    """Concurrent, and then one after the other: the same first prompt from two clients is
    two sessions, and each client's continuation (its own answer echoed back) stays in its
    own session."""
    served = scripted_server([f"{LONG} (reply {i})" for i in range(8)], token_delay_s=0.002)
    answers: dict[str, str] = {}

    def client(name: str) -> None:
        answers[name] = _chat(served, [SYSTEM, TASK]).choices[0].message.content

    threads = [threading.Thread(target=client, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(_sessions(served)) == 2
    client("c")  # a third client, after both answered: still not a retry of either
    assert len(_sessions(served)) == 3
    for name in ("a", "b", "c"):
        follow = {"role": "user", "content": f"Thanks ({name}). Now run the tests."}
        _chat(served, [SYSTEM, TASK, {"role": "assistant", "content": answers[name]}, follow])
    assert len(_sessions(served)) == 3
    for sid in _sessions(served):
        turns = served.store.session_turns(sid)
        assert len(turns) == 2, [t.client["attribution"] for t in turns]
        assert turns[1].client["attribution"] == "inferred:prefix"
        assert turns[1].parent_turn_id == turns[0].id
    firsts = [served.store.session_turns(sid)[0] for sid in _sessions(served)]
    (third,) = [t for t in firsts if t.completion_ids and "(reply 2)" in t.output["content"]]
    earlier = {t.id for t in firsts if t.id != third.id}
    assert third.client["attribution_evidence"]["same_prompt_as"] in earlier


def test_many_clients_with_the_same_first_prompt_never_merge(scripted_server):
    """Parallel rollouts, repeated evaluation prompts: seven calls with the same prompt, from
    seven keys and then seven more from one key, are fourteen sessions."""
    served = scripted_server([f"{LONG} (reply {i})" for i in range(14)])
    for i in range(7):
        _chat(served, [SYSTEM, TASK], api_key=f"key-{i}")
    for _ in range(7):
        _chat(served, [SYSTEM, TASK])
    assert len(_sessions(served)) == 14
    turns = [t for sid in _sessions(served) for t in served.store.session_turns(sid)]
    assert {t.client["attribution"] for t in turns} == {"inferred:new"}


def test_another_clients_failed_call_is_not_retried(scripted_server):
    served = scripted_server([EngineError("upstream down"), "Bob's answer."])
    with pytest.raises(openai.InternalServerError):
        served.client(api_key="alice").chat.completions.create(
            model="tiny", messages=[SYSTEM, TASK]
        )
    _chat(served, [SYSTEM, TASK], api_key="bob")
    assert len(_sessions(served)) == 2


def test_a_marked_retry_after_success_is_a_sibling(scripted_server):
    served = scripted_server(["First answer.", "Second answer."])
    _chat(served, [SYSTEM, TASK])
    _chat(served, [SYSTEM, TASK], headers={"x-stainless-retry-count": "1"})
    (sid,) = _sessions(served)
    first, retry = served.store.session_turns(sid)
    assert retry.client["attribution"] == "inferred:retry"
    tree = load_tree(served.store, sid)
    assert tree.node(retry.id).segment == tree.node(first.id).segment


def test_a_retry_of_a_failed_call_joins_it(scripted_server):
    """The SDK's own retry (``x-stainless-retry-count: 1``) after a 500 is a sibling of the failed
    call; a client that sends no count is believed when the earlier call failed."""
    served = scripted_server([EngineError("upstream down"), "Now it works."])
    client = openai.OpenAI(base_url=served.server.base_url, api_key="k", max_retries=1)
    client.chat.completions.create(model="tiny", messages=[SYSTEM, TASK])
    (sid,) = _sessions(served)
    failed, ok = served.store.session_turns(sid)
    assert failed.status.value == "error" and failed.client["retry_count"] == 0
    assert ok.client["attribution"] == "inferred:retry" and ok.client["retry_count"] == 1

    served = scripted_server([EngineError("upstream down"), "Now it works."])
    raw = httpx.Client(base_url=served.url)
    body = {"model": "tiny", "messages": [SYSTEM, TASK]}
    assert raw.post("/v1/chat/completions", json=body).status_code == 500
    assert raw.post("/v1/chat/completions", json=body).status_code == 200
    (sid,) = _sessions(served)
    assert served.store.session_turns(sid)[1].client["attribution"] == "inferred:retry"


def test_parallel_rollouts_are_not_taken_for_retries(scripted_server):
    """One client, two rollouts with the same first prompt: B fails, A is a first attempt
    (count 0), B's SDK retries (count 1): A is its own session, B's retry joins B."""
    served = scripted_server([EngineError("B fails"), "A's answer.", "B's retry answer."])
    b = served.client()
    with pytest.raises(openai.InternalServerError):
        b.chat.completions.create(model="tiny", messages=[SYSTEM, TASK])
    _chat(served, [SYSTEM, TASK])  # rollout A: x-stainless-retry-count 0
    assert len(_sessions(served)) == 2
    _chat(served, [SYSTEM, TASK], headers={"x-stainless-retry-count": "1"})  # B's retry
    # the retry matches the failed call and A's call: two sessions, so it joins neither
    assert len(_sessions(served)) == 3
    last = max(
        (t for sid in _sessions(served) for t in served.store.session_turns(sid)),
        key=lambda t: t.created_at,
    )
    assert last.client["attribution_evidence"]["ambiguous_retry_sessions"] == 2


def test_odd_retry_counts_and_agent_ids(scripted_server):
    served = scripted_server(["One.", "Two.", "Three."])
    raw = httpx.Client(base_url=served.url)
    body = {"model": "tiny", "messages": [SYSTEM, TASK]}
    for count in (b"\xb2", b"9" * 5000, b"-1", b"abc"):  # b"\xb2" reads as "\u00b2", a digit
        r = raw.post("/v1/chat/completions", json=body, headers={b"x-stainless-retry-count": count})
        assert r.status_code == 200, (count[:10], r.text)
    for bad in ("a\x01b", "x" * 300):
        r = raw.post("/v1/chat/completions", json=body, headers={"x-claude-code-agent-id": bad})
        assert r.status_code == 400 and "x-claude-code-agent-id" in r.json()["error"]["message"]


def test_a_rerendered_first_message_joins_by_the_echoed_answer(scripted_server):
    """Qwen Code re-renders the first user message (a directory listing changed) when it
    continues: the prefix breaks, but the history repeats the recorded answer."""
    served = scripted_server([LONG, "Tests pass."])
    _chat(served, [SYSTEM, {"role": "user", "content": "Files: calc.py\n\nFix calc.py."}])
    changed = {"role": "user", "content": "Files: calc.py notes.md\n\nFix calc.py."}
    follow = {"role": "user", "content": "Now run the tests."}
    _chat(served, [SYSTEM, changed, {"role": "assistant", "content": LONG}, follow])
    (sid,) = _sessions(served)
    first, second = served.store.session_turns(sid)
    assert second.client["attribution"] == "inferred:echo"
    assert second.client["attribution_confidence"] == "medium"
    assert second.client["attribution_evidence"]["echoed_tokens"] >= 16
    assert second.parent_turn_id == first.id
    tree = load_tree(served.store, sid)
    assert tree.node(second.id).parent_id is None  # ids differ: a new segment, same session


def test_a_short_or_ambiguous_echo_does_not_join(scripted_server):
    served = scripted_server(["OK.", LONG, LONG, "Tests pass.", "Fine."])
    _chat(served, [SYSTEM, {"role": "user", "content": "Say OK."}])
    short = [
        SYSTEM,
        {"role": "user", "content": "Say OK!"},
        {"role": "assistant", "content": "OK."},
    ]
    _chat(served, [*short, {"role": "user", "content": "And?"}])
    assert len(_sessions(served)) == 2  # "OK." is too short to be evidence
    _chat(served, [SYSTEM, {"role": "user", "content": "Fix calc.py (client 1)."}])
    _chat(served, [SYSTEM, {"role": "user", "content": "Fix calc.py (client 2)."}])
    assert len(_sessions(served)) == 4  # the same long answer now lives in two sessions
    echo = [SYSTEM, {"role": "user", "content": "Fix calc.py (edited)."}]
    _chat(served, [*echo, {"role": "assistant", "content": LONG}, {"role": "user", "content": "?"}])
    assert len(_sessions(served)) == 5  # ambiguous evidence: a session of its own


def test_an_echo_from_another_client_does_not_join(scripted_server):
    served = scripted_server([LONG, "Bob's reply."])
    _chat(served, [SYSTEM, TASK], api_key="alice")
    bob = [
        {"role": "system", "content": "Another harness."},
        {"role": "user", "content": "Look at this answer:"},
        {"role": "assistant", "content": LONG},
        {"role": "user", "content": "Is it right?"},
    ]
    _chat(served, bob, api_key="bob")
    assert len(_sessions(served)) == 2


def test_echo_evidence_is_counted_per_session(scripted_server):
    """Two short answers from two sessions (each under the minimum) are no evidence together."""
    eight, ten = "Yes, add is wrong here.", "No, the test itself is right, I checked it."
    served = scripted_server([eight, ten, "Fine."])
    _chat(served, [SYSTEM, {"role": "user", "content": "Is add wrong?"}], api_key="x")
    _chat(served, [SYSTEM, {"role": "user", "content": "Is the test wrong?"}], api_key="y")
    both = [
        SYSTEM,
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": eight},
        {"role": "user", "content": "Q2"},
        {"role": "assistant", "content": ten},
        {"role": "user", "content": "Q3"},
    ]
    _chat(served, both, api_key="z")
    assert len(_sessions(served)) == 3


def test_a_dropped_answer_continues_the_session(scripted_server):
    """mini-swe-agent drops an answer with no tool call and appends a format-error message."""
    served = scripted_server(["Let me think.", "Done."])
    _chat(served, [SYSTEM, TASK])
    error = {"role": "user", "content": "Format error: every response must include a tool call."}
    _chat(served, [SYSTEM, TASK, error])
    (sid,) = _sessions(served)
    first, second = served.store.session_turns(sid)
    assert second.client["attribution"] == "inferred:dropped_answer"
    assert second.client["attribution_evidence"]["dropped_turn"] == first.id


def test_a_dropped_answer_follows_its_own_client(scripted_server):
    """Bob, then Alice, start the same way; Bob's format-error follow-up stays Bob's."""
    served = scripted_server(["Bob thinks.", "Alice thinks.", "Bob's tool call."])
    _chat(served, [SYSTEM, TASK], api_key="bob")
    _chat(served, [SYSTEM, TASK], api_key="alice")
    error = {"role": "user", "content": "Format error: every response must include a tool call."}
    _chat(served, [SYSTEM, TASK, error], api_key="bob")
    bob_sessions = [
        sid
        for sid in _sessions(served)
        if any(
            "Bob" in ((t.output or {}).get("content") or "")
            for t in served.store.session_turns(sid)
        )
    ]
    (bob,) = bob_sessions
    assert len(served.store.session_turns(bob)) == 2
    assert len(_sessions(served)) == 2


def test_a_side_call_joins_its_clients_latest_session(scripted_server):
    """aider's commit-message call has its own system prompt and no session id."""
    served = scripted_server(["Edited hello.py.", "feat: greet", "feat: other"])
    _chat(served, [SYSTEM, TASK])
    commit = [
        {
            "role": "system",
            "content": "You are an expert software engineer that generates concise, one-line "
            "Git commit messages based on the provided diffs.",
        },
        {"role": "user", "content": "# Diffs:\n+print('hello')"},
    ]
    _chat(served, commit)
    (sid,) = _sessions(served)
    side = served.store.session_turns(sid)[1]
    assert (
        side.side_kind == "commit_message" and side.client["attribution"] == "inferred:side_recent"
    )
    assert not side.trainable and side.untrainable_reason == "side_call"
    _chat(served, commit, api_key="another-key")  # another client: not joined
    assert len(_sessions(served)) == 2


def test_openclaw_runtime_session_id(scripted_server):
    served = scripted_server(["Working on it.", "Done."])
    runtime = "Runtime: agent=main | session=agent:main:x | sessionId=oc-123 | host=h | os=Linux"
    first = {"role": "user", "content": f"[Tue 16:06] Fix calc.py.\n\n{runtime}"}
    rewritten = {"role": "user", "content": f"[Tue 16:07] [Queued ...]\nFix calc.py.\n\n{runtime}"}
    _chat(served, [SYSTEM, first])
    _chat(served, [SYSTEM, rewritten])
    assert _sessions(served) == ["oc-123"]
    assert {t.client["attribution"] for t in served.store.session_turns("oc-123")} == {
        "body:openclaw_runtime"
    }
    # a tool output that quotes such a line later in another conversation does not count
    quoted = {"role": "tool", "tool_call_id": "c1", "content": runtime}
    call = {"role": "assistant", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "cat", "arguments": "{}"}}
    ]}  # fmt: skip
    _chat(served, [SYSTEM, {"role": "user", "content": "Show the log."}, call, quoted])
    assert len(_sessions(served)) == 2


def test_claude_code_session_title_is_a_side_call(scripted_server):
    served = scripted_server(['{"title": "Calc fix"}'])
    client = httpx.Client(base_url=served.url)
    r = client.post(
        "/v1/messages",
        headers={"x-api-key": "k", "x-claude-code-session-id": "cc-1"},
        json={
            "model": "tiny",
            "max_tokens": 64,
            "system": [
                {
                    "type": "text",
                    "text": "You are naming a coding session so the user can pick it out of a "
                    "long list of sessions.",
                }
            ],
            "messages": [{"role": "user", "content": "<session>\nFix calc.py"}],
            "output_config": {
                "format": {
                    "type": "json_schema",
                    "schema": {"type": "object", "properties": {"title": {"type": "string"}}},
                }
            },
        },
    )
    assert r.status_code == 200, r.text
    (turn,) = served.store.session_turns("cc-1")
    assert turn.side_kind == "title" and turn.untrainable_reason == "side_call"


def test_preflight_and_responses_error_param(scripted_server):
    served = scripted_server(["x"], max_context=64)
    client = httpx.Client(base_url=served.url)
    assert client.head("/api/hello").status_code == 200
    assert client.get("/api/hello").json() == {"status": "ok"}
    r = client.post("/v1/responses", json={"model": "tiny", "input": "word " * 200})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "input"


def test_a_subagent_is_linked_to_the_main_agents_spawning_call(tmp_path):
    """Without a parent-agent header the spawner is a main-agent turn, never a sibling
    subagent's, even when that sibling's tool call mentions the same text."""
    from clawrl.gateway.attribution import spawning_turn
    from clawrl.store import Store, TurnRecord

    store = Store(tmp_path / "s.db")
    session = store.get_or_create_session("cc", SessionSource.HEADER)
    prompt = "Summarise the file notes/plan.md in three lines."

    def turn(agent: str | None, args: dict, t: float) -> TurnRecord:
        call = {"id": "c", "name": "Agent" if agent is None else "Read", "arguments": args}
        client = {} if agent is None else {"agent_id": agent}
        out = {"content": None, "reasoning": None, "tool_calls": [call]}
        rec = TurnRecord(session.id, [1, 2], [3], [-0.1], output=out, client=client, created_at=t)
        store.record_turn(rec)
        return rec

    spawner = turn(None, {"prompt": prompt, "description": "plan"}, 1.0)
    turn(None, {"prompt": "something else entirely", "description": "x"}, 2.0)
    turn("agent-1", {"file_path": "notes/plan.md"}, 3.0)  # a sibling subagent reading the file
    assert spawning_turn(store, session.id, "agent-2", None, prompt) == (
        spawner.id,
        "tool_call_prompt",
    )
    assert spawning_turn(store, session.id, "agent-1", None, prompt) is None  # not its first
    latest = spawning_turn(store, session.id, "agent-3", None, "unrelated")
    assert latest is not None and latest[1] == "latest_parent_turn"
    store.close()
