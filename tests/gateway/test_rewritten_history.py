"""Multi-turn conversations through the gateway with the real chat templates shipped in trl
(issue "Your model, not ours", deliverable 3): when a template re-renders an earlier answer to
other ids than were sampled (Gemma 3 trims whitespace, Qwen3 and DeepSeek-R1 drop reasoning,
native-tools templates re-serialise tool calls, gpt-oss ends answers with another token), every
turn but the last still gets its next state and stays trainable on its own sampled ids, and the
link records how the prompt differed (:mod:`clawrl.trajectory.history`).

The client behaves like an OpenAI SDK user: it sends back the answer's content as it received
it (stripped by the gateway's parse), omits ``reasoning_content``, and re-serialises tool-call
arguments with its own spacing. The tiny policy's tokenizer gets each template and its special
tokens; a :class:`~clawrl.engine.scripted.ScriptedEngine` samples the scripted texts (+ the
template's end-of-turn token as EOS).
"""

from __future__ import annotations

import copy
import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trl
from starlette.testclient import TestClient

from clawrl.engine.scripted import ScriptedEngine
from clawrl.gateway import create_app
from clawrl.store import Store, TurnRecord
from clawrl.trajectory import HistoryChange, LinkKind, load_tree, next_state, training_rows
from clawrl.trajectory.history import HISTORY_LINK_FACT

TEMPLATES = Path(trl.__file__).parent / "chat_templates"

# template -> (end-of-turn token = EOS, BOS or None, other special tokens it writes)
SPECIALS: dict[str, tuple[str, str | None, list[str]]] = {
    "gemma3": ("<end_of_turn>", "<bos>", ["<start_of_turn>"]),
    "qwen3": ("<|im_end|>", None, []),
    "qwen2_5": ("<|im_end|>", None, []),
    "llama3_1": ("<|eot_id|>", "<|begin_of_text|>",
                 ["<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>"]),
    "llama3_2": ("<|eot_id|>", "<|begin_of_text|>",
                 ["<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>"]),
    "phi3": ("<|end|>", None, ["<|user|>", "<|assistant|>", "<|system|>"]),
    "deepseek_r1_distill": ("<｜end▁of▁sentence｜>", "<｜begin▁of▁sentence｜>",
                            ["<｜User｜>", "<｜Assistant｜>"]),
    "gptoss": ("<|return|>", None, ["<|start|>", "<|end|>", "<|message|>", "<|channel|>",
                                    "<|call|>"]),
}  # fmt: skip
# Llama 3's templates expect calls as {"name": ..., "parameters": ...} JSON, which the gateway
# may parse in that format: their conversations make no tool call (the rest is the same).
HERMES_CALLS = {"gemma3", "qwen3", "qwen2_5", "phi3", "deepseek_r1_distill", "gptoss"}

SYSTEM = {"role": "system", "content": "Be brief."}
TOOLS = [{"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                                                    "b": {"type": "integer"}}},
}}]  # fmt: skip
WHITESPACE = "Sure.\n\n"  # the parse strips it, the client echoes "Sure."
REASONING = "<think>\nLet me add.\n</think>\n\nIt is 4.\n"  # the client drops the reasoning
CALL = '<tool_call>\n{"name": "add", "arguments": {"a":2,"b":2}}\n</tool_call>'
PLAIN = "The tool says 4."


@dataclass
class Step:
    """One call: the engine's scripted reply, then what the client sends next (a user message,
    or ``None``: the tool result of the answer's call)."""

    reply: str
    then: str | None


def _script(template: str) -> list[Step]:
    steps = [Step(WHITESPACE, "What is 2+2?"), Step(REASONING, "Check it with the tool.")]
    if template in HERMES_CALLS:
        steps += [Step(CALL, None), Step(PLAIN, "Thanks!")]
    else:
        steps += [Step(PLAIN, "Thanks!")]
    return [*steps, Step("Bye.", "")]


_TOKENIZERS: dict[str, Any] = {}  # kept alive for the whole module: one copy per template


def template_tokenizer(base: Any, name: str) -> Any:
    """The tiny policy's tokenizer with trl's ``name`` template and its special tokens."""
    if name not in _TOKENIZERS:
        tok = copy.deepcopy(base)
        eos, bos, extra = SPECIALS[name]
        new = [t for t in (eos, bos, *extra) if t and t not in tok.all_special_tokens]
        tok.add_special_tokens({"additional_special_tokens": new})
        tok.eos_token = eos
        if bos is not None:
            tok.bos_token = bos
        tok.chat_template = (TEMPLATES / f"{name}.jinja").read_text()
        _TOKENIZERS[name] = tok
    return _TOKENIZERS[name]


@dataclass
class Gateway:
    http: TestClient
    store: Store
    tokenizer: Any

    def chat(self, messages: list[dict], **body: Any) -> tuple[dict[str, Any], str]:
        """One call; the answer's message and the session the gateway put it in."""
        r = self.http.post(
            "/v1/chat/completions", json={"model": "tiny", "messages": messages, **body}
        )
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["message"], r.headers["x-clawrl-session-id"]

    def turns(self) -> list[TurnRecord]:
        turns = [t for s in self.store.session_ids() for t in self.store.session_turns(s)]
        return sorted(turns, key=lambda t: t.created_at)


