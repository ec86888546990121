"""Session attribution, trajectory linking by ids through the live gateway, end and feedback."""

from __future__ import annotations

import threading

import httpx
import pytest

from clawrl.store import SessionSource, Store, UntrainableReason
from clawrl.trajectory import RootReason, load_tree, training_rows

SYSTEM = {"role": "system", "content": "You are a careful assistant."}


def _grow(served, n, **create_kw):
    """n calls whose message lists grow turn by turn (the SDK message echoed back)."""
    client = served.client()
    messages = [SYSTEM, {"role": "user", "content": "Question 0"}]
    for i in range(n):
        r = client.chat.completions.create(model="tiny", messages=messages, **create_kw)
        messages += [
            r.choices[0].message.model_dump(exclude_none=True),
            {"role": "user", "content": f"Question {i + 1}"},
        ]


def _assert_one_chain(served, n, session_id=None):
    sessions = served.store.session_ids()
    assert len(sessions) == 1
    if session_id is not None:
        assert sessions == [session_id]
    tree = load_tree(served.store, sessions[0])
    assert len(tree.nodes) == n and len(tree.roots) == 1
    assert sorted(node.depth for node in tree.nodes.values()) == list(range(n))
    (row,) = training_rows(tree)
    assert len(row.trained_turn_ids) == n
    turns = served.store.session_turns(sessions[0])
    assert [t.parent_turn_id for t in turns[1:]] == [t.id for t in turns[:-1]]
    return turns


REPLIES = ["Answer zero.", "Answer one!", "Answer two?", "Answer three.", "Answer four."]


def test_five_growing_calls_without_session_info_are_one_trajectory(scripted_server):
    served = scripted_server(REPLIES)
    _grow(served, 5)
    turns = _assert_one_chain(served, 5)
    assert {t.session_source for t in turns} == {SessionSource.INFERRED}
    assert [t.client["attribution"] for t in turns] == ["inferred:new"] + ["inferred:prefix"] * 4


@pytest.mark.parametrize("header", ["x-session-id", "X-Session-Id", "X-SESSION-ID"])
def test_five_growing_calls_with_session_header(scripted_server, header):
    served = scripted_server(REPLIES)
    _grow(served, 5, extra_headers={header: "sess-42"})
    turns = _assert_one_chain(served, 5, session_id="sess-42")
    assert {t.session_source for t in turns} == {SessionSource.HEADER}
    assert {t.client["attribution"] for t in turns} == {"header:x-session-id"}


def test_url_prefix_wins_over_header_and_body(scripted_server):
    served = scripted_server()
    r = httpx.post(
        f"{served.url}/s/from-url/v1/chat/completions",
        json={"model": "tiny", "messages": [SYSTEM], "session_id": "from-body"},
        headers={"X-Session-Id": "from-header"},
        timeout=30,
    )
    assert r.status_code == 200 and r.headers["x-clawrl-session-id"] == "from-url"
    (turn,) = served.turns()
    assert turn.session_id == "from-url" and turn.session_source == SessionSource.URL


