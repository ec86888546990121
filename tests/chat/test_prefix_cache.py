"""Prefix renders and segment tokenizations remembered across calls give the same spans as a
fresh computation (clawrl.chat.prefix_cache)."""

from __future__ import annotations

import copy

from clawrl.chat import ChatMessage, ToolSpec, render_prompt
from clawrl.chat import prefix_cache as pc
from clawrl.lru import LRU


def _conversation(n: int) -> list[ChatMessage]:
    msgs = [ChatMessage(role="system", content="Be brief.")]
    for k in range(n):
        msgs.append(ChatMessage(role="user", content=f"question {k}: " + "words " * (k + 3)))
        msgs.append(ChatMessage(role="assistant", content=f"answer {k}"))
    return msgs


def _fresh(monkeypatch) -> None:
    monkeypatch.setattr(pc, "PREFIXES", LRU(1024))
    monkeypatch.setattr(pc, "SEGMENTS", LRU(1024))


def test_remembered_spans_equal_fresh_ones(tokenizer, monkeypatch) -> None:
    tools = [ToolSpec(name="ls", description="list files", parameters={"type": "object"})]
    _fresh(monkeypatch)
    warm = []
    for n in (1, 2, 4, 6):  # an agent's conversation growing call by call
        for t in (None, tools):
            r = render_prompt(tokenizer, _conversation(n), t)
            warm.append((r.token_ids, r.message_spans))
    assert len(pc.PREFIXES._data) > 0 and len(pc.SEGMENTS._data) > 0
    _fresh(monkeypatch)
    cold = []
    for n in (1, 2, 4, 6):
        for t in (None, tools):
            _fresh(monkeypatch)
            r = render_prompt(tokenizer, _conversation(n), t)
            cold.append((r.token_ids, r.message_spans))
    assert warm == cold


def test_tokenizations_are_remembered_per_tokenizer(tokenizer) -> None:
    other = copy.deepcopy(tokenizer)
    assert pc.tokenizer_key(tokenizer) == pc.tokenizer_key(tokenizer)
    assert pc.tokenizer_key(tokenizer) != pc.tokenizer_key(other)
    seen = []
    assert pc.encode_segments(["ab", "cd"], lambda t: seen.extend(t) or [[1], [2]], b"x") == [
        [1], [2],
    ]  # fmt: skip
    assert pc.encode_segments(["ab"], lambda t: seen.extend(t) or [[9]], b"x") == [[1]]
    assert pc.encode_segments(["ab"], lambda t: seen.extend(t) or [[9]], b"y") == [[9]]
    assert seen == ["ab", "cd", "ab"]