@pytest.fixture
def gateway(tokenizer, tmp_path) -> Iterator[Any]:
    """Factory: ``gateway(template, replies)`` -> a :class:`Gateway` on a fresh store."""
    stores: list[Store] = []
    clients: list[TestClient] = []

    def make(name: str, replies: list[str]) -> Gateway:
        tok = template_tokenizer(tokenizer, name)
        store = Store(tmp_path / f"{name}-{len(stores)}.db")
        stores.append(store)
        app = create_app(ScriptedEngine(tok, replies), tok, store, model_name="tiny")
        client = TestClient(app).__enter__()
        clients.append(client)
        return Gateway(client, store, tok)

    yield make
    for client in clients:
        client.__exit__(None, None, None)
    for store in stores:
        store.close()


def echo(message: dict[str, Any], keep_reasoning: bool = False) -> dict[str, Any]:
    """The answer as an OpenAI client sends it back: its content as received, no reasoning
    (unless kept), tool-call arguments re-serialised without spaces."""
    out: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    if keep_reasoning and message.get("reasoning_content"):
        out["reasoning_content"] = message["reasoning_content"]
    calls = message.get("tool_calls") or []
    if calls:
        out["tool_calls"] = [
            {**c, "function": {**c["function"], "arguments": json.dumps(
                json.loads(c["function"]["arguments"]), separators=(",", ":"))}}
            for c in calls
        ]  # fmt: skip
    return out


def converse(
    gw: Gateway, steps: list[Step], *, keep_reasoning: bool = False, **body: Any
) -> list[list[dict[str, Any]]]:
    """Run the scripted conversation; the messages of each call, in order."""
    messages: list[dict[str, Any]] = [SYSTEM, {"role": "user", "content": "Hello there"}]
    sent = []
    for step in steps:
        sent.append(list(messages))
        answer, _ = gw.chat(messages, tools=TOOLS, **body)
        messages.append(echo(answer, keep_reasoning))
        if step.then is None:
            (call,) = answer["tool_calls"]
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": "4"})
        else:
            messages.append({"role": "user", "content": step.then})
    return sent


def _check_every_turn_but_the_last_has_its_next_state(gw: Gateway, n: int) -> dict[str, Any]:
    """Assert the chain of ``n`` turns in one session: each turn's next state is the next call's
    new messages, every turn trainable and trained exactly once on its own sampled ids."""
    (sid,) = gw.store.session_ids()
    tree = load_tree(gw.store, sid)
    turns = gw.turns()
    assert len(turns) == n
    for before, after in itertools.pairwise(turns):
        state = next_state(tree, before.id)
        assert state is not None and state.child_turn_id == after.id, before.output
        assert state.messages == after.request_messages[len(before.request_messages) + 1 :]
        assert state.role.value in ("user", "tool") and state.messages
        node = tree.node(after.id)
        if node.link == LinkKind.HISTORY_REWRITTEN:
            assert node.changes and HistoryChange.UNKNOWN.value not in node.changes
            fact = after.client[HISTORY_LINK_FACT]
            assert fact["turn_id"] == before.id and fact["changes"] == list(node.changes)
            assert state.changes == list(node.changes)
            if fact["next_state_at"] is not None:  # the new messages' ids, as the engine got them
                text = gw.tokenizer.decode(state.ids)
                assert _text(state.messages[0]) in text, (text, state.messages)
        else:
            assert node.link == LinkKind.PREFIX
    assert next_state(tree, turns[-1].id) is None
    rows = training_rows(tree)
    trained = [t for row in rows for t in row.trained_turn_ids]
    assert sorted(trained) == sorted(t.id for t in turns)  # every turn, exactly once
    for row in rows:  # rows hold the sampled ids: nothing re-tokenized
        end = tree.node(row.leaf_turn_id).turn
        assert row.input_ids == end.seq_ids
        for tid in row.trained_turn_ids:
            turn = tree.node(tid).turn
            at = len(turn.prompt_ids)
            assert row.input_ids[at : at + len(turn.completion_ids)] == turn.completion_ids
            assert row.sampling_logprobs[at : at + len(turn.completion_ids)] == (
                turn.sampling_logprobs
            )
    return {t.id: tree.node(t.id) for t in turns}


def _text(message: dict[str, Any]) -> str:
    return message.get("content") or ""