@pytest.mark.parametrize(
    ("fields", "expected", "detail"),
    [
        ({"session_id": "a", "metadata": {"session_id": "b"}, "user": "c"}, "a", "session_id"),
        ({"metadata": {"session_id": "b"}, "user": "c"}, "b", "metadata.session_id"),
        ({"user": "c"}, "c", "user"),
    ],
)
def test_body_fields_in_order(scripted_server, fields, expected, detail):
    served = scripted_server()
    body = {"model": "tiny", "messages": [SYSTEM], **fields}
    r = httpx.post(f"{served.url}/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    (turn,) = served.turns()
    assert turn.session_id == expected
    assert turn.session_source == SessionSource.BODY
    assert turn.client["attribution"] == f"body:{detail}"


def test_retry_branch_and_concurrent_subagent(scripted_server, tmp_path):
    """A and its retry A' share prompt P; B continues A' with a tool result; C is a concurrent
    subagent call in the same session with another system prompt."""
    tools = [{"type": "function", "function": {"name": "run", "parameters": {"type": "object"}}}]
    replies = [
        '<tool_call>{"name": "run", "arguments": {"cmd": "ls"}}</tool_call>',
        '<tool_call>{"name": "run", "arguments": {"cmd": "ls -la"}}</tool_call>',
        "Both done.",
        "Both done.",
    ]
    served = scripted_server(replies, token_delay_s=0.002)
    client = served.client(default_headers={"X-Session-Id": "tree"})
    p = [SYSTEM, {"role": "user", "content": "List the files."}]
    a = client.chat.completions.create(model="tiny", messages=p, tools=tools)
    a2 = client.chat.completions.create(model="tiny", messages=p, tools=tools)
    call = a2.choices[0].message.tool_calls[0]
    b_messages = [
        *p,
        a2.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "a.txt b.txt"},
    ]
    c_messages = [
        {"role": "system", "content": "You are a subagent that summarises."},
        {"role": "user", "content": "Summarise the repository."},
    ]
    errors: list[BaseException] = []

    def call_in_thread(messages):
        try:
            client.chat.completions.create(model="tiny", messages=messages, tools=tools)
        except BaseException as e:  # surfaced by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=call_in_thread, args=(m,)) for m in (b_messages, c_messages)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    assert a.choices[0].message.tool_calls[0].function.arguments != call.function.arguments

    reopened = Store(served.store.target)  # a fresh connection: only committed data is visible
    try:
        turns = reopened.session_turns("tree")
        assert len(turns) == 4
        tree = load_tree(reopened, "tree")
    finally:
        reopened.close()
    by_prompt = {}
    for t in turns:
        by_prompt.setdefault(tuple(t.prompt_ids), []).append(t)
    t_a, t_a2 = sorted(by_prompt[tuple(turns[0].prompt_ids)], key=lambda t: t.created_at)
    (t_b,) = [t for t in turns if len(t.request_messages) == 4]
    (t_c,) = [t for t in turns if t.request_messages[0]["content"].startswith("You are a sub")]
    assert tree.node(t_b.id).parent_id == t_a2.id and t_b.parent_turn_id == t_a2.id
    assert tree.node(t_a.id).parent_id is None and tree.node(t_a2.id).parent_id is None
    assert tree.node(t_a2.id).root_reason == RootReason.RETRY
    assert tree.node(t_a2.id).segment == tree.node(t_a.id).segment
    assert tree.node(t_c.id).parent_id is None
    assert tree.node(t_c.id).segment != tree.node(t_a.id).segment
    # the first attempt a led nowhere (its client sent the same prompt again): a dead retry leaf,
    # not trained; every other sampled token is trained exactly once, in exactly one row
    assert tree.node(t_a.id).untrainable_reason == UntrainableReason.ABANDONED_RETRY
    trained = [t for t in turns if t.id != t_a.id]
    rows = training_rows(tree)
    assert not any(t_a.id in row.trained_turn_ids for row in rows)
    for t in trained:
        owners = []
        for row in rows:
            idx = row.turn_ids.index(t.id) if t.id in row.turn_ids else None
            hits = [
                k
                for k, (m, owner) in enumerate(zip(row.loss_mask, row.token_turn, strict=True))
                if m == 1 and owner == idx
            ]
            if hits:
                owners.append(row)
                start = len(t.prompt_ids)
                assert hits == list(range(start, start + len(t.completion_ids)))
                assert [row.input_ids[k] for k in hits] == t.completion_ids
                assert [row.sampling_logprobs[k] for k in hits] == t.sampling_logprobs
        assert len(owners) == 1, t.id
    assert sum(sum(r.loss_mask) for r in rows) == sum(len(t.completion_ids) for t in trained)


def test_non_canonical_sampled_ids_are_spliced_back(scripted_server, tokenizer):
    """The policy sampled "Hello world" as one token per character; the template would
    re-tokenize it differently. The next prompt must contain the sampled ids exactly."""
    text = "Hello world"
    char_ids = [i for ch in text for i in tokenizer.encode(ch, add_special_tokens=False)]
    assert char_ids != tokenizer.encode(text, add_special_tokens=False)
    served = scripted_server([[*char_ids, tokenizer.eos_token_id], "Fine."])
    client = served.client()
    messages = [SYSTEM, {"role": "user", "content": "Greet me."}]
    r = client.chat.completions.create(model="tiny", messages=messages)
    assert r.choices[0].message.content == text
    messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "Thanks."}]
    raw = client.chat.completions.with_raw_response.create(model="tiny", messages=messages)
    first, second = served.engine.prompts
    seq = [*first, *char_ids, tokenizer.eos_token_id]
    assert second[: len(seq)] == seq
    (t2,) = [served.store.get_turn(raw.headers["x-clawrl-turn-ids"])]
    (t1,) = [t for t in served.turns() if t.id != t2.id]
    assert t2.parent_turn_id == t1.id and t2.session_id == t1.session_id
    assert t2.sampling_params["history_splices"] == [[2, t1.id]]