@pytest.mark.parametrize("template", sorted(SPECIALS))
def test_every_turn_keeps_its_next_state_with_the_real_template(gateway, template):
    steps = _script(template)
    gw = gateway(template, [s.reply for s in steps])
    converse(gw, steps)
    nodes = _check_every_turn_but_the_last_has_its_next_state(gw, len(steps))
    links = [n.link for n in nodes.values()][1:]
    changes = [set(n.changes) for n in nodes.values()][1:]
    assert LinkKind.HISTORY_REWRITTEN in links  # every one of these templates rewrites one
    # the answer with trailing whitespace: linked by ids, or rewritten in whitespace (gpt-oss
    # also frames it in its final channel and ends it with <|end|>: "rendering")
    rewrites = {HistoryChange.WHITESPACE.value, HistoryChange.RENDERING.value}
    assert links[0] == LinkKind.PREFIX or changes[0] & rewrites
    # the reasoning the client dropped is never in the next prompt
    assert links[1] == LinkKind.HISTORY_REWRITTEN
    assert HistoryChange.REASONING_DROPPED.value in changes[1]
    if template in HERMES_CALLS:  # arguments sampled as {"a":2,"b":2}, echoed re-serialised
        assert links[2] == LinkKind.HISTORY_REWRITTEN
        assert HistoryChange.TOOL_CALL_JSON.value in changes[2]
    turns = gw.turns()
    assert {t.client["attribution"] for t in turns[1:]} <= {"inferred:prefix", "inferred:history"}


def test_qwen3_drops_reasoning_the_client_sent_back(gateway):
    """A client that keeps ``reasoning_content``: Qwen3's template drops it once a later
    question comes (the template's doing, not the client's), and the link says so."""
    steps = [Step(REASONING, "And 3+3?"), Step("<think>\nAgain.\n</think>\n\n6.", "Thanks."),
             Step("Bye.", "")]  # fmt: skip
    gw = gateway("qwen3", [s.reply for s in steps])
    converse(gw, steps, keep_reasoning=True)
    nodes = list(_check_every_turn_but_the_last_has_its_next_state(gw, 3).values())
    for node in nodes[1:]:
        assert node.link == LinkKind.HISTORY_REWRITTEN
        assert HistoryChange.REASONING_DROPPED.value in node.changes
    assert gw.turns()[1].request_messages[2]["reasoning"] == "Let me add."  # it was sent back


def test_a_named_session_links_rewritten_answers_too(gateway):
    steps = _script("gemma3")
    gw = gateway("gemma3", [s.reply for s in steps])
    converse(gw, steps, session_id="conv-7")
    nodes = _check_every_turn_but_the_last_has_its_next_state(gw, len(steps))
    turns = gw.turns()
    assert {t.session_id for t in turns} == {"conv-7"}
    assert [t.parent_turn_id for t in turns[1:]] == [t.id for t in turns[:-1]]
    assert all(n.hint.value == "confirmed" for n in list(nodes.values())[1:])


def test_an_edited_answer_or_another_conversation_is_not_continued(gateway):
    """The client rewrote what the answer says, or a different conversation repeats the
    answer: the earlier turn gets no next state from them."""
    gw = gateway("gemma3", [WHITESPACE, "Oui.", "Hm.", "Okay."])
    first = [SYSTEM, {"role": "user", "content": "Hello there"}]
    gw.chat(first)
    edited = {"role": "assistant", "content": "Sure, and in French: bien sûr."}
    gw.chat([*first, edited, {"role": "user", "content": "Say it again."}])
    other = [SYSTEM, {"role": "user", "content": "Are you ready?"}]
    gw.chat([*other, {"role": "assistant", "content": "Sure."},
             {"role": "user", "content": "Go."}])  # fmt: skip
    # the same conversation, then the same answer: this one does continue
    gw.chat([*first, {"role": "assistant", "content": "Sure."},
             {"role": "user", "content": "Thanks."}])  # fmt: skip
    turns = gw.turns()
    t0, edited_call, other_call, good = turns
    for sid in gw.store.session_ids():
        tree = load_tree(gw.store, sid)
        for call in (edited_call, other_call):
            if call.id in tree.nodes:
                assert tree.node(call.id).parent_id != t0.id
    tree = load_tree(gw.store, t0.session_id)
    state = next_state(tree, t0.id)
    assert state is not None and state.child_turn_id == good.id
    assert tree.node(good.id).link == LinkKind.HISTORY_REWRITTEN
    assert other_call.session_id != t0.session_id
    assert HISTORY_LINK_FACT not in edited_call.client
    assert HISTORY_LINK_FACT not in other_call.client


def test_qwen3_rerenders_earlier_answers_once_a_new_question_comes(gateway):
    """A tool chain with reasoning the client sends back: Qwen3 keeps the reasoning of the
    answers after the last question, and drops all of it when the next question comes, so that
    call's prompt differs before the answer it continues too (``earlier_history``)."""
    call = "<think>\nI need the tool.\n</think>\n\n" + CALL
    steps = [Step(call, None), Step("<think>\nIt said 4.\n</think>\n\n4.", "And 3+3?"),
             Step("6.", "Thanks."), Step("Bye.", "")]  # fmt: skip
    gw = gateway("qwen3", [s.reply for s in steps])
    converse(gw, steps, keep_reasoning=True)
    nodes = list(_check_every_turn_but_the_last_has_its_next_state(gw, 4).values())
    assert HistoryChange.TOOL_CALL_JSON.value in nodes[1].changes
    assert HistoryChange.EARLIER_HISTORY.value in nodes[2].changes
    assert HistoryChange.REASONING_DROPPED.value in nodes[2].changes
    facts = [t.client[HISTORY_LINK_FACT] for t in gw.turns()[1:3]]
    assert all(f["next_state_at"] is not None for f in facts)