def test_edited_history_is_not_spliced(scripted_server, tokenizer):
    text = "Hello world"
    char_ids = [i for ch in text for i in tokenizer.encode(ch, add_special_tokens=False)]
    served = scripted_server([[*char_ids, tokenizer.eos_token_id], "Fine."])
    client = served.client()
    messages = [SYSTEM, {"role": "user", "content": "Greet me."}]
    client.chat.completions.create(model="tiny", messages=messages)
    edited = [*messages, {"role": "assistant", "content": "Hello world!"}]
    client.chat.completions.create(
        model="tiny", messages=[*edited, {"role": "user", "content": "?"}]
    )
    second = served.engine.prompts[1]
    assert not _contains(second, char_ids)
    t1, t2 = sorted(served.turns(), key=lambda t: t.created_at)
    assert t2.sampling_params["history_splices"] == []
    assert t2.session_id != t1.session_id  # no prefix: a new session (no session info sent)


def _contains(seq, sub):
    return any(seq[i : i + len(sub)] == sub for i in range(len(seq) - len(sub) + 1))


def test_end_session_stops_inference_and_unknown_is_404(scripted_server):
    served = scripted_server(["One.", "Two."])
    client = served.client()
    messages = [SYSTEM, {"role": "user", "content": "Hi"}]
    raw = client.chat.completions.with_raw_response.create(model="tiny", messages=messages)
    sid = raw.headers["x-clawrl-session-id"]
    r = httpx.post(f"{served.url}/v1/sessions/{sid}/end")
    assert r.status_code == 200 and r.json()["ended"] is True
    assert served.store.get_session(sid).ended_at is not None
    messages += [raw.parse().choices[0].message.model_dump(exclude_none=True)]
    messages += [{"role": "user", "content": "again"}]
    raw2 = client.chat.completions.with_raw_response.create(model="tiny", messages=messages)
    assert raw2.headers["x-clawrl-session-id"] != sid
    missing = httpx.post(f"{served.url}/v1/sessions/nope/end")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "session_not_found"


def test_feedback(scripted_server):
    served = scripted_server()
    raw = served.client().chat.completions.with_raw_response.create(model="tiny", messages=[SYSTEM])
    turn_id, sid = raw.headers["x-clawrl-turn-ids"], raw.headers["x-clawrl-session-id"]
    url = f"{served.url}/v1/feedback"
    ok = httpx.post(url, json={"turn_id": turn_id, "reward": -0.5, "comment": "too short"})
    assert ok.status_code == 200, ok.text
    assert ok.json()["session_id"] == sid
    assert httpx.post(url, json={"session_id": sid, "reward": 1}).status_code == 200
    (fb,) = served.store.feedback_for(turn_id=turn_id)
    assert fb.reward == -0.5 and fb.comment == "too short"
    assert len(served.store.feedback_for(session_id=sid)) == 2
    out_of_range = httpx.post(url, json={"turn_id": turn_id, "reward": 1.5})
    assert out_of_range.status_code == 400
    assert out_of_range.json()["error"]["param"] == "reward"
    assert httpx.post(url, json={"reward": 0.5}).status_code == 400
    assert httpx.post(url, json={"turn_id": "nope", "reward": 0.5}).status_code == 404
    assert httpx.post(url, json={"session_id": "nope", "reward": 0.5}).status_code == 404


def test_non_ascii_session_ids_are_kept_and_headers_stay_valid(scripted_server):
    served = scripted_server()
    body = {"model": "tiny", "messages": [SYSTEM], "user": "用户 42"}
    r = httpx.post(f"{served.url}/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    assert r.headers["x-clawrl-session-id"] == "%E7%94%A8%E6%88%B7 42"
    assert served.store.session_ids() == ["用户 42"]
    bad = httpx.post(
        f"{served.url}/v1/chat/completions",
        json={**body, "session_id": "a\nb"},
        timeout=30,
    )
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "session_id"
